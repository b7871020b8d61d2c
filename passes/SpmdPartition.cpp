//===- SpmdPartition.cpp - the per-rank program ------------------------------===//
//
// Global shapes become local ones, reshards become collectives, and the few
// ops whose local form is not the op itself on local shapes are expanded.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Passes/Passes.h"
#include "ernie/Sharding/Resharding.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

#define DEBUG_TYPE "ernie-spmd-partition"

namespace mlir::ernie {
#define GEN_PASS_DEF_SPMDPARTITIONPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

class Partitioner {
public:
  Partitioner(ModuleOp module, const MeshShape &mesh)
      : module(module), mesh(mesh) {}

  LogicalResult run();

private:
  LogicalResult collectShardings();
  LogicalResult partitionFunction(func::FuncOp func);
  LogicalResult partitionDeclaration(func::FuncOp func);
  LogicalResult setLocalType(Value value, Operation *where);
  FailureOr<Value> emitReshard(OpBuilder &builder, Location loc, Value input,
                               ShardingAttr from, ShardingAttr to,
                               RankedTensorType globalType);
  LogicalResult expandEmbedding(EmbeddingOp op);

  ArrayAttr axesAttr(StringRef axis) {
    return ArrayAttr::get(module.getContext(),
                          {StringAttr::get(module.getContext(), axis)});
  }

  ModuleOp module;
  MeshShape mesh;
  llvm::DenseMap<Value, ShardingAttr> shardings;
  llvm::DenseMap<Value, RankedTensorType> globalTypes;
};

LogicalResult Partitioner::collectShardings() {
  WalkResult walk = module.walk([&](Operation *op) -> WalkResult {
    if (auto func = dyn_cast<func::FuncOp>(op)) {
      if (func.isDeclaration())
        return WalkResult::advance();
      for (BlockArgument arg : func.getArguments())
        if (auto s = func.getArgAttrOfType<ShardingAttr>(arg.getArgNumber(),
                                                         kShardingAttrName))
          shardings[arg] = s;
      return WalkResult::advance();
    }
    if (auto reshard = dyn_cast<ReshardOp>(op)) {
      shardings[reshard.getResult()] = reshard.getSharding();
      return WalkResult::advance();
    }
    auto given = op->getAttrOfType<ArrayAttr>(kResultShardingsAttrName);
    for (auto [i, result] : llvm::enumerate(op->getResults())) {
      if (!isa<RankedTensorType>(result.getType()))
        continue;
      if (!given) {
        op->emitError() << "result #" << i
                        << " has no sharding; run "
                           "--ernie-sharding-propagation first";
        return WalkResult::interrupt();
      }
      shardings[result] = cast<ShardingAttr>(given[i]);
    }
    return WalkResult::advance();
  });
  return failure(walk.wasInterrupted());
}

LogicalResult Partitioner::setLocalType(Value value, Operation *where) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  ShardingAttr sharding = shardings.lookup(value);
  if (!type || !sharding)
    return success();
  globalTypes[value] = type;
  FailureOr<RankedTensorType> local = getLocalType(type, sharding, mesh);
  if (failed(local)) {
    InFlightDiagnostic diag = where->emitError();
    diag << "value of type " << type << " cannot be split as " << sharding
         << ": a dimension does not divide over its mesh axes";
    return diag;
  }
  value.setType(*local);
  return success();
}

FailureOr<Value> Partitioner::emitReshard(OpBuilder &builder, Location loc,
                                          Value input, ShardingAttr from,
                                          ShardingAttr to,
                                          RankedTensorType globalType) {
  FailureOr<SmallVector<ReshardStep>> plan =
      planReshard(from, to, globalType, mesh);
  if (failed(plan))
    return emitError(loc) << "no way to reshard " << globalType << " from "
                          << from << " to " << to;
  Value current = input;
  for (const ReshardStep &step : *plan) {
    auto localType = *getLocalType(globalType, step.after, mesh);
    auto kind = ReduceKindAttr::get(builder.getContext(), step.reduce);
    ArrayAttr axes = axesAttr(step.axis);
    switch (step.kind) {
    case ReshardStep::Kind::AllReduce:
      current = AllReduceOp::create(builder, loc, current.getType(), current,
                                    mesh.name, axes, kind);
      break;
    case ReshardStep::Kind::ReduceScatter:
      current = ReduceScatterOp::create(builder, loc, localType, current,
                                        mesh.name, axes,
                                        builder.getI64IntegerAttr(step.dim), kind);
      break;
    case ReshardStep::Kind::AllGather:
      current = AllGatherOp::create(builder, loc, localType, current,
                                    mesh.name, axes,
                                    builder.getI64IntegerAttr(step.dim));
      break;
    case ReshardStep::Kind::AllToAll:
      current = AllToAllOp::create(builder, loc, localType, current,
                                   mesh.name, axes,
                                   builder.getI64IntegerAttr(step.toDim),
                                   builder.getI64IntegerAttr(step.dim));
      break;
    case ReshardStep::Kind::ShardSlice:
      current = ShardSliceOp::create(builder, loc, localType, current,
                                     mesh.name, axes,
                                     builder.getI64IntegerAttr(step.dim));
      break;
    case ReshardStep::Kind::PartialInit:
      current = PartialInitOp::create(builder, loc, current.getType(),
                                      current, mesh.name, axes, kind);
      break;
    }
  }
  return current;
}

/// A vocabulary-split table: look up the rows this rank owns (ids shifted by
/// its first row), zero the others; the sum over the vocabulary axes is the
/// global lookup, as the result's Partial sharding says.
LogicalResult Partitioner::expandEmbedding(EmbeddingOp op) {
  ShardingAttr table = shardings.lookup(op.getWeight());
  SmallVector<StringRef> vocabAxes = table.getDimAxes(0);
  OpBuilder b(op);
  Location loc = op.getLoc();
  auto ids = cast<RankedTensorType>(op.getIndices().getType());
  auto weight = cast<RankedTensorType>(op.getWeight().getType());
  auto result = cast<RankedTensorType>(op.getType());
  Type idType = ids.getElementType();
  auto scalar = [&](Type element) { return RankedTensorType::get({}, element); };

  SmallVector<Attribute> axisNames;
  for (StringRef axis : vocabAxes)
    axisNames.push_back(b.getStringAttr(axis));
  Value index = AxisIndexOp::create(b, loc, scalar(b.getI64Type()), mesh.name,
                                    b.getArrayAttr(axisNames));
  if (idType != b.getI64Type())
    index = CastOp::create(b, loc, scalar(idType), index);
  int64_t rows = weight.getDimSize(0);
  Value rowsScalar = FullOp::create(b, loc, scalar(idType),
                                    IntegerAttr::get(idType, rows));
  Value firstRow = MulOp::create(b, loc, index, rowsScalar);
  Value offset = BroadcastOp::create(b, loc, ids, firstRow,
                                     b.getDenseI64ArrayAttr({}));
  Value local = SubOp::create(b, loc, op.getIndices(), offset);
  Value zero = FullOp::create(b, loc, ids, IntegerAttr::get(idType, 0));
  Value limit = FullOp::create(b, loc, ids, IntegerAttr::get(idType, rows));
  Value geZero = CompareOp::create(b, loc, CompareDirection::ge, local, zero);
  Value ltRows = CompareOp::create(b, loc, CompareDirection::lt, local, limit);
  auto maskType = cast<RankedTensorType>(geZero.getType());
  Value no = FullOp::create(b, loc, maskType, b.getBoolAttr(false));
  Value owned = SelectOp::create(b, loc, geZero, ltRows, no);
  Value safe = SelectOp::create(b, loc, owned, local, zero);
  Value rowsOut = EmbeddingOp::create(b, loc, result, safe, op.getWeight(),
                                      IntegerAttr());
  SmallVector<int64_t> keep = llvm::to_vector(llvm::seq<int64_t>(0, ids.getRank()));
  auto wideMask = RankedTensorType::get(result.getShape(), b.getI1Type());
  Value ownedWide = BroadcastOp::create(b, loc, wideMask, owned,
                                        b.getDenseI64ArrayAttr(keep));
  Value zeros = FullOp::create(
      b, loc, result, FloatAttr::get(result.getElementType(), 0.0));
  Value out = SelectOp::create(b, loc, ownedWide, rowsOut, zeros);
  shardings[out] = shardings.lookup(op.getResult());
  globalTypes[out] = globalTypes.lookup(op.getResult());
  op.getResult().replaceAllUsesWith(out);
  op.erase();
  return success();
}

LogicalResult Partitioner::partitionFunction(func::FuncOp func) {
  if (!func.getBody().hasOneBlock())
    return func.emitError("partition handles single-block functions");
  Block &body = func.getBody().front();
  for (BlockArgument arg : body.getArguments())
    if (failed(setLocalType(arg, func)))
      return failure();

  SmallVector<Operation *> ops;
  for (Operation &op : body)
    ops.push_back(&op);
  for (Operation *op : ops) {
    if (auto reshard = dyn_cast<ReshardOp>(op)) {
      OpBuilder builder(reshard);
      Value input = reshard.getInput();
      ShardingAttr from = shardings.lookup(input);
      RankedTensorType global = globalTypes.lookup(input);
      if (!from || !global)
        return reshard.emitError("reshard of a value without a sharding");
      FailureOr<Value> lowered = emitReshard(
          builder, reshard.getLoc(), input, from, reshard.getSharding(),
          global);
      if (failed(lowered))
        return failure();
      globalTypes[*lowered] = global;
      shardings[*lowered] = reshard.getSharding();
      reshard.getResult().replaceAllUsesWith(*lowered);
      reshard.erase();
      continue;
    }
    if (op->getNumRegions() != 0)
      return op->emitError("partition does not handle ops with regions");
    for (Value result : op->getResults())
      if (failed(setLocalType(result, op)))
        return failure();
    op->removeAttr(kResultShardingsAttrName);

    // Ops whose local form needs more than local types.
    if (auto slice = dyn_cast<SliceOp>(op)) {
      auto in = cast<RankedTensorType>(slice.getInput().getType());
      SmallVector<int64_t> limit(slice.getLimit());
      for (int64_t d = 0; d < in.getRank(); ++d)
        if (slice.getStart()[d] == 0 && slice.getStep()[d] == 1 &&
            limit[d] == globalTypes.lookup(slice.getInput()).getDimSize(d))
          limit[d] = in.getDimSize(d);
      slice.setLimit(limit);
    } else if (auto embedding = dyn_cast<EmbeddingOp>(op)) {
      if (!shardings.lookup(embedding.getWeight()).getDimAxes(0).empty() &&
          failed(expandEmbedding(embedding)))
        return failure();
    } else if (auto constant = dyn_cast<ConstantOp>(op)) {
      // Values are global: build the whole and slice this rank's piece.
      ShardingAttr want = shardings.lookup(constant.getResult());
      RankedTensorType global = globalTypes.lookup(constant.getResult());
      if (!want.isReplicated()) {
        constant.getResult().setType(global);
        OpBuilder builder(op->getContext());
        builder.setInsertionPointAfter(op);
        ShardingAttr whole =
            ShardingAttr::getReplicated(op->getContext(), mesh.name,
                                        global.getRank());
        Value result = constant.getResult();
        FailureOr<Value> piece =
            emitReshard(builder, op->getLoc(), result, whole, want, global);
        if (failed(piece))
          return failure();
        result.replaceAllUsesExcept(*piece, piece->getDefiningOp());
      }
    }
  }

  // The signature follows the local types; shardings become "shard of".
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  func.setType(FunctionType::get(func.getContext(), body.getArgumentTypes(),
                                 ret.getOperandTypes()));
  for (unsigned i = 0; i < func.getNumArguments(); ++i)
    if (Attribute s = func.getArgAttr(i, kShardingAttrName)) {
      func.removeArgAttr(i, kShardingAttrName);
      func.setArgAttr(i, kShardOfAttrName, s);
    }
  for (unsigned i = 0; i < func.getNumResults(); ++i)
    if (Attribute s = func.getResultAttr(i, kShardingAttrName)) {
      func.removeResultAttr(
          i, StringAttr::get(func.getContext(), kShardingAttrName));
      func.setResultAttr(i, kShardOfAttrName, s);
    }
  return success();
}

/// An external function: its signature becomes the local one its shardings
/// say, so calls to it type-check after partition.
LogicalResult Partitioner::partitionDeclaration(func::FuncOp func) {
  auto localize = [&](Type type, ShardingAttr s) -> FailureOr<Type> {
    auto tensor = dyn_cast<RankedTensorType>(type);
    if (!tensor || !s)
      return type;
    FailureOr<RankedTensorType> local = getLocalType(tensor, s, mesh);
    if (failed(local))
      return func.emitError() << "signature type " << type
                              << " cannot be split as " << s;
    return Type(*local);
  };
  SmallVector<Type> inputs, results;
  for (auto [i, type] : llvm::enumerate(func.getArgumentTypes())) {
    auto s = func.getArgAttrOfType<ShardingAttr>(i, kShardingAttrName);
    FailureOr<Type> local = localize(type, s);
    if (failed(local))
      return failure();
    inputs.push_back(*local);
    if (s) {
      func.removeArgAttr(i, kShardingAttrName);
      func.setArgAttr(i, kShardOfAttrName, s);
    }
  }
  for (auto [i, type] : llvm::enumerate(func.getResultTypes())) {
    auto s = func.getResultAttrOfType<ShardingAttr>(i, kShardingAttrName);
    FailureOr<Type> local = localize(type, s);
    if (failed(local))
      return failure();
    results.push_back(*local);
    if (s) {
      func.removeResultAttr(
          i, StringAttr::get(func.getContext(), kShardingAttrName));
      func.setResultAttr(i, kShardOfAttrName, s);
    }
  }
  func.setType(FunctionType::get(func.getContext(), inputs, results));
  return success();
}

LogicalResult Partitioner::run() {
  if (failed(collectShardings()))
    return failure();
  for (auto func : llvm::make_early_inc_range(module.getOps<func::FuncOp>()))
    if (failed(func.isDeclaration() ? partitionDeclaration(func)
                                    : partitionFunction(func)))
      return failure();
  return success();
}

struct SpmdPartitionPass
    : ernie::impl::SpmdPartitionPassBase<SpmdPartitionPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto meshes = module.getOps<MeshOp>();
    if (meshes.empty())
      return; // Nothing is distributed.
    if (std::next(meshes.begin()) != meshes.end()) {
      module.emitError("partition supports one mesh per module");
      return signalPassFailure();
    }
    Partitioner partitioner(module, MeshShape::get(*meshes.begin()));
    if (failed(partitioner.run()))
      return signalPassFailure();
  }
};

} // namespace
