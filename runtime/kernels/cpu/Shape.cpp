//===- Shape.cpp - CPU kernels that move data: reshape, transpose, ... ------===//
//
// Dtype-agnostic: they copy elements of byteSize(type) bytes. index_add and
// topk compute, so they see narrow floats as f32.
//
//===----------------------------------------------------------------------===//

#include "kernels/common/Registry.h"
#include "kernels/common/Strided.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace ernie::runtime::cpu {

namespace {

/// out[c] = in[base + sum_d c_d * from[d]] over out's coordinates c.
void gatherStrided(const TensorView &in, const TensorView &out, int64_t base,
                   std::vector<int64_t> from) {
  StridedSpace<2> space{out.shape, {stridesOf(out.shape), std::move(from)}};
  copyStrided(std::move(space), out.as<char>(),
              in.as<char>() + base * byteSize(in.type), byteSize(in.type));
}

} // namespace

void registerShapeKernels(Registry &r) {
  r["ernie.reshape"] = [](const std::vector<TensorView> &in,
                          const std::vector<TensorView> &out, const Attrs &) {
    expectCount(in, 1, "ernie.reshape");
    if (out[0].data != in[0].data)
      std::memcpy(out[0].data, in[0].data,
                  in[0].numElements() * byteSize(in[0].type));
  };
  r["ernie.transpose"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &attrs) {
    expectCount(in, 1, "ernie.transpose");
    StridedView v = transposeView(in[0].shape, attrs.getInts("perm"));
    gatherStrided(in[0], out[0], v.base, std::move(v.strides));
  };
  r["ernie.broadcast"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &attrs) {
    expectCount(in, 1, "ernie.broadcast");
    StridedView v =
        broadcastView(in[0].shape, out[0].rank(), attrs.getInts("dims"));
    gatherStrided(in[0], out[0], v.base, std::move(v.strides));
  };
  r["ernie.slice"] = [](const std::vector<TensorView> &in,
                        const std::vector<TensorView> &out,
                        const Attrs &attrs) {
    expectCount(in, 1, "ernie.slice");
    StridedView v = sliceView(in[0].shape, attrs.getInts("start"),
                              attrs.getInts("step"));
    gatherStrided(in[0], out[0], v.base, std::move(v.strides));
  };
  r["ernie.pad"] = [](const std::vector<TensorView> &in,
                      const std::vector<TensorView> &out, const Attrs &attrs) {
    expectCount(in, 1, "ernie.pad");
    size_t bytes = byteSize(out[0].type);
    std::memset(out[0].data, 0, out[0].numElements() * bytes);
    // The input scattered into the zeros.
    StridedView v = padView(out[0].shape, attrs.getInts("low"),
                            attrs.getInts("interior"));
    StridedSpace<2> space{in[0].shape,
                          {std::move(v.strides), stridesOf(in[0].shape)}};
    copyStrided(std::move(space), out[0].as<char>() + v.base * bytes,
                in[0].as<char>(), bytes);
  };
  r["ernie.split"] = [](const std::vector<TensorView> &in,
                        const std::vector<TensorView> &out,
                        const Attrs &attrs) {
    expectCount(in, 1, "ernie.split");
    int64_t axis = attrs.getInt("axis");
    size_t bytes = byteSize(in[0].type);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d)
      outer *= in[0].shape[d];
    for (int64_t d = axis + 1; d < in[0].rank(); ++d)
      inner *= in[0].shape[d];
    int64_t rowBytes = in[0].shape[axis] * inner * bytes, offset = 0;
    for (const TensorView &piece : out) {
      int64_t pieceBytes = piece.shape[axis] * inner * bytes;
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(piece.as<char>() + o * pieceBytes,
                    in[0].as<char>() + o * rowBytes + offset, pieceBytes);
      offset += pieceBytes;
    }
  };
  r["ernie.concat"] = [](const std::vector<TensorView> &in,
                         const std::vector<TensorView> &out,
                         const Attrs &attrs) {
    int64_t axis = attrs.getInt("axis");
    size_t bytes = byteSize(out[0].type);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d)
      outer *= out[0].shape[d];
    for (int64_t d = axis + 1; d < out[0].rank(); ++d)
      inner *= out[0].shape[d];
    char *dst = out[0].as<char>();
    int64_t rowBytes = out[0].shape[axis] * inner * bytes, offset = 0;
    for (const TensorView &piece : in) {
      int64_t pieceBytes = piece.shape[axis] * inner * bytes;
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(dst + o * rowBytes + offset,
                    piece.as<char>() + o * pieceBytes, pieceBytes);
      offset += pieceBytes;
    }
  };
  // Byte copies: narrow floats (NaN payloads included) pass through as bits.
  r.everyType.insert({"ernie.reshape", "ernie.transpose", "ernie.broadcast",
                      "ernie.slice", "ernie.pad", "ernie.split",
                      "ernie.concat"});
}

int64_t indexAt(const TensorView &v, int64_t i) {
  switch (v.type) {
  case DType::I64:
    return v.as<int64_t>()[i];
  case DType::I32:
    return v.as<int32_t>()[i];
  default:
    throw KernelError("indices must be i32 or i64");
  }
}

double scalarAt(const TensorView &v) {
  if (!isFloat(v.type))
    throw KernelError("scalars must be floats, got " +
                      std::string(name(v.type)));
  return loadAsDouble(v, 0);
}

void registerIndexingKernels(Registry &r) {
  // result[a, i, b] = input[a, indices[i], b]
  r["ernie.gather"] = [](const std::vector<TensorView> &in,
                         const std::vector<TensorView> &out,
                         const Attrs &attrs) {
    expectCount(in, 2, "ernie.gather");
    int64_t axis = attrs.getInt("axis");
    const TensorView &x = in[0], &idx = in[1];
    size_t bytes = byteSize(x.type);
    int64_t outer = 1, inner = 1, count = idx.numElements(),
            size = x.shape[axis];
    for (int64_t d = 0; d < axis; ++d)
      outer *= x.shape[d];
    for (int64_t d = axis + 1; d < x.rank(); ++d)
      inner *= x.shape[d];
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < count; ++i) {
        int64_t row = indexAt(idx, i);
        if (row < 0 || row >= size)
          throw KernelError("gather index " + std::to_string(row) +
                            " is outside [0, " + std::to_string(size) + ")");
        std::memcpy(out[0].as<char>() + (o * count + i) * inner * bytes,
                    x.as<char>() + (o * size + row) * inner * bytes,
                    inner * bytes);
      }
  };
  r["ernie.embedding"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &) {
    expectCount(in, 2, "ernie.embedding");
    const TensorView &idx = in[0], &table = in[1];
    size_t rowBytes = table.shape[1] * byteSize(table.type);
    for (int64_t i = 0, n = idx.numElements(); i < n; ++i) {
      int64_t row = indexAt(idx, i);
      if (row < 0 || row >= table.shape[0])
        throw KernelError("embedding index " + std::to_string(row) +
                          " is outside the vocabulary of " +
                          std::to_string(table.shape[0]));
      std::memcpy(out[0].as<char>() + i * rowBytes,
                  table.as<char>() + row * rowBytes, rowBytes);
    }
  };
  // result = base; result[a, indices[i], b] += updates[a, i, b]
  r["ernie.index_add"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &attrs) {
    expectCount(in, 3, "ernie.index_add");
    int64_t axis = attrs.getInt("axis");
    const TensorView &base = in[0], &idx = in[1], &updates = in[2];
    int64_t outer = 1, inner = 1, count = idx.numElements(),
            size = base.shape[axis];
    for (int64_t d = 0; d < axis; ++d)
      outer *= base.shape[d];
    for (int64_t d = axis + 1; d < base.rank(); ++d)
      inner *= base.shape[d];
    dispatchNumeric(base.type, [&](auto zero) {
      using T = decltype(zero);
      T *y = out[0].as<T>();
      if (y != base.as<T>())
        std::memcpy(y, base.data, base.numElements() * sizeof(T));
      const T *u = updates.as<T>();
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < count; ++i) {
          int64_t row = indexAt(idx, i);
          if (row < 0 || row >= size)
            throw KernelError("index_add index out of range");
          for (int64_t j = 0; j < inner; ++j)
            y[(o * size + row) * inner + j] += u[(o * count + i) * inner + j];
        }
    });
  };
  // Sorted values and their i64 indices along an axis; ties: lower index first.
  r["ernie.topk"] = [](const std::vector<TensorView> &in,
                       const std::vector<TensorView> &out,
                       const Attrs &attrs) {
    expectCount(in, 1, "ernie.topk");
    int64_t axis = attrs.getInt("axis"), k = attrs.getInt("k");
    bool largest = !attrs.has("largest") || attrs.getBool("largest");
    const TensorView &x = in[0];
    int64_t outer = 1, inner = 1, size = x.shape[axis];
    if (k < 0 || k > size)
      throw KernelError("ernie.topk: k = " + std::to_string(k) +
                        " is outside [0, " + std::to_string(size) + "]");
    for (int64_t d = 0; d < axis; ++d)
      outer *= x.shape[d];
    for (int64_t d = axis + 1; d < x.rank(); ++d)
      inner *= x.shape[d];
    dispatchNumeric(x.type, [&](auto zero) {
      using T = decltype(zero);
      std::vector<int64_t> order(size);
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < inner; ++j) {
          auto at = [&](int64_t p) { return x.as<T>()[(o * size + p) * inner + j]; };
          for (int64_t p = 0; p < size; ++p)
            order[p] = p;
          // NaN counts as larger than every number (as in PyTorch), so the
          // comparison stays a strict weak order.
          auto less = [](T a, T b) {
            if constexpr (std::is_floating_point_v<T>)
              if (std::isnan(a) || std::isnan(b))
                return !std::isnan(a);
            return a < b;
          };
          std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
            return largest ? less(at(b), at(a)) : less(at(a), at(b));
          });
          for (int64_t p = 0; p < k; ++p) {
            out[0].as<T>()[(o * k + p) * inner + j] = at(order[p]);
            out[1].as<int64_t>()[(o * k + p) * inner + j] = order[p];
          }
        }
    });
  };
  r.everyType.insert({"ernie.gather", "ernie.embedding"}); // byte copies
}

} // namespace ernie::runtime::cpu
