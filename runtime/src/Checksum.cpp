//===- Checksum.cpp - CRC-32C of byte ranges ------------------------------===//

#include "ernie/runtime/Checksum.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ernie::runtime {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u; // Castagnoli, reflected

/// shift[k][b]: the CRC register after byte b is followed by k zero bytes
/// (slicing by 8).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int k = 0; k < 8; ++k)
        c = c & 1 ? (c >> 1) ^ kPoly : c >> 1;
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b)
      for (int k = 1; k < 8; ++k)
        t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
};

uint32_t software(uint32_t crc, const unsigned char *p, size_t n) {
  static const Tables tables;
  const auto &t = tables.t;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^
          t[5][(word >> 16) & 0xFF] ^ t[4][(word >> 24) & 0xFF] ^
          t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^
          t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n--)
    crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return crc;
}

#if defined(__x86_64__)
/// The lanes three interleaved streams each run before they are combined.
constexpr size_t kLane = 4096;

/// Moves a CRC register past kLane zero bytes, by a table per byte of it
/// (the register's update is linear over GF(2)).
struct LaneShift {
  std::array<std::array<uint32_t, 256>, 4> t{};
  __attribute__((target("sse4.2"))) LaneShift() {
    uint32_t bit[32];
    for (int i = 0; i < 32; ++i) {
      uint64_t c = uint32_t(1) << i;
      for (size_t k = 0; k < kLane / 8; ++k)
        c = _mm_crc32_u64(c, 0);
      bit[i] = static_cast<uint32_t>(c);
    }
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int i = 0; i < 8; ++i)
          if (b >> i & 1)
            v ^= bit[8 * k + i];
        t[k][b] = v;
      }
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^
           t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t
hardware(uint32_t crc, const unsigned char *p, size_t n) {
  static const LaneShift shift;
  // Three independent streams hide the instruction's latency.
  while (n >= 3 * kLane) {
    uint64_t a = crc, b = 0, c = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t wa, wb, wc;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, p + kLane + i, 8);
      std::memcpy(&wc, p + 2 * kLane + i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      c = _mm_crc32_u64(c, wc);
    }
    crc = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(c);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--)
    c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif

} // namespace

uint32_t crc32c(uint32_t crc, const void *data, size_t bytes) {
  const auto *p = static_cast<const unsigned char *>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hasSse42 = __builtin_cpu_supports("sse4.2");
  crc = hasSse42 ? hardware(crc, p, bytes) : software(crc, p, bytes);
#else
  crc = software(crc, p, bytes);
#endif
  return ~crc;
}

} // namespace ernie::runtime
