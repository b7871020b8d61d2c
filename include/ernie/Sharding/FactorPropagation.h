//===- FactorPropagation.h - shardings through one op's rule -----*- C++ -*-===//
//
// The step every sharding algorithm repeats: given the shardings some of an
// op's operands and results already have, decide which mesh axes shard each
// factor of the op's rule, and project that back onto every operand and
// result. Propagation, partition and inferSpmd share it.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_SHARDING_FACTORPROPAGATION_H
#define ERNIE_SHARDING_FACTORPROPAGATION_H

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/ShardingRule.h"
#include "llvm/ADT/DenseMap.h"

#include <cmath>
#include <functional>
#include <memory>
#include <tuple>

namespace mlir::ernie {

struct ReshardStep;

/// A mesh's axes and sizes, detached from the IR.
struct MeshShape {
  FlatSymbolRefAttr name;
  SmallVector<StringRef> axes;
  SmallVector<int64_t> sizes;

  static MeshShape get(MeshOp mesh);
  /// The size of `axis`; 1 for an axis the mesh does not have.
  int64_t axisSize(StringRef axis) const;
  /// The product of the sizes of `axes`.
  int64_t product(ArrayRef<StringRef> axes) const;

  /// Whether a dimension may be split by axes that do not divide it (the
  /// pieces padded to equal size, GSPMD's convention), or such a split is an
  /// error (`strict-divisibility`).
  bool allowUneven = true;

  /// What one collective (a reshard step) costs: the planner's edge weight
  /// and the currency of every choice propagation makes. Unset, every link
  /// is latency-free at one byte per unit, so a step costs the bytes one
  /// rank sends. A cluster (cost::useCluster) makes it seconds: the latency
  /// of the links the step's group spans, once per hop of NCCL's ring or
  /// tree, plus its bytes over their bandwidth.
  std::function<double(const ReshardStep &)> stepCost;
  double costOf(const ReshardStep &step) const;

  /// What running `op` whole (its global types) on one device costs, in
  /// stepCost's currency, where its arithmetic bounds it; 0 where its bytes
  /// do (they are fused away later, and dividing them moves as many as it
  /// saves). Only a cluster says (seconds, the step model's roofline);
  /// unset, compute and bytes have no common measure and propagation never
  /// trades one for the other.
  std::function<double(Operation *)> opTime;

  /// Reshard costs already planned on this mesh, by (from, to, type).
  using CostKey = std::tuple<Attribute, Attribute, Type>;
  std::shared_ptr<llvm::DenseMap<CostKey, double>> costCache =
      std::make_shared<llvm::DenseMap<CostKey, double>>();
};

/// The cost of a tensor no plan can bring to a sharding: large enough to
/// lose every comparison, small enough to add up without overflowing.
constexpr double kUnreachableCost = 1e30;

/// Whether cost `a` beats `b` by more than rounding. Times summed in another
/// order differ in their last bits (a reduce-scatter and an all-gather cost
/// what one ring all-reduce does); such ties must fall to the same
/// deterministic order as equal byte counts, not to the noise.
inline bool isCheaper(double a, double b) { return a < b - 1e-9 * std::abs(b); }

/// For every factor of a rule, the mesh axes that shard it, major to minor.
using FactorAxes = SmallVector<SmallVector<StringRef, 2>>;

/// What one op's operands and results should be, and the factor choice that
/// gives it.
struct OpShardings {
  FactorAxes factorAxes;
  SmallVector<ShardingAttr> operands;
  SmallVector<ShardingAttr> results;
};

/// Reads from one tensor's `sharding` which axes shard each of its factors
/// (`dims`, from the rule). A dimension's axes go to its factors major to
/// minor, each factor taking axes while their product divides it; an axis
/// that fits no factor is dropped (the tensor will be resharded).
FactorAxes readFactorAxes(const OpShardingRule &rule, const TensorFactors &dims,
                          ShardingAttr sharding, const MeshShape &mesh);

/// The sharding of a tensor whose dims are `dims` under `factorAxes`. Results
/// (`isResult`) become Partial over the axes of sharded reduction factors.
ShardingAttr projectSharding(MLIRContext *context, const OpShardingRule &rule,
                             const TensorFactors &dims,
                             const FactorAxes &factorAxes,
                             const MeshShape &mesh, bool isResult);

/// What moving a tensor of `type` from `from` to `to` costs (the mesh's
/// `stepCost`: bytes one rank sends, or seconds on a cluster): the total of
/// the cheapest resharding plan (Resharding.h), i.e. of the collectives
/// partition would emit. Cached per mesh; a sharding the tensor cannot take
/// costs kUnreachableCost.
double reshardCost(ShardingAttr from, ShardingAttr to, RankedTensorType type,
                   const MeshShape &mesh);

/// What running an op as `choice` says costs where its operands are
/// `operands` and its users want `results` (null: open, free): each known
/// operand resharded to the choice's, each choice's result resharded to the
/// known one.
double movedCost(const OpShardings &choice, ArrayRef<ShardingAttr> operands,
                 ArrayRef<ShardingAttr> results,
                 ArrayRef<RankedTensorType> operandTypes,
                 ArrayRef<RankedTensorType> resultTypes, const MeshShape &mesh);

/// The points of an op's iteration space (the product of its factors) one
/// rank computes under `axes`: what splitting saves, and what a choice
/// that leaves factors whole makes every rank compute again.
double localIterations(const OpShardingRule &rule, const FactorAxes &axes,
                       const MeshShape &mesh);

/// Every operand's and result's sharding under `factorAxes`, after dropping
/// the axes of factors whose pieces would be strided (a minor factor of a
/// dimension whose major factor is not fully split).
OpShardings projectFactors(MLIRContext *context, const OpShardingRule &rule,
                           FactorAxes factorAxes, const MeshShape &mesh);

/// Decides the factor axes of `rule` from the known shardings (null entries
/// are open) and projects them onto every operand and result. Each known
/// tensor in turn seeds the choice (its axes first, then the others' in
/// operand-then-result order where they do not collide); the seed whose
/// projection costs least to move to (reshardCost) wins, the earliest on
/// ties.
OpShardings resolveShardings(MLIRContext *context, const OpShardingRule &rule,
                             ArrayRef<ShardingAttr> operands,
                             ArrayRef<ShardingAttr> results,
                             ArrayRef<RankedTensorType> operandTypes,
                             ArrayRef<RankedTensorType> resultTypes,
                             const MeshShape &mesh);

} // namespace mlir::ernie

#endif // ERNIE_SHARDING_FACTORPROPAGATION_H
