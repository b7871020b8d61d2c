//===- Sharding.h - meshes and shardings of values ---------------*- C++ -*-===//
//
// Looking up a sharding's mesh and checking a sharding against a tensor type;
// where shardings live on functions and ops.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_DIALECT_ERNIE_IR_SHARDING_H
#define ERNIE_DIALECT_ERNIE_IR_SHARDING_H

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"

namespace mlir::ernie {

/// Function argument/result attribute holding a value's sharding.
inline constexpr llvm::StringLiteral kShardingAttrName = "ernie.sharding";
/// After partition: the global sharding a local argument or result is one
/// rank's piece of.
inline constexpr llvm::StringLiteral kShardOfAttrName = "ernie.shard_of";
/// After partition, beside `ernie.shard_of` where a dimension is split
/// unevenly: the global shape (the local one times the parts would count
/// the padding).
inline constexpr llvm::StringLiteral kGlobalShapeAttrName = "ernie.global_shape";
/// Unit attribute on `ernie.mesh`: every split must divide its dimension
/// (without it a dimension its axes do not divide is split unevenly, the
/// last pieces padded).
inline constexpr llvm::StringLiteral kEvenSplitsAttrName = "ernie.even_splits";
/// Op attribute: an array with one sharding per result.
inline constexpr llvm::StringLiteral kResultShardingsAttrName =
    "ernie.shardings";

/// Checks an `ernie.global_shape` attribute on function argument or result
/// `index` (`what` is "argument" or "result").
LogicalResult verifyGlobalShape(Operation *op, NamedAttribute attr,
                                StringRef what, unsigned index);

/// The mesh `sharding` names, looked up from `from`'s symbol tables.
MeshOp lookupMesh(Operation *from, ShardingAttr sharding);

/// Checks `sharding` against `mesh` and `type`: as many dimensions as the
/// type, every axis on the mesh. A split dimension need not divide by the
/// product of its axes (uneven splits are padded; see kEvenSplitsAttrName). `what` names the value in the diagnostic.
LogicalResult verifySharding(function_ref<InFlightDiagnostic()> emitError,
                             ShardingAttr sharding, MeshOp mesh, Type type,
                             StringRef what);

/// The same, looking the mesh up from `op` and reporting on it.
LogicalResult verifySharding(Operation *op, ShardingAttr sharding, Type type,
                             StringRef what);

} // namespace mlir::ernie

#endif // ERNIE_DIALECT_ERNIE_IR_SHARDING_H
