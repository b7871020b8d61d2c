//===- HostTensor.h - owned tensors, shard pieces and .npy files -*- C++ -*-===//
//
// What callers of the runtime hand in and get back: a global or local tensor
// in host memory. A rank's piece of a global tensor follows the program's
// sharding exactly as the compiler's partitioner assumes: dimension d split
// over its axes in the order listed (major to minor), a pending sum held by
// the first member of each partial group (zeros elsewhere), a pending
// max/min/avg held by every member. A dimension its axes do not divide is
// split unevenly: every piece is `ceil(global / parts)` long and the last
// ones are padded with zeros (GSPMD's convention), which assembly drops.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_HOSTTENSOR_H
#define ERNIE_RUNTIME_HOSTTENSOR_H

#include "ernie/runtime/Kernel.h"
#include "ernie/runtime/Program.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ernie::runtime {

struct HostTensor {
  DType type = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  /// A zero-filled tensor.
  HostTensor(DType type, std::vector<int64_t> shape);

  int64_t numElements() const;
  /// A view for kernels; the tensor must outlive it.
  TensorView view() { return {bytes.data(), type, shape}; }
  template <typename T> T *as() { return reinterpret_cast<T *>(bytes.data()); }
  template <typename T> const T *as() const {
    return reinterpret_cast<const T *>(bytes.data());
  }
};

/// Copies the block `blockShape` at `src` into `dst` (of `dstShape`) with its
/// first element at `offsets`. Row-major, `elementBytes` per element.
void insertBlock(const uint8_t *src, const std::vector<int64_t> &blockShape,
                 uint8_t *dst, const std::vector<int64_t> &dstShape,
                 const std::vector<int64_t> &offsets, size_t elementBytes);
/// The inverse: copies the block of `blockShape` at `offsets` in `src` out
/// to the contiguous `dst`.
void extractBlock(const uint8_t *src, const std::vector<int64_t> &srcShape,
                  const std::vector<int64_t> &offsets, uint8_t *dst,
                  const std::vector<int64_t> &blockShape, size_t elementBytes);

/// Where `rank`'s piece of a tensor laid out as `spec` starts in the global
/// tensor.
std::vector<int64_t> pieceOffsets(const TensorSpec &spec, const Mesh &mesh,
                                  int64_t rank);
/// The part of the piece at `offsets` that lies inside the global tensor:
/// the local shape, less the padding of an uneven split (every piece has
/// the local shape `ceil(global / parts)`, the last ones padded). Empty
/// when the piece is all padding (a rank-0 tensor's extent is empty too, and
/// equals its local shape).
std::vector<int64_t> realExtent(const TensorSpec &spec,
                                const std::vector<int64_t> &offsets);

/// `rank`'s piece of `global` under `spec`'s sharding.
HostTensor pieceOf(const HostTensor &global, const TensorSpec &spec,
                   const Mesh &mesh, int64_t rank);
/// The global tensor from every rank's piece (indexed by rank), pending
/// reductions done in group order.
HostTensor assemble(const std::vector<HostTensor> &pieces,
                    const TensorSpec &spec, const Mesh &mesh);

/// `tensor` converted to `type` by the cast kernel (rounding once).
HostTensor convert(const HostTensor &tensor, DType type);

/// "[2, 3]", for messages.
std::string shapeString(const std::vector<int64_t> &shape);

/// NumPy's .npy format (version 1.0, little-endian, C order). bf16 and the
/// fp8 types have no NumPy dtype: they are written as their raw bits ('<u2',
/// '|u1'). Reading converts to `want` (an f32 file feeds a bf16 argument)
/// and takes raw bits only for a type of their width.
HostTensor readNpy(const std::string &path, DType want);
void writeNpy(const std::string &path, const HostTensor &tensor);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_HOSTTENSOR_H
