//===- Safetensors.cpp - the safetensors format, read and written ----------===//

#include "ernie/runtime/Safetensors.h"
#include "ernie/runtime/BoundedInput.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <tuple>
#include <unistd.h>
#include <unordered_set>

namespace ernie::runtime {

namespace {

struct DtypeName {
  DType type;
  const char *name;
};
// bool is stored one byte per element, as ernie's i1.
constexpr DtypeName kDtypes[] = {
    {DType::F64, "F64"},          {DType::F32, "F32"},
    {DType::F16, "F16"},          {DType::BF16, "BF16"},
    {DType::F8E4M3FN, "F8_E4M3"}, {DType::F8E5M2, "F8_E5M2"},
    {DType::I64, "I64"},          {DType::I32, "I32"},
    {DType::I1, "BOOL"}};

/// The header's size limit: safetensors' own reference reader refuses
/// headers over 100 MB, which keeps a hostile length from allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
/// The header's JSON is {name: {dtype, shape: [...], data_offsets: [...]},
/// "__metadata__": {key: string}}: three levels; a deeper one is refused.
constexpr int kMaxHeaderDepth = 3;
/// Dimensions of one tensor.
constexpr size_t kMaxRank = 64;

[[noreturn]] void fail(const std::string &path, const std::string &why) {
  throw std::runtime_error(path + ": " + why);
}

void writeAll(int fd, const void *src, uint64_t bytes, const std::string &path) {
  auto *in = static_cast<const char *>(src);
  while (bytes > 0) {
    ssize_t put = ::write(fd, in, bytes);
    if (put < 0 && errno == EINTR)
      continue;
    if (put <= 0)
      fail(path, std::string("write failed: ") + std::strerror(errno));
    in += put;
    bytes -= put;
  }
}

} // namespace

const char *safetensorsDtype(DType type) {
  for (const DtypeName &d : kDtypes)
    if (d.type == type)
      return d.name;
  return "?";
}

bool parseSafetensorsDtype(const std::string &name, DType &type) {
  for (const DtypeName &d : kDtypes)
    if (name == d.name) {
      type = d.type;
      return true;
    }
  return false;
}

SafetensorsFile::SafetensorsFile(const std::string &path) : path_(path) {
  // A FIFO or a device is refused before anything blocks on it.
  RegularFile file(path);
  uint64_t fileBytes = file.size();
  fd_ = file.release();
  try {
    if (fileBytes < 8)
      fail(path, "too short for a safetensors header (" +
                     std::to_string(fileBytes) + " bytes)");
    unsigned char length[8];
    readExactly(fd_, length, 8, 0, path);
    uint64_t headerBytes = 0;
    for (int i = 7; i >= 0; --i)
      headerBytes = (headerBytes << 8) | length[i];
    if (headerBytes > kMaxHeaderBytes || headerBytes > fileBytes - 8)
      fail(path, "header length " + std::to_string(headerBytes) +
                     " does not fit the file of " + std::to_string(fileBytes) +
                     " bytes");
    std::string text(headerBytes, '\0');
    readExactly(fd_, text.data(), headerBytes, 8, path);
    dataStart_ = 8 + headerBytes;
    uint64_t dataBytes = fileBytes - dataStart_;

    JsonLimits limits;
    limits.maxDepth = kMaxHeaderDepth;
    limits.maxBytes = kMaxHeaderBytes;
    nlohmann::json header =
        parseBoundedJson(text, path + ": the header", limits);
    if (!header.is_object())
      fail(path, "the header is not a JSON object");
    for (auto &[key, value] : header.items()) {
      if (key == "__metadata__") {
        if (!value.is_object())
          fail(path, "__metadata__ is not an object");
        for (auto &[k, v] : value.items()) {
          if (!v.is_string())
            fail(path, "__metadata__ entry '" + k + "' is not a string");
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      std::string where = "tensor '" + key + "'";
      if (!value.is_object() || !value.contains("dtype") ||
          !value.contains("shape") || !value.contains("data_offsets"))
        fail(path, where + " needs dtype, shape and data_offsets");
      SafetensorsEntry e;
      e.name = key;
      const auto &dtype = value["dtype"];
      if (!dtype.is_string() || !parseSafetensorsDtype(dtype.get<std::string>(), e.type))
        fail(path, where + " has dtype " + briefJson(dtype) +
                       ", which ernie does not read");
      const auto &shape = value["shape"];
      if (!shape.is_array() || shape.size() > kMaxRank)
        fail(path, where + " has a shape that is not a list of at most " +
                       std::to_string(kMaxRank) + " sizes");
      uint64_t elements = 1;
      for (const auto &d : shape) {
        if (!d.is_number_unsigned())
          fail(path, where + " has a shape entry " + briefJson(d) +
                         " that is not a size");
        uint64_t n = d.get<uint64_t>();
        if (n > 0 && elements > UINT64_MAX / n)
          fail(path, where + " has a shape whose size overflows");
        elements *= n;
        e.shape.push_back(static_cast<int64_t>(n));
      }
      const auto &offsets = value["data_offsets"];
      if (!offsets.is_array() || offsets.size() != 2 ||
          !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
        fail(path, where + " has data_offsets that are not [begin, end)");
      e.begin = offsets[0].get<uint64_t>();
      e.end = offsets[1].get<uint64_t>();
      if (e.begin > e.end || e.end > dataBytes)
        fail(path, where + " has data_offsets [" + std::to_string(e.begin) +
                       ", " + std::to_string(e.end) + ") outside the " +
                       std::to_string(dataBytes) + " data bytes");
      if (elements > UINT64_MAX / byteSize(e.type) ||
          e.end - e.begin != elements * byteSize(e.type))
        fail(path, where + " holds " + std::to_string(e.end - e.begin) +
                       " bytes, not the " +
                       std::to_string(elements * byteSize(e.type)) +
                       " its dtype and shape need");
      index_[e.name] = tensors_.size();
      tensors_.push_back(std::move(e));
    }
    // The data region is covered exactly: sorted extents meet end to start.
    std::vector<const SafetensorsEntry *> sorted;
    for (const SafetensorsEntry &e : tensors_)
      sorted.push_back(&e);
    std::sort(sorted.begin(), sorted.end(), [](auto *a, auto *b) {
      return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
    });
    uint64_t next = 0;
    for (const SafetensorsEntry *e : sorted) {
      if (e->begin != next)
        fail(path, "tensor '" + e->name + "' starts at " +
                       std::to_string(e->begin) + ", not at " +
                       std::to_string(next) +
                       " (the data must be covered without holes or overlaps)");
      next = e->end;
    }
    if (next != dataBytes)
      fail(path, std::to_string(dataBytes - next) +
                     " bytes after the last tensor's data");
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0)
    ::close(fd_);
}

const SafetensorsEntry *SafetensorsFile::find(const std::string &name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::readBytes(const std::string &name, uint64_t offset,
                                uint64_t bytes, void *dst) const {
  const SafetensorsEntry *e = find(name);
  if (!e)
    fail(path_, "has no tensor '" + name + "'");
  if (offset > e->end - e->begin || bytes > e->end - e->begin - offset)
    fail(path_, "tensor '" + name + "': bytes [" + std::to_string(offset) +
                    ", " + std::to_string(offset + bytes) +
                    ") are outside its data");
  readExactly(fd_, dst, bytes, dataStart_ + e->begin + offset, path_);
}

void SafetensorsFile::readFileBytes(uint64_t offset, uint64_t bytes,
                                    void *dst) const {
  readExactly(fd_, dst, bytes, offset, path_);
}

HostTensor SafetensorsFile::read(const std::string &name) const {
  const SafetensorsEntry *e = find(name);
  if (!e)
    fail(path_, "has no tensor '" + name + "'");
  HostTensor t(e->type, e->shape);
  readBytes(name, 0, t.bytes.size(), t.bytes.data());
  return t;
}

SafetensorsWriter::SafetensorsWriter(const std::string &path,
                                     const std::vector<Tensor> &tensors,
                                     const std::map<std::string, std::string> &metadata)
    : path_(path) {
  // The header is composed as text, in the order given: a JSON object
  // built member by member (ordered_json's lookups are linear) would make
  // writing quadratic in the number of tensors.
  std::unordered_set<std::string> names;
  std::string text = "{";
  if (!metadata.empty())
    text += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  for (const Tensor &t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      fail(path, "tensor name '" + t.name + "' is reserved or repeated");
    uint64_t bytes = byteSize(t.type);
    for (int64_t d : t.shape)
      bytes *= static_cast<uint64_t>(d);
    nlohmann::ordered_json entry = {{"dtype", safetensorsDtype(t.type)},
                            {"shape", t.shape},
                            {"data_offsets", {expected_, expected_ + bytes}}};
    if (text.size() > 1)
      text += ',';
    text += nlohmann::json(t.name).dump() + ":" + entry.dump();
    expected_ += bytes;
  }
  text += '}';
  // Pad the header with spaces to 8 bytes, as the reference writer does,
  // so the data region starts aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail(path, std::string("cannot create: ") + std::strerror(errno));
  writeAll(fd_, length, 8, path);
  writeAll(fd_, text.data(), text.size(), path);
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0)
    ::close(fd_);
}

void SafetensorsWriter::append(const void *bytes, uint64_t size) {
  if (size > expected_ - written_)
    fail(path_, "more data than the header declares");
  writeAll(fd_, bytes, size, path_);
  written_ += size;
}

void SafetensorsWriter::finish(bool sync) {
  if (written_ != expected_)
    fail(path_, "closed after " + std::to_string(written_) + " of " +
                    std::to_string(expected_) + " data bytes");
  if (sync && ::fsync(fd_) != 0)
    fail(path_, std::string("fsync failed: ") + std::strerror(errno));
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0)
    fail(path_, std::string("close failed: ") + std::strerror(errno));
}

void writeSafetensors(
    const std::string &path,
    const std::vector<std::pair<std::string, const HostTensor *>> &tensors,
    const std::map<std::string, std::string> &metadata, bool sync) {
  std::vector<SafetensorsWriter::Tensor> header;
  for (const auto &[name, tensor] : tensors)
    header.push_back({name, tensor->type, tensor->shape});
  SafetensorsWriter writer(path, header, metadata);
  for (const auto &[name, tensor] : tensors)
    writer.append(tensor->bytes.data(), tensor->bytes.size());
  writer.finish(sync);
}

} // namespace ernie::runtime
