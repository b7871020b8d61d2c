//===- BuildOp.cpp - one op from its name, operands and attributes --------===//

#include "ernie/Sharding/BuildOp.h"

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "llvm/ADT/DenseMap.h"

#include <utility>

using namespace mlir;
using namespace mlir::ernie;

namespace {

/// The largest fixed operand count the trait probe looks for.
constexpr unsigned kMaxFixedOperands = 16;

template <unsigned... Ns>
std::pair<int64_t, int64_t>
countFromTraits(RegisteredOperationName name,
                std::integer_sequence<unsigned, Ns...>) {
  std::pair<int64_t, int64_t> range{0, -1};
  if (name.hasTrait<OpTrait::ZeroOperands>())
    return {0, 0};
  if (name.hasTrait<OpTrait::OneOperand>())
    return {1, 1};
  auto probe = [&](auto n) {
    constexpr unsigned k = decltype(n)::value;
    if constexpr (k > 1)
      if (name.hasTrait<OpTrait::NOperands<k>::template Impl>())
        range = {k, k};
    if (name.hasTrait<OpTrait::AtLeastNOperands<k>::template Impl>())
      range = {k, -1};
  };
  (probe(std::integral_constant<unsigned, Ns + 1>{}), ...);
  return range;
}

/// Every ernie op's generated adaptor check (required attributes present,
/// attribute constraints met), run on properties before type inference
/// reads them: inference trusts what the verifier would have checked.
using AdaptorCheck = LogicalResult (*)(ValueRange, DictionaryAttr,
                                       OpaqueProperties, Location);

template <typename OpTy>
LogicalResult checkAdaptor(ValueRange operands, DictionaryAttr attrs,
                           OpaqueProperties properties, Location loc) {
  using Properties = typename OpTy::Properties;
  if constexpr (std::is_same_v<Properties, EmptyProperties>) {
    typename OpTy::Adaptor adaptor(operands, attrs);
    return adaptor.verify(loc);
  } else {
    typename OpTy::Adaptor adaptor(operands, attrs,
                                   *properties.as<Properties *>());
    return adaptor.verify(loc);
  }
}

template <typename... OpTys>
llvm::DenseMap<TypeID, AdaptorCheck> makeAdaptorChecks() {
  return {{TypeID::get<OpTys>(), &checkAdaptor<OpTys>}...};
}

const llvm::DenseMap<TypeID, AdaptorCheck> &adaptorChecks() {
  static const llvm::DenseMap<TypeID, AdaptorCheck> checks = makeAdaptorChecks<
#define GET_OP_LIST
#include "ernie/Dialect/Ernie/IR/ErnieOps.cpp.inc"
      >();
  return checks;
}

/// An op's properties, built from its inherent attributes and destroyed
/// with this object.
class PropertyStorage {
public:
  explicit PropertyStorage(OperationName name)
      : name(name),
        storage((name.getOpPropertyByteSize() + sizeof(uint64_t) - 1) /
                    sizeof(uint64_t) +
                1) {
    name.initOpProperties(get(), nullptr);
  }
  ~PropertyStorage() { name.destroyOpProperties(get()); }
  PropertyStorage(const PropertyStorage &) = delete;
  PropertyStorage &operator=(const PropertyStorage &) = delete;

  OpaqueProperties get() { return OpaqueProperties(storage.data()); }

private:
  OperationName name;
  std::vector<uint64_t> storage;
};

} // namespace

std::pair<int64_t, int64_t>
mlir::ernie::operandCountRange(RegisteredOperationName name) {
  if (name.hasTrait<OpTrait::VariadicOperands>())
    return {0, -1};
  return countFromTraits(
      name, std::make_integer_sequence<unsigned, kMaxFixedOperands>());
}

FailureOr<Operation *> mlir::ernie::buildOp(OpBuilder &builder, Location loc,
                                            StringRef name, ValueRange operands,
                                            DictionaryAttr attrs,
                                            TypeRange resultTypes) {
  MLIRContext *context = builder.getContext();
  std::optional<RegisteredOperationName> info =
      RegisteredOperationName::lookup(name, context);
  if (!info)
    return emitError(loc) << "unknown op '" << name << "'", failure();
  auto [minOperands, maxOperands] = operandCountRange(*info);
  int64_t count = operands.size();
  if (count < minOperands || (maxOperands >= 0 && count > maxOperands)) {
    InFlightDiagnostic diag = emitError(loc) << "'" << name << "' takes ";
    if (maxOperands == minOperands)
      diag << minOperands;
    else if (maxOperands < 0)
      diag << "at least " << minOperands;
    else
      diag << minOperands << " to " << maxOperands;
    return diag << " operand" << (maxOperands == 1 ? "" : "s") << ", got "
                << count,
           failure();
  }

  // Inherent attributes are the op's properties; the rest stay attributes.
  NamedAttrList inherent, discardable;
  if (attrs)
    for (NamedAttribute attr : attrs) {
      bool isInherent =
          llvm::is_contained(info->getAttributeNames(), attr.getName());
      (isInherent ? inherent : discardable).push_back(attr);
    }
  bool hasProperties = info->getOpPropertyByteSize() > 0;
  DictionaryAttr inherentDict = inherent.getDictionary(context);
  PropertyStorage properties(*info);
  if (hasProperties && failed(info->setOpPropertiesFromAttribute(
                           *info, properties.get(), inherentDict, [&] {
                             return emitError(loc) << "'" << name << "': ";
                           })))
    return failure();
  DictionaryAttr attrDict =
      hasProperties ? discardable.getDictionary(context) : inherentDict;
  const auto &checks = adaptorChecks();
  if (auto it = checks.find(info->getTypeID()); it != checks.end())
    if (failed(it->second(operands, attrDict, properties.get(), loc)))
      return failure();

  SmallVector<Type> types(resultTypes.begin(), resultTypes.end());
  if (types.empty()) {
    auto *infer = info->getInterface<InferTypeOpInterface>();
    if (!infer)
      return emitError(loc) << "'" << name << "' needs its result types",
             failure();
    if (failed(infer->inferReturnTypes(context, loc, operands, attrDict,
                                       properties.get(), {}, types)))
      return failure();
  }

  OperationState state(loc, *info);
  state.addOperands(operands);
  state.addTypes(types);
  if (hasProperties) {
    state.propertiesAttr = inherentDict;
    state.addAttributes(discardable);
  } else {
    state.addAttributes(inherent);
    state.addAttributes(discardable);
  }
  Operation *op = builder.create(state);
  if (failed(verify(op))) {
    op->erase();
    return failure();
  }
  return op;
}
