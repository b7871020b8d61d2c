//===- BoundedInput.h - files and JSON read within limits -------*- C++ -*-===//
//
// Every file ernie reads (a program, a rank file, an index shard, a weights
// file, a manifest, an .npy input) is opened through openRegularFile: a FIFO,
// a device or a directory is refused before the open could block, and the
// size is known before anything is allocated. Every JSON text (checkpoint
// manifests, safetensors headers, Hugging Face config and index files) is
// parsed through parseBoundedJson: nlohmann's DOM builder behind a SAX
// handler that refuses nesting deeper than the limit as it opens (the parser
// is iterative, but copying, comparing and dumping a value recurse) and
// containers holding more items than the limit, and texts longer than it.
// Linear in the text (nlohmann's parse callback is quadratic in an object's
// members). Errors are std::runtime_error naming the file.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_BOUNDEDINPUT_H
#define ERNIE_RUNTIME_BOUNDEDINPUT_H

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace ernie::runtime {

/// A read-only descriptor of a regular file, closed on destruction.
class RegularFile {
public:
  /// Opens `path`; throws naming it when it is missing, not a regular file
  /// (a FIFO, a device, a socket, a directory) or unreadable.
  explicit RegularFile(const std::string &path);
  ~RegularFile();
  RegularFile(RegularFile &&other) noexcept;
  RegularFile(const RegularFile &) = delete;
  RegularFile &operator=(const RegularFile &) = delete;
  RegularFile &operator=(RegularFile &&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  const std::string &path() const { return path_; }
  /// Reads exactly `bytes` at `offset`; throws on a short read.
  void readAt(void *dst, uint64_t bytes, uint64_t offset) const;
  /// The whole file, refused when larger than `maxBytes`.
  std::string readAll(uint64_t maxBytes) const;
  /// Gives up ownership of the descriptor.
  int release();

private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// Reads exactly `bytes` at `offset` of descriptor `fd` (pread, retried on
/// EINTR and short reads); throws naming `path` at the end of the file or
/// on an error.
void readExactly(int fd, void *dst, uint64_t bytes, uint64_t offset,
                 const std::string &path);

/// Throws naming `path` unless it is a regular file (stat, not open: a FIFO
/// is refused without blocking).
void requireRegularFile(const std::string &path);

struct JsonLimits {
  /// Arrays and objects nested deeper than this are refused.
  int maxDepth = 64;
  /// Elements of one array or members of one object.
  uint64_t maxItems = 1u << 22;
  /// The text's length.
  uint64_t maxBytes = 256u << 20;
};

/// Parses `text`; throws std::runtime_error "<where>: ..." when it is not
/// JSON or exceeds `limits`.
nlohmann::json parseBoundedJson(const std::string &text,
                                const std::string &where,
                                const JsonLimits &limits = {});
/// Reads regular file `path` (at most limits.maxBytes) and parses it.
nlohmann::json readBoundedJson(const std::string &path,
                               const JsonLimits &limits = {});
/// `value` serialised for an error message, cut to `maxChars`.
std::string briefJson(const nlohmann::json &value, size_t maxChars = 80);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_BOUNDEDINPUT_H
