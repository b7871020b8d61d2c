//===- SequenceParallelOverlap.cpp - decomposed collective matmuls ----------===//
//
// Sequence parallelism surrounds its matmuls with an all-gather (before the
// column-parallel one) and a reduce-scatter (after the row-parallel one).
// Both split into per-piece steps: the GEMM of one piece runs while the
// next piece travels, through collective_permute_start / wait, which the
// runtime executes on its communication thread.
//
// Both rewrites are exact. A GEMM's row is the same dot product whichever
// rows surround it, and the reduce-scatter side sums the partials in rank
// order — how every engine's reduce_scatter sums — so the result equals the
// original bit for bit.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Dominance.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"

namespace mlir::ernie {
#define GEN_PASS_DEF_SEQUENCEPARALLELOVERLAPPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

/// Whether `dim` of `matmul`'s left operand is a row of the product: a batch
/// dimension or `m`, never the contraction. Splitting the left operand
/// there splits the product the same way, at the same dimension.
bool splitsRows(MatmulOp matmul, int64_t dim) {
  if (matmul.getTransposeA())
    return false;
  auto lhs = cast<RankedTensorType>(matmul.getLhs().getType());
  int64_t rank = lhs.getRank();
  if (dim == rank - 2)
    return true;
  // A batch dimension: only a shared (rank-2) weight is the same for
  // every piece; a batched right operand would need slicing too.
  return dim < rank - 2 &&
         cast<RankedTensorType>(matmul.getRhs().getType()).getRank() == 2;
}

/// `matmul` applied to a piece of its left operand (the same attributes).
Value pieceProduct(OpBuilder &b, MatmulOp matmul, Value piece, int64_t dim,
                   int64_t members) {
  auto full = cast<RankedTensorType>(matmul.getType());
  SmallVector<int64_t> shape(full.getShape());
  shape[dim] /= members;
  auto type = RankedTensorType::get(shape, full.getElementType());
  return MatmulOp::create(b, matmul.getLoc(), type, piece, matmul.getRhs(),
                          matmul.getTransposeAAttr(),
                          matmul.getTransposeBAttr());
}

Value zeros(OpBuilder &b, Location loc, Type type) {
  return FullOp::create(b, loc, cast<RankedTensorType>(type), 0.0);
}

/// all_gather -> matmul(s): the pieces go around the ring (member i holds
/// piece i - k at step k) and every matmul multiplies each as it passes.
LogicalResult overlapAllGather(AllGatherOp gather, MeshOp mesh,
                               const DominanceInfo &dominance) {
  int64_t members = gather.getGroupSize(mesh);
  int64_t dim = gather.getDim();
  if (members < 2 || gather->use_empty())
    return failure();
  // The ring starts where the gathered value is first needed, so every
  // weight it multiplies must already exist there.
  Operation *firstUser = nullptr;
  for (Operation *user : gather->getUsers())
    if (!firstUser || user->isBeforeInBlock(firstUser))
      firstUser = user;
  if (firstUser->getBlock() != gather->getBlock())
    return failure();
  SmallVector<MatmulOp> matmuls;
  bool needsGathered = false;
  for (OpOperand &use : gather->getUses()) {
    auto matmul = dyn_cast<MatmulOp>(use.getOwner());
    if (matmul && use.getOperandNumber() == 0 &&
        matmul.getRhs() != gather.getResult() && splitsRows(matmul, dim) &&
        dominance.properlyDominates(matmul.getRhs(), firstUser) &&
        !llvm::is_contained(matmuls, matmul))
      matmuls.push_back(matmul);
    else if (!matmul || !llvm::is_contained(matmuls, matmul))
      needsGathered = true;
  }
  if (matmuls.empty())
    return failure();
  llvm::sort(matmuls, [](MatmulOp a, MatmulOp b) {
    return a->isBeforeInBlock(b);
  });

  OpBuilder b(firstUser);
  Location loc = gather.getLoc();
  auto shardInsert = [&](Value piece, Value into, int64_t step) {
    return ShardInsertOp::create(b, loc, into.getType(), piece, into,
                                 gather.getMeshAttr(), gather.getAxesAttr(),
                                 b.getI64IntegerAttr(dim),
                                 b.getI64IntegerAttr(-step))
        .getResult();
  };
  SmallVector<Value> products;
  for (MatmulOp matmul : matmuls)
    products.push_back(zeros(b, matmul.getLoc(), matmul.getType()));
  Value gathered = needsGathered ? zeros(b, loc, gather.getType()) : Value();
  Value piece = gather.getInput();
  for (int64_t step = 0; step < members; ++step) {
    Value inFlight;
    if (step + 1 < members)
      inFlight = CollectivePermuteStartOp::create(
          b, loc, piece, gather.getMeshAttr(), gather.getAxesAttr(),
          b.getI64IntegerAttr(1));
    for (size_t i = 0; i < matmuls.size(); ++i)
      products[i] = shardInsert(
          pieceProduct(b, matmuls[i], piece, dim, members), products[i], step);
    if (gathered)
      gathered = shardInsert(piece, gathered, step);
    if (inFlight)
      piece = WaitOp::create(b, loc, piece.getType(), inFlight);
  }
  for (auto [matmul, product] : llvm::zip(matmuls, products)) {
    matmul.getResult().replaceAllUsesWith(product);
    matmul.erase();
  }
  if (gathered)
    gather.getResult().replaceAllUsesWith(gathered);
  gather.erase();
  return success();
}

/// Whether `v` is a sum of matmul products, each splitting its rows at
/// `dim` and read only by the sum: a gradient that adds up the data
/// gradients of q, k and v. Collects the ops, operands before users.
bool isSumOfProducts(Value v, int64_t dim, Block *block,
                     SmallVectorImpl<Operation *> &ops) {
  Operation *def = v.getDefiningOp();
  if (!def || !def->hasOneUse() || def->getBlock() != block)
    return false;
  if (auto matmul = dyn_cast<MatmulOp>(def)) {
    if (!splitsRows(matmul, dim))
      return false;
  } else if (auto add = dyn_cast<AddOp>(def)) {
    if (!isSumOfProducts(add.getLhs(), dim, block, ops) ||
        !isSumOfProducts(add.getRhs(), dim, block, ops))
      return false;
  } else {
    return false;
  }
  ops.push_back(def);
  return true;
}

/// matmul -> reduce_scatter(sum): at step k a rank computes the partial
/// product of piece i + k and sends it to member i + k, computing the next
/// while it travels; the partials received are summed in rank order. (A
/// ring that adds as it forwards would sum in a rank-dependent order.)
LogicalResult overlapReduceScatter(ReduceScatterOp scatter, MeshOp mesh) {
  int64_t members = scatter.getGroupSize(mesh);
  int64_t dim = scatter.getDim();
  SmallVector<Operation *> sum;
  if (members < 2 || scatter.getKind() != ReduceKind::sum ||
      !isSumOfProducts(scatter.getInput(), dim, scatter->getBlock(), sum))
    return failure();

  OpBuilder b(scatter);
  Location loc = scatter.getLoc();
  // The partial product of piece `step`: every matmul on its piece of rows,
  // added up as the original adds (the same association, so each element
  // is the same float).
  auto partialOf = [&](int64_t step) {
    IRMapping pieces;
    for (Operation *op : sum) {
      if (auto add = dyn_cast<AddOp>(op)) {
        pieces.map(add.getResult(),
                   AddOp::create(b, loc, pieces.lookup(add.getLhs()),
                                 pieces.lookup(add.getRhs())));
        continue;
      }
      auto matmul = cast<MatmulOp>(op);
      auto lhsType = cast<RankedTensorType>(matmul.getLhs().getType());
      SmallVector<int64_t> shape(lhsType.getShape());
      shape[dim] /= members;
      Value piece = ShardSliceOp::create(
          b, loc, RankedTensorType::get(shape, lhsType.getElementType()),
          matmul.getLhs(), scatter.getMeshAttr(), scatter.getAxesAttr(),
          b.getI64IntegerAttr(dim), b.getI64IntegerAttr(step));
      pieces.map(matmul.getResult(),
                 pieceProduct(b, matmul, piece, dim, members));
    }
    return pieces.lookup(scatter.getInput());
  };
  // Partials by source member, at the source's index along `dim`: the
  // partial received at step k comes from member i - k.
  Value bySource = zeros(b, loc, scatter.getInput().getType());
  auto place = [&](Value partial, int64_t step) {
    bySource = ShardInsertOp::create(b, loc, bySource.getType(), partial,
                                     bySource, scatter.getMeshAttr(),
                                     scatter.getAxesAttr(),
                                     b.getI64IntegerAttr(dim),
                                     b.getI64IntegerAttr(-step));
  };
  // The partials for the other members go first, each computed while the
  // one before travels; this member's own partial covers the last transfer.
  Value inFlight;
  for (int64_t step = 1; step < members; ++step) {
    Value sent = CollectivePermuteStartOp::create(
        b, loc, partialOf(step), scatter.getMeshAttr(), scatter.getAxesAttr(),
        b.getI64IntegerAttr(step));
    if (inFlight)
      place(WaitOp::create(b, loc, scatter.getType(), inFlight), step - 1);
    inFlight = sent;
  }
  place(partialOf(0), 0);
  place(WaitOp::create(b, loc, scatter.getType(), inFlight), members - 1);

  // Sum in source order: ((p0 + p1) + p2) + ..., as reduce_scatter does.
  auto pieceOfResult = cast<RankedTensorType>(scatter.getType());
  int64_t rows = pieceOfResult.getDimSize(dim);
  int64_t rank = pieceOfResult.getRank();
  Value total;
  for (int64_t source = 0; source < members; ++source) {
    SmallVector<int64_t> start(rank, 0), limit(pieceOfResult.getShape()),
        strides(rank, 1);
    start[dim] = source * rows;
    limit[dim] = start[dim] + rows;
    Value part = SliceOp::create(b, loc, pieceOfResult, bySource,
                                 b.getDenseI64ArrayAttr(start),
                                 b.getDenseI64ArrayAttr(limit),
                                 b.getDenseI64ArrayAttr(strides));
    total = total ? AddOp::create(b, loc, total, part).getResult() : part;
  }
  scatter.getResult().replaceAllUsesWith(total);
  scatter.erase();
  for (Operation *op : llvm::reverse(sum))
    op->erase();
  return success();
}

struct SequenceParallelOverlapPass
    : ernie::impl::SequenceParallelOverlapPassBase<
          SequenceParallelOverlapPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    DominanceInfo dominance(module);
    SmallVector<AllGatherOp> gathers;
    SmallVector<ReduceScatterOp> scatters;
    module.walk([&](Operation *op) {
      if (auto gather = dyn_cast<AllGatherOp>(op))
        gathers.push_back(gather);
      else if (auto scatter = dyn_cast<ReduceScatterOp>(op))
        scatters.push_back(scatter);
    });
    auto meshOf = [&](auto op) {
      return SymbolTable::lookupNearestSymbolFrom<MeshOp>(op, op.getMeshAttr());
    };
    for (AllGatherOp gather : gathers)
      if (MeshOp mesh = meshOf(gather))
        (void)overlapAllGather(gather, mesh, dominance);
    for (ReduceScatterOp scatter : scatters)
      if (MeshOp mesh = meshOf(scatter))
        (void)overlapReduceScatter(scatter, mesh);
  }
};

} // namespace
