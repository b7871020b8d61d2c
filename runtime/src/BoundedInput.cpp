//===- BoundedInput.cpp - files and JSON read within limits ---------------===//

#include "ernie/runtime/BoundedInput.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace ernie::runtime {

namespace {

[[noreturn]] void fail(const std::string &where, const std::string &why) {
  throw std::runtime_error(where + ": " + why);
}

const char *kindOf(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode))
    return "a device";
  if (S_ISSOCK(mode))
    return "a socket";
  return "not a regular file";
}

} // namespace

void requireRegularFile(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    fail(path, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    fail(path,
         std::string("is ") + kindOf(st.st_mode) + ", not a regular file");
}

RegularFile::RegularFile(const std::string &path) : path_(path) {
  requireRegularFile(path);
  // O_NONBLOCK: should the path become a FIFO after the stat, the open
  // returns at once and the fstat below refuses it.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0)
    fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail(path, "is not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

RegularFile::~RegularFile() {
  if (fd_ >= 0)
    ::close(fd_);
}

RegularFile::RegularFile(RegularFile &&other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), size_(other.size_) {
  other.fd_ = -1;
}

int RegularFile::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void readExactly(int fd, void *dst, uint64_t bytes, uint64_t offset,
                 const std::string &path) {
  auto *out = static_cast<char *>(dst);
  while (bytes > 0) {
    ssize_t got = ::pread(fd, out, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      fail(path, got == 0
                     ? "unexpected end of file"
                     : std::string("read failed: ") + std::strerror(errno));
    out += got;
    bytes -= got;
    offset += got;
  }
}

void RegularFile::readAt(void *dst, uint64_t bytes, uint64_t offset) const {
  readExactly(fd_, dst, bytes, offset, path_);
}

std::string RegularFile::readAll(uint64_t maxBytes) const {
  if (size_ > maxBytes)
    fail(path_, "is " + std::to_string(size_) + " bytes, over the limit of " +
                    std::to_string(maxBytes));
  std::string text(size_, '\0');
  readAt(text.data(), size_, 0);
  return text;
}

namespace {

/// nlohmann's DOM builder, refusing depth and counts as values arrive (a
/// SAX handler: the parse callback's bookkeeping is quadratic in the
/// members of an object).
class BoundedSax
    : public nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
  using Base = nlohmann::detail::json_sax_dom_parser<nlohmann::json>;
  using json = nlohmann::json;

public:
  BoundedSax(json &root, const JsonLimits &limits)
      : Base(root, /*allow_exceptions=*/true), limits_(limits) {}
  const std::string &refused() const { return refused_; }

  bool null() { return item() && Base::null(); }
  bool boolean(bool v) { return item() && Base::boolean(v); }
  bool number_integer(json::number_integer_t v) {
    return item() && Base::number_integer(v);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    return item() && Base::number_unsigned(v);
  }
  bool number_float(json::number_float_t v, const json::string_t &s) {
    return item() && Base::number_float(v, s);
  }
  bool string(json::string_t &v) { return item() && Base::string(v); }
  bool binary(json::binary_t &v) { return item() && Base::binary(v); }
  bool start_object(std::size_t n) {
    return item() && open() && Base::start_object(n);
  }
  bool end_object() {
    items_.pop_back();
    return Base::end_object();
  }
  bool start_array(std::size_t n) {
    return item() && open() && Base::start_array(n);
  }
  bool end_array() {
    items_.pop_back();
    return Base::end_array();
  }

private:
  /// A value in the innermost open container.
  bool item() {
    if (items_.empty() || ++items_.back() <= limits_.maxItems)
      return true;
    refused_ = "a container holds more than " +
               std::to_string(limits_.maxItems) + " items";
    return false;
  }
  bool open() {
    if (items_.size() >= static_cast<size_t>(std::max(limits_.maxDepth, 0))) {
      refused_ =
          "nested deeper than " + std::to_string(limits_.maxDepth) + " levels";
      return false;
    }
    items_.push_back(0);
    return true;
  }

  const JsonLimits &limits_;
  std::vector<uint64_t> items_; // per open container
  std::string refused_;
};

} // namespace

nlohmann::json parseBoundedJson(const std::string &text,
                                const std::string &where,
                                const JsonLimits &limits) {
  using json = nlohmann::json;
  if (text.size() > limits.maxBytes)
    fail(where, "the JSON text is " + std::to_string(text.size()) +
                    " bytes, over the limit of " +
                    std::to_string(limits.maxBytes));
  json j;
  try {
    BoundedSax sax(j, limits);
    if (!json::sax_parse(text, &sax))
      fail(where,
           "refused JSON: " + (sax.refused().empty() ? std::string("not valid")
                                                     : sax.refused()));
  } catch (const json::exception &e) {
    fail(where, std::string("not valid JSON: ") + e.what());
  }
  return j;
}

nlohmann::json readBoundedJson(const std::string &path,
                               const JsonLimits &limits) {
  return parseBoundedJson(RegularFile(path).readAll(limits.maxBytes), path,
                          limits);
}

std::string briefJson(const nlohmann::json &value, size_t maxChars) {
  // Containers are described, not dumped: a deep one would recurse.
  std::string text;
  if (value.is_object())
    text = "an object of " + std::to_string(value.size()) + " members";
  else if (value.is_array())
    text = "a list of " + std::to_string(value.size()) + " items";
  else
    text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > maxChars)
    text = text.substr(0, maxChars) + "...";
  return text;
}

} // namespace ernie::runtime
