//===- InferSpmd.h - one op's SPMD rule, called alone ------------*- C++ -*-===//
//
// Paddle's `infer_spmd`: given an op by name, its inputs' types and
// shardings and its attributes, the shardings its inputs should have, its
// outputs' shardings and their partial axes. Used by tests and by the Python
// `ernie.distributed.infer_spmd`.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_SHARDING_INFERSPMD_H
#define ERNIE_SHARDING_INFERSPMD_H

#include "ernie/Sharding/FactorPropagation.h"

#include <string>

namespace mlir::ernie {

struct SpmdResult {
  /// What each input should be (a reshard where it differs from the given).
  SmallVector<ShardingAttr> inputs;
  /// Each output's sharding; Partial axes included.
  SmallVector<ShardingAttr> outputs;
};

/// Runs the rule of op `opName` (e.g. "ernie.matmul") on inputs of
/// `inputTypes` sharded as `inputShardings` (null: unknown) over `mesh`.
/// `resultTypes` is needed only by ops whose results are not inferred
/// (reshape, broadcast, cast). On failure returns failure and sets `error`
/// to the diagnostics the op produced.
FailureOr<SpmdResult> inferSpmd(MLIRContext *context, StringRef opName,
                                ArrayRef<RankedTensorType> inputTypes,
                                ArrayRef<ShardingAttr> inputShardings,
                                DictionaryAttr attrs, const MeshShape &mesh,
                                std::string &error,
                                ArrayRef<RankedTensorType> resultTypes = {});

/// Paddle's dims_mapping: per tensor dimension the mesh dimension splitting
/// it, or -1; plus the mesh dimensions on which the value is Partial (sum).
struct DimsMapping {
  SmallVector<int64_t> dims;
  SmallVector<int64_t> partialDims;
};

/// A sharding from a dims_mapping on `mesh`; fails on an out-of-range mesh
/// dimension or one used twice.
FailureOr<ShardingAttr> shardingFromDimsMapping(MLIRContext *context,
                                                const MeshShape &mesh,
                                                const DimsMapping &mapping);
/// The dims_mapping of `sharding`; fails when a dimension is split over more
/// than one mesh axis, which dims_mapping cannot say.
FailureOr<DimsMapping> dimsMappingFromSharding(ShardingAttr sharding,
                                               const MeshShape &mesh);

} // namespace mlir::ernie

#endif // ERNIE_SHARDING_INFERSPMD_H
