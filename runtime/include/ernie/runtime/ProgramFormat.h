//===- ProgramFormat.h - constants both writer and reader agree on -*- C++ -*-===//
//
// The program file's schema is runtime/schema/program.fbs; this header holds
// what the compiler's writer and the runtime's reader must share beyond it.
// Header-only and dependency-free: the compiler includes it without linking
// the runtime.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_PROGRAMFORMAT_H
#define ERNIE_RUNTIME_PROGRAMFORMAT_H

#include <cstdint>

namespace ernie::program {

/// Bumped on every incompatible change of program.fbs or of what its fields
/// mean; a reader rejects every other version.
inline constexpr uint32_t kFormatVersion = 2;

/// Byte alignment of every buffer in an arena (a cache line; also enough for
/// any SIMD load the kernels do).
inline constexpr uint64_t kBufferAlignment = 64;

/// Alignment of the envelope's nested program bytes (the writer's
/// ForceVectorAlignment). The builder writes that vector first, so it ends
/// the file but for fewer than this many zero padding bytes; a reader
/// rejects anything else after it.
inline constexpr uint64_t kPayloadAlignment = 16;

} // namespace ernie::program

#endif // ERNIE_RUNTIME_PROGRAMFORMAT_H
