//===- ErnieAttrs.cpp - the sharding attribute -------------------------------===//
//
// Syntax, structural verification and accessors of #ernie.sharding. Checks
// that need the mesh (known axes, divisibility) live in Sharding.cpp, where
// the mesh is looked up from the op that carries the sharding.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieAttrs.h"
#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::ernie;

/// The attribute's parameters from per-dimension axis names and partials.
static std::tuple<ArrayAttr, ArrayAttr, ArrayAttr>
shardingParams(MLIRContext *context, ArrayRef<SmallVector<StringRef>> dims,
               ArrayRef<std::pair<StringRef, ReduceKind>> partial) {
  Builder b(context);
  SmallVector<Attribute> dimAttrs;
  for (const SmallVector<StringRef> &axes : dims)
    dimAttrs.push_back(b.getStrArrayAttr(axes));
  SmallVector<Attribute> axes, kinds;
  for (auto [axis, kind] : partial) {
    axes.push_back(b.getStringAttr(axis));
    kinds.push_back(ReduceKindAttr::get(context, kind));
  }
  return {b.getArrayAttr(dimAttrs), b.getArrayAttr(axes),
          b.getArrayAttr(kinds)};
}

ShardingAttr
ShardingAttr::get(MLIRContext *context, FlatSymbolRefAttr mesh,
                  ArrayRef<SmallVector<StringRef>> dims,
                  ArrayRef<std::pair<StringRef, ReduceKind>> partial) {
  auto [dimAttrs, axes, kinds] = shardingParams(context, dims, partial);
  return get(context, mesh, dimAttrs, axes, kinds);
}

ShardingAttr ShardingAttr::getCheckedFromNames(
    function_ref<InFlightDiagnostic()> emitError, MLIRContext *context,
    FlatSymbolRefAttr mesh, ArrayRef<SmallVector<StringRef>> dims,
    ArrayRef<std::pair<StringRef, ReduceKind>> partial) {
  auto [dimAttrs, axes, kinds] = shardingParams(context, dims, partial);
  return getChecked(emitError, context, mesh, dimAttrs, axes, kinds);
}

ShardingAttr ShardingAttr::getReplicated(MLIRContext *context,
                                         FlatSymbolRefAttr mesh,
                                         int64_t rank) {
  return get(context, mesh, SmallVector<SmallVector<StringRef>>(rank));
}

ShardingAttr ShardingAttr::withoutPartials() const {
  if (!isPartial())
    return *this;
  SmallVector<SmallVector<StringRef>> dims;
  for (int64_t d = 0; d < getRank(); ++d)
    dims.push_back(getDimAxes(d));
  return get(getContext(), getMesh(), dims);
}

SmallVector<StringRef> ShardingAttr::getDimAxes(int64_t dim) const {
  SmallVector<StringRef> axes;
  for (Attribute axis : cast<ArrayAttr>(getDims()[dim]))
    axes.push_back(cast<StringAttr>(axis).getValue());
  return axes;
}

SmallVector<std::pair<StringRef, ReduceKind>>
ShardingAttr::getPartials() const {
  SmallVector<std::pair<StringRef, ReduceKind>> partials;
  for (auto [axis, kind] : llvm::zip(getPartialAxes(), getPartialKinds()))
    partials.emplace_back(cast<StringAttr>(axis).getValue(),
                          cast<ReduceKindAttr>(kind).getValue());
  return partials;
}

bool ShardingAttr::isReplicated() const {
  return !isPartial() && llvm::all_of(getDims(), [](Attribute dim) {
    return cast<ArrayAttr>(dim).empty();
  });
}

SmallVector<StringRef> ShardingAttr::getUsedAxes() const {
  SmallVector<StringRef> axes;
  for (int64_t d = 0, e = getRank(); d < e; ++d)
    llvm::append_range(axes, getDimAxes(d));
  for (Attribute axis : getPartialAxes())
    axes.push_back(cast<StringAttr>(axis).getValue());
  return axes;
}

LogicalResult
ShardingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                     FlatSymbolRefAttr mesh, ArrayAttr dims,
                     ArrayAttr partialAxes, ArrayAttr partialKinds) {
  if (!mesh)
    return emitError() << "sharding needs a mesh";
  llvm::StringSet<> seen;
  auto use = [&](Attribute axis) -> LogicalResult {
    auto name = dyn_cast<StringAttr>(axis);
    if (!name || name.getValue().empty())
      return emitError() << "mesh axes are named by non-empty strings";
    if (!seen.insert(name.getValue()).second)
      return emitError() << "mesh axis '" << name.getValue()
                         << "' is used twice in one sharding";
    return success();
  };
  for (Attribute dim : dims) {
    auto axes = dyn_cast<ArrayAttr>(dim);
    if (!axes)
      return emitError() << "each dimension lists its axes in an array";
    for (Attribute axis : axes)
      if (failed(use(axis)))
        return failure();
  }
  if (partialAxes.size() != partialKinds.size())
    return emitError() << "every partial axis needs one reduce kind";
  for (auto [axis, kind] : llvm::zip(partialAxes, partialKinds)) {
    if (failed(use(axis)))
      return failure();
    if (!isa<ReduceKindAttr>(kind))
      return emitError() << "partial kinds are #ernie.reduce_kind values";
  }
  return success();
}

/// `<@mesh, [{a, b}, {}, ...](, partial = {axis = kind, ...})?>`
Attribute ShardingAttr::parse(AsmParser &parser, Type) {
  MLIRContext *ctx = parser.getContext();
  FlatSymbolRefAttr mesh;
  SmallVector<SmallVector<StringRef>> dims;
  SmallVector<std::pair<StringRef, ReduceKind>> partial;
  // Axis names are interned in the context, so the StringRefs stay valid.
  auto parseAxis = [&](StringRef &out) -> ParseResult {
    std::string name;
    if (parser.parseKeywordOrString(&name))
      return failure();
    out = StringAttr::get(ctx, name).getValue();
    return success();
  };
  auto parseDim = [&]() -> ParseResult {
    SmallVector<StringRef> &axes = dims.emplace_back();
    return parser.parseCommaSeparatedList(
        AsmParser::Delimiter::Braces, [&]() -> ParseResult {
          return parseAxis(axes.emplace_back());
        });
  };
  auto parsePartial = [&]() -> ParseResult {
    StringRef axis;
    std::string kindName;
    SMLoc loc = parser.getCurrentLocation();
    if (parseAxis(axis) || parser.parseEqual() ||
        parser.parseKeywordOrString(&kindName))
      return failure();
    std::optional<ReduceKind> kind = symbolizeReduceKind(kindName);
    if (!kind)
      return parser.emitError(loc, "unknown reduce kind '")
             << kindName << "' (expected sum, avg, max or min)";
    partial.emplace_back(axis, *kind);
    return success();
  };
  if (parser.parseLess() || parser.parseAttribute(mesh) ||
      parser.parseComma() ||
      parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, parseDim))
    return {};
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseKeyword("partial") || parser.parseEqual() ||
        parser.parseCommaSeparatedList(AsmParser::Delimiter::Braces,
                                       parsePartial))
      return {};
  }
  if (parser.parseGreater())
    return {};
  Builder b(ctx);
  SmallVector<Attribute> dimAttrs, axes, kinds;
  for (const SmallVector<StringRef> &dim : dims)
    dimAttrs.push_back(b.getStrArrayAttr(dim));
  for (auto [axis, kind] : partial) {
    axes.push_back(b.getStringAttr(axis));
    kinds.push_back(ReduceKindAttr::get(ctx, kind));
  }
  return getChecked([&] { return parser.emitError(parser.getNameLoc()); },
                    ctx, mesh, b.getArrayAttr(dimAttrs), b.getArrayAttr(axes),
                    b.getArrayAttr(kinds));
}

void ShardingAttr::print(AsmPrinter &printer) const {
  printer << '<' << getMesh() << ", [";
  llvm::interleaveComma(getDims(), printer, [&](Attribute dim) {
    printer << '{';
    llvm::interleaveComma(cast<ArrayAttr>(dim), printer, [&](Attribute axis) {
      printer.printKeywordOrString(cast<StringAttr>(axis).getValue());
    });
    printer << '}';
  });
  printer << ']';
  if (isPartial()) {
    printer << ", partial = {";
    llvm::interleaveComma(getPartials(), printer, [&](auto partial) {
      printer.printKeywordOrString(partial.first);
      printer << " = " << stringifyReduceKind(partial.second);
    });
    printer << '}';
  }
  printer << '>';
}
