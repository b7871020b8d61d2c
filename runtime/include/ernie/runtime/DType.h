//===- DType.h - element types of runtime buffers ----------------*- C++ -*-===//
//
// The element types a program file names, with their storage sizes. They
// mirror the ernie dialect's element types one for one.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_DTYPE_H
#define ERNIE_RUNTIME_DTYPE_H

#include <cmath>
#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>

namespace ernie::runtime {

enum class DType {
  F64,
  F32,
  F16,
  BF16,
  F8E4M3FN,
  F8E5M2,
  I64,
  I32,
  I1,
};

/// Bytes one element occupies in a buffer (i1 is stored as one byte).
std::size_t byteSize(DType type);
/// The MLIR spelling: "f32", "bf16", "f8E4M3FN", "i1", ...
std::string_view name(DType type);
/// The inverse of name(); std::nullopt for an unknown spelling.
std::optional<DType> parseDType(std::string_view spelling);
/// True for the floating-point types.
bool isFloat(DType type);

/// max and min as the compiler folds them (llvm::maximum/minimum): a NaN in
/// either operand is the result, whichever side it is on. Kernels and
/// collectives share them so a NaN survives any reduction order.
template <typename T> T maximumOf(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (std::isnan(a) || std::isnan(b))
      return a + b;
  return a > b ? a : b;
}
template <typename T> T minimumOf(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (std::isnan(a) || std::isnan(b))
      return a + b;
  return a < b ? a : b;
}

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_DTYPE_H
