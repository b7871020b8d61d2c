//===- Checksum.h - XXH3 checksums of checkpoint data -----------*- C++ -*-===//
//
// The checksum of checkpoint data: XXH3's 64-bit hash (seed 0) from
// libxxhash, named "xxh3" in manifests. Checkpoints record one per block of
// kChecksumBlockBytes of every piece, so a load that reads part of a piece
// verifies only the blocks it touches. xxhash.h stays behind this header, so
// code that includes the runtime's headers does not need it.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_CHECKSUM_H
#define ERNIE_RUNTIME_CHECKSUM_H

#include <cstddef>
#include <cstdint>

namespace ernie::runtime {

/// The XXH3 64-bit hash (seed 0) of `bytes` bytes at `data`.
uint64_t xxh3(const void *data, size_t bytes);

/// The block a checkpoint's checksums cover (the last one of a piece may be
/// shorter).
constexpr uint64_t kChecksumBlockBytes = 1u << 20;

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_CHECKSUM_H
