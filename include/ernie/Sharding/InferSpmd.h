//===- InferSpmd.h - one op's SPMD rule, called alone -----------*- C++ -*-===//
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
/// `inputTypes` over `mesh`, from what is known: `inputShardings` and
/// `outputShardings` (empty, or one per tensor with null for unknown).
/// Known inputs alone is Paddle's infer_forward, known outputs alone its
/// infer_backward; both go through resolveShardings, which weighs every
/// known tensor.
///
/// `attrs` are the op's attributes as a Python user writes them and
/// normalised here: Paddle's spellings (`trans_x`, reductions' `axis`,
/// `keep_dim`, split's `num_or_sections`), negative axes, bools for unit
/// flags, ints for lists and back, strings for enums; Paddle attributes
/// ernie fixes (`begin_norm_axis`, cross-entropy's `axis`, `soft_label`)
/// at ernie's value. Results that are not inferred come from `resultTypes`
/// or the attributes `shape` (reshape: Paddle's 0 and -1), `dtype` and
/// `value`. On failure returns failure and sets `error` to a message that
/// names the op and, where one is at fault, the attribute.
FailureOr<SpmdResult> inferSpmd(MLIRContext *context, StringRef opName,
                                ArrayRef<RankedTensorType> inputTypes,
                                ArrayRef<ShardingAttr> inputShardings,
                                DictionaryAttr attrs, const MeshShape &mesh,
                                std::string &error,
                                ArrayRef<RankedTensorType> resultTypes = {},
                                ArrayRef<ShardingAttr> outputShardings = {});

/// Paddle's infer_backward: from the outputs' shardings to the inputs' (and
/// the outputs' as the rule makes them).
FailureOr<SpmdResult>
inferSpmdReverse(MLIRContext *context, StringRef opName,
                 ArrayRef<RankedTensorType> inputTypes,
                 ArrayRef<ShardingAttr> outputShardings, DictionaryAttr attrs,
                 const MeshShape &mesh, std::string &error,
                 ArrayRef<RankedTensorType> resultTypes = {});

/// The types of the op's results for these inputs and attributes (the
/// attributes normalised as inferSpmd does).
FailureOr<SmallVector<RankedTensorType>>
inferSpmdResultTypes(MLIRContext *context, StringRef opName,
                     ArrayRef<RankedTensorType> inputTypes,
                     DictionaryAttr attrs, std::string &error);

/// Paddle's dims_mapping: per tensor dimension the mesh dimension splitting
/// it, or -1; plus the mesh dimensions on which the value is Partial (sum).
struct DimsMapping {
  SmallVector<int64_t> dims;
  SmallVector<int64_t> partialDims;
};

/// A sharding from a dims_mapping on `mesh`; fails on an out-of-range mesh
/// dimension, one used twice, or an unnamed mesh axis.
FailureOr<ShardingAttr> shardingFromDimsMapping(MLIRContext *context,
                                                const MeshShape &mesh,
                                                const DimsMapping &mapping);
/// The dims_mapping of `sharding`; fails when a dimension is split over more
/// than one mesh axis, which dims_mapping cannot say.
FailureOr<DimsMapping> dimsMappingFromSharding(ShardingAttr sharding,
                                               const MeshShape &mesh);

} // namespace mlir::ernie

#endif // ERNIE_SHARDING_INFERSPMD_H
