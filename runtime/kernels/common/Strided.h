//===- Strided.h - walking strided index spaces a row at a time -*- C++ -*-===//
//
// Transpose, broadcast, slice, pad and the reductions all map an output
// coordinate affinely onto an input offset. Instead of dividing every flat
// index back into coordinates, they describe each operand by element strides
// over one shape and walk it with an odometer over all but the innermost
// dimension, handing the innermost row to a loop (a memcpy, a fill, a
// vectorisable strided loop). Dimensions of extent 1 are dropped and
// neighbours that are contiguous in every operand merged first, so a
// transpose of [b, s, h, d] to [b, h, s, d] walks rows of d elements.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_KERNELS_CPU_STRIDED_H
#define ERNIE_RUNTIME_KERNELS_CPU_STRIDED_H

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ernie::runtime::cpu {

/// Per-operand containers: a fixed count (std::array<int64_t, N> offsets)
/// or one known only at run time (std::vector<int64_t>, a fused loop's).
template <typename Offsets> struct PerOperand;
template <size_t N> struct PerOperand<std::array<int64_t, N>> {
  template <typename T> using Of = std::array<T, N>;
  static Of<int64_t> zeros(size_t) { return {}; }
};
template <> struct PerOperand<std::vector<int64_t>> {
  template <typename T> using Of = std::vector<T>;
  static Of<int64_t> zeros(size_t n) { return Of<int64_t>(n, 0); }
};

/// One shape and, per operand, its element stride along each dimension
/// (0: the operand does not move along it, as a broadcast's input).
template <typename Offsets> struct BasicStridedSpace {
  using Operands = PerOperand<Offsets>;
  std::vector<int64_t> shape;
  typename Operands::template Of<std::vector<int64_t>> strides;

  /// Drops extent-1 dimensions and merges dimension d into d + 1 where
  /// every operand steps over d + 1 exactly once per step of d.
  void simplify() {
    const size_t n = strides.size();
    std::vector<int64_t> s;
    auto t = strides;
    for (auto &each : t)
      each.clear();
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1)
        continue;
      bool merge = !s.empty();
      for (size_t k = 0; k < n && merge; ++k)
        merge = t[k].back() == strides[k][d] * shape[d];
      if (merge) {
        s.back() *= shape[d];
        for (size_t k = 0; k < n; ++k)
          t[k].back() = strides[k][d];
        continue;
      }
      s.push_back(shape[d]);
      for (size_t k = 0; k < n; ++k)
        t[k].push_back(strides[k][d]);
    }
    shape = std::move(s);
    strides = std::move(t);
  }

  /// fn(offsets, length, innerStrides): every innermost row, in row-major
  /// order of the shape, with each operand's element offset at its start.
  template <typename Fn> void forEachRow(Fn fn) const {
    const size_t n = strides.size();
    const int64_t rank = static_cast<int64_t>(shape.size());
    Offsets offsets = Operands::zeros(n), inner = Operands::zeros(n);
    if (rank == 0) {
      fn(offsets, int64_t(1), inner);
      return;
    }
    for (int64_t e : shape)
      if (e == 0)
        return;
    for (size_t k = 0; k < n; ++k)
      inner[k] = strides[k][rank - 1];
    const int64_t length = shape[rank - 1];
    std::vector<int64_t> coords(rank - 1, 0);
    while (true) {
      fn(offsets, length, inner);
      int64_t d = rank - 2;
      for (; d >= 0; --d) {
        for (size_t k = 0; k < n; ++k)
          offsets[k] += strides[k][d];
        if (++coords[d] < shape[d])
          break;
        for (size_t k = 0; k < n; ++k)
          offsets[k] -= strides[k][d] * shape[d];
        coords[d] = 0;
      }
      if (d < 0)
        return;
    }
  }
};

template <size_t N> using StridedSpace = BasicStridedSpace<std::array<int64_t, N>>;
/// As many operands as a fused loop has loads and stores.
using DynamicStridedSpace = BasicStridedSpace<std::vector<int64_t>>;

/// dst[space] = src[space] for elements of `bytes` bytes (operand 0: the
/// destination, 1: the source), a row at a time.
inline void copyStrided(StridedSpace<2> space, char *dst, const char *src,
                        size_t bytes) {
  space.simplify();
  auto rows = [&](auto unit) {
    using U = decltype(unit);
    space.forEachRow([&](const std::array<int64_t, 2> &at, int64_t n,
                         const std::array<int64_t, 2> &step) {
      U *to = reinterpret_cast<U *>(dst + at[0] * bytes);
      const U *from = reinterpret_cast<const U *>(src + at[1] * bytes);
      if (step[0] == 1 && step[1] == 1) {
        std::memcpy(to, from, n * sizeof(U));
      } else if (step[1] == 0) {
        U v;
        std::memcpy(&v, from, sizeof(U));
        for (int64_t i = 0; i < n; ++i)
          to[i * step[0]] = v;
      } else {
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(to + i * step[0], from + i * step[1], sizeof(U));
      }
    });
  };
  switch (bytes) {
  case 1: return rows(uint8_t{});
  case 2: return rows(uint16_t{});
  case 4: return rows(uint32_t{});
  case 8: return rows(uint64_t{});
  default: {
    // Any other width: scale strides and copy bytes.
    for (size_t k = 0; k < 2; ++k)
      for (int64_t &s : space.strides[k])
        s *= static_cast<int64_t>(bytes);
    return copyStrided(std::move(space), dst, src, 1);
  }
  }
}

} // namespace ernie::runtime::cpu

#endif // ERNIE_RUNTIME_KERNELS_CPU_STRIDED_H
