//===- Checksum.cpp - XXH3 checksums of checkpoint data -------------------===//

#include "ernie/runtime/Checksum.h"

#include <xxhash.h>
// On x86-64 the library's dispatching entry points pick SSE2, AVX2 or
// AVX-512 when first called (the plain ones are built for the
// distribution's baseline, SSE2); the header maps XXH3_64bits to them. In a
// load, where a block is hashed just after it is read, SSE2 XXH3 was
// slower than the hand-written CRC-32C it replaced and the dispatched one
// faster (bench/README.md).
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

// XXH3's output is fixed from xxHash 0.8.0 on (it changed between earlier
// releases); a checkpoint's checksums must mean the same to every build.
static_assert(XXH_VERSION_NUMBER >= 800,
              "checkpoint checksums need xxHash 0.8.0 or later");

namespace ernie::runtime {

uint64_t xxh3(const void *data, size_t bytes) {
  return XXH3_64bits(data, bytes);
}

} // namespace ernie::runtime
