//===- HostTensor.cpp - shard pieces, assembly and .npy files ---------------===//

#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/BoundedInput.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

namespace ernie::runtime {

HostTensor::HostTensor(DType type, std::vector<int64_t> shape)
    : type(type), shape(std::move(shape)) {
  bytes.assign(numElements() * byteSize(type), 0);
}

int64_t HostTensor::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

namespace {

/// Walks every row (the innermost dimension) of a block inside a larger
/// array, calling `row(blockOffset, arrayOffset, rowBytes)` in bytes.
void forEachRow(const std::vector<int64_t> &blockShape,
                const std::vector<int64_t> &arrayShape,
                const std::vector<int64_t> &offsets, size_t elementBytes,
                const std::function<void(size_t, size_t, size_t)> &row) {
  size_t rank = blockShape.size();
  if (rank == 0) {
    row(0, 0, elementBytes);
    return;
  }
  for (int64_t d : blockShape)
    if (d == 0)
      return;
  std::vector<int64_t> arrayStrides(rank, 1);
  for (size_t d = rank - 1; d-- > 0;)
    arrayStrides[d] = arrayStrides[d + 1] * arrayShape[d + 1];
  size_t rowBytes = blockShape[rank - 1] * elementBytes;
  std::vector<int64_t> index(rank, 0);
  size_t blockOffset = 0;
  while (true) {
    int64_t arrayElement = 0;
    for (size_t d = 0; d < rank; ++d)
      arrayElement += (index[d] + offsets[d]) * arrayStrides[d];
    row(blockOffset, arrayElement * elementBytes, rowBytes);
    blockOffset += rowBytes;
    int64_t d = static_cast<int64_t>(rank) - 2; // rows advance the outer dims
    for (; d >= 0; --d) {
      if (++index[d] < blockShape[d])
        break;
      index[d] = 0;
    }
    if (d < 0)
      return;
  }
}

void requireShape(const HostTensor &t, const std::vector<int64_t> &shape,
                  DType type, const std::string &what) {
  if (t.shape != shape || t.type != type) {
    std::ostringstream os;
    os << what << " must be " << name(type) << "[";
    for (size_t i = 0; i < shape.size(); ++i)
      os << (i ? ", " : "") << shape[i];
    os << "], not " << name(t.type) << "[";
    for (size_t i = 0; i < t.shape.size(); ++i)
      os << (i ? ", " : "") << t.shape[i];
    os << "]";
    throw std::invalid_argument(os.str());
  }
}

} // namespace

std::vector<int64_t> pieceOffsets(const TensorSpec &spec, const Mesh &mesh,
                                  int64_t rank) {
  std::vector<int64_t> offsets(spec.localShape.size(), 0);
  for (size_t d = 0; d < spec.sharding.dims.size(); ++d)
    offsets[d] =
        mesh.indexInGroup(rank, spec.sharding.dims[d]) * spec.localShape[d];
  return offsets;
}

std::vector<int64_t> realExtent(const TensorSpec &spec,
                                const std::vector<int64_t> &offsets) {
  std::vector<int64_t> real(spec.localShape.size());
  for (size_t d = 0; d < real.size(); ++d) {
    real[d] = std::min(spec.localShape[d], spec.globalShape[d] - offsets[d]);
    if (real[d] <= 0)
      return {};
  }
  return real;
}

void insertBlock(const uint8_t *src, const std::vector<int64_t> &blockShape,
                 uint8_t *dst, const std::vector<int64_t> &dstShape,
                 const std::vector<int64_t> &offsets, size_t elementBytes) {
  forEachRow(blockShape, dstShape, offsets, elementBytes,
             [&](size_t b, size_t a, size_t n) { std::memcpy(dst + a, src + b, n); });
}

void extractBlock(const uint8_t *src, const std::vector<int64_t> &srcShape,
                  const std::vector<int64_t> &offsets, uint8_t *dst,
                  const std::vector<int64_t> &blockShape, size_t elementBytes) {
  forEachRow(blockShape, srcShape, offsets, elementBytes,
             [&](size_t b, size_t a, size_t n) { std::memcpy(dst + b, src + a, n); });
}

HostTensor pieceOf(const HostTensor &global, const TensorSpec &spec,
                   const Mesh &mesh, int64_t rank) {
  requireShape(global, spec.globalShape, spec.type,
               spec.name.empty() ? "the input" : "'" + spec.name + "'");
  HostTensor piece(spec.type, spec.localShape);
  std::vector<int64_t> coords = mesh.coordinates(rank);
  for (const auto &[axis, kind] : spec.sharding.partials)
    if (kind == ReduceOp::Sum && coords[mesh.axisIndex(axis)] != 0)
      return piece; // the first member holds the whole pending sum
  std::vector<int64_t> offsets = pieceOffsets(spec, mesh, rank);
  std::vector<int64_t> real = realExtent(spec, offsets);
  if (real == piece.shape) {
    extractBlock(global.bytes.data(), global.shape, offsets, piece.bytes.data(),
                 piece.shape, byteSize(spec.type));
  } else if (!real.empty()) {
    // A padded piece: its real part, zeros past the global edge.
    HostTensor block(spec.type, real);
    extractBlock(global.bytes.data(), global.shape, offsets, block.bytes.data(),
                 real, byteSize(spec.type));
    insertBlock(block.bytes.data(), real, piece.bytes.data(), piece.shape,
                std::vector<int64_t>(real.size(), 0), byteSize(spec.type));
  }
  return piece;
}

HostTensor assemble(const std::vector<HostTensor> &pieces,
                    const TensorSpec &spec, const Mesh &mesh) {
  if (static_cast<int64_t>(pieces.size()) != mesh.numRanks())
    throw std::invalid_argument("assemble needs one piece per rank");
  for (const HostTensor &p : pieces)
    requireShape(p, spec.localShape, spec.type, "a piece");
  HostTensor global(spec.type, spec.globalShape);
  size_t count = spec.localShape.empty() ? 1 : pieces[0].numElements();
  // The value at `rank` once the pending reductions from `next` on are done,
  // each over its group in group order (as the collectives would do it).
  std::function<HostTensor(int64_t, size_t)> complete = [&](int64_t rank,
                                                            size_t next) {
    if (next == spec.sharding.partials.size())
      return pieces[rank];
    const auto &[axis, kind] = spec.sharding.partials[next];
    std::vector<HostTensor> members;
    for (int64_t m : mesh.group(rank, {axis}))
      members.push_back(complete(m, next + 1));
    std::vector<const void *> inputs;
    for (const HostTensor &m : members)
      inputs.push_back(m.bytes.data());
    HostTensor out(spec.type, spec.localShape);
    reduceInOrder(inputs, out.bytes.data(), count, spec.type, kind);
    return out;
  };
  for (int64_t rank = 0; rank < mesh.numRanks(); ++rank) {
    std::vector<int64_t> coords = mesh.coordinates(rank);
    bool leader = true;
    for (const auto &partial : spec.sharding.partials)
      leader &= coords[mesh.axisIndex(partial.first)] == 0;
    if (!leader)
      continue;
    HostTensor value = complete(rank, 0);
    std::vector<int64_t> offsets = pieceOffsets(spec, mesh, rank);
    std::vector<int64_t> real = realExtent(spec, offsets);
    if (real.empty() && !spec.localShape.empty())
      continue; // all padding
    if (real != spec.localShape) {
      HostTensor block(spec.type, real);
      extractBlock(value.bytes.data(), spec.localShape,
                   std::vector<int64_t>(real.size(), 0), block.bytes.data(),
                   real, byteSize(spec.type));
      value = std::move(block);
    }
    insertBlock(value.bytes.data(), real, global.bytes.data(), global.shape,
                offsets, byteSize(spec.type));
  }
  return global;
}

HostTensor convert(const HostTensor &tensor, DType type) {
  if (tensor.type == type)
    return tensor;
  HostTensor out(type, tensor.shape);
  HostTensor in = tensor;
  const Kernel *cast = findCpuKernel("ernie.cast");
  (*cast)({in.view()}, {out.view()}, Attrs{});
  return out;
}

//===----------------------------------------------------------------------===//
// .npy
//===----------------------------------------------------------------------===//

namespace {

/// The NumPy descr of `type`; raw bits for the types NumPy lacks.
const char *npyDescr(DType type) {
  switch (type) {
  case DType::F64: return "<f8";
  case DType::F32: return "<f4";
  case DType::F16: return "<f2";
  case DType::BF16: return "<u2";
  case DType::F8E4M3FN:
  case DType::F8E5M2: return "|u1";
  case DType::I64: return "<i8";
  case DType::I32: return "<i4";
  case DType::I1: return "|b1";
  }
  return "";
}

std::optional<DType> fromDescr(const std::string &descr) {
  for (DType t : {DType::F64, DType::F32, DType::F16, DType::I64, DType::I32,
                  DType::I1})
    if (descr == npyDescr(t))
      return t;
  return std::nullopt;
}

/// The value of `key` in the header dict ("'descr': '<f4', ...").
std::string headerField(const std::string &header, const std::string &key,
                        const std::string &path) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos)
    throw std::runtime_error(path + ": .npy header has no '" + key + "'");
  at = header.find(':', at);
  size_t end = key == "shape" ? header.find(')', at) : header.find(',', at);
  if (at == std::string::npos || end == std::string::npos)
    throw std::runtime_error(path + ": .npy header's '" + key +
                             "' is malformed");
  return header.substr(at + 1, end + (key == "shape") - at - 1);
}

std::string trim(std::string s) {
  const char *space = " '\"";
  s.erase(0, s.find_first_not_of(space));
  s.erase(s.find_last_not_of(space) + 1);
  return s;
}

} // namespace

/// The longest .npy header read (NumPy's own reader refuses over 10000).
constexpr uint32_t kMaxNpyHeader = 1u << 16;
/// Dimensions of an .npy array.
constexpr size_t kMaxNpyRank = 64;

HostTensor readNpy(const std::string &path, DType want) {
  // A FIFO or device is refused up front; sizes are checked against the
  // file's before anything is allocated.
  RegularFile file(path);
  auto truncated = [&](const std::string &what) {
    return std::runtime_error(path + ": truncated " + what);
  };
  unsigned char magic[8];
  if (file.size() < 10)
    throw std::runtime_error(path + ": not a .npy file");
  file.readAt(magic, 8, 0);
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0 || magic[6] < 1 || magic[6] > 3)
    throw std::runtime_error(path + ": not a .npy file");
  uint64_t headerLength = 0, at = 8;
  uint8_t len[4] = {0, 0, 0, 0};
  if (magic[6] == 1) {
    file.readAt(len, 2, at);
    at += 2;
  } else {
    if (file.size() < 12)
      throw truncated(".npy header");
    file.readAt(len, 4, at);
    at += 4;
  }
  headerLength =
      len[0] | (len[1] << 8) | (len[2] << 16) | (uint64_t(len[3]) << 24);
  if (headerLength > kMaxNpyHeader)
    throw std::runtime_error(
        path + ": .npy header length " + std::to_string(headerLength) +
        " is over the limit of " + std::to_string(kMaxNpyHeader));
  if (headerLength > file.size() - at)
    throw truncated(".npy header");
  std::string header(headerLength, '\0');
  file.readAt(header.data(), headerLength, at);
  at += headerLength;
  std::string descr = trim(headerField(header, "descr", path));
  if (trim(headerField(header, "fortran_order", path)) != "False")
    throw std::runtime_error(path + ": Fortran-ordered arrays are not supported");
  // "(2, 8)", "(4,)", "()": sizes, each a plain non-negative integer.
  std::string shapeText = trim(headerField(header, "shape", path));
  if (shapeText.size() < 2 || shapeText.front() != '(' ||
      shapeText.back() != ')')
    throw std::runtime_error(path + ": .npy shape '" + shapeText +
                             "' is not a tuple");
  std::vector<int64_t> shape;
  std::string inner = shapeText.substr(1, shapeText.size() - 2);
  for (size_t i = 0; i <= inner.size();) {
    size_t comma = std::min(inner.find(',', i), inner.size());
    std::string item = trim(inner.substr(i, comma - i));
    bool last = comma == inner.size();
    if (item.empty() && last &&
        (!shape.empty() || inner.find_first_not_of(' ') == std::string::npos))
      break; // "(4,)" and "()"
    if (item.empty() || item.size() > 18 ||
        item.find_first_not_of("0123456789") != std::string::npos)
      throw std::runtime_error(
          path + ": .npy shape '" + shapeText +
          "' has a size that is not a non-negative integer");
    shape.push_back(std::stoll(item));
    if (shape.size() > kMaxNpyRank)
      throw std::runtime_error(path + ": .npy shape has more than " +
                               std::to_string(kMaxNpyRank) + " dimensions");
    i = comma + 1;
  }
  DType stored;
  if (auto t = fromDescr(descr)) {
    stored = *t;
  } else if (descr == npyDescr(want)) {
    stored = want; // raw bits of bf16 or fp8
  } else {
    throw std::runtime_error(path + ": dtype '" + descr + "' cannot hold " +
                             std::string(name(want)));
  }
  if (isFloat(stored) != isFloat(want) && !(stored == DType::I1 || want == DType::I1))
    throw std::runtime_error(path + ": holds " + std::string(name(stored)) +
                             ", expected " + std::string(name(want)));
  // The data the shape declares must be in the file before it is allocated.
  uint64_t bytes = byteSize(stored), available = file.size() - at;
  for (int64_t d : shape) {
    if (d > 0 && bytes > available / uint64_t(d))
      throw truncated("data (the shape " + shapeString(shape) +
                      " needs more than the " + std::to_string(available) +
                      " bytes after the header)");
    bytes *= uint64_t(d);
  }
  if (bytes > available)
    throw truncated("data");
  HostTensor t(stored, shape);
  file.readAt(t.bytes.data(), t.bytes.size(), at);
  return convert(t, want);
}

void writeNpy(const std::string &path, const HostTensor &tensor) {
  std::ostringstream dict;
  dict << "{'descr': '" << npyDescr(tensor.type)
       << "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < tensor.shape.size(); ++i)
    dict << tensor.shape[i] << (tensor.shape.size() == 1 || i + 1 < tensor.shape.size() ? "," : "");
  dict << "), }";
  std::string header = dict.str();
  // Pad with spaces so the data starts 64-byte aligned; end with a newline.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out)
    throw std::runtime_error(path + ": cannot write");
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  char lenBytes[2] = {char(len & 0xff), char(len >> 8)};
  out.write(lenBytes, 2);
  out.write(header.data(), header.size());
  out.write(reinterpret_cast<const char *>(tensor.bytes.data()), tensor.bytes.size());
  if (!out)
    throw std::runtime_error(path + ": write failed");
}

std::string shapeString(const std::vector<int64_t> &shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i)
    os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

} // namespace ernie::runtime
