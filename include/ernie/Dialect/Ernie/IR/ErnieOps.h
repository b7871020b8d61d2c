//===- ErnieOps.h - ernie operations -----------------------------*- C++ -*-===//

#ifndef ERNIE_DIALECT_ERNIE_IR_ERNIEOPS_H
#define ERNIE_DIALECT_ERNIE_IR_ERNIEOPS_H

#include "ernie/Dialect/Ernie/IR/ErnieAttrs.h"
#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Dialect/Ernie/IR/ErnieInterfaces.h"
#include "ernie/Dialect/Ernie/IR/ErnieTypes.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::ernie {
/// True when the shape's byte size at 8 bytes an element fits in an int64:
/// the bound every buffer the runtime allocates must respect, with room for
/// any element type a pass gives the same shape.
bool hasAddressableSize(ShapedType type);
/// Bytes one element of `element` occupies in a buffer (i1 takes a byte);
/// 0 for types that are not integers or floats.
int64_t getElementByteSize(Type element);
/// The op of `fn`'s body that computes its `ernie.loss` result on each rank
/// — where the forward ends — looking through the all-reduce partition puts
/// at the return; null when no result is a loss or a call computes it.
Operation *getLocalLossOp(func::FuncOp fn);

/// A function's argument (or result) attributes, edited in bulk. Each
/// FuncOp::setArgAttr builds a new array of every argument's dictionary, so
/// a loop of them over a model's thousands of parameters is quadratic in
/// its depth; this keeps the dictionaries as lists and writes the array
/// once, in commit() (or when it goes out of scope). While it is open, read
/// through it: the function's own attributes lag until the commit.
class FunctionAttrEditor {
public:
  enum Which { Arguments, Results };
  FunctionAttrEditor(func::FuncOp fn, Which which);
  ~FunctionAttrEditor() { commit(); }
  Attribute get(unsigned i, StringRef name) const {
    return lists[i].get(name);
  }
  template <typename T> T getAs(unsigned i, StringRef name) const {
    return llvm::dyn_cast_or_null<T>(get(i, name));
  }
  void set(unsigned i, StringRef name, Attribute value);
  void remove(unsigned i, StringRef name);
  void commit();

private:
  func::FuncOp fn;
  Which which;
  SmallVector<NamedAttrList> lists;
  bool dirty = false;
};

/// Fails with "zero-size dimension" on the first operand or result of `op`
/// that is a tensor with a dimension of size 0: ernie tensors have none.
LogicalResult verifyNoZeroSizeTensors(Operation *op);
/// Whether `type` is a shaped type with a dimension of size 0.
bool hasZeroSizeDimension(Type type);

/// Every ernie op carries this trait (Ernie_Op in ErnieBase.td).
template <typename ConcreteType>
class NoZeroSizeTensors
    : public OpTrait::TraitBase<ConcreteType, NoZeroSizeTensors> {
public:
  static LogicalResult verifyTrait(Operation *op) {
    return verifyNoZeroSizeTensors(op);
  }
};

/// Fails on an `op` with operands whose region has no SSA dominance (a
/// graph region, such as the module's body).
LogicalResult verifyOperandsDominate(Operation *op);

/// Every ernie op carries this trait (Ernie_Op in ErnieBase.td).
template <typename ConcreteType>
class OperandsDominate
    : public OpTrait::TraitBase<ConcreteType, OperandsDominate> {
public:
  static LogicalResult verifyTrait(Operation *op) {
    return verifyOperandsDominate(op);
  }
};

/// Fails when mesh `op`'s positive axis sizes multiply (checked for
/// overflow) to more than MeshOp::kMaxRanks ranks.
LogicalResult verifyMeshRankCount(Operation *op);

/// On ernie.mesh: the bound on its rank count.
template <typename ConcreteType>
class MeshRankBound : public OpTrait::TraitBase<ConcreteType, MeshRankBound> {
public:
  static LogicalResult verifyTrait(Operation *op) {
    return verifyMeshRankCount(op);
  }
};

/// What an op is to a fused region (FusedOp): a member computed per
/// element, a broadcast of one of its inputs, a fill, a reduction that ends
/// it, or nothing it may hold.
enum class FusedRole { None, Elementwise, Broadcast, Fill, Reduction };
FusedRole getFusedRole(Operation *op);
/// The arithmetic an op computes in inside a fused region: f64, f32 (every
/// narrower float widens to it), Any (only i1 masks, as a fill of i1), or
/// None (integers: not fused). A region computes in one of f32 and f64.
enum class FusedCompute { None, Any, F32, F64 };
FusedCompute getFusedCompute(Operation *op);

namespace detail {
/// Runs an op's inferReturnTypes as its verifier: the shape rules of ops with
/// inferred results are written once, there.
template <typename OpTy>
LogicalResult verifyInferredShapeRules(OpTy op) {
  SmallVector<Type> inferred;
  return OpTy::inferReturnTypes(op->getContext(), op->getLoc(),
                                typename OpTy::Adaptor(op), inferred);
}
} // namespace detail
} // namespace mlir::ernie

#define GET_OP_CLASSES
#include "ernie/Dialect/Ernie/IR/ErnieOps.h.inc"

namespace mlir::ernie {
/// An asynchronous collective (`ernie.*_start`): its results are futures,
/// each waited for once later in the block, and it reads its inputs until
/// the first of those waits.
inline bool isStartedCollective(Operation *op) {
  return isa<CollectivePermuteStartOp, AllReduceStartOp, ReduceScatterStartOp,
             AllGatherStartOp>(op);
}

/// The earliest wait on one of a started collective's futures: where its
/// transfer is known to be over.
Operation *getFirstWait(Operation *start);

/// `v` as a cast rounding a float to a narrower float (an f32 sum to bf16,
/// say): the cast, else null.
inline CastOp getNarrowingCast(Value v) {
  auto cast = v ? v.getDefiningOp<CastOp>() : CastOp();
  if (!cast)
    return {};
  auto from = dyn_cast<FloatType>(getElementTypeOrSelf(cast.getOperand().getType()));
  auto to = dyn_cast<FloatType>(getElementTypeOrSelf(cast.getType()));
  return from && to && to.getWidth() < from.getWidth() ? cast : CastOp();
}

/// The bytes of a bucket's inputs (`ernie.{all_reduce,reduce_scatter,
/// all_gather}_start`) as its one message carries them: narrow floats it
/// accumulates in f32 travel widened (Executor::startBucket).
int64_t getBucketBytes(Operation *start);
} // namespace mlir::ernie

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIEOPS_H
