//===- PipelineSplit.cpp - assign the loss function's ops to stages -------===//
//
// A stage is the number of `ernie.split_point` markers on an op's way from
// the function's arguments: one forward sweep, max over operands. Constant
// expressions (ops reading no argument, however deep) stay unstaged: any
// stage that needs one rebuilds it instead of receiving it.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/PipelineInfo.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"

#include <map>

namespace mlir::ernie {
#define GEN_PASS_DEF_PIPELINESPLITPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

struct PipelineSplitPass
    : ernie::impl::PipelineSplitPassBase<PipelineSplitPass> {
  using PipelineSplitPassBase::PipelineSplitPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto fn = module.lookupSymbol<func::FuncOp>(function);
    if (!fn || fn.isDeclaration()) {
      module.emitError() << "no function @" << function << " to split";
      return signalPassFailure();
    }
    if (stages < 1 || virtualStages < 1) {
      module.emitError() << "a pipeline needs stages >= 1 and virtual-stages "
                            ">= 1, got "
                         << int64_t(stages) << " and " << int64_t(virtualStages);
      return signalPassFailure();
    }
    // What this pass will record, checked by the one reader (its bounds
    // included) before any per-chunk table is sized from it.
    Builder b(module.getContext());
    DictionaryAttr pipeline = b.getDictionaryAttr({
        b.getNamedAttr("stages", b.getI64IntegerAttr(stages)),
        b.getNamedAttr("virtual_stages", b.getI64IntegerAttr(virtualStages)),
        b.getNamedAttr("axis", b.getStringAttr(axis)),
    });
    if (failed(parsePipelineInfo(
            pipeline,
            [&] { return module.emitError("--ernie-pipeline-split: "); })) ||
        failed(checkMesh(module)) || failed(assignStages(fn)))
      return signalPassFailure();
    module->setAttr(ErnieDialect::kPipelineAttrName, pipeline);
  }

  /// With more than one stage, the mesh must have `axis` of that size.
  LogicalResult checkMesh(ModuleOp module) {
    if (stages == 1)
      return success();
    auto meshes = llvm::to_vector(module.getOps<MeshOp>());
    if (meshes.empty())
      return module.emitError() << "a pipeline over " << int64_t(stages)
                                << " stages needs a mesh with axis '" << axis
                                << "'";
    MeshOp mesh = meshes.front();
    for (auto [name, size] :
         llvm::zip(mesh.getAxisNames().getAsValueRange<StringAttr>(),
                   mesh.getAxisSizes()))
      if (name == axis) {
        if (size != stages)
          return mesh.emitError() << "pipeline axis '" << axis << "' has size "
                                  << size << ", but the pipeline has " << int64_t(stages)
                                  << " stages";
        return success();
      }
    return mesh.emitError() << "the mesh has no pipeline axis '" << axis
                            << "'";
  }

  LogicalResult assignStages(func::FuncOp fn) {
    if (!fn.getBody().hasOneBlock())
      return fn.emitError("pipeline split handles single-block functions");
    Block &body = fn.getBody().front();
    int64_t chunks = stages * virtualStages;
    auto i64 = IntegerType::get(fn.getContext(), 64);
    // Forward: an op's stage is its operands' latest; -1 for an op that
    // reads only arguments and constants (placed below, by its users).
    llvm::DenseMap<Value, int64_t> stageOf;
    auto lookup = [&](Value v) { return stageOf.lookup_or(v, -1); };
    SmallVector<SplitPointOp> markers;
    SmallVector<Operation *> free;
    for (Operation &op : body.without_terminator()) {
      int64_t stage = -1;
      for (Value v : op.getOperands())
        stage = std::max(stage, lookup(v));
      if (auto marker = dyn_cast<SplitPointOp>(op)) {
        stage = std::max<int64_t>(stage, 0) + 1;
        if (stage >= chunks)
          return marker.emitError()
                 << "this split point starts chunk " << stage
                 << ", but the pipeline has " << chunks << " (" << int64_t(stages)
                 << " stages x " << int64_t(virtualStages) << " virtual stages)";
        markers.push_back(marker);
        stageOf[marker.getResult()] = stage;
        continue;
      }
      if (stage < 0) {
        free.push_back(&op);
        continue;
      }
      op.setAttr(ErnieDialect::kStageAttrName, IntegerAttr::get(i64, stage));
      for (Value r : op.getResults())
        stageOf[r] = stage;
    }
    // Backward over the rest: each goes to the stage that reads it, with a
    // copy per further stage (a tied weight's transpose on the last stage, a
    // mask every stage needs), so no stage waits on another for it. The
    // loss is read on the last chunk; new state (MoE routing's bias, from
    // the layer's own routing) is read nowhere in particular: it stays with
    // what it is computed from, and the schedule updates it on that stage.
    auto updatesState = [&](OpOperand &use) {
      return isa<func::ReturnOp>(use.getOwner()) &&
             fn.getResultAttr(use.getOperandNumber(),
                              ErnieDialect::kUpdatesAttrName);
    };
    auto userStage = [&](OpOperand &use) -> int64_t {
      Operation *user = use.getOwner();
      if (isa<func::ReturnOp>(user))
        return chunks - 1;
      if (auto marker = dyn_cast<SplitPointOp>(user))
        return stageOf.lookup(marker.getResult()) - 1;
      return cast<IntegerAttr>(user->getAttr(ErnieDialect::kStageAttrName))
          .getInt();
    };
    for (Operation *op : llvm::reverse(free)) {
      std::map<int64_t, SmallVector<OpOperand *>> uses;
      for (Value r : op->getResults())
        for (OpOperand &use : r.getUses())
          if (!updatesState(use))
            uses[userStage(use)].push_back(&use);
      if (uses.empty()) {
        op->setAttr(ErnieDialect::kStageAttrName, IntegerAttr::get(i64, 0));
        continue;
      }
      OpBuilder b(op);
      for (auto &[stage, operands] : llvm::drop_begin(uses)) {
        Operation *copy = b.clone(*op);
        copy->setAttr(ErnieDialect::kStageAttrName,
                      IntegerAttr::get(i64, stage));
        for (OpOperand *use : operands)
          use->set(copy->getResult(
              cast<OpResult>(use->get()).getResultNumber()));
      }
      op->setAttr(ErnieDialect::kStageAttrName,
                  IntegerAttr::get(i64, uses.begin()->first));
    }
    SmallVector<bool> populated(chunks, false);
    for (Operation &op : body.without_terminator())
      if (auto s = op.getAttrOfType<IntegerAttr>(ErnieDialect::kStageAttrName))
        populated[s.getInt()] = true;
    for (int64_t c = 0; c < chunks; ++c)
      if (!populated[c])
        return fn.emitError() << "chunk " << c << " of " << chunks
                              << " has no op: the split points make "
                              << "fewer chunks than " << int64_t(stages)
                              << " stages x " << int64_t(virtualStages)
                              << " virtual stages";
    Operation *ret = body.getTerminator();
    for (OpOperand &result : ret->getOpOperands())
      if (auto def = result.get().getDefiningOp();
          def && !updatesState(result))
        if (int64_t stage = cast<IntegerAttr>(def->getAttr(
                                ErnieDialect::kStageAttrName))
                                .getInt();
            stage != chunks - 1)
          return ret->emitError()
                 << "the loss is computed on chunk " << stage
                 << ", not on the last one (" << chunks - 1 << ")";

    for (SplitPointOp marker : markers) {
      marker.getResult().replaceAllUsesWith(marker.getOperand());
      marker.erase();
    }

    // Which chunks read each parameter, with any a frontend declared.
    Builder b(fn.getContext());
    for (BlockArgument arg : body.getArguments()) {
      if (!fn.getArgAttr(arg.getArgNumber(), ErnieDialect::kParamAttrName))
        continue;
      llvm::SmallSet<int64_t, 4> used;
      if (auto declared = fn.getArgAttrOfType<DenseI64ArrayAttr>(
              arg.getArgNumber(), ErnieDialect::kPipelineStagesAttrName))
        for (int64_t c : declared.asArrayRef()) {
          if (c >= chunks)
            return fn.emitError()
                   << "argument #" << arg.getArgNumber()
                   << " is declared on chunk " << c << " of " << chunks;
          used.insert(c);
        }
      for (OpOperand &use : arg.getUses()) {
        if (auto s = use.getOwner()->getAttrOfType<IntegerAttr>(
                ErnieDialect::kStageAttrName))
          used.insert(s.getInt());
      }
      SmallVector<int64_t> sorted(used.begin(), used.end());
      llvm::sort(sorted);
      if (sorted.empty())
        sorted.push_back(0); // Unused: kept, with a zero gradient, on stage 0.
      fn.setArgAttr(arg.getArgNumber(), ErnieDialect::kPipelineStagesAttrName,
                    b.getDenseI64ArrayAttr(sorted));
    }
    return success();
  }
};

} // namespace
