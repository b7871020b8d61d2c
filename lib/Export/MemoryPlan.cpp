//===- MemoryPlan.cpp - liveness, in-place reuse and arena offsets ----------===//

#include "ernie/Export/MemoryPlan.h"

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/runtime/ProgramFormat.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpDefinition.h"
#include "llvm/ADT/STLExtras.h"

#include <algorithm>
#include <tuple>

using namespace mlir;
using namespace mlir::ernie;

int64_t mlir::ernie::storageBytes(Type t) {
  if (t.isF64() || t.isInteger(64))
    return 8;
  if (t.isF32() || t.isInteger(32))
    return 4;
  if (t.isF16() || t.isBF16())
    return 2;
  if (isa<Float8E4M3FNType, Float8E5M2Type>(t) || t.isInteger(1))
    return 1;
  return 0;
}

RankedTensorType mlir::ernie::storageType(Type type) {
  if (auto future = dyn_cast<FutureType>(type))
    return future.getValueType(); // the buffer the collective writes into
  if (auto tensor = dyn_cast<RankedTensorType>(type))
    return tensor;
  if (type.isIntOrFloat())
    return RankedTensorType::get({}, type);
  return {};
}

static int64_t alignUp(int64_t bytes) {
  int64_t a = ::ernie::program::kBufferAlignment;
  return (bytes + a - 1) / a * a;
}

/// Per result, the operands an op's kernel may write it over when they die
/// there: any operand of an elementwise op, the tensor a shard_insert
/// writes into, a matmul_accumulate's accumulator, an optimizer update's
/// parameter and state (each element read before it is written), and for a
/// fused loop any input of the result's type (the loop reads a chunk of
/// every input before it writes that chunk, and reductions are written
/// after the last read).
static SmallVector<SmallVector<Value>> overwritableOperands(Operation *op) {
  if (auto insert = dyn_cast<ShardInsertOp>(op))
    return {{insert.getDest()}};
  if (auto gemm = dyn_cast<MatmulAccumulateOp>(op))
    return {{gemm.getAcc()}}; // the GEMM adds into it (beta = 1)
  if (auto sgd = dyn_cast<SgdUpdateOp>(op))
    return {{sgd.getParam()}, {sgd.getMomentumBuffer()}};
  if (auto adamw = dyn_cast<AdamWUpdateOp>(op))
    return {{adamw.getParam()}, {adamw.getMoment1()}, {adamw.getMoment2()}};
  if (op->hasTrait<OpTrait::Elementwise>() && op->getNumResults() == 1 &&
      isa<ErnieDialect>(op->getDialect()))
    return {llvm::to_vector(op->getOperands())};
  if (isa<FusedOp>(op))
    return SmallVector<SmallVector<Value>>(op->getNumResults(),
                                           llvm::to_vector(op->getOperands()));
  return {};
}

/// Gives every reader of a fill its own copy just before it (see
/// planMemory).
static void sinkFills(func::FuncOp fn) {
  SmallVector<Operation *> fills;
  for (Operation &op : fn.getBody().front())
    if (isa<FullOp, IotaOp, AxisIndexOp>(op))
      fills.push_back(&op);
  for (Operation *fill : fills) {
    Value value = fill->getResult(0);
    for (OpOperand &use : llvm::make_early_inc_range(value.getUses())) {
      Operation *user = use.getOwner();
      if (user->getPrevNode() == fill)
        continue; // Already right before its only reader so far.
      OpBuilder b(user);
      use.set(b.clone(*fill)->getResult(0));
    }
    if (value.use_empty())
      fill->erase();
  }
}

FailureOr<MemoryPlan> mlir::ernie::planMemory(func::FuncOp fn) {
  if (fn.isExternal() || !fn.getBody().hasOneBlock())
    return fn.emitError("a memory plan needs a function with one block");
  sinkFills(fn);
  Block &body = fn.getBody().front();
  MemoryPlan plan;

  // Last use of every value: the position of its last user; returned
  // values live to one past the terminator.
  llvm::DenseMap<Operation *, int64_t> position;
  int64_t n = 0;
  for (Operation &op : body)
    position[&op] = ++n;
  int64_t exit = n + 1;
  auto lastUse = [&](Value v, int64_t defined) {
    int64_t end = defined;
    for (Operation *user : v.getUsers()) {
      // A started collective reads its inputs until the first of its waits.
      if (isStartedCollective(user))
        if (Operation *wait = getFirstWait(user))
          user = wait;
      Operation *top = body.findAncestorOpInBlock(*user);
      int64_t at = top->hasTrait<OpTrait::IsTerminator>() ? exit : position[top];
      end = std::max(end, at);
    }
    return end;
  };
  // A buffer, or the one a view shares (views of views share the first).
  auto rootOf = [&](unsigned id) {
    return plan.buffers[id].viewOf < 0 ? id
                                       : static_cast<unsigned>(
                                             plan.buffers[id].viewOf);
  };
  auto newBuffer = [&](Value v, int64_t start) -> FailureOr<unsigned> {
    RankedTensorType type = storageType(v.getType());
    int64_t element = type ? storageBytes(type.getElementType()) : 0;
    if (!type || !type.hasStaticShape() || element == 0) {
      InFlightDiagnostic diag =
          emitError(v.getLoc())
          << "cannot plan memory for a value of type " << v.getType()
          << ": the runtime stores statically shaped tensors of f64, f32, "
             "f16, bf16, f8E4M3FN, f8E5M2, i64, i32 or i1";
      return diag;
    }
    plan.buffers.push_back(
        {type, type.getNumElements() * element, 0, start, lastUse(v, start)});
    plan.bufferOf[v] = plan.buffers.size() - 1;
    return plan.buffers.size() - 1;
  };

  for (BlockArgument arg : body.getArguments())
    if (failed(newBuffer(arg, 0)))
      return failure();
  // An argument's buffer is the caller's tensor (bound for the call): only
  // a value the function returns may be written over it (a state update, a
  // running gradient sum), so that the caller can donate it. Scratch
  // written over a dying argument would make the runtime stage a copy;
  // a pipeline's gradient sums are the exception: the call consumes them
  // (the runtime refills them before the next step reads them).
  unsigned numArguments = body.getNumArguments();
  auto isArgument = [&](unsigned id) { return rootOf(id) < numArguments; };
  auto isConsumed = [&](unsigned id) {
    return fn.getArgAttr(rootOf(id), ErnieDialect::kGradientAttrName) != nullptr;
  };
  // The argument each returned value replaces (the state it `updates`): a
  // value made after that argument is dead is made in its buffer, which the
  // caller donates (ZeRO-1's gathered parameters), instead of in the arena
  // and copied out. A future's value is its wait's.
  llvm::DenseMap<Attribute, unsigned> stateArgument; // by state name
  for (unsigned a = 0; a < numArguments; ++a)
    for (StringRef kind :
         {ErnieDialect::kParamAttrName, ErnieDialect::kOptStateAttrName})
      if (Attribute name = fn.getArgAttr(a, kind))
        stateArgument[name] = a;
  llvm::DenseMap<Value, unsigned> replaces;
  Operation *terminator = body.getTerminator();
  for (auto [i, value] : llvm::enumerate(terminator->getOperands()))
    if (Attribute name = fn.getResultAttr(i, ErnieDialect::kUpdatesAttrName))
      if (auto it = stateArgument.find(name); it != stateArgument.end())
        replaces[value] = it->second;
  auto replacedArgument = [&](Value result) -> std::optional<unsigned> {
    if (isa<FutureType>(result.getType()))
      for (Operation *user : result.getUsers())
        if (auto wait = dyn_cast<WaitOp>(user))
          result = wait.getResult();
    auto it = replaces.find(result);
    if (it == replaces.end())
      return std::nullopt;
    return it->second;
  };
  for (Operation &op : body) {
    if (op.hasTrait<OpTrait::IsTerminator>())
      continue;
    int64_t at = position[&op];
    // A fused loop's body values live in the runtime's chunk registers,
    // never in the arena: only its inputs and results are planned.
    if (op.getNumRegions() && !isa<FusedOp>(op))
      return op.emitError("a memory plan needs ops without regions");
    if (auto wait = dyn_cast<WaitOp>(op)) {
      // The collective received into the future's buffer: that is the
      // tensor, no copy.
      unsigned id = plan.bufferOf.lookup(wait.getFuture());
      plan.buffers[id].end = std::max(plan.buffers[id].end,
                                      lastUse(wait.getResult(), at));
      plan.bufferOf[wait.getResult()] = id;
      continue;
    }
    if (auto reshape = dyn_cast<ReshapeOp>(op)) {
      // The same bytes under another shape: a view, no copy (the kernel
      // sees its result at its operand's address and moves nothing).
      unsigned viewed = rootOf(plan.bufferOf.lookup(reshape.getInput()));
      Value result = reshape.getResult();
      RankedTensorType type = storageType(result.getType());
      int64_t end = lastUse(result, at);
      plan.buffers.push_back({type, plan.buffers[viewed].bytes, 0, at, end,
                              static_cast<int64_t>(viewed)});
      plan.buffers[viewed].end = std::max(plan.buffers[viewed].end, end);
      plan.bufferOf[result] = plan.buffers.size() - 1;
      continue;
    }
    SmallVector<SmallVector<Value>> candidates = overwritableOperands(&op);
    for (auto [result, operands] : llvm::zip(op.getResults(), candidates))
      for (Value operand : operands) {
        auto it = plan.bufferOf.find(operand);
        if (it == plan.bufferOf.end() || operand.getType() != result.getType())
          continue;
        // The memory is free when nothing sharing it lives on: the viewed
        // buffer's lifetime covers its views'.
        PlannedBuffer &memory = plan.buffers[rootOf(it->second)];
        if (memory.end != at)
          continue; // the operand (or a value sharing its buffer) lives on
        if (isArgument(it->second) && !isConsumed(it->second) &&
            lastUse(result, at) != exit)
          continue; // not returned: scratch, not the caller's new value
        // A GEMM reads its factors while it writes: neither may share the
        // accumulator's memory (elementwise kernels read element i first).
        if (auto gemm = dyn_cast<MatmulAccumulateOp>(op);
            gemm && llvm::any_of(ValueRange{gemm.getLhs(), gemm.getRhs()},
                                 [&](Value factor) {
                                   return rootOf(plan.bufferOf.lookup(factor)) ==
                                          rootOf(it->second);
                                 }))
          continue;
        memory.end = lastUse(result, at);
        plan.buffers[it->second].end = memory.end;
        plan.bufferOf[result] = it->second;
        ++plan.inPlaceReuses;
        break;
      }
    for (Value result : op.getResults()) {
      if (plan.bufferOf.count(result))
        continue;
      if (std::optional<unsigned> arg = replacedArgument(result)) {
        PlannedBuffer &memory = plan.buffers[*arg];
        if (memory.end < at && memory.type == storageType(result.getType())) {
          memory.end = lastUse(result, at);
          plan.bufferOf[result] = *arg;
          ++plan.inPlaceReuses;
          continue;
        }
      }
      if (failed(newBuffer(result, at)))
        return failure();
    }
  }

  // Greedy by size: the largest buffers take the low offsets first.
  // Arguments (and what is written over them) are not in the arena: they
  // go after it, in a region the runtime never allocates as a whole.
  auto order = llvm::to_vector(
      llvm::make_filter_range(llvm::seq<unsigned>(0, plan.buffers.size()),
                              [&](unsigned id) { return !isArgument(id); }));
  llvm::stable_sort(order, [&](unsigned a, unsigned b) {
    const PlannedBuffer &x = plan.buffers[a], &y = plan.buffers[b];
    return std::make_tuple(-x.bytes, x.start) <
           std::make_tuple(-y.bytes, y.start);
  });
  // Each goes at the lowest offset clear of every placed buffer whose life
  // overlaps its own. The placed ones are kept in address order as they
  // come, so finding the gap is one walk, not a sort per buffer (that sort
  // made an 80-layer model's plan quadratic: 2 s of its compile).
  SmallVector<unsigned> placed; // by (offset, offset + bytes)
  auto extent = [&](unsigned id) {
    const PlannedBuffer &b = plan.buffers[id];
    return std::make_pair(b.offset, b.offset + b.bytes);
  };
  for (unsigned id : order) {
    PlannedBuffer &buffer = plan.buffers[id];
    if (buffer.viewOf >= 0)
      continue; // placed with the buffer it views (below)
    int64_t offset = 0;
    for (unsigned other : placed) {
      const PlannedBuffer &o = plan.buffers[other];
      if (o.start > buffer.end || buffer.start > o.end)
        continue; // never alive together
      if (offset + buffer.bytes <= o.offset)
        break;
      offset = std::max(offset, alignUp(o.offset + o.bytes));
    }
    buffer.offset = offset;
    plan.arenaBytes = std::max(plan.arenaBytes, alignUp(offset + buffer.bytes));
    placed.insert(llvm::upper_bound(placed, id,
                                    [&](unsigned a, unsigned b) {
                                      return extent(a) < extent(b);
                                    }),
                  id);
  }
  int64_t next = plan.arenaBytes;
  for (unsigned id = 0; id < numArguments; ++id) {
    plan.buffers[id].offset = next;
    next = alignUp(next + plan.buffers[id].bytes);
  }
  plan.argumentBytes = next - plan.arenaBytes;
  for (PlannedBuffer &view : plan.buffers)
    if (view.viewOf >= 0)
      view.offset = plan.buffers[view.viewOf].offset;

  // Activation memory: live at the forward's end (the loss), arguments
  // aside (they live from position 0, which no op has). A view's bytes are
  // its viewed buffer's: counted there.
  if (Operation *loss = getLocalLossOp(fn)) {
    int64_t at = position[loss];
    for (const PlannedBuffer &b : plan.buffers)
      if (b.viewOf < 0 && b.start > 0 && b.start <= at && at <= b.end)
        plan.activationBytes += b.bytes;
  }

  // The arena's lower bound: most bytes live at any one position.
  SmallVector<int64_t> delta(exit + 2, 0);
  for (auto [id, b] : llvm::enumerate(plan.buffers)) {
    if (b.viewOf >= 0 || isArgument(id))
      continue;
    delta[b.start] += b.bytes;
    delta[b.end + 1] -= b.bytes;
  }
  int64_t live = 0;
  for (int64_t d : delta)
    plan.livePeakBytes = std::max(plan.livePeakBytes, live += d);
  return plan;
}
