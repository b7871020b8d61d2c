//===- Checksum.h - CRC-32C of byte ranges ----------------------*- C++ -*-===//
//
// The checksum of checkpoint data: CRC-32C (Castagnoli), with the SSE 4.2
// instruction where the CPU has it (three interleaved streams, several GB/s
// per core) and a table otherwise. Checkpoints record one per block of
// kChecksumBlockBytes of every piece, so a load that reads part of a piece
// verifies only the blocks it touches.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_CHECKSUM_H
#define ERNIE_RUNTIME_CHECKSUM_H

#include <cstddef>
#include <cstdint>

namespace ernie::runtime {

/// The CRC-32C of `bytes` bytes at `data`, continuing from `crc` (0 to
/// start): crc32c(crc32c(0, a), b) == crc32c(0, a ++ b).
uint32_t crc32c(uint32_t crc, const void *data, size_t bytes);

/// The block a checkpoint's checksums cover (the last one of a piece may be
/// shorter).
constexpr uint64_t kChecksumBlockBytes = 1u << 20;

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_CHECKSUM_H
