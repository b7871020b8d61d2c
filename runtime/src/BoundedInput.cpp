//===- BoundedInput.cpp - files and JSON read within stated limits
//---------===//

#include "ernie/runtime/BoundedInput.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

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

void RegularFile::readAt(void *dst, uint64_t bytes, uint64_t offset) const {
  auto *out = static_cast<char *>(dst);
  while (bytes > 0) {
    ssize_t got = ::pread(fd_, out, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      fail(path_, got == 0
                      ? "unexpected end of file"
                      : std::string("read failed: ") + std::strerror(errno));
    out += got;
    bytes -= got;
    offset += got;
  }
}

std::string RegularFile::readAll(uint64_t maxBytes) const {
  if (size_ > maxBytes)
    fail(path_, "is " + std::to_string(size_) + " bytes, over the limit of " +
                    std::to_string(maxBytes));
  std::string text(size_, '\0');
  readAt(text.data(), size_, 0);
  return text;
}

nlohmann::json parseBoundedJson(const std::string &text,
                                const std::string &where,
                                const JsonLimits &limits) {
  using json = nlohmann::json;
  if (text.size() > limits.maxBytes)
    fail(where, "the JSON text is " + std::to_string(text.size()) +
                    " bytes, over the limit of " +
                    std::to_string(limits.maxBytes));
  // The callback sees each container open before its contents and each
  // value as it is added: depth and counts are refused before they grow.
  struct Refused {
    std::string why;
  };
  std::vector<uint64_t> items; // per open container
  auto check = [&](int depth, json::parse_event_t event, json &) {
    switch (event) {
    case json::parse_event_t::object_start:
    case json::parse_event_t::array_start:
      if (depth >= limits.maxDepth)
        throw Refused{"nested deeper than " + std::to_string(limits.maxDepth) +
                      " levels"};
      items.push_back(0);
      break;
    case json::parse_event_t::key:
      break;
    case json::parse_event_t::object_end:
    case json::parse_event_t::array_end:
      if (!items.empty())
        items.pop_back();
      [[fallthrough]]; // the container is an item of the one around it
    case json::parse_event_t::value:
      if (!items.empty() && ++items.back() > limits.maxItems)
        throw Refused{"a container holds more than " +
                      std::to_string(limits.maxItems) + " items"};
      break;
    }
    return true;
  };
  try {
    json j = json::parse(text, check, /*allow_exceptions=*/true);
    return j;
  } catch (const Refused &r) {
    fail(where, "refused JSON: " + r.why);
  } catch (const json::exception &e) {
    fail(where, std::string("not valid JSON: ") + e.what());
  }
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
