//===- Resharding.h - the cheapest way between two shardings -----*- C++ -*-===//
//
// Plans how to move a tensor from any sharding to any other on an N-D mesh
// as a sequence of single-axis collectives and local slices, moving the
// fewest bytes per rank. Axes may sit anywhere (several per dimension, in
// any order, Partial with any reduce kind); a shortest-path search over the
// intermediate shardings finds the plan, so no pattern list can run out.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_SHARDING_RESHARDING_H
#define ERNIE_SHARDING_RESHARDING_H

#include "ernie/Sharding/FactorPropagation.h"

namespace mlir::ernie {

struct ReshardStep {
  enum class Kind {
    /// Complete a pending reduction over `axis`.
    AllReduce,
    /// Complete it and keep this rank's piece: `axis` becomes the minor
    /// split of `dim`.
    ReduceScatter,
    /// `axis`, the minor split of `dim`, stops splitting it.
    AllGather,
    /// `axis` moves from the minor split of `dim` to the minor split of
    /// `toDim`.
    AllToAll,
    /// `axis` becomes the minor split of `dim` by local slicing (no traffic).
    ShardSlice,
    /// A replicated value becomes a pending reduction over `axis` (no
    /// traffic).
    PartialInit,
  };
  Kind kind;
  StringRef axis;
  int64_t dim = -1;
  int64_t toDim = -1;
  ReduceKind reduce = ReduceKind::sum;
  /// Bytes one rank sends for this step.
  int64_t bytes = 0;
  /// The sharding after this step.
  ShardingAttr after;
};

/// The cheapest plan from `from` to `to` for a tensor of global type `type`.
/// Fails only when `to` cannot be reached because a dimension does not
/// divide over its axes.
FailureOr<SmallVector<ReshardStep>> planReshard(ShardingAttr from,
                                                ShardingAttr to,
                                                RankedTensorType type,
                                                const MeshShape &mesh);

/// The per-rank type of `type` under `sharding`; fails when a dimension does
/// not divide over its axes.
FailureOr<RankedTensorType> getLocalType(RankedTensorType type,
                                         ShardingAttr sharding,
                                         const MeshShape &mesh);

} // namespace mlir::ernie

#endif // ERNIE_SHARDING_RESHARDING_H
