//===- Safetensors.h - the safetensors format, read and written ---*- C++ -*-===//
//
// Hugging Face's safetensors file: 8 bytes of little-endian header length N,
// N bytes of JSON ({name: {dtype, shape, data_offsets: [begin, end)}} and an
// optional "__metadata__" string map), then the tensors' raw little-endian
// row-major bytes, covering the data region with no holes or overlaps.
// Checkpoints (one file per writing rank) and Hugging Face weight folders
// are read and written through this, without Python.
//
// Reading validates everything before it hands out a byte: that the path is
// a regular file, the header's length against the file, the JSON (at most
// three levels deep), every dtype and shape, every extent
// against its dtype and shape, and the extents' exact cover of the data.
// Errors are std::runtime_error naming the file (and the tensor).
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_SAFETENSORS_H
#define ERNIE_RUNTIME_SAFETENSORS_H

#include "ernie/runtime/HostTensor.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ernie::runtime {

/// The safetensors spelling of `type` ("F32", "BF16", "F8_E4M3", ...).
const char *safetensorsDtype(DType type);
/// The DType of a safetensors dtype string; false when ernie has none.
bool parseSafetensorsDtype(const std::string &name, DType &type);

/// One tensor of a file: where its bytes are, relative to the data region.
struct SafetensorsEntry {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

/// An open, validated safetensors file. Reads are positioned (pread), so a
/// rank reads only the byte ranges it needs.
class SafetensorsFile {
public:
  /// Opens and validates `path`; throws std::runtime_error on any fault.
  explicit SafetensorsFile(const std::string &path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile &) = delete;
  SafetensorsFile &operator=(const SafetensorsFile &) = delete;

  const std::string &path() const { return path_; }
  /// The tensors, in header order.
  const std::vector<SafetensorsEntry> &tensors() const { return tensors_; }
  /// The entry named `name`, or null.
  const SafetensorsEntry *find(const std::string &name) const;
  const std::map<std::string, std::string> &metadata() const { return metadata_; }

  /// Copies `bytes` bytes from `offset` within tensor `name`'s data to `dst`.
  void readBytes(const std::string &name, uint64_t offset, uint64_t bytes,
                 void *dst) const;
  /// The whole tensor `name`.
  HostTensor read(const std::string &name) const;
  /// Where the data region starts: the length field and the header before
  /// it are the file's first dataStart() bytes.
  uint64_t dataStart() const { return dataStart_; }
  /// Copies `bytes` bytes at file offset `offset` (the header's bytes,
  /// say); throws past the end of the file.
  void readFileBytes(uint64_t offset, uint64_t bytes, void *dst) const;

private:
  std::string path_;
  int fd_ = -1;
  uint64_t dataStart_ = 0;
  std::vector<SafetensorsEntry> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// A safetensors file written as a stream: the header from the tensors'
/// names, dtypes and shapes first, then each tensor's bytes in that order,
/// so a writer holds one tensor at a time.
class SafetensorsWriter {
public:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
  };
  /// Creates `path` and writes the header; throws on an I/O fault or a
  /// repeated or reserved name.
  SafetensorsWriter(const std::string &path, const std::vector<Tensor> &tensors,
                    const std::map<std::string, std::string> &metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter &) = delete;
  SafetensorsWriter &operator=(const SafetensorsWriter &) = delete;
  /// Appends the next tensor's bytes (`bytes` must be its whole size, and
  /// tensors come in header order; appending in parts is allowed).
  void append(const void *bytes, uint64_t size);
  /// Checks every byte was written, fsyncs when `sync`, closes.
  void finish(bool sync = true);

private:
  std::string path_;
  int fd_ = -1;
  uint64_t expected_ = 0, written_ = 0;
};

/// Writes `tensors` (name, tensor; names distinct and not "__metadata__")
/// to `path` in order, with `metadata`; fsyncs the file when `sync`.
/// Throws std::runtime_error on an I/O fault.
void writeSafetensors(const std::string &path,
                      const std::vector<std::pair<std::string, const HostTensor *>> &tensors,
                      const std::map<std::string, std::string> &metadata = {},
                      bool sync = true);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_SAFETENSORS_H
