//===- Shape.cpp - CPU kernels that move data: reshape, transpose, ... ------===//
//
// Dtype-agnostic: they copy elements of byteSize(type) bytes.
//
//===----------------------------------------------------------------------===//

#include "Registry.h"

#include <cstring>

namespace ernie::runtime::cpu {

namespace {

std::vector<int64_t> stridesOf(const std::vector<int64_t> &shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * shape[d + 1];
  return s;
}

/// Copies out[i] = in[source(coords of i in out)] element by element.
template <typename Fn>
void gatherElements(const TensorView &in, const TensorView &out, Fn source) {
  size_t bytes = byteSize(in.type);
  std::vector<int64_t> outStrides = stridesOf(out.shape),
                       inStrides = stridesOf(in.shape);
  std::vector<int64_t> coords(out.rank());
  const char *src = in.as<char>();
  char *dst = out.as<char>();
  for (int64_t i = 0, n = out.numElements(); i < n; ++i) {
    int64_t rest = i;
    for (int64_t d = 0; d < out.rank(); ++d) {
      coords[d] = rest / outStrides[d];
      rest %= outStrides[d];
    }
    int64_t from = source(coords, inStrides);
    std::memcpy(dst + i * bytes, src + from * bytes, bytes);
  }
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
    std::vector<int64_t> perm = attrs.getInts("perm");
    gatherElements(in[0], out[0], [&](const std::vector<int64_t> &c,
                                      const std::vector<int64_t> &strides) {
      int64_t from = 0;
      for (size_t d = 0; d < perm.size(); ++d)
        from += c[d] * strides[perm[d]];
      return from;
    });
  };
  r["ernie.broadcast"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &attrs) {
    expectCount(in, 1, "ernie.broadcast");
    std::vector<int64_t> dims = attrs.getInts("dims");
    gatherElements(in[0], out[0], [&](const std::vector<int64_t> &c,
                                      const std::vector<int64_t> &strides) {
      int64_t from = 0;
      for (size_t i = 0; i < dims.size(); ++i)
        if (in[0].shape[i] != 1)
          from += c[dims[i]] * strides[i];
      return from;
    });
  };
  r["ernie.slice"] = [](const std::vector<TensorView> &in,
                        const std::vector<TensorView> &out,
                        const Attrs &attrs) {
    expectCount(in, 1, "ernie.slice");
    std::vector<int64_t> start = attrs.getInts("start"),
                         step = attrs.getInts("step");
    gatherElements(in[0], out[0], [&](const std::vector<int64_t> &c,
                                      const std::vector<int64_t> &strides) {
      int64_t from = 0;
      for (size_t d = 0; d < c.size(); ++d)
        from += (start[d] + c[d] * step[d]) * strides[d];
      return from;
    });
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
}

} // namespace ernie::runtime::cpu
