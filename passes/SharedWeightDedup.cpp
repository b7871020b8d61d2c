//===- SharedWeightDedup.cpp - one replica per stage of a shared weight ---===//
//
// Paddle's SharedLayerDesc hung jobs when ranks created the shared groups in
// different orders, and left ranks out of the all-reduce when a stage
// produced no gradient. Here a group is the sorted list of pipeline ranks
// whose chunks hold the parameter, computed from the program alone (the same
// on every rank), and every member is a function argument, so autodiff gives
// it a gradient — zeros where the stage does not read it.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/PipelineInfo.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::ernie {
#define GEN_PASS_DEF_SHAREDWEIGHTDEDUPPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

struct SharedWeightDedupPass
    : ernie::impl::SharedWeightDedupPassBase<SharedWeightDedupPass> {
  using SharedWeightDedupPassBase::SharedWeightDedupPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto fn = module.lookupSymbol<func::FuncOp>(function);
    FailureOr<std::optional<PipelineInfo>> pipeline = readPipelineInfo(module);
    if (failed(pipeline))
      return signalPassFailure();
    if (!fn || fn.isDeclaration() || !*pipeline) {
      module.emitError() << "shared-weight dedup needs a function @" << function
                         << " split by --ernie-pipeline-split";
      return signalPassFailure();
    }
    if (!SymbolTable::symbolKnownUseEmpty(fn, module)) {
      fn.emitError("shared-weight dedup changes this function's signature; "
                   "it must have no callers");
      return signalPassFailure();
    }
    int64_t stages = (*pipeline)->stages;
    Builder b(module.getContext());
    // Back to front, so that inserting replicas keeps earlier indices.
    for (int64_t i = fn.getNumArguments() - 1; i >= 0; --i) {
      auto chunks = fn.getArgAttrOfType<DenseI64ArrayAttr>(
          i, ErnieDialect::kPipelineStagesAttrName);
      if (!chunks)
        continue;
      SmallVector<int64_t> ranks;
      for (int64_t c : chunks.asArrayRef())
        ranks.push_back(c % stages);
      llvm::sort(ranks);
      ranks.erase(llvm::unique(ranks), ranks.end());
      if (ranks.size() == 1) {
        fn.setArgAttr(i, ErnieDialect::kPipelineRankAttrName,
                      b.getI64IntegerAttr(ranks.front()));
        continue;
      }
      if (failed(replicate(fn, i, chunks.asArrayRef(), ranks, stages)))
        return signalPassFailure();
    }
  }

  /// Replaces argument `index` by one replica per pipeline rank in `ranks`.
  LogicalResult replicate(func::FuncOp fn, unsigned index,
                          ArrayRef<int64_t> chunks, ArrayRef<int64_t> ranks,
                          int64_t stages) {
    Builder b(fn.getContext());
    BlockArgument shared = fn.getArgument(index);
    for (OpOperand &use : shared.getUses())
      if (!use.getOwner()->hasAttr(ErnieDialect::kStageAttrName))
        return use.getOwner()->emitError(
            "reads a shared parameter but belongs to no pipeline stage");
    DictionaryAttr attrs = fn.getArgAttrDict(index);
    for (auto [k, rank] : llvm::enumerate(ranks)) {
      NamedAttrList replicaAttrs(attrs);
      SmallVector<int64_t> own;
      for (int64_t c : chunks)
        if (c % stages == rank)
          own.push_back(c);
      replicaAttrs.set(ErnieDialect::kPipelineStagesAttrName,
                       b.getDenseI64ArrayAttr(own));
      replicaAttrs.set(ErnieDialect::kPipelineRankAttrName,
                       b.getI64IntegerAttr(rank));
      replicaAttrs.set(ErnieDialect::kSharedStagesAttrName,
                       b.getDenseI64ArrayAttr(ranks));
      unsigned at = index + 1 + k;
      if (failed(fn.insertArgument(at, shared.getType(),
                                   replicaAttrs.getDictionary(b.getContext()),
                                   shared.getLoc())))
        return failure();
      BlockArgument replica = fn.getArgument(at);
      shared.replaceUsesWithIf(replica, [&](OpOperand &use) {
        auto c = use.getOwner()->getAttrOfType<IntegerAttr>(
            ErnieDialect::kStageAttrName);
        return c.getInt() % stages == rank;
      });
    }
    return fn.eraseArgument(index);
  }
};

} // namespace
