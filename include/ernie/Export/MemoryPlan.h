//===- MemoryPlan.h - where every value of a function lives -------*- C++ -*-===//
//
// The runtime gives each rank one arena, as large as its largest function's
// plan (its functions run one at a time). The plan decides, ahead of time,
// which bytes of it hold which value of a function:
//   * liveness: a value is live from the op that defines it (arguments: from
//     the start) to its last use (returned values: to the end);
//   * in-place reuse: an elementwise op whose operand dies at it, with the
//     result's exact type, writes its result over that operand (the CPU and
//     CUDA elementwise kernels read element i before writing element i),
//     a matmul_accumulate's result over its dying accumulator (the GEMM
//     adds into it), an optimizer update's over its parameter and state;
//     over an argument only a returned result (a state update, a running
//     sum: what a caller donates), or anything over a pipeline's gradient
//     sum (`ernie.gradient`: the call consumes it);
//   * a value returned in place of a state (`ernie.updates`) made after
//     that state's argument is dead is made in its buffer (ZeRO-1's
//     gathered parameters), so the caller's donated tensor receives it;
//   * arguments: not in the arena. Each is the caller's tensor, bound for
//     the call (or a copy the runtime stages when it cannot bind it); the
//     plan gives them offsets after the arena (`argumentBytes`), so that
//     every buffer still has an address of its own;
//   * offsets: buffers are placed largest first, each at the lowest aligned
//     offset free for its whole lifetime (greedy by size, as TFLite's arena
//     planner does), so the arena is close to the peak of live bytes;
//   * asynchronous collectives: a wait's tensor is its future's buffer, and
//     a start's input lives until the wait (the transfer reads it);
//   * views: a reshape's result is its operand's bytes under another shape,
//     a buffer of its own type at the operand's offset (`viewOf`), and the
//     operand's memory lives as long as either does.
// Plans are per rank: after partition, every rank has the same local shapes.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_EXPORT_MEMORYPLAN_H
#define ERNIE_EXPORT_MEMORYPLAN_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

namespace mlir::ernie {

struct PlannedBuffer {
  RankedTensorType type;
  int64_t bytes = 0;
  int64_t offset = 0;
  /// Positions: 0 is the function entry, op i of the body is i + 1.
  int64_t start = 0, end = 0;
  /// A view (a reshape's result): the buffer whose bytes it shares, placed
  /// with it; its own `end` is its value's last use, the shared lifetime is
  /// on the viewed buffer. -1: a buffer of its own.
  int64_t viewOf = -1;
};

struct MemoryPlan {
  SmallVector<PlannedBuffer> buffers;
  /// Every argument and op result, to its buffer.
  llvm::DenseMap<Value, unsigned> bufferOf;
  /// The arena: every buffer but the arguments' fits below it.
  int64_t arenaBytes = 0;
  /// The arguments' region, from `arenaBytes` on: each argument's buffer
  /// (and its views, and what is written over it) at an offset of its own.
  /// The runtime binds each to the caller's tensor, or stages a copy.
  int64_t argumentBytes = 0;
  /// The most bytes live at one position in the arena (arguments aside):
  /// no plan can use less.
  int64_t livePeakBytes = 0;
  /// Results written over a dying operand.
  int64_t inPlaceReuses = 0;
  /// In a function that returns a loss (`ernie.loss`): the bytes live, other
  /// than the arguments, just after the loss is computed — what the forward
  /// keeps for the backward (Korthikanti et al.'s activation memory). 0
  /// when the function returns no loss, or a loss a call computed.
  int64_t activationBytes = 0;
};

/// Bytes one element of `type` takes in a runtime buffer (i1: one byte), or
/// 0 for a type the runtime does not store.
/// A plan's figures, kept once the plan itself (tied to the IR) is gone:
/// what the program file writer reports of each function it planned.
struct PlanFigures {
  int64_t arenaBytes = 0, argumentBytes = 0, livePeakBytes = 0,
          activationBytes = 0;
};

int64_t storageBytes(Type elementType);

/// How the runtime stores a value of `type`: a ranked tensor as itself, a
/// scalar integer or float as a rank-0 tensor; null for anything else.
RankedTensorType storageType(Type type);

/// Plans `fn`'s single block for execution. First gives every reader of a
/// fill (`full`, `iota`, `axis_index`: an op that reads nothing and stores
/// no data) its own copy just before it: folding and CSE hoist such ops to
/// the top of a function and share them, so a constant the backward needs
/// would otherwise occupy the arena from the first op on — counted as
/// activation memory, and held through the forward. That changes what the
/// runtime executes (one fill per reader), not what it computes, and is
/// part of planning so that no caller can plan without it. Fails (with a
/// diagnostic on the value) when a value is not a statically shaped tensor
/// of a storable element type, or the body has more than one block.
FailureOr<MemoryPlan> planMemory(func::FuncOp fn);

} // namespace mlir::ernie

#endif // ERNIE_EXPORT_MEMORYPLAN_H
