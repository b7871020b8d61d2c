//===- InferSpmd.cpp - one op's SPMD rule, called alone -------------------===//
//
// Builds the op in a throwaway module (with the mesh as an `ernie.mesh`, so
// the mesh is checked as a program's would be), runs resolveShardings on it
// alone, and reads the answer back. Most of the file is the translation of
// attributes as Paddle and Python users write them into the op's own.
//
//===----------------------------------------------------------------------===//

#include "ernie/Sharding/InferSpmd.h"

#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Sharding/BuildOp.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::ernie;

namespace {

/// Other frameworks' names for an ernie attribute (Paddle's first). An
/// alias applies to ops that have the canonical attribute and not the alias.
struct Alias {
  StringLiteral alias, canonical;
};
constexpr Alias kAliases[] = {
    {"trans_x", "transpose_a"},
    {"transpose_x", "transpose_a"},
    {"trans_y", "transpose_b"},
    {"transpose_y", "transpose_b"},
    {"axis", "axes"},
    {"keep_dim", "keepdim"},
    {"num_or_sections", "sizes"},
    {"sections", "sizes"},
    {"num", "sizes"},
    {"eps", "epsilon"},
};

/// Paddle attributes for what ernie's op fixes: accepted at ernie's value
/// and dropped. (Where Paddle's op has more freedom, docs/spmd-rules.md.)
enum class Fixed { LastAxis, False, True, AnyBool };
struct FixedAttr {
  StringLiteral op, name;
  Fixed value;
};
constexpr FixedAttr kFixedAttrs[] = {
    {"ernie.layer_norm", "begin_norm_axis", Fixed::LastAxis},
    {"ernie.rms_norm", "begin_norm_axis", Fixed::LastAxis},
    {"ernie.cross_entropy", "axis", Fixed::LastAxis},
    {"ernie.cross_entropy", "soft_label", Fixed::False},
    {"ernie.cross_entropy", "use_softmax", Fixed::True},
    {"ernie.cross_entropy", "numeric_stable_mode", Fixed::AnyBool},
    {"ernie.cross_entropy_grad", "axis", Fixed::LastAxis},
    {"ernie.cross_entropy_grad", "soft_label", Fixed::False},
    {"ernie.cross_entropy_grad", "use_softmax", Fixed::True},
    {"ernie.cross_entropy_grad", "numeric_stable_mode", Fixed::AnyBool},
    {"ernie.embedding", "sparse", Fixed::AnyBool},
};

/// Paddle's spelling of "none" for an optional attribute: the attribute is
/// left out (Paddle's phi embedding takes padding_idx = -1 for no padding).
struct NoneValue {
  StringLiteral op, name;
  int64_t value;
};
constexpr NoneValue kNoneValues[] = {
    {"ernie.embedding", "padding_idx", -1},
};

/// Attributes naming dimensions of the first input: negative values count
/// from the end, as in numpy and Paddle.
constexpr StringLiteral kAxisAttrs[] = {"axis", "axes", "perm"};

std::string str(Attribute attr) {
  std::string s;
  llvm::raw_string_ostream os(s);
  attr.print(os);
  return s;
}

std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    s += (i ? ", " : "") + std::to_string(d);
  return s + "]";
}

/// The attributes of one inferSpmd call, translated for op `info`.
class AttributeTranslator {
public:
  AttributeTranslator(RegisteredOperationName info,
                      ArrayRef<RankedTensorType> inputs, std::string &error)
      : info(info), context(info.getContext()), builder(context),
        inputs(inputs), error(error) {}

  /// The op's attributes; null after setting `error`.
  DictionaryAttr translate(DictionaryAttr given,
                           SmallVectorImpl<RankedTensorType> &resultTypes) {
    NamedAttrList attrs;
    std::optional<SmallVector<int64_t>> shape;
    Type dtype;
    bool inferred = info.hasInterface<InferTypeOpInterface>();
    for (NamedAttribute attr :
         given ? given.getValue() : ArrayRef<NamedAttribute>()) {
      StringRef key = attr.getName().strref();
      Attribute value = attr.getValue();
      if (!inferred && resultTypes.empty() && key == "shape") {
        if (!(shape = intList(value)))
          return fail("attribute 'shape' must be a list of integers, not " +
                      str(value));
        continue;
      }
      if (!inferred && resultTypes.empty() && key == "dtype") {
        auto name = dyn_cast<StringAttr>(value);
        dtype = name ? parseType(name.getValue(), context, nullptr,
                                 /*isKnownNullTerminated=*/false)
                     : Type();
        if (!dtype || !(isa<FloatType>(dtype) || isa<IntegerType>(dtype)))
          return fail("attribute 'dtype' must name an element type (f32, "
                      "bf16, i64, ...), not " +
                      str(value));
        continue;
      }
      if (isNoneValue(key, value))
        continue;
      if (const FixedAttr *fixed = findFixed(key)) {
        if (!checkFixed(*fixed, value))
          return nullptr;
        continue;
      }
      FailureOr<StringRef> name = canonicalName(key, given);
      if (failed(name))
        return nullptr;
      if (attrs.get(*name))
        return fail("attribute '" + name->str() + "' is given twice (as '" +
                    key.str() + "' too)");
      attrs.set(*name, value);
    }

    NamedAttrList out;
    for (NamedAttribute attr : attrs) {
      FailureOr<Attribute> value = coerce(attr.getName(), attr.getValue());
      if (failed(value))
        return nullptr;
      if (*value)
        out.set(attr.getName(), *value);
    }
    if (failed(normalizeAxes(out)) || failed(splitSections(out)))
      return nullptr;
    if (!inferred && resultTypes.empty() &&
        failed(deriveResultType(out, shape, dtype, resultTypes)))
      return nullptr;
    return out.getDictionary(context);
  }

private:
  DictionaryAttr fail(const Twine &why) {
    error = "'" + info.getStringRef().str() + "': " + why.str();
    return nullptr;
  }

  bool hasAttr(StringRef name) const {
    return llvm::any_of(info.getAttributeNames(),
                        [&](StringAttr a) { return a.getValue() == name; });
  }

  std::string attrList() const {
    std::string names;
    for (StringAttr a : info.getAttributeNames())
      names += (names.empty() ? "" : ", ") + a.getValue().str();
    return names.empty() ? "it has none" : "it has " + names;
  }

  bool isNoneValue(StringRef key, Attribute value) const {
    auto integer = dyn_cast<IntegerAttr>(value);
    return integer && !isa<BoolAttr>(value) &&
           llvm::any_of(kNoneValues, [&](const NoneValue &none) {
             return none.op == info.getStringRef() && none.name == key &&
                    none.value == integer.getInt();
           });
  }

  const FixedAttr *findFixed(StringRef key) const {
    for (const FixedAttr &fixed : kFixedAttrs)
      if (fixed.op == info.getStringRef() && fixed.name == key)
        return &fixed;
    return nullptr;
  }

  bool checkFixed(const FixedAttr &fixed, Attribute value) {
    auto flag = [&]() -> std::optional<bool> {
      if (auto b = dyn_cast<BoolAttr>(value))
        return b.getValue();
      if (isa<UnitAttr>(value))
        return true;
      return std::nullopt;
    };
    std::string wants;
    switch (fixed.value) {
    case Fixed::LastAxis: {
      int64_t rank = inputs.empty() ? 0 : inputs.front().getRank();
      auto axis = dyn_cast<IntegerAttr>(value);
      if (axis && !isa<BoolAttr>(value) &&
          (axis.getInt() == -1 || axis.getInt() == rank - 1))
        return true;
      wants = "-1 or " + std::to_string(rank - 1) +
              " (ernie's op works on the last dimension)";
      break;
    }
    case Fixed::False:
      if (flag() == false)
        return true;
      wants = "False (ernie's op has no other form)";
      break;
    case Fixed::True:
      if (flag() == true)
        return true;
      wants = "True (ernie's op has no other form)";
      break;
    case Fixed::AnyBool:
      if (flag())
        return true;
      wants = "a bool";
      break;
    }
    fail("attribute '" + fixed.name.str() + "' must be " + wants + ", not " +
         str(value));
    return false;
  }

  FailureOr<StringRef> canonicalName(StringRef key, DictionaryAttr given) {
    if (hasAttr(key))
      return key;
    for (const Alias &alias : kAliases)
      if (alias.alias == key && hasAttr(alias.canonical))
        return StringRef(alias.canonical);
    fail("has no attribute '" + key.str() + "' (" + attrList() + ")");
    return failure();
  }

  /// Whether op properties accept `value` under `name` (a null value: the
  /// attribute left out). Only the storage kind is checked here; values
  /// are checked by the op's verifier.
  bool accepts(StringAttr name, Attribute value) {
    if (!value)
      return accepts(name, builder.getUnitAttr());
    if (info.getOpPropertyByteSize() == 0)
      return true;
    std::vector<uint64_t> storage(
        (info.getOpPropertyByteSize() + sizeof(uint64_t) - 1) /
            sizeof(uint64_t) +
        1);
    OpaqueProperties props(storage.data());
    info.initOpProperties(props, nullptr);
    ScopedDiagnosticHandler quiet(context,
                                  [](Diagnostic &) { return success(); });
    NamedAttribute entry(name, value);
    bool ok = succeeded(info.setOpPropertiesFromAttribute(
        info, props, DictionaryAttr::get(context, entry),
        [&] { return emitError(UnknownLoc::get(context)); }));
    info.destroyOpProperties(props);
    return ok;
  }

  /// `value` in the kind the op stores under `name`: a bool for a unit flag
  /// (False leaves it out) and back, an int for a float, an int for a
  /// one-element list and back, a string for an enum.
  FailureOr<Attribute> coerce(StringAttr name, Attribute value) {
    SmallVector<Attribute> candidates{value};
    // Integers of other widths as i64, unless stored as they are (enums).
    if (auto integer = dyn_cast<IntegerAttr>(value);
        integer && !isa<BoolAttr>(value) && !integer.getType().isInteger(64) &&
        integer.getType().isInteger()) {
      if (accepts(name, value))
        return value;
      value = builder.getI64IntegerAttr(integer.getInt());
      candidates.push_back(value);
    }
    if (auto flag = dyn_cast<BoolAttr>(value)) {
      if (accepts(name, builder.getUnitAttr()))
        return flag.getValue() ? Attribute(builder.getUnitAttr()) : Attribute();
    } else if (isa<UnitAttr>(value)) {
      candidates.push_back(builder.getBoolAttr(true));
    } else if (auto integer = dyn_cast<IntegerAttr>(value)) {
      candidates.push_back(
          builder.getF64FloatAttr(static_cast<double>(integer.getInt())));
      candidates.push_back(builder.getDenseI64ArrayAttr({integer.getInt()}));
    } else if (auto list = dyn_cast<DenseI64ArrayAttr>(value)) {
      if (list.size() == 1)
        candidates.push_back(builder.getI64IntegerAttr(list[0]));
    } else if (std::optional<SmallVector<int64_t>> ints = intList(value)) {
      candidates.push_back(builder.getDenseI64ArrayAttr(*ints));
    } else if (auto text = dyn_cast<StringAttr>(value)) {
      StringRef s = text.getValue();
      if (auto r = symbolizeLossReduction(s))
        candidates.push_back(LossReductionAttr::get(context, *r));
      if (auto k = symbolizeReduceKind(s))
        candidates.push_back(ReduceKindAttr::get(context, *k));
      if (auto d = symbolizeCompareDirection(s))
        candidates.push_back(CompareDirectionAttr::get(context, *d));
    }
    for (Attribute candidate : candidates)
      if (accepts(name, candidate))
        return candidate;
    fail("attribute '" + name.str() + "' cannot be " + str(value));
    return failure();
  }

  static std::optional<SmallVector<int64_t>> intList(Attribute value) {
    if (auto list = dyn_cast<DenseI64ArrayAttr>(value))
      return SmallVector<int64_t>(list.asArrayRef());
    auto array = dyn_cast<ArrayAttr>(value);
    if (!array)
      return std::nullopt;
    SmallVector<int64_t> ints;
    for (Attribute element : array) {
      auto integer = dyn_cast<IntegerAttr>(element);
      if (!integer || isa<BoolAttr>(element))
        return std::nullopt;
      ints.push_back(integer.getInt());
    }
    return ints;
  }

  /// Negative axes count from the end; reduction axes are a set (sorted).
  LogicalResult normalizeAxes(NamedAttrList &attrs) {
    if (inputs.empty())
      return success();
    int64_t rank = inputs.front().getRank();
    auto wrap = [&](int64_t axis) { return axis < 0 ? axis + rank : axis; };
    for (StringRef key : kAxisAttrs) {
      Attribute value = attrs.get(key);
      if (auto axis = dyn_cast_or_null<IntegerAttr>(value);
          axis && !isa<BoolAttr>(value)) {
        attrs.set(key, builder.getI64IntegerAttr(wrap(axis.getInt())));
      } else if (auto list = dyn_cast_or_null<DenseI64ArrayAttr>(value)) {
        SmallVector<int64_t> axes;
        for (int64_t a : list.asArrayRef())
          axes.push_back(wrap(a));
        if (key == "axes")
          llvm::sort(axes);
        attrs.set(key, builder.getDenseI64ArrayAttr(axes));
      }
    }
    return success();
  }

  /// Split's sizes as Paddle's num_or_sections: an int is a number of
  /// equal pieces, one -1 among the sections takes the rest.
  LogicalResult splitSections(NamedAttrList &attrs) {
    if (!hasAttr("sizes") || inputs.empty())
      return success();
    auto axisAttr = dyn_cast_or_null<IntegerAttr>(attrs.get("axis"));
    int64_t rank = inputs.front().getRank();
    auto sizes = dyn_cast_or_null<DenseI64ArrayAttr>(attrs.get("sizes"));
    if (!axisAttr || !sizes || axisAttr.getInt() < 0 ||
        axisAttr.getInt() >= rank)
      return success(); // the op's verifier says what is wrong
    int64_t total = inputs.front().getDimSize(axisAttr.getInt());
    SmallVector<int64_t> pieces(sizes.asArrayRef());
    if (pieces.size() == 1 && pieces[0] > 0) {
      int64_t num = pieces[0];
      if (total % num != 0) {
        fail("cannot split a dimension of " + std::to_string(total) + " into " +
             std::to_string(num) + " equal pieces");
        return failure();
      }
      pieces.assign(num, total / num);
    } else if (llvm::count(pieces, -1) == 1) {
      int64_t known = 0;
      for (int64_t p : pieces)
        if (p != -1 && llvm::AddOverflow(known, p, known))
          return success();
      for (int64_t &p : pieces)
        if (p == -1)
          p = total - known;
    }
    attrs.set("sizes", builder.getDenseI64ArrayAttr(pieces));
    return success();
  }

  /// A result type from `shape`, `dtype` and `value`, for ops whose results
  /// are not inferred: the input's shape and element type where not given;
  /// a reshape's 0 copies the input's dimension and one -1 takes the rest
  /// (Paddle); a broadcast without `dims` aligns trailing dimensions
  /// (numpy); a fill value takes the element type.
  LogicalResult deriveResultType(NamedAttrList &attrs,
                                 std::optional<SmallVector<int64_t>> shape,
                                 Type dtype,
                                 SmallVectorImpl<RankedTensorType> &results) {
    if (!info.hasTrait<OpTrait::OneResult>()) {
      fail("needs its result types");
      return failure();
    }
    RankedTensorType input = inputs.empty() ? nullptr : inputs.front();
    auto value = dyn_cast_or_null<TypedAttr>(attrs.get("value"));
    if (auto elements =
            dyn_cast_or_null<ShapedType>(value ? value.getType() : Type());
        elements && !shape && !dtype) {
      if (auto ranked = dyn_cast<RankedTensorType>(elements)) {
        results.push_back(ranked);
        return success();
      }
    }
    if (!shape && !input) {
      fail("needs a 'shape' (its result is not inferred)");
      return failure();
    }
    SmallVector<int64_t> dims =
        shape ? *shape : SmallVector<int64_t>(input.getShape());
    if (shape && input && info.getStringRef() == ReshapeOp::getOperationName())
      if (failed(resolveReshape(input, dims)))
        return failure();
    for (int64_t d : dims)
      if (d < 0) {
        fail("attribute 'shape' " + shapeStr(dims) +
             " has a negative dimension");
        return failure();
      }
    Type element = dtype ? dtype : input ? input.getElementType() : Type();
    if (!element && value && !isa<ShapedType>(value.getType()))
      element = value.getType();
    if (!element) {
      fail("needs a 'dtype' (its result is not inferred)");
      return failure();
    }
    auto type = RankedTensorType::get(dims, element);
    if (!hasAddressableSize(type)) {
      fail("attribute 'shape' " + shapeStr(dims) + " is too large");
      return failure();
    }
    results.push_back(type);
    if (value && !isa<ShapedType>(value.getType()) &&
        value.getType() != element) {
      Attribute retyped;
      if (auto f = dyn_cast<FloatAttr>(value); f && isa<FloatType>(element))
        retyped = builder.getFloatAttr(element, f.getValueAsDouble());
      else if (auto i = dyn_cast<IntegerAttr>(value);
               i && isa<FloatType>(element))
        retyped =
            builder.getFloatAttr(element, static_cast<double>(i.getInt()));
      else if (i && isa<IntegerType>(element))
        retyped = builder.getIntegerAttr(element, i.getInt());
      if (retyped)
        attrs.set("value", retyped);
    }
    if (hasAttr("dims") && !attrs.get("dims") && input &&
        input.getRank() <= type.getRank()) {
      SmallVector<int64_t> aligned;
      for (int64_t i = 0; i < input.getRank(); ++i)
        aligned.push_back(type.getRank() - input.getRank() + i);
      attrs.set("dims", builder.getDenseI64ArrayAttr(aligned));
    }
    return success();
  }

  LogicalResult resolveReshape(RankedTensorType input,
                               SmallVectorImpl<int64_t> &dims) {
    int64_t known = 1, inferAt = -1;
    for (auto [i, d] : llvm::enumerate(dims)) {
      if (d == 0 && static_cast<int64_t>(i) < input.getRank())
        d = input.getDimSize(i);
      if (d == -1) {
        if (inferAt >= 0) {
          fail("attribute 'shape' has more than one -1");
          return failure();
        }
        inferAt = i;
        continue;
      }
      if (d < 0 || llvm::MulOverflow(known, d, known)) {
        fail("attribute 'shape' " + shapeStr(dims) + " is not a shape");
        return failure();
      }
    }
    if (inferAt >= 0) {
      int64_t count = input.getNumElements();
      if (known == 0 || count % known != 0) {
        fail("attribute 'shape' " + shapeStr(dims) + " cannot hold the " +
             std::to_string(count) + " elements of " +
             shapeStr(input.getShape()));
        return failure();
      }
      dims[inferAt] = count / known;
    }
    return success();
  }

  RegisteredOperationName info;
  MLIRContext *context;
  Builder builder;
  ArrayRef<RankedTensorType> inputs;
  std::string &error;
};

/// A given sharding must fit its tensor: its rank, and axes the mesh has.
/// (Divisibility is the rule's business: it leaves what does not divide.)
LogicalResult checkGiven(ShardingAttr sharding, RankedTensorType type,
                         const MeshShape &mesh, const Twine &what,
                         std::string &error) {
  if (!sharding)
    return success();
  if (sharding.getRank() != type.getRank()) {
    error = what.str() + " has a sharding of rank " +
            std::to_string(sharding.getRank()) + " for a tensor of rank " +
            std::to_string(type.getRank());
    return failure();
  }
  auto known = [&](StringRef axis) {
    return llvm::is_contained(mesh.axes, axis);
  };
  for (int64_t d = 0; d < sharding.getRank(); ++d)
    for (StringRef axis : sharding.getDimAxes(d))
      if (!known(axis)) {
        error = what.str() + " is sharded over '" + axis.str() +
                "', which the mesh does not have";
        return failure();
      }
  for (auto [axis, kind] : sharding.getPartials())
    if (!known(axis)) {
      error = what.str() + " is partial over '" + axis.str() +
              "', which the mesh does not have";
      return failure();
    }
  return success();
}

/// Tensors inferSpmd takes: static shapes whose bytes an int64 counts.
LogicalResult checkStatic(StringRef opName, ArrayRef<RankedTensorType> types,
                          StringRef what, std::string &error) {
  for (auto [i, type] : llvm::enumerate(types))
    if (!type || !type.hasStaticShape() || !hasAddressableSize(type)) {
      error = "'" + opName.str() + "': " + what.str() + " " +
              std::to_string(i) + " needs a static shape of addressable size";
      return failure();
    }
  return success();
}

/// The op of one call, built and verified in `module`; `name` and `attrs`
/// translated.
FailureOr<Operation *> buildSpmdOp(MLIRContext *context, ModuleOp module,
                                   StringRef opName,
                                   ArrayRef<RankedTensorType> inputTypes,
                                   DictionaryAttr attrs,
                                   ArrayRef<RankedTensorType> resultTypes,
                                   const MeshShape *mesh, std::string &error) {
  context->getOrLoadDialect<ErnieDialect>();
  context->getOrLoadDialect<func::FuncDialect>();
  std::string diagnostics;
  ScopedDiagnosticHandler handler(context, [&](Diagnostic &diag) {
    if (!diagnostics.empty())
      diagnostics += "\n";
    diagnostics += diag.str();
    return success();
  });
  auto fail = [&](const Twine &why) -> FailureOr<Operation *> {
    error = diagnostics.empty() ? why.str() : diagnostics;
    return failure();
  };

  std::optional<RegisteredOperationName> name =
      RegisteredOperationName::lookup(opName, context);
  if (!name)
    return fail("unknown op '" + opName + "'");
  if (failed(checkStatic(opName, inputTypes, "input", error)) ||
      failed(checkStatic(opName, resultTypes, "result", error)))
    return failure();

  OpBuilder builder(context);
  Location loc = builder.getUnknownLoc();
  builder.setInsertionPointToEnd(module.getBody());
  if (mesh) {
    if (mesh->axes.size() != mesh->sizes.size())
      return fail("the mesh has " + Twine(mesh->axes.size()) +
                  " axis names but " + Twine(mesh->sizes.size()) + " sizes");
    if (!mesh->name)
      return fail("the mesh has no name");
    auto meshOp = MeshOp::create(builder, loc, mesh->name.getValue(),
                                 builder.getStrArrayAttr(mesh->axes),
                                 builder.getDenseI64ArrayAttr(mesh->sizes));
    if (failed(verify(meshOp)))
      return fail("invalid mesh");
  }

  std::string attrError;
  SmallVector<RankedTensorType> results(resultTypes);
  AttributeTranslator translator(*name, inputTypes, attrError);
  DictionaryAttr opAttrs = translator.translate(attrs, results);
  if (!opAttrs) {
    error = attrError;
    return failure();
  }

  // A throwaway function holding the op, so its verifier sees real values.
  SmallVector<Type> argTypes(inputTypes.begin(), inputTypes.end());
  auto func = func::FuncOp::create(builder, loc, "infer_spmd",
                                   builder.getFunctionType(argTypes, {}));
  Block *entry = func.addEntryBlock();
  builder.setInsertionPointToEnd(entry);
  SmallVector<Type> types(results.begin(), results.end());
  FailureOr<Operation *> op =
      buildOp(builder, loc, opName, entry->getArguments(), opAttrs, types);
  func::ReturnOp::create(builder, loc);
  if (failed(op))
    return fail("'" + opName + "' rejects these inputs");
  for (Type type : (*op)->getResultTypes())
    if (!isa<RankedTensorType>(type))
      return fail("'" + opName + "' has a result that is not a tensor");
  return op;
}

/// numpy's broadcast of the shapes (trailing dimensions aligned, 1
/// stretching); none when they do not broadcast.
std::optional<SmallVector<int64_t>>
broadcastShape(ArrayRef<RankedTensorType> types) {
  int64_t rank = 0;
  for (RankedTensorType type : types)
    rank = std::max(rank, type.getRank());
  SmallVector<int64_t> shape(rank, 1);
  for (RankedTensorType type : types) {
    int64_t offset = rank - type.getRank();
    for (int64_t d = 0; d < type.getRank(); ++d) {
      int64_t &out = shape[d + offset], size = type.getDimSize(d);
      if (out == 1)
        out = size;
      else if (size != 1 && size != out)
        return std::nullopt;
    }
  }
  return shape;
}

/// Elementwise ops broadcast as numpy does here, as Paddle's rule does:
/// ernie's ops take one shape (broadcasting is an explicit op), so the rule
/// is that of the broadcast shape (`broadcast`, set when the inputs' shapes
/// differ), the inputs' expanded dimensions taking no factor.
LogicalResult broadcastInputs(MLIRContext *context, StringRef opName,
                              ArrayRef<RankedTensorType> inputTypes,
                              std::optional<SmallVector<int64_t>> &broadcast,
                              std::string &error) {
  std::optional<RegisteredOperationName> info =
      RegisteredOperationName::lookup(opName, context);
  if (!info || !info->hasTrait<OpTrait::Elementwise>() ||
      llvm::all_of(inputTypes, [&](RankedTensorType t) {
        return t && t.getShape() == inputTypes.front().getShape();
      }))
    return success();
  if (llvm::is_contained(inputTypes, RankedTensorType()) ||
      !(broadcast = broadcastShape(inputTypes))) {
    error = "'" + opName.str() + "': the input shapes do not broadcast";
    return failure();
  }
  return success();
}

FailureOr<SpmdResult> runRule(MLIRContext *context, StringRef opName,
                              ArrayRef<RankedTensorType> inputTypes,
                              ArrayRef<ShardingAttr> inputShardings,
                              ArrayRef<ShardingAttr> outputShardings,
                              DictionaryAttr attrs, const MeshShape &mesh,
                              std::string &error,
                              ArrayRef<RankedTensorType> resultTypes) {
  if (!inputShardings.empty() && inputShardings.size() != inputTypes.size()) {
    error = "got " + std::to_string(inputShardings.size()) + " shardings for " +
            std::to_string(inputTypes.size()) + " inputs";
    return failure();
  }
  if (failed(checkStatic(opName, inputTypes, "input", error)))
    return failure();
  for (auto [i, sharding] : llvm::enumerate(inputShardings))
    if (failed(checkGiven(sharding, inputTypes[i], mesh, "input " + Twine(i),
                          error)))
      return failure();

  std::optional<SmallVector<int64_t>> broadcast;
  if (failed(broadcastInputs(context, opName, inputTypes, broadcast, error)))
    return failure();
  SmallVector<RankedTensorType> buildTypes(inputTypes);
  if (broadcast)
    for (RankedTensorType &type : buildTypes)
      type = RankedTensorType::get(*broadcast, type.getElementType());

  OpBuilder builder(context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(builder.getUnknownLoc());
  FailureOr<Operation *> built = buildSpmdOp(
      context, *module, opName, buildTypes, attrs, resultTypes, &mesh, error);
  if (failed(built))
    return failure();
  Operation *op = *built;
  auto ruleOp = dyn_cast<ShardingRuleOpInterface>(op);
  if (!ruleOp) {
    error = "'" + opName.str() + "' has no sharding rule";
    return failure();
  }
  OpShardingRule rule = ruleOp.getShardingRule();
  if (broadcast) {
    int64_t rank = broadcast->size();
    for (auto [i, type] : llvm::enumerate(inputTypes)) {
      TensorFactors dims(type.getRank());
      int64_t offset = rank - type.getRank();
      for (int64_t d = 0; d < type.getRank(); ++d)
        if (type.getDimSize(d) == (*broadcast)[d + offset])
          dims[d] = rule.operands[i][d + offset];
      rule.operands[i] = std::move(dims);
    }
  }

  SmallVector<RankedTensorType> outTypes;
  for (Type type : op->getResultTypes())
    outTypes.push_back(cast<RankedTensorType>(type));
  if (!outputShardings.empty() && outputShardings.size() != outTypes.size()) {
    error = "'" + opName.str() + "' has " + std::to_string(outTypes.size()) +
            " outputs; got " + std::to_string(outputShardings.size()) +
            " shardings";
    return failure();
  }
  for (auto [i, sharding] : llvm::enumerate(outputShardings))
    if (failed(checkGiven(sharding, outTypes[i], mesh, "output " + Twine(i),
                          error)))
      return failure();

  SmallVector<ShardingAttr> ins(inputShardings);
  ins.resize(inputTypes.size());
  SmallVector<ShardingAttr> outs(outputShardings);
  outs.resize(outTypes.size());
  OpShardings resolved =
      resolveShardings(context, rule, ins, outs, inputTypes, outTypes, mesh);
  return SpmdResult{resolved.operands, resolved.results};
}

} // namespace

FailureOr<SpmdResult>
mlir::ernie::inferSpmd(MLIRContext *context, StringRef opName,
                       ArrayRef<RankedTensorType> inputTypes,
                       ArrayRef<ShardingAttr> inputShardings,
                       DictionaryAttr attrs, const MeshShape &mesh,
                       std::string &error,
                       ArrayRef<RankedTensorType> resultTypes,
                       ArrayRef<ShardingAttr> outputShardings) {
  return runRule(context, opName, inputTypes, inputShardings, outputShardings,
                 attrs, mesh, error, resultTypes);
}

FailureOr<SpmdResult>
mlir::ernie::inferSpmdReverse(MLIRContext *context, StringRef opName,
                              ArrayRef<RankedTensorType> inputTypes,
                              ArrayRef<ShardingAttr> outputShardings,
                              DictionaryAttr attrs, const MeshShape &mesh,
                              std::string &error,
                              ArrayRef<RankedTensorType> resultTypes) {
  return runRule(context, opName, inputTypes, {}, outputShardings, attrs, mesh,
                 error, resultTypes);
}

FailureOr<SmallVector<RankedTensorType>>
mlir::ernie::inferSpmdResultTypes(MLIRContext *context, StringRef opName,
                                  ArrayRef<RankedTensorType> inputTypes,
                                  DictionaryAttr attrs, std::string &error) {
  std::optional<SmallVector<int64_t>> broadcast;
  if (failed(broadcastInputs(context, opName, inputTypes, broadcast, error)))
    return failure();
  SmallVector<RankedTensorType> buildTypes(inputTypes);
  if (broadcast)
    for (RankedTensorType &type : buildTypes)
      type = RankedTensorType::get(*broadcast, type.getElementType());
  OwningOpRef<ModuleOp> module = ModuleOp::create(UnknownLoc::get(context));
  FailureOr<Operation *> op = buildSpmdOp(context, *module, opName, buildTypes,
                                          attrs, {}, nullptr, error);
  if (failed(op))
    return failure();
  SmallVector<RankedTensorType> types;
  for (Type type : (*op)->getResultTypes())
    types.push_back(cast<RankedTensorType>(type));
  return types;
}

FailureOr<ShardingAttr> mlir::ernie::shardingFromDimsMapping(
    MLIRContext *context, const MeshShape &mesh, const DimsMapping &mapping) {
  int64_t meshRank = std::min(mesh.axes.size(), mesh.sizes.size());
  // By name: a mesh whose axes repeat a name must not make a sharding that
  // uses one axis twice.
  llvm::StringSet<> used;
  auto take = [&](int64_t meshDim) {
    return meshDim >= 0 && meshDim < meshRank && !mesh.axes[meshDim].empty() &&
           used.insert(mesh.axes[meshDim]).second;
  };
  SmallVector<SmallVector<StringRef>> dims;
  for (int64_t meshDim : mapping.dims) {
    SmallVector<StringRef> &axes = dims.emplace_back();
    if (meshDim == -1)
      continue;
    if (!take(meshDim))
      return failure();
    axes.push_back(mesh.axes[meshDim]);
  }
  SmallVector<std::pair<StringRef, ReduceKind>> partial;
  for (int64_t meshDim : mapping.partialDims) {
    if (!take(meshDim))
      return failure();
    partial.emplace_back(mesh.axes[meshDim], ReduceKind::sum);
  }
  if (!mesh.name)
    return failure();
  return ShardingAttr::get(context, mesh.name, dims, partial);
}

FailureOr<DimsMapping>
mlir::ernie::dimsMappingFromSharding(ShardingAttr sharding,
                                     const MeshShape &mesh) {
  auto meshDim = [&](StringRef axis) -> int64_t {
    const auto *it = llvm::find(mesh.axes, axis);
    return it == mesh.axes.end() ? -1 : it - mesh.axes.begin();
  };
  DimsMapping mapping;
  for (int64_t d = 0; d < sharding.getRank(); ++d) {
    SmallVector<StringRef> axes = sharding.getDimAxes(d);
    if (axes.size() > 1)
      return failure();
    mapping.dims.push_back(axes.empty() ? -1 : meshDim(axes.front()));
  }
  for (auto [axis, kind] : sharding.getPartials())
    mapping.partialDims.push_back(meshDim(axis));
  return mapping;
}
