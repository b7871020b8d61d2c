//===- Resharding.h - the cheapest way between two shardings -----*- C++ -*-===//
//
// Plans how to move a tensor from any sharding to any other on an N-D mesh
// as a sequence of single-axis collectives and local slices, at the least
// cost (MeshShape::stepCost: bytes per rank, or a cluster's time). Axes may
// sit anywhere (several per dimension, in any order, Partial with any
// reduce kind); a shortest-path search over the intermediate shardings
// finds the plan, so no pattern list can run out.
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
    /// `axes`, the minor splits of `dim`, stop splitting it.
    AllGather,
    /// `axis` moves from the minor split of `dim` to the minor split of
    /// `toDim`.
    AllToAll,
    /// `axes` become the minor splits of `dim` by local slicing (no traffic).
    ShardSlice,
    /// A replicated value becomes a pending reduction over `axis` (no
    /// traffic).
    PartialInit,
  };
  Kind kind;
  /// The mesh axes of the step's group, major to minor: one, except where a
  /// gather or a slice moves several minor axes of an unevenly split
  /// dimension at once (their pieces would not nest one axis at a time).
  SmallVector<StringRef, 2> axes;
  int64_t dim = -1;
  int64_t toDim = -1;
  ReduceKind reduce = ReduceKind::sum;
  /// Bytes one rank sends for this step.
  int64_t bytes = 0;
  /// The sharding after this step.
  ShardingAttr after;
};

/// The cheapest plan from `from` to `to` for a tensor of global type `type`.
/// Fails only when `to` cannot be reached: a dimension does not divide over
/// its axes and the mesh allows no uneven split, or the uneven pieces on the
/// way do not nest (isAlignedSplit). Each step's `after` sharding says the
/// padded local type; partition pads before a scatter and slices after a
/// gather where the padding changes.
FailureOr<SmallVector<ReshardStep>> planReshard(ShardingAttr from,
                                                ShardingAttr to,
                                                RankedTensorType type,
                                                const MeshShape &mesh);

/// The per-rank type of `type` under `sharding`. A dimension its axes do not
/// divide is padded: every rank holds `ceil(size / parts)` (GSPMD's
/// convention; the last ranks' pieces end in padding). Fails on such a
/// dimension when the mesh does not allow uneven splits.
FailureOr<RankedTensorType> getLocalType(RankedTensorType type,
                                         ShardingAttr sharding,
                                         const MeshShape &mesh);

/// One rank's extent of a dimension of `size` split `parts` ways.
int64_t localDimSize(int64_t size, int64_t parts);

/// Whether the pieces of a dimension of `size` split `fine` ways nest inside
/// those of the same dimension split `coarse` ways (`coarse` divides `fine`):
/// each coarse piece is exactly `fine / coarse` fine ones. Always true for
/// even splits and for `coarse` == 1 (the whole, padding at the end).
bool isAlignedSplit(int64_t size, int64_t coarse, int64_t fine);

} // namespace mlir::ernie

#endif // ERNIE_SHARDING_RESHARDING_H
