//===- MemoryPlan.cpp - the arena plan, recorded on the IR ------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Export/MemoryPlan.h"
#include "ernie/Passes/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::ernie {
#define GEN_PASS_DEF_MEMORYPLANPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

struct MemoryPlanPass : ernie::impl::MemoryPlanPassBase<MemoryPlanPass> {
  void runOnOperation() override {
    Builder b(&getContext());
    for (auto fn : getOperation().getOps<func::FuncOp>()) {
      if (fn.isExternal())
        continue;
      FailureOr<MemoryPlan> plan = planMemory(fn);
      if (failed(plan))
        return signalPassFailure();
      auto offsetOf = [&](Value v) {
        return plan->buffers[plan->bufferOf.lookup(v)].offset;
      };
      fn->setAttr(ErnieDialect::kArenaBytesAttrName, b.getI64IntegerAttr(plan->arenaBytes));
      fn->setAttr(ErnieDialect::kArgumentBytesAttrName,
                  b.getI64IntegerAttr(plan->argumentBytes));
      fn->setAttr(ErnieDialect::kLivePeakBytesAttrName,
                  b.getI64IntegerAttr(plan->livePeakBytes));
      if (plan->activationBytes)
        fn->setAttr(ErnieDialect::kActivationBytesAttrName,
                    b.getI64IntegerAttr(plan->activationBytes));
      FunctionAttrEditor args(fn, FunctionAttrEditor::Arguments);
      for (BlockArgument arg : fn.getArguments())
        args.set(arg.getArgNumber(), ErnieDialect::kBufferOffsetAttrName,
                 b.getI64IntegerAttr(offsetOf(arg)));
      args.commit();
      fn.walk([&](Operation *op) {
        if (op->getNumResults() == 0)
          return;
        SmallVector<int64_t> offsets;
        for (Value r : op->getResults())
          offsets.push_back(offsetOf(r));
        op->setAttr(ErnieDialect::kBufferOffsetsAttrName, b.getDenseI64ArrayAttr(offsets));
      });
      mlir::emitRemark(fn.getLoc())
          << "memory plan: arena " << plan->arenaBytes
          << " bytes per rank (arguments " << plan->argumentBytes
          << " beside it), live peak " << plan->livePeakBytes << ", "
          << plan->buffers.size() << " buffers, " << plan->inPlaceReuses
          << " written in place";
    }
  }
};

} // namespace
