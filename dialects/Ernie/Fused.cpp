//===- Fused.cpp - ernie.fused: what a fused region may hold ----------------===//
//
// One definition of the ops a fused region holds, shared by the verifier,
// `--ernie-fuse` and (by name) the runtime's fused-loop interpreter.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"

#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::ernie;

FusedRole mlir::ernie::getFusedRole(Operation *op) {
  return llvm::TypeSwitch<Operation *, FusedRole>(op)
      .Case<NegOp, ExpOp, LogOp, SqrtOp, RsqrtOp, TanhOp, SigmoidOp, SiluOp,
            ReluOp, AbsOp, ReciprocalOp, ErfOp, GeluOp, StopGradientOp, CastOp,
            AddOp, SubOp, MulOp, DivOp, MaximumOp, MinimumOp, PowOp, CompareOp,
            SelectOp>([](auto) { return FusedRole::Elementwise; })
      .Case<BroadcastOp>([](auto) { return FusedRole::Broadcast; })
      .Case<FullOp>([](auto) { return FusedRole::Fill; })
      .Case<ReduceSumOp, ReduceMeanOp, ReduceMaxOp>(
          [](auto) { return FusedRole::Reduction; })
      .Default([](Operation *) { return FusedRole::None; });
}

/// The arithmetic a value of `element` type computes in inside a fused
/// region: f64, f32 (every narrower float), or none (i1 masks compute in
/// either; integers are not fused).
static FusedCompute computeOf(Type element) {
  if (element.isF64())
    return FusedCompute::F64;
  if (isa<FloatType>(element))
    return FusedCompute::F32;
  if (element.isInteger(1))
    return FusedCompute::Any;
  return FusedCompute::None;
}

FusedCompute mlir::ernie::getFusedCompute(Operation *op) {
  FusedCompute compute = FusedCompute::Any;
  auto meet = [&](Type type) {
    auto tensor = dyn_cast<RankedTensorType>(type);
    FusedCompute c = tensor ? computeOf(tensor.getElementType())
                            : FusedCompute::None;
    if (c == FusedCompute::Any || compute == FusedCompute::None)
      return;
    if (compute == FusedCompute::Any || c == FusedCompute::None)
      compute = c;
    else if (c != compute)
      compute = FusedCompute::None;
  };
  for (Type t : op->getOperandTypes())
    meet(t);
  for (Type t : op->getResultTypes())
    meet(t);
  // A compare of masks, or a select between them, computes on integers.
  if (compute == FusedCompute::Any && op->getNumOperands() > 0 &&
      !isa<SelectOp>(op))
    return FusedCompute::None;
  if (auto select = dyn_cast<SelectOp>(op);
      select && computeOf(getElementTypeOrSelf(select.getType())) ==
                    FusedCompute::Any)
    return FusedCompute::None;
  return compute;
}

ArrayRef<int64_t> FusedOp::getIterationShape() {
  // The widest value's; on a tie an op's over an input (a broadcast that
  // only adds unit dimensions, [2, 8, 4] to [2, 8, 1, 4], ties with its
  // input, and the region iterates over what the ops compute), the first
  // op's among ops. The runtime's fused kernels pick the same (Fused.cpp).
  ArrayRef<int64_t> widest;
  int64_t elements = -1;
  bool input = false;
  auto consider = [&](Type type, bool isInput) {
    auto t = cast<RankedTensorType>(type);
    if (t.getNumElements() > elements ||
        (t.getNumElements() == elements && input && !isInput)) {
      elements = t.getNumElements();
      widest = t.getShape();
      input = isInput;
    }
  };
  for (Value arg : getBody().getArguments())
    consider(arg.getType(), true);
  for (Operation &op : getBody().front().without_terminator())
    for (Type t : op.getResultTypes())
      consider(t, false);
  return widest;
}

LogicalResult FusedOp::verify() {
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size() ||
      body.getArgumentTypes() != getInputs().getTypes())
    return emitOpError("the body's arguments must have the inputs' types");
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield || yield.getValues().getTypes() != getResultTypes())
    return emitOpError("the body must yield values of the results' types");
  ArrayRef<int64_t> shape = getIterationShape();
  FusedCompute compute = FusedCompute::Any;
  for (Operation &op : body.without_terminator()) {
    FusedRole role = getFusedRole(&op);
    if (role == FusedRole::None)
      return op.emitOpError("cannot be part of a fused region");
    FusedCompute c = getFusedCompute(&op);
    if (c == FusedCompute::None ||
        (c != FusedCompute::Any && compute != FusedCompute::Any &&
         c != compute))
      return op.emitOpError("mixes f64 with narrower floats (or computes on "
                            "integers) in a fused region");
    if (c != FusedCompute::Any)
      compute = c;
    if (role == FusedRole::Broadcast && !isa<BlockArgument>(op.getOperand(0)))
      return op.emitOpError("in a fused region broadcasts only the region's "
                            "inputs");
    Value value = role == FusedRole::Reduction ? op.getOperand(0)
                                               : op.getResult(0);
    if (cast<RankedTensorType>(value.getType()).getShape() != shape) {
      InFlightDiagnostic d = op.emitOpError(
          "does not have the fused region's iteration shape [");
      llvm::interleaveComma(shape, d);
      return d << "]";
    }
    if (role == FusedRole::Reduction)
      for (Operation *user : op.getResult(0).getUsers())
        if (!isa<YieldOp>(user))
          return op.emitOpError("ends a fused region: only its yield may "
                                "read a reduction");
  }
  // A block argument is read whole (iteration shape) or through broadcasts.
  for (BlockArgument arg : body.getArguments())
    for (Operation *user : arg.getUsers())
      if (!isa<BroadcastOp>(user) &&
          cast<RankedTensorType>(arg.getType()).getShape() != shape)
        return emitOpError() << "input #" << arg.getArgNumber()
                             << " is read without a broadcast but does not "
                                "have the iteration shape";
  return success();
}

int64_t FusedOp::getFlops() {
  int64_t flops = 0;
  for (Operation &op : getBody().front().without_terminator())
    if (auto cost = dyn_cast<CostOpInterface>(op))
      flops += cost.getFlops();
  return flops;
}
