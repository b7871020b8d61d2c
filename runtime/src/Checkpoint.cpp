//===- Checkpoint.cpp - distributed checkpoints that reshard on load -------===//

#include "ernie/runtime/Checkpoint.h"
#include "ernie/runtime/BoundedInput.h"
#include "ernie/runtime/Checksum.h"
#include "ernie/runtime/HfLayout.h"
#include "ernie/runtime/Device.h"
#include "ernie/runtime/Safetensors.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <csignal>
#include <cstdlib>
#include <unistd.h>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace ernie::runtime {

namespace {

constexpr const char *kManifest = "manifest.json";
constexpr const char *kPiecesKey = "ernie.pieces";
constexpr const char *kFormat = "ernie-checkpoint";
/// Version 3 checksums every block of kChecksumBlockBytes of a piece with
/// XXH3 and records each file's size and header checksum; version 1 (one
/// zlib CRC-32 per piece) is still read. Version 2 (CRC-32C where version 3
/// has XXH3) was written only by development builds and is refused.
constexpr int kVersion = 3;
/// Caller's metadata nests at most this deep (the manifest holds it one
/// level down, within the reading limit).
constexpr int kMaxMetadataDepth = 32;

[[noreturn]] void fail(const std::string &why) { throw std::runtime_error(why); }

std::string stepName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string rankFile(int64_t rank) {
  char name[40];
  std::snprintf(name, sizeof name, "rank-%05lld.safetensors",
                static_cast<long long>(rank));
  return name;
}

/// The step of a directory named step-<N>, or -1.
int64_t stepOf(const fs::path &dir) {
  std::string name = dir.filename().string();
  if (name.rfind("step-", 0) != 0 || name.size() == 5)
    return -1;
  int64_t step = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9' || step > (INT64_MAX - 9) / 10)
      return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

void fsyncPath(const fs::path &path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) |
                                    O_CLOEXEC);
  if (fd < 0)
    fail(path.string() + ": cannot open to sync: " + std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0)
    fail(path.string() + ": fsync failed: " + std::strerror(errno));
}

void writeSynced(const fs::path &path, const std::string &text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush())
      fail(path.string() + ": write failed");
  }
  fsyncPath(path, false);
}

json readJson(const fs::path &path) {
  json j = readBoundedJson(path.string());
  if (!j.is_object())
    fail(path.string() + ": not a JSON object");
  return j;
}

/// Whether `shape` has no negative dimension and its bytes fit in 2^62.
bool sizeFits(const std::vector<int64_t> &shape, DType type) {
  uint64_t bytes = byteSize(type);
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && bytes > (uint64_t(1) << 62) / uint64_t(d)))
      return false;
    bytes *= uint64_t(d);
  }
  return true;
}

/// An XXH3 checksum as manifests hold it: 16 lowercase hex digits, a
/// string because a JSON number above 2^53 loses digits in many readers
/// (jq 1.6, JavaScript).
std::string checksumText(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx",
                static_cast<unsigned long long>(value));
  return text;
}

/// The checksum `text` holds (checksumText's form), or false.
bool parseChecksum(const std::string &text, uint64_t &value) {
  if (text.size() != 16)
    return false;
  value = 0;
  for (char c : text) {
    int digit = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
    if (digit < 0)
      return false;
    value = value << 4 | uint64_t(digit);
  }
  return true;
}

/// The checksums of `bytes`: one XXH3 per block of kChecksumBlockBytes, as
/// manifests hold them.
json blockChecksums(const uint8_t *bytes, uint64_t size) {
  json sums = json::array();
  for (uint64_t at = 0; at < size; at += kChecksumBlockBytes)
    sums.push_back(checksumText(
        xxh3(bytes + at, std::min(kChecksumBlockBytes, size - at))));
  return sums;
}

/// Whether `rank` writes its piece of `spec`: the lowest coordinate of the
/// ranks holding the same piece, along every mesh axis that does not split
/// it (the stage axis: the first stage holding the state).
bool ownsPiece(const Program &program, const TensorSpec &spec, int64_t rank) {
  const Mesh &mesh = program.mesh();
  std::vector<int64_t> coords = mesh.coordinates(rank);
  for (size_t a = 0; a < mesh.axisNames().size(); ++a) {
    const std::string &axis = mesh.axisNames()[a];
    if (program.isPipelined() && axis == program.stageAxis()) {
      std::vector<int64_t> stages = program.stagesHolding(spec.name);
      if (!stages.empty() && program.stageOf(rank) != stages.front())
        return false;
      continue;
    }
    bool splits = false;
    for (const Axes &dim : spec.sharding.dims)
      splits |= std::count(dim.begin(), dim.end(), axis) > 0;
    if (!splits && coords[a] != 0)
      return false;
  }
  return true;
}

/// Where a state's values are: pieces of safetensors files, each a block
/// of the state (its offsets and shape in the state's coordinates) held as
/// tensor `tensor` of `file` in the file's dtype, or transposed (2-D).
struct Piece {
  std::string file, tensor;
  DType type = DType::F32;
  std::vector<int64_t> offsets, shape;
  bool transposed = false;
  /// Checkpoints only: the checksum of each block of the piece's bytes
  /// (version 1: one CRC-32 of the whole piece; empty: not checksummed, a
  /// weight map's piece).
  std::vector<uint64_t> checksums;
};
/// How a manifest's pieces are checksummed.
struct ChecksumScheme {
  /// Version 1: one zlib CRC-32 over the whole piece.
  bool wholePieceCrc32 = false;
  uint64_t blockBytes = kChecksumBlockBytes;
};
/// What version 3 records of each file: its size and its header's XXH3
/// (the 8 length bytes and the JSON).
struct SavedFile {
  uint64_t bytes = 0;
  uint64_t headerChecksum = 0;
};
struct SavedTensor {
  DType type;
  std::vector<int64_t> globalShape;
  std::vector<Piece> pieces;
  /// Per dimension the distinct starts, sorted; a piece by its starts.
  std::vector<std::vector<int64_t>> starts;
  std::map<std::vector<int64_t>, size_t> byStart;
};
struct Manifest {
  fs::path dir;
  int64_t step = 0;
  json metadata;
  ChecksumScheme checksums;
  /// Version 3: every file the pieces name.
  std::map<std::string, SavedFile> files;
  std::map<std::string, SavedTensor> tensors;
};

/// Checks that `saved`'s pieces lie in its global shape and cover it
/// exactly once, and builds the interval index; `where` and `name` are for
/// the errors.
void indexPieces(SavedTensor &saved, const std::string &where,
                 const std::string &name) {
  size_t rank = saved.globalShape.size();
  saved.starts.assign(rank, {});
  saved.byStart.clear();
  int64_t covered = 0;
  for (size_t i = 0; i < saved.pieces.size(); ++i) {
    const Piece &piece = saved.pieces[i];
    // A weight map's piece is another tensor, in a file of its own.
    std::string what = "tensor '" + name + "' has a piece";
    if (piece.tensor != name)
      what = "tensor '" + piece.tensor + "' of " + piece.file + " (at " +
             shapeString(piece.offsets) + " of '" + name + "') is a piece";
    if (piece.offsets.size() != rank || piece.shape.size() != rank)
      fail(where + ": " + what + " of the wrong rank");
    for (size_t d = 0; d < rank; ++d)
      if (piece.offsets[d] < 0 || piece.shape[d] < 1 ||
          piece.offsets[d] > saved.globalShape[d] - piece.shape[d])
        fail(where + ": " + what + " outside the global shape " +
             shapeString(saved.globalShape) + " (its shape " +
             shapeString(piece.shape) + ")");
    for (size_t d = 0; d < rank; ++d)
      saved.starts[d].push_back(piece.offsets[d]);
    if (!saved.byStart.emplace(piece.offsets, i).second)
      fail(where + ": " + what + " at the place of another");
    covered += elementCount(piece.shape);
  }
  if (covered != elementCount(saved.globalShape))
    fail(where + ": the pieces of tensor '" + name + "' cover " +
         std::to_string(covered) + " of its " +
         std::to_string(elementCount(saved.globalShape)) + " elements");
  for (auto &s : saved.starts) {
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
  }
  // The interval lookup needs the pieces to tile a grid: along each
  // dimension a piece ends where the next start is (or at the end). With
  // distinct starts that, and the volume, make the cover exact.
  for (const Piece &piece : saved.pieces)
    for (size_t d = 0; d < rank; ++d) {
      const auto &s = saved.starts[d];
      size_t k = std::lower_bound(s.begin(), s.end(), piece.offsets[d]) - s.begin();
      int64_t end = k + 1 < s.size() ? s[k + 1] : saved.globalShape[d];
      if (piece.offsets[d] + piece.shape[d] != end)
        fail(where + ": the pieces of tensor '" + name + "' overlap or leave "
             "gaps: the piece at " + shapeString(piece.offsets) + " of shape " +
             shapeString(piece.shape) + " does not end where the next begins "
             "along dimension " + std::to_string(d));
    }
}

Manifest readManifest(const fs::path &dir) {
  fs::path path = dir / kManifest;
  json j = readJson(path);
  std::string where = path.string();
  int version = 0;
  if (j.contains("version") && j["version"].is_number_integer())
    version = j["version"].get<int>();
  if (j.value("format", "") != kFormat || version < 1 || version > kVersion)
    fail(where + ": not an ernie checkpoint manifest (format " + kFormat +
         " version 1 or " + std::to_string(kVersion) + ")");
  if (version == 2)
    fail(where +
         ": checkpoint manifest version 2 (CRC-32C checksums, "
         "written only by development builds) is no longer read; "
         "this build reads versions 1 and " +
         std::to_string(kVersion));
  Manifest m;
  m.dir = dir;
  auto fileName = [&](const json &value, const std::string &whose) {
    std::string file = value.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." ||
        file == "..")
      fail(where + ": " + whose + " names file '" + file +
           "' outside the checkpoint");
    return file;
  };
  auto checksumOf = [&](const json &value, const std::string &whose) {
    uint64_t sum = 0;
    if (!value.is_string() || !parseChecksum(value.get<std::string>(), sum))
      fail(where + ": " + whose + " has checksum " + briefJson(value) +
           ", not 16 lowercase hex digits");
    return sum;
  };
  try {
    m.step = j.at("step").get<int64_t>();
    m.metadata = j.value("metadata", json::object());
    if (version == 1) {
      m.checksums.wholePieceCrc32 = true;
    } else {
      const json &scheme = j.at("checksum");
      if (scheme.at("algorithm").get<std::string>() != "xxh3" ||
          scheme.at("block_bytes").get<uint64_t>() != kChecksumBlockBytes)
        fail(where + ": checksums " + briefJson(scheme) +
             " are not xxh3 over blocks of " +
             std::to_string(kChecksumBlockBytes) + " bytes");
      for (auto &[file, f] : j.at("files").items()) {
        std::string name = fileName(json(file), "the file list");
        m.files[name] = {f.at("bytes").get<uint64_t>(),
                         checksumOf(f.at("header_xxh3"), "file " + name)};
      }
    }
    for (auto &[name, t] : j.at("tensors").items()) {
      SavedTensor saved;
      if (!parseSafetensorsDtype(t.at("dtype").get<std::string>(), saved.type))
        fail(where + ": tensor '" + name + "' has an unknown dtype");
      saved.globalShape = t.at("global_shape").get<std::vector<int64_t>>();
      if (!sizeFits(saved.globalShape, saved.type))
        fail(where + ": tensor '" + name + "' has global shape " +
             shapeString(saved.globalShape) +
             ", which is not a size ernie holds");
      for (const json &p : t.at("pieces")) {
        Piece piece{fileName(p.at("file"), "tensor '" + name + "'"),
                    name,
                    saved.type,
                    p.at("offsets").get<std::vector<int64_t>>(),
                    p.at("shape").get<std::vector<int64_t>>(),
                    false,
                    {}};
        if (version == 1)
          piece.checksums = {p.at("crc32").get<uint32_t>()};
        else
          for (const json &sum : p.at("xxh3"))
            piece.checksums.push_back(checksumOf(
                sum, "tensor '" + name + "' (a piece in " + piece.file + ")"));
        if (version > 1 && !m.files.count(piece.file))
          fail(where + ": tensor '" + name + "' names file '" + piece.file +
               "', which the file list lacks");
        saved.pieces.push_back(std::move(piece));
      }
      indexPieces(saved, where, name);
      for (const Piece &piece : saved.pieces) {
        uint64_t bytes = elementCount(piece.shape) * byteSize(saved.type);
        uint64_t blocks =
            m.checksums.wholePieceCrc32
                ? 1
                : (bytes + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
        if (piece.checksums.size() != blocks)
          fail(where + ": tensor '" + name + "' has a piece in " + piece.file +
               " with " + std::to_string(piece.checksums.size()) +
               " checksums for its " + std::to_string(blocks) + " blocks");
      }
      m.tensors.emplace(name, std::move(saved));
    }
  } catch (const json::exception &e) {
    fail(where + ": malformed manifest: " + e.what());
  }
  return m;
}

/// Calls `run(srcOffset, dstOffset, elements)` for every innermost run of
/// the box [lo, hi) (global coordinates) within a block at `srcStart` of
/// `srcShape` and one at `dstStart` of `dstShape`, offsets in elements.
void forEachRun(const std::vector<int64_t> &lo, const std::vector<int64_t> &hi,
                const std::vector<int64_t> &srcStart,
                const std::vector<int64_t> &srcShape,
                const std::vector<int64_t> &dstStart,
                const std::vector<int64_t> &dstShape,
                const std::function<void(int64_t, int64_t, int64_t)> &run) {
  size_t rank = lo.size();
  if (rank == 0) {
    run(0, 0, 1);
    return;
  }
  std::vector<int64_t> index(lo);
  while (true) {
    int64_t src = 0, dst = 0;
    for (size_t d = 0; d < rank; ++d) {
      src = src * srcShape[d] + (index[d] - srcStart[d]);
      dst = dst * dstShape[d] + (index[d] - dstStart[d]);
    }
    run(src, dst, hi[rank - 1] - lo[rank - 1]);
    int64_t d = static_cast<int64_t>(rank) - 2;
    for (; d >= 0; --d) {
      if (++index[d] < hi[d])
        break;
      index[d] = lo[d];
    }
    if (d < 0)
      return;
  }
}

/// A checkpoint of weights alone (ernie-ckpt import-hf): a program
/// loading it takes its parameters (master weights from them) and keeps
/// its optimizer state and step count at their start.
bool isWeightsOnly(const Manifest &m) {
  auto it = m.metadata.find("weights_only");
  return it != m.metadata.end() && it->is_boolean() && it->get<bool>();
}

/// Removes checkpoint directory `dir` without ever leaving a step-* name on
/// a partly deleted one: it is renamed out of the way first (a kill during
/// the removal leaves a hidden directory the next save clears).
void discard(const fs::path &dir) {
  fs::path gone = dir.parent_path() / (".tmp-" + dir.filename().string() +
                                       "-gone-" + std::to_string(::getpid()));
  fs::remove_all(gone);
  fs::rename(dir, gone);
  fs::remove_all(gone);
}

} // namespace

void removeQuietly(const std::string &dir) {
  std::error_code ignored;
  fs::remove_all(dir, ignored);
}

IoMeter::IoMeter(Report report, std::chrono::milliseconds interval)
    : report_(std::move(report)), start_(std::chrono::steady_clock::now()),
      interval_(interval), lastReport_(start_) {}

void IoMeter::add(uint64_t bytes) {
  done_ += bytes;
  if (!report_)
    return;
  auto now = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock || now - lastReport_ < interval_)
    return; // another rank reports, or too soon
  lastReport_ = now;
  report_(done_, expected_, std::chrono::duration<double>(now - start_).count(),
          false, checksumSeconds());
}

double IoMeter::finish() {
  double seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start_)
                       .count();
  if (report_)
    report_(done_, expected_, seconds, true, checksumSeconds());
  return seconds;
}

IoMeter::Report IoMeter::printer(std::string what) {
  const bool terminal = ::isatty(2);
  return [what = std::move(what), terminal](uint64_t done, uint64_t expected,
                                            double seconds, bool final,
                                            double checksum) {
    double mb = done / 1e6, rate = seconds > 0 ? mb / seconds : 0;
    char line[256], sums[64] = "";
    if (checksum > 0)
      std::snprintf(sums, sizeof sums, "; checksums %.3f s over the ranks",
                    checksum);
    if (final)
      std::snprintf(line, sizeof line, "%s: %.1f MB in %.2f s (%.0f MB/s%s)\n",
                    what.c_str(), mb, seconds, rate, sums);
    else if (terminal)
      std::snprintf(line, sizeof line, "\r\033[K%s: %.0f%% (%.1f of %.1f MB, %.0f MB/s)",
                    what.c_str(), expected ? 100.0 * done / expected : 0.0, mb,
                    expected / 1e6, rate);
    else
      std::snprintf(line, sizeof line, "%s: %.1f of %.1f MB (%.0f MB/s)\n",
                    what.c_str(), mb, expected / 1e6, rate);
    std::string text = line;
    if (final && terminal)
      text = "\r\033[K" + text;
    std::fputs(text.c_str(), stderr);
  };
}

std::string checkpointTempDir(const std::string &root, int64_t step,
                              int64_t tag) {
  return (fs::path(root) / (".tmp-" + stepName(step) + "-" +
                            std::to_string(tag < 0 ? ::getpid() : tag)))
      .string();
}

std::string beginCheckpoint(const std::string &root, int64_t step, int64_t tag) {
  fs::create_directories(root);
  // What a killed save left: temporary directories of processes gone.
  for (const auto &entry : fs::directory_iterator(root)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-step-", 0) != 0)
      continue;
    long pid = std::strtol(name.substr(name.rfind('-') + 1).c_str(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      fs::remove_all(entry.path());
  }
  fs::path tmp = checkpointTempDir(root, step, tag);
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  return tmp.string();
}

void writeCheckpointShards(const Program &program, const RankRunner &runner,
                           int64_t rank, const std::string &dir, IoMeter *meter) {
  // What this rank owns, and each piece's real extent (padding is not saved).
  struct Owned {
    std::string name;
    const TensorSpec *spec;
    std::vector<int64_t> offsets, real;
  };
  std::vector<Owned> owned;
  for (const std::string &name : runner.stateNames()) {
    const TensorSpec &spec = runner.stateSpec(name);
    if (!spec.sharding.partials.empty())
      fail("state '" + name + "' is a pending reduction; it cannot be saved");
    if (!ownsPiece(program, spec, rank))
      continue;
    std::vector<int64_t> offsets = pieceOffsets(spec, program.mesh(), rank);
    std::vector<int64_t> real = realExtent(spec, offsets);
    if (real.empty() && !spec.localShape.empty())
      continue; // all padding
    owned.push_back({name, &spec, std::move(offsets), std::move(real)});
  }
  if (owned.empty())
    return;
  // The pieces' checksums go in the header, so each is computed first;
  // the data is then streamed piece by piece (one padded copy at a time).
  json pieces = json::object();
  std::vector<SafetensorsWriter::Tensor> header;
  // `use(bytes)` on a piece's real part: the piece itself unless padded.
  auto withBlock = [&](const Owned &o, auto use) {
    const HostTensor &piece = runner.localState(o.name);
    if (o.real == piece.shape)
      return use(piece.bytes);
    HostTensor b(o.spec->type, o.real);
    extractBlock(piece.bytes.data(), piece.shape,
                 std::vector<int64_t>(o.real.size(), 0), b.bytes.data(), o.real,
                 byteSize(o.spec->type));
    return use(b.bytes);
  };
  for (const Owned &o : owned) {
    json sums = withBlock(o, [](const std::vector<uint8_t> &bytes) {
      return blockChecksums(bytes.data(), bytes.size());
    });
    pieces[o.name] = {{"offsets", o.offsets},
                      {"global_shape", o.spec->globalShape},
                      {"xxh3", std::move(sums)}};
    header.push_back({o.name, o.spec->type, o.real});
  }
  if (meter)
    for (const Owned &o : owned)
      meter->expect(elementCount(o.real) * byteSize(o.spec->type));
  SafetensorsWriter writer((fs::path(dir) / rankFile(rank)).string(), header,
                           {{kPiecesKey, pieces.dump()}});
  for (const Owned &o : owned)
    withBlock(o, [&](const std::vector<uint8_t> &bytes) {
      writer.append(bytes.data(), bytes.size());
      if (meter)
        meter->add(bytes.size());
    });
  writer.finish();
}

std::string commitCheckpoint(const Mesh &mesh, const std::string &dir,
                             const std::string &root, int64_t step,
                             const std::string &metadataJson, int keep) {
  json tensors = json::object(), fileList = json::object();
  std::vector<fs::path> files;
  for (const auto &entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const fs::path &path : files) {
    SafetensorsFile file(path.string());
    std::string header(file.dataStart(), '\0');
    file.readFileBytes(0, header.size(), header.data());
    fileList[path.filename().string()] = {
        {"bytes", fs::file_size(path)},
        {"header_xxh3", checksumText(xxh3(header.data(), header.size()))}};
    auto it = file.metadata().find(kPiecesKey);
    json pieces =
        it == file.metadata().end()
            ? json()
            : parseBoundedJson(it->second, path.string() + ": " + kPiecesKey);
    if (!pieces.is_object())
      fail(path.string() + ": no '" + kPiecesKey + "' metadata");
    for (const SafetensorsEntry &e : file.tensors()) {
      const json &p = pieces.at(e.name);
      json &t = tensors[e.name];
      std::vector<int64_t> global = p.at("global_shape").get<std::vector<int64_t>>();
      if (t.is_null())
        t = {{"dtype", safetensorsDtype(e.type)},
             {"global_shape", global},
             {"pieces", json::array()}};
      else if (t["dtype"] != safetensorsDtype(e.type) || t["global_shape"] != global)
        fail(path.string() + ": tensor '" + e.name +
             "' disagrees with another rank's dtype or shape");
      t["pieces"].push_back({{"file", path.filename().string()},
                             {"offsets", p.at("offsets")},
                             {"shape", e.shape},
                             {"xxh3", p.at("xxh3")}});
    }
  }
  JsonLimits limits;
  limits.maxDepth = kMaxMetadataDepth;
  json metadata = parseBoundedJson(metadataJson.empty() ? "{}" : metadataJson,
                                   "the checkpoint's metadata", limits);
  json manifest = {
      {"format", kFormat},
      {"version", kVersion},
      {"step", step},
      {"mesh", {{"axes", mesh.axisNames()}, {"sizes", mesh.axisSizes()}}},
      {"metadata", metadata},
      {"checksum",
       {{"algorithm", "xxh3"}, {"block_bytes", kChecksumBlockBytes}}},
      {"files", fileList},
      {"tensors", tensors}};
  writeSynced(fs::path(dir) / kManifest, manifest.dump(1));
  readManifest(dir); // what is committed must load: coverage checked here
  fsyncPath(dir, true);
  fs::path final = fs::path(root) / stepName(step);
  if (fs::exists(final)) {
    // Saving a step again: the new one replaces the old after it is complete.
    discard(final);
    fs::rename(dir, final);
  } else {
    fs::rename(dir, final);
  }
  fsyncPath(root, true);
  if (keep > 0) {
    // Retention counts the checkpoints at or below this step: a higher one
    // is another run's (or a stray), and counting it would delete the
    // checkpoint just written. The newest `keep` of them include this one.
    std::vector<std::pair<int64_t, fs::path>> complete;
    for (const auto &entry : fs::directory_iterator(root))
      if (int64_t s = stepOf(entry.path());
          s >= 0 && s <= step && fs::exists(entry.path() / kManifest))
        complete.emplace_back(s, entry.path());
    std::sort(complete.begin(), complete.end());
    for (size_t i = 0; i + keep < complete.size(); ++i)
      if (complete[i].second != final)
        discard(complete[i].second);
  }
  return final.string();
}

namespace {

/// Throws unless every file checkpoint `m` names is present: a regular file
/// of the size the manifest records (version 1: one whose header is valid).
void checkFilesPresent(const Manifest &m) {
  std::set<std::string> named;
  for (const auto &entry : m.tensors)
    for (const Piece &p : entry.second.pieces)
      named.insert(p.file);
  for (const std::string &file : named) {
    fs::path path = m.dir / file;
    if (m.checksums.wholePieceCrc32) {
      SafetensorsFile check(path.string());
      continue;
    }
    uint64_t bytes = RegularFile(path.string()).size();
    if (bytes != m.files.at(file).bytes)
      fail(path.string() + ": " + std::to_string(bytes) +
           " bytes, the manifest records " +
           std::to_string(m.files.at(file).bytes));
  }
}

} // namespace

std::string resolveCheckpoint(const std::string &path) {
  if (fs::exists(fs::path(path) / kManifest))
    return path;
  if (!fs::is_directory(path))
    fail(path + ": no such checkpoint directory");
  // The newest step-* whose manifest reads and whose files are all there;
  // a newer damaged one is skipped, saying why.
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto &entry : fs::directory_iterator(path))
    if (int64_t s = stepOf(entry.path()); s >= 0)
      steps.emplace_back(s, entry.path());
  std::sort(steps.rbegin(), steps.rend());
  std::string skipped;
  for (const auto &[step, dir] : steps) {
    if (!fs::exists(dir / kManifest))
      continue; // not a checkpoint (a save renames only complete ones)
    try {
      checkFilesPresent(readManifest(dir));
      if (!skipped.empty())
        std::fprintf(stderr, "ernie: %s: loading %s; skipped:%s\n",
                     path.c_str(), dir.filename().c_str(), skipped.c_str());
      return dir.string();
    } catch (const std::exception &e) {
      skipped += std::string("\n  ") + e.what();
    }
  }
  fail(path + ": no complete checkpoint (no step-* directory with a " +
       kManifest + " and all its files)" + skipped);
}

CheckpointInfo readCheckpointInfo(const std::string &dir) {
  Manifest m = readManifest(dir);
  return {m.step, m.metadata.dump()};
}

namespace {

/// `value` in hex, `digits` wide, for an error message.
std::string hex(uint64_t value, int digits) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%0*llx", digits,
                static_cast<unsigned long long>(value));
  return text;
}

/// Opens each file once and reads pieces' bytes. For a checkpoint's files
/// (a manifest given) nothing is handed out unverified: a file's size and
/// header checksum are checked when it is opened, and every block of a
/// piece that a read touches is read whole and checked against its
/// checksum first (one block held at a time).
class FileCache {
public:
  explicit FileCache(const Manifest *manifest = nullptr,
                     IoMeter *meter = nullptr)
      : manifest_(manifest), meter_(meter) {}
  SafetensorsFile &open(const std::string &file) {
    auto &f = files_[file];
    if (f)
      return *f;
    fs::path path = manifest_ ? manifest_->dir / file : fs::path(file);
    auto opened = std::make_unique<SafetensorsFile>(path.string());
    if (manifest_ && !manifest_->checksums.wholePieceCrc32) {
      const SavedFile &saved = manifest_->files.at(file);
      uint64_t bytes = fs::file_size(path);
      if (bytes != saved.bytes)
        fail(path.string() + ": " + std::to_string(bytes) +
             " bytes, the manifest records " + std::to_string(saved.bytes));
      std::string header(opened->dataStart(), '\0');
      opened->readFileBytes(0, header.size(), header.data());
      uint64_t sum = xxh3(header.data(), header.size());
      if (sum != saved.headerChecksum)
        fail(path.string() + ": the header (bytes [0, " +
             std::to_string(header.size()) + ")) fails its checksum (xxh3 " +
             hex(saved.headerChecksum, 16) + " recorded, " + hex(sum, 16) +
             " read): the file is damaged");
    }
    f = std::move(opened);
    return *f;
  }

  /// Copies `bytes` bytes from `offset` of piece `piece`'s data to `dst`,
  /// verifying the blocks they lie in when the piece has checksums.
  void read(const Piece &piece, uint64_t offset, uint64_t bytes, void *dst) {
    SafetensorsFile &file = open(piece.file);
    if (piece.checksums.empty() || bytes == 0) {
      file.readBytes(piece.tensor, offset, bytes, dst);
      return;
    }
    const uint64_t pieceBytes =
        elementCount(piece.shape) * byteSize(piece.type);
    const uint64_t block = manifest_->checksums.wholePieceCrc32
                               ? pieceBytes
                               : manifest_->checksums.blockBytes;
    auto *out = static_cast<uint8_t *>(dst);
    for (uint64_t k = offset / block; k * block < offset + bytes; ++k) {
      if (&piece != block_.piece || k != block_.index) {
        uint64_t start = k * block, n = std::min(block, pieceBytes - start);
        block_ = {nullptr, 0};
        buffer_.resize(n);
        file.readBytes(piece.tensor, start, n, buffer_.data());
        auto began = std::chrono::steady_clock::now();
        const bool wholePiece = manifest_->checksums.wholePieceCrc32;
        uint64_t sum = wholePiece ? ::crc32(0L, buffer_.data(), n)
                                  : xxh3(buffer_.data(), n);
        if (meter_)
          meter_->addChecksumTime(std::chrono::steady_clock::now() - began);
        if (sum != piece.checksums[k])
          fail(file.path() + ": tensor '" + piece.tensor + "': bytes [" +
               std::to_string(start) + ", " + std::to_string(start + n) +
               ") fail their checksum (" + (wholePiece ? "crc32 " : "xxh3 ") +
               hex(piece.checksums[k], wholePiece ? 8 : 16) + " recorded, " +
               hex(sum, wholePiece ? 8 : 16) + " read): the file is damaged");
        block_ = {&piece, k};
      }
      uint64_t from = std::max(offset, k * block),
               to = std::min(offset + bytes, k * block + buffer_.size());
      std::memcpy(out + (from - offset), buffer_.data() + (from - k * block),
                  to - from);
    }
  }

private:
  const Manifest *manifest_;
  IoMeter *meter_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  struct {
    const Piece *piece;
    uint64_t index;
  } block_{nullptr, 0};
  std::vector<uint8_t> buffer_;
};

/// Copies the box [a, b) (the state's coordinates) of saved piece `src`
/// into `piece`, rank `lo`'s block of `spec`: whole runs straight into the
/// piece when the file holds the state's dtype untransposed, else through
/// a buffer of one run, converted and (transposed) scattered by column.
void copyBox(FileCache &files, const Piece &src, const std::vector<int64_t> &a,
             const std::vector<int64_t> &b, const std::vector<int64_t> &lo,
             const TensorSpec &spec, HostTensor &piece) {
  const size_t dstBytes = byteSize(spec.type), srcBytes = byteSize(src.type);
  if (!src.transposed && src.type == spec.type) {
    forEachRun(a, b, src.offsets, src.shape, lo, spec.localShape,
               [&](int64_t from, int64_t to, int64_t n) {
                 files.read(src, from * srcBytes, n * srcBytes,
                            piece.bytes.data() + to * dstBytes);
               });
    return;
  }
  // One contiguous run of the file: `n` elements from element `from`, to
  // land at `to` with a stride of `stride` elements.
  auto run = [&](int64_t from, int64_t to, int64_t n, int64_t stride) {
    HostTensor buffer(src.type, {n});
    files.read(src, from * srcBytes, n * srcBytes, buffer.bytes.data());
    HostTensor converted = convert(buffer, spec.type);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(piece.bytes.data() + (to + i * stride) * dstBytes,
                  converted.bytes.data() + i * dstBytes, dstBytes);
  };
  if (!src.transposed) {
    forEachRun(a, b, src.offsets, src.shape, lo, spec.localShape,
               [&](int64_t from, int64_t to, int64_t n) { run(from, to, n, 1); });
    return;
  }
  // The file holds the block with its last two dimensions swapped: for
  // each coordinate of the leading ones (a stacked expert's index, say),
  // column j of the state's matrix is a row there.
  const size_t rank = spec.localShape.size(), r = rank - 2, c = rank - 1;
  const int64_t rows = src.shape[r], width = spec.localShape[c],
                fileMatrix = src.shape[r] * src.shape[c],
                pieceMatrix = spec.localShape[r] * width;
  std::vector<int64_t> lead(a.begin(), a.begin() + r);
  while (true) {
    int64_t fileBase = 0, pieceBase = 0;
    for (size_t d = 0; d < r; ++d) {
      fileBase = fileBase * src.shape[d] + (lead[d] - src.offsets[d]);
      pieceBase = pieceBase * spec.localShape[d] + (lead[d] - lo[d]);
    }
    fileBase *= fileMatrix;
    pieceBase *= pieceMatrix;
    for (int64_t j = a[c]; j < b[c]; ++j)
      run(fileBase + (j - src.offsets[c]) * rows + (a[r] - src.offsets[r]),
          pieceBase + (a[r] - lo[r]) * width + (j - lo[c]), b[r] - a[r], width);
    size_t d = r;
    while (d-- > 0) {
      if (++lead[d] < b[d])
        break;
      lead[d] = a[d];
    }
    if (d == static_cast<size_t>(-1))
      break;
  }
}

/// The shape a weight-map piece has in its file: the block's, its last two
/// dimensions swapped when transposed, without the leading unit dimensions
/// the file's tensor lacks (one expert's [out, in] matrix is the block
/// [1, in, out] of the stacked experts).
std::vector<int64_t> fileShapeOf(const Piece &src, size_t fileRank) {
  std::vector<int64_t> shape = src.shape;
  if (src.transposed && shape.size() >= 2)
    std::swap(shape[shape.size() - 2], shape[shape.size() - 1]);
  while (shape.size() > fileRank && shape.front() == 1)
    shape.erase(shape.begin());
  return shape;
}

/// Rank `rank`'s piece of `spec` (padding zero) from `saved`, found by an
/// interval lookup per dimension: only the overlapping byte ranges are read.
HostTensor readPiece(const Program &program, const TensorSpec &spec, int64_t rank,
                     const SavedTensor &saved, const std::string &where,
                     FileCache &files, IoMeter *meter) {
  HostTensor piece(spec.type, spec.localShape);
  std::vector<int64_t> lo = pieceOffsets(spec, program.mesh(), rank);
  std::vector<int64_t> real = realExtent(spec, lo);
  if (real.empty() && !spec.localShape.empty())
    return piece; // all padding
  std::vector<int64_t> hi(lo.size());
  for (size_t d = 0; d < lo.size(); ++d)
    hi[d] = lo[d] + real[d];
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t d = 0; d < lo.size(); ++d) {
    const auto &s = saved.starts[d];
    size_t first = std::upper_bound(s.begin(), s.end(), lo[d]) - s.begin();
    first = first == 0 ? 0 : first - 1;
    size_t last = std::lower_bound(s.begin(), s.end(), hi[d]) - s.begin();
    ranges.emplace_back(first, last);
  }
  if (meter)
    meter->expect(elementCount(real) * byteSize(spec.type));
  std::vector<size_t> k;
  for (auto [first, last] : ranges)
    k.push_back(first);
  while (true) {
    std::vector<int64_t> start(lo.size());
    for (size_t d = 0; d < lo.size(); ++d)
      start[d] = saved.starts[d][k[d]];
    auto p = saved.byStart.find(start);
    if (p == saved.byStart.end())
      fail(where + ": tensor '" + spec.name +
           "' has no saved piece at an offset this rank needs");
    const Piece &src = saved.pieces[p->second];
    std::vector<int64_t> a(lo.size()), b(lo.size());
    bool overlaps = true;
    for (size_t d = 0; d < lo.size(); ++d) {
      a[d] = std::max(lo[d], src.offsets[d]);
      b[d] = std::min(hi[d], src.offsets[d] + src.shape[d]);
      overlaps &= a[d] < b[d];
    }
    if (overlaps) {
      SafetensorsFile &file = files.open(src.file);
      const SafetensorsEntry *entry = file.find(src.tensor);
      if (!entry || entry->type != src.type ||
          entry->shape != fileShapeOf(src, entry->shape.size()))
        fail(file.path() + ": tensor '" + src.tensor +
             "' is missing or not the piece the manifest lists");
      copyBox(files, src, a, b, lo, spec, piece);
      if (meter) {
        int64_t n = 1;
        for (size_t d = 0; d < a.size(); ++d)
          n *= b[d] - a[d];
        meter->add(n * byteSize(spec.type));
      }
    }
    size_t d = lo.size();
    while (d-- > 0) {
      if (++k[d] < ranges[d].second)
        break;
      k[d] = ranges[d].first;
    }
    if (d == static_cast<size_t>(-1) || lo.empty())
      break;
  }
  return piece;
}

} // namespace

std::map<std::string, HostTensor>
readCheckpointShards(const Program &program, const RankRunner &runner,
                     int64_t rank, const std::string &dir, IoMeter *meter) {
  Manifest m = readManifest(dir);
  FileCache files(&m, meter);
  const bool weightsOnly = isWeightsOnly(m);
  std::map<std::string, HostTensor> out;
  for (const std::string &name : runner.stateNames()) {
    const TensorSpec &spec = runner.stateSpec(name);
    auto it = m.tensors.find(name);
    if (weightsOnly && it == m.tensors.end() && !masterWeightOf(name).empty())
      it = m.tensors.find(masterWeightOf(name));
    if (weightsOnly && it == m.tensors.end() && spec.role != Role::Parameter)
      continue; // optimizer state starts afresh
    if (it == m.tensors.end())
      fail(m.dir.string() + ": the checkpoint has no tensor '" + name + "'" +
           (weightsOnly ? " (it holds weights only, and this is a parameter)" : ""));
    const SavedTensor &saved = it->second;
    // Weights convert to the program's dtype (round to nearest even), as a
    // Hugging Face folder's do; a training checkpoint's state must match.
    bool converts = weightsOnly && isFloat(saved.type) && isFloat(spec.type);
    if ((saved.type != spec.type && !converts) || saved.globalShape != spec.globalShape)
      fail(m.dir.string() + ": tensor '" + it->first + "' is " +
           std::string(runtime::name(saved.type)) + shapeString(saved.globalShape) +
           " in the checkpoint, the program wants " +
           std::string(runtime::name(spec.type)) + shapeString(spec.globalShape) +
           (name != it->first ? " for '" + name + "'" : ""));
    out.emplace(name, readPiece(program, spec, rank, saved, m.dir.string(),
                                files, meter));
  }
  return out;
}

std::map<std::string, HostTensor>
readWeightShards(const Program &program, const RankRunner &runner,
                 int64_t rank, const WeightMap &weights, IoMeter *meter) {
  FileCache files;
  // The map's pieces as saved pieces of `spec`, shapes and dtypes from the
  // files' headers.
  auto savedOf = [&](const std::string &name, const TensorSpec &spec) {
    SavedTensor saved{spec.type, spec.globalShape, {}, {}, {}};
    for (const WeightPiece &w : weights.at(name)) {
      SafetensorsFile &file = files.open(w.file);
      const SafetensorsEntry *entry = file.find(w.tensor);
      if (!entry)
        fail(file.path() + ": no tensor '" + w.tensor + "' (for '" + name + "')");
      if (isFloat(entry->type) != isFloat(spec.type) ||
          (!isFloat(spec.type) && entry->type != spec.type))
        fail(file.path() + ": tensor '" + w.tensor + "' is " +
             std::string(runtime::name(entry->type)) + "; '" + name + "' is " +
             std::string(runtime::name(spec.type)));
      std::vector<int64_t> shape = entry->shape;
      if (w.transposed) {
        if (shape.size() < 2)
          fail(file.path() + ": tensor '" + w.tensor + "' is not a matrix; "
               "it cannot be read transposed");
        std::swap(shape[shape.size() - 2], shape[shape.size() - 1]);
      }
      // A tensor of lower rank is a block with leading unit dimensions
      // (one expert of a stacked parameter).
      if (w.offsets.size() > shape.size())
        shape.insert(shape.begin(), w.offsets.size() - shape.size(), 1);
      saved.pieces.push_back(
          {w.file, w.tensor, entry->type, w.offsets, shape, w.transposed, {}});
    }
    indexPieces(saved, "the weight map", name);
    return saved;
  };
  std::map<std::string, HostTensor> out;
  for (const std::string &name : runner.stateNames()) {
    std::string source = name;
    if (!weights.count(name) && !masterWeightOf(name).empty())
      source = masterWeightOf(name);
    auto it = weights.find(source);
    if (it == weights.end())
      continue;
    if (it->second.empty())
      fail("the weight map lists no pieces for '" + source + "'");
    const TensorSpec &spec = runner.stateSpec(name);
    SavedTensor saved = savedOf(source, spec);
    out.emplace(name, readPiece(program, spec, rank, saved,
                                files.open(it->second.front().file).path(),
                                files, meter));
  }
  return out;
}

namespace {

/// Throws unless piece `p` of tensor `name` is in its file as the manifest
/// lists it (dtype and shape); opens (and for version 3 checks) the file.
void requireListedPiece(FileCache &files, const std::string &name,
                        const SavedTensor &saved, const Piece &p) {
  SafetensorsFile &f = files.open(p.file);
  const SafetensorsEntry *e = f.find(name);
  if (!e || e->type != saved.type || e->shape != p.shape)
    fail(f.path() + ": tensor '" + name +
         "' is missing or not the piece the manifest lists");
}

} // namespace

std::string verifyCheckpoint(const std::string &dir) {
  Manifest m = readManifest(dir);
  FileCache files(&m);
  std::ostringstream summary;
  uint64_t bytes = 0;
  std::vector<uint8_t> chunk(kChecksumBlockBytes);
  std::set<std::string> listed;
  for (const auto &[name, saved] : m.tensors) {
    for (const Piece &p : saved.pieces) {
      requireListedPiece(files, name, saved, p);
      listed.insert(p.file);
      uint64_t size = elementCount(p.shape) * byteSize(saved.type);
      for (uint64_t at = 0; at < size; at += chunk.size())
        files.read(p, at, std::min<uint64_t>(chunk.size(), size - at),
                   chunk.data());
      bytes += size;
    }
    summary << name << " " << safetensorsDtype(saved.type)
            << shapeString(saved.globalShape) << " in " << saved.pieces.size()
            << " piece(s)\n";
  }
  for (const auto &entry : fs::directory_iterator(m.dir))
    if (entry.path().extension() == ".safetensors" &&
        !listed.count(entry.path().filename().string()))
      fail(entry.path().string() + ": a file the manifest does not list");
  summary << m.tensors.size() << " tensors, " << bytes << " bytes, step "
          << m.step << ": verified\n";
  return summary.str();
}

std::string describeCheckpoint(const std::string &dir) {
  Manifest m = readManifest(dir);
  json j = readJson(m.dir / kManifest);
  std::ostringstream out;
  out << m.dir.string() << ": step " << m.step << ", saved on mesh";
  const json &mesh = j.value("mesh", json::object());
  auto axes = mesh.value("axes", std::vector<std::string>{});
  auto sizes = mesh.value("sizes", std::vector<int64_t>{});
  for (size_t i = 0; i < axes.size() && i < sizes.size(); ++i)
    out << (i ? " x " : " ") << axes[i] << "=" << sizes[i];
  out << "\n";
  uint64_t total = 0;
  std::map<std::string, uint64_t> fileBytes;
  for (const auto &[name, saved] : m.tensors) {
    uint64_t bytes = elementCount(saved.globalShape) * byteSize(saved.type);
    total += bytes;
    for (const Piece &p : saved.pieces)
      fileBytes[p.file] += elementCount(p.shape) * byteSize(saved.type);
    out << "  " << name << "  " << safetensorsDtype(saved.type)
        << shapeString(saved.globalShape) << "  " << bytes << " bytes in "
        << saved.pieces.size() << " piece(s)\n";
  }
  out << m.tensors.size() << " tensors, " << total << " bytes in "
      << fileBytes.size() << " file(s)";
  if (!m.metadata.empty())
    out << "; metadata " << m.metadata.dump();
  out << "\n";
  return out.str();
}

namespace {

/// Global tensor `name` of checkpoint `m`, from its pieces.
HostTensor readWhole(const Manifest &m, FileCache &files, const std::string &name) {
  const SavedTensor &saved = m.tensors.at(name);
  HostTensor whole(saved.type, saved.globalShape);
  for (const Piece &p : saved.pieces) {
    HostTensor piece(saved.type, p.shape);
    files.read(p, 0, piece.bytes.size(), piece.bytes.data());
    insertBlock(piece.bytes.data(), p.shape, whole.bytes.data(), saved.globalShape,
                p.offsets, byteSize(saved.type));
  }
  return whole;
}

/// Every piece of the states `names` is in its file before anything is
/// written or a whole tensor allocated: the pieces' bytes bound what is
/// allocated.
void requirePieces(const Manifest &m, FileCache &files,
                   const std::vector<std::string> &names) {
  for (const std::string &name : names)
    for (const Piece &p : m.tensors.at(name).pieces)
      requireListedPiece(files, name, m.tensors.at(name), p);
}

/// Writes safetensors file `out` of the tensors `header` (under a
/// temporary name, fsynced and renamed once complete), each tensor's bytes
/// from `bytesOf(i)` in order: one tensor in memory at a time.
void writeTensorFile(const fs::path &out,
                     const std::vector<SafetensorsWriter::Tensor> &header,
                     const std::function<HostTensor(size_t)> &bytesOf) {
  fs::path tmp = out.string() + ".tmp";
  try {
    SafetensorsWriter writer(tmp.string(), header, {{"format", "pt"}});
    for (size_t i = 0; i < header.size(); ++i) {
      HostTensor t = bytesOf(i);
      writer.append(t.bytes.data(), t.bytes.size());
    }
    writer.finish();
    fsyncPath(tmp, false);
    fs::rename(tmp, out);
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

/// Writes the global tensors `names` of checkpoint `m` as safetensors file
/// `out`.
void writeGlobalTensors(const Manifest &m, const std::vector<std::string> &names,
                        const fs::path &out) {
  std::vector<SafetensorsWriter::Tensor> header;
  for (const std::string &name : names)
    header.push_back({name, m.tensors.at(name).type, m.tensors.at(name).globalShape});
  FileCache files(&m);
  requirePieces(m, files, names);
  writeTensorFile(out, header, [&](size_t i) { return readWhole(m, files, names[i]); });
}

bool isSafetensorsPath(const std::string &path) {
  return fs::path(path).extension() == ".safetensors";
}

/// Hugging Face's sharded layout: consecutive tensors of `bytes` into files
/// of at most `maxShardBytes` (a larger tensor alone; 0: one file).
std::vector<std::vector<size_t>> shardsOf(const std::vector<uint64_t> &bytes,
                                          uint64_t maxShardBytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t size = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (maxShardBytes && !shards.back().empty() && size + bytes[i] > maxShardBytes) {
      shards.emplace_back();
      size = 0;
    }
    shards.back().push_back(i);
    size += bytes[i];
  }
  return shards;
}

/// model.safetensors, or model-00001-of-00003.safetensors, ...
std::string shardName(size_t i, size_t count) {
  if (count == 1)
    return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, count);
  return name;
}

/// Writes `out`'s model.safetensors.index.json for tensors `names` in
/// `shards` (none for a single file).
void writeShardIndex(const fs::path &out, const std::vector<std::string> &names,
                     const std::vector<std::vector<size_t>> &shards, uint64_t total) {
  if (shards.size() < 2)
    return;
  json weightMap = json::object();
  for (size_t i = 0; i < shards.size(); ++i)
    for (size_t k : shards[i])
      weightMap[names[k]] = shardName(i, shards.size());
  writeSynced(out / "model.safetensors.index.json",
              json{{"metadata", {{"total_size", total}}}, {"weight_map", weightMap}}
                      .dump(2) + "\n");
}

} // namespace

void consolidateCheckpoint(const std::string &dir, const std::string &out,
                           uint64_t maxShardBytes) {
  Manifest m = readManifest(dir);
  std::vector<std::string> all;
  for (const auto &entry : m.tensors)
    all.push_back(entry.first);
  if (isSafetensorsPath(out)) {
    if (maxShardBytes)
      fail(out + ": a single file cannot be sharded; give a folder to shard into");
    writeGlobalTensors(m, all, out);
    return;
  }
  std::vector<uint64_t> bytes;
  uint64_t total = 0;
  for (const std::string &name : all) {
    const SavedTensor &t = m.tensors.at(name);
    bytes.push_back(elementCount(t.globalShape) * byteSize(t.type));
    total += bytes.back();
  }
  std::vector<std::vector<size_t>> shards = shardsOf(bytes, maxShardBytes);
  fs::create_directories(out);
  for (size_t i = 0; i < shards.size(); ++i) {
    std::vector<std::string> names;
    for (size_t k : shards[i])
      names.push_back(all[k]);
    writeGlobalTensors(m, names, fs::path(out) / shardName(i, shards.size()));
  }
  writeShardIndex(out, all, shards, total);
}

namespace {

/// The safetensors files of `source` (one file, or a folder's
/// model.safetensors or the files its index lists) and, for an index,
/// which file each tensor is listed for.
std::vector<std::string> weightFiles(const std::string &source,
                                     std::map<std::string, std::string> &listed) {
  std::vector<std::string> files;
  if (!fs::is_directory(source)) {
    files.push_back(source);
  } else if (fs::path index = fs::path(source) / "model.safetensors.index.json";
             fs::exists(index)) {
    json j = readJson(index);
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index.string() + ": no weight_map");
    for (auto &[name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        fail(index.string() + ": tensor '" + name + "' names no file of the folder");
      listed[name] = (fs::path(source) / file.get<std::string>()).string();
    }
    for (const auto &entry : listed)
      if (std::find(files.begin(), files.end(), entry.second) == files.end())
        files.push_back(entry.second);
    std::sort(files.begin(), files.end());
  } else if (fs::exists(fs::path(source) / "model.safetensors")) {
    files.push_back((fs::path(source) / "model.safetensors").string());
  } else {
    fail(source + ": neither a safetensors file nor a folder with "
                  "model.safetensors or model.safetensors.index.json");
  }
  return files;
}

/// A weights source's files (weightFiles), each opened once, with the file
/// that holds each tensor: every tensor in the file its index lists it
/// for, none in two files, none listed but missing.
struct WeightSource {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, size_t> fileOf;
};

WeightSource openWeightFiles(const std::string &source, const std::vector<std::string> &paths,
                             std::map<std::string, std::string> &listed) {
  WeightSource out;
  for (size_t i = 0; i < paths.size(); ++i) {
    out.files.push_back(std::make_unique<SafetensorsFile>(paths[i]));
    for (const SafetensorsEntry &e : out.files.back()->tensors()) {
      if (listed.count(e.name) && listed[e.name] != paths[i])
        fail(paths[i] + ": tensor '" + e.name + "' is listed for another file");
      if (!out.fileOf.emplace(e.name, i).second)
        fail(paths[i] + ": tensor '" + e.name + "' appears in two files");
    }
  }
  for (const auto &entry : listed)
    if (!out.fileOf.count(entry.first))
      fail(source + ": tensor '" + entry.first + "' is listed but in no file");
  return out;
}

WeightSource openWeightSource(const std::string &source) {
  std::map<std::string, std::string> listed;
  std::vector<std::string> paths = weightFiles(source, listed);
  return openWeightFiles(source, paths, listed);
}

/// Writes rank file `path` of a checkpoint being made, each of `header`'s
/// tensors one whole piece from `tensorOf(i)`: called twice, for the
/// checksums the header carries and then for the bytes, so that one
/// tensor is held at a time.
void writeWholeTensors(const fs::path &path,
                       const std::vector<SafetensorsWriter::Tensor> &header,
                       const std::function<HostTensor(size_t)> &tensorOf) {
  json pieces = json::object();
  for (size_t i = 0; i < header.size(); ++i) {
    HostTensor t = tensorOf(i);
    pieces[header[i].name] = {{"offsets", std::vector<int64_t>(t.shape.size(), 0)},
                              {"global_shape", t.shape},
                              {"xxh3", blockChecksums(t.bytes.data(), t.bytes.size())}};
  }
  SafetensorsWriter writer(path.string(), header, {{kPiecesKey, pieces.dump()}});
  for (size_t i = 0; i < header.size(); ++i) {
    HostTensor t = tensorOf(i);
    writer.append(t.bytes.data(), t.bytes.size());
  }
  writer.finish();
}

} // namespace

std::string importCheckpoint(const std::string &source, const std::string &root,
                             int64_t step) {
  std::map<std::string, std::string> listed;
  std::vector<std::string> paths = weightFiles(source, listed);
  std::string dir = beginCheckpoint(root, step);
  try {
    WeightSource in = openWeightFiles(source, paths, listed);
    for (size_t i = 0; i < in.files.size(); ++i) {
      const SafetensorsFile &file = *in.files[i];
      std::vector<SafetensorsWriter::Tensor> header;
      for (const SafetensorsEntry &e : file.tensors())
        header.push_back({e.name, e.type, e.shape});
      writeWholeTensors(fs::path(dir) / rankFile(i), header,
                        [&](size_t j) { return file.read(header[j].name); });
    }
    return commitCheckpoint(Mesh({"world"}, {1}), dir, root, step, "{}", 0);
  } catch (...) {
    removeQuietly(dir); // a failed import leaves no temporary folder
    throw;
  }
}

namespace {

/// `t` ([..., r, c]) with its last two dimensions swapped.
HostTensor swapLastTwo(const HostTensor &t) {
  size_t rank = t.shape.size();
  std::vector<int64_t> shape = t.shape;
  std::swap(shape[rank - 2], shape[rank - 1]);
  HostTensor out(t.type, shape);
  const int64_t rows = t.shape[rank - 2], cols = t.shape[rank - 1];
  const int64_t matrices = rows * cols > 0 ? t.numElements() / (rows * cols) : 0;
  const size_t e = byteSize(t.type);
  for (int64_t m = 0; m < matrices; ++m)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        std::memcpy(out.bytes.data() + ((m * cols + j) * rows + i) * e,
                    t.bytes.data() + ((m * rows + i) * cols + j) * e, e);
  return out;
}

/// The shape of Hugging Face tensor `t`'s block in its state of `stateShape`:
/// its own or its source block's (unswapped when transposed), with the leading unit dimensions
/// of one expert of a stack; the state's own when the tensor only adds
/// unit dimensions (ERNIE's [1, E] selection bias of the [E] state).
std::vector<int64_t> blockInState(const HfTensor &t, const std::vector<int64_t> &stateShape) {
  std::vector<int64_t> block = t.sourceShape.empty() ? t.shape : t.sourceShape;
  if (t.transposed)
    std::swap(block[block.size() - 2], block[block.size() - 1]);
  while (block.size() < stateShape.size())
    block.insert(block.begin(), 1);
  if (block.size() > stateShape.size()) {
    if (elementCount(block) != elementCount(stateShape))
      fail("tensor '" + t.name + "' " + shapeString(t.shape) + " is no block of state '" +
           t.state + "' " + shapeString(stateShape));
    block = stateShape;
  }
  return block;
}

/// The element type a config.json's torch_dtype (or transformers 5's
/// dtype) names, if any.
std::optional<DType> configDtype(const json &config) {
  for (const char *key : {"torch_dtype", "dtype"})
    if (auto it = config.find(key); it != config.end() && it->is_string()) {
      std::optional<DType> type = parseTorchDtype(it->get<std::string>());
      if (!type)
        fail(std::string("config.json: ") + key + " = '" + it->get<std::string>() +
             "' is not float32, bfloat16 or float16");
      return type;
    }
  return std::nullopt;
}

const char *torchDtype(DType type) {
  switch (type) {
  case DType::F32:
    return "float32";
  case DType::BF16:
    return "bfloat16";
  case DType::F16:
    return "float16";
  default:
    fail("a Hugging Face folder holds float32, bfloat16 or float16 weights, not " +
         std::string(name(type)));
  }
}

} // namespace

std::optional<DType> parseTorchDtype(const std::string &name) {
  for (DType type : {DType::F32, DType::BF16, DType::F16})
    if (name == torchDtype(type))
      return type;
  return std::nullopt;
}

void exportHfFolder(const std::string &dir, const std::string &out,
                    const std::string &configPath, std::optional<DType> dtype,
                    uint64_t maxShardBytes) {
  Manifest m = readManifest(dir);
  json config = readBoundedJson(configPath);
  NamedShapes states;
  for (const auto &[name, t] : m.tensors)
    states.emplace_back(name, t.globalShape);
  std::vector<HfTensor> tensors;
  try {
    tensors = hfTensorsOfStates(config, states);
  } catch (const std::runtime_error &e) {
    fail(configPath + " and " + m.dir.string() + ": " + e.what());
  }
  // Floats in the dtype asked, else the config's, else each state's own.
  std::optional<DType> floats = dtype ? dtype : configDtype(config);
  if (floats)
    torchDtype(*floats);
  std::vector<std::string> names, used;
  std::vector<SafetensorsWriter::Tensor> header;
  std::vector<uint64_t> bytes;
  uint64_t total = 0;
  for (const HfTensor &t : tensors) {
    // A selection bias the checkpoint lacks is written as zeros.
    DType own = m.tensors.count(t.state) ? m.tensors.at(t.state).type : DType::F32;
    DType type = floats && isFloat(own) ? *floats : own;
    names.push_back(t.name);
    header.push_back({t.name, type, t.shape});
    bytes.push_back(elementCount(t.shape) * byteSize(type));
    total += bytes.back();
    if ((used.empty() || used.back() != t.state) && m.tensors.count(t.state))
      used.push_back(t.state);
  }
  FileCache files(&m);
  requirePieces(m, files, used);
  std::vector<std::vector<size_t>> shards = shardsOf(bytes, maxShardBytes);
  fs::create_directories(out);
  std::string cachedState;
  HostTensor cached;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::vector<SafetensorsWriter::Tensor> shardHeader;
    for (size_t k : shards[i])
      shardHeader.push_back(header[k]);
    writeTensorFile(fs::path(out) / shardName(i, shards.size()), shardHeader, [&](size_t j) {
      const HfTensor &t = tensors[shards[i][j]];
      if (!m.tensors.count(t.state))
        return HostTensor(shardHeader[j].type, t.shape);
      if (cachedState != t.state) { // a stack's experts come one after another
        cached = readWhole(m, files, t.state);
        cachedState = t.state;
      }
      std::vector<int64_t> block = blockInState(t, cached.shape);
      HostTensor piece(cached.type, block);
      extractBlock(cached.bytes.data(), cached.shape, t.offsets, piece.bytes.data(), block,
                   byteSize(cached.type));
      if (t.transposed) { // [1, in, out] of a stack: the expert's [out, in]
        piece.shape.erase(piece.shape.begin(),
                          piece.shape.end() - static_cast<ptrdiff_t>(t.shape.size()));
        piece = swapLastTwo(piece);
      }
      piece.shape = t.shape; // the same elements in the file's shape
      return piece.type == shardHeader[j].type ? piece : convert(piece, shardHeader[j].type);
    });
  }
  writeShardIndex(out, names, shards, total);
  if (floats) {
    config["torch_dtype"] = torchDtype(*floats);
    if (config.contains("dtype"))
      config["dtype"] = torchDtype(*floats);
  }
  writeSynced(fs::path(out) / "config.json", config.dump(2) + "\n");
}

std::string importHfFolder(const std::string &folder, const std::string &root,
                           int64_t step) {
  fs::path configPath = fs::path(folder) / "config.json";
  if (!fs::is_directory(folder) || !fs::exists(configPath))
    fail(folder + ": no config.json (not a Hugging Face model folder)");
  json config = readBoundedJson(configPath.string());
  WeightSource in = openWeightSource(folder);
  NamedShapes found;
  for (const auto &file : in.files)
    for (const SafetensorsEntry &e : file->tensors())
      found.emplace_back(e.name, e.shape);
  NamedShapes states;
  std::vector<HfTensor> tensors;
  try {
    std::tie(states, tensors) = statesOfHfTensors(config, found);
  } catch (const std::runtime_error &e) {
    fail(folder + ": " + e.what());
  }
  std::map<std::string, std::vector<const HfTensor *>> parts;
  for (const HfTensor &t : tensors)
    parts[t.state].push_back(&t);
  auto fileOf = [&](const HfTensor *t) -> const SafetensorsFile & {
    return *in.files[in.fileOf.at(t->name)];
  };
  // A state is in its first tensor's dtype, assembled from its tensors.
  auto typeOf = [&](const std::string &state) {
    const HfTensor *first = parts.at(state).front();
    return fileOf(first).find(first->name)->type;
  };
  auto assemble = [&](const std::string &state, const std::vector<int64_t> &shape) {
    DType type = typeOf(state);
    HostTensor whole(type, shape);
    for (const HfTensor *t : parts.at(state)) {
      HostTensor x = fileOf(t).read(t->name);
      if (!t->sourceShape.empty()) { // one block of a fused tensor
        HostTensor block(x.type, t->sourceShape);
        extractBlock(x.bytes.data(), x.shape, t->sourceOffsets, block.bytes.data(),
                     t->sourceShape, byteSize(x.type));
        x = std::move(block);
      }
      if (x.type != type)
        x = convert(x, type);
      if (t->transposed)
        x = swapLastTwo(x);
      insertBlock(x.bytes.data(), blockInState(*t, shape), whole.bytes.data(), shape,
                  t->offsets, byteSize(type));
    }
    return whole;
  };
  // Rank files of about 2 GiB (a larger state alone).
  constexpr uint64_t kFileBytes = 2ull << 30;
  std::string dir = beginCheckpoint(root, step);
  try {
    size_t next = 0, fileIndex = 0;
    while (next < states.size()) {
      std::vector<SafetensorsWriter::Tensor> header;
      std::vector<size_t> which;
      uint64_t size = 0;
      while (next < states.size() && (header.empty() || size < kFileBytes)) {
        const auto &[state, shape] = states[next];
        DType type = typeOf(state);
        header.push_back({state, type, shape});
        which.push_back(next++);
        size += elementCount(shape) * byteSize(type);
      }
      writeWholeTensors(fs::path(dir) / rankFile(fileIndex++), header, [&](size_t j) {
        return assemble(states[which[j]].first, states[which[j]].second);
      });
    }
    json metadata = {{"weights_only", true}, {"hf_folder", fs::absolute(folder).string()}};
    return commitCheckpoint(Mesh({"world"}, {1}), dir, root, step, metadata.dump(), 0);
  } catch (...) {
    removeQuietly(dir);
    throw;
  }
}

namespace {

/// Runs `work` on this rank and agrees with every other rank whether all
/// succeeded; a rank whose work threw rethrows its error, the others fail
/// naming the collective step.
template <typename Work>
void onAllRanksOrNone(Communicator &comm, const std::string &what, Work work) {
  std::exception_ptr error;
  try {
    work();
  } catch (...) {
    error = std::current_exception();
  }
  int64_t ok = error ? 0 : 1, all = 0;
  hostAllReduce(comm, &ok, &all, 1, DType::I64, ReduceOp::Min,
                comm.mesh().axisNames());
  if (error)
    std::rethrow_exception(error);
  if (!all) // a consequence, not the cause: a collective's kind of error
    throw CommunicationError(what + " failed on another rank (its error says why)");
}

} // namespace

std::string saveCheckpointOnRank(const Program &program, const RankRunner &runner,
                                 Communicator &comm, const std::string &root,
                                 int64_t step, const std::string &metadataJson,
                                 int keep, IoMeter *meter) {
  const Axes all = comm.mesh().axisNames();
  int64_t tag = ::getpid();
  hostBroadcast(comm, &tag, sizeof tag, 0, all);
  const bool leader = comm.rank() == 0;
  std::string dir = checkpointTempDir(root, step, tag), done;
  onAllRanksOrNone(comm, "starting the checkpoint", [&] {
    if (leader)
      beginCheckpoint(root, step, tag);
  });
  try {
    onAllRanksOrNone(comm, "writing the checkpoint", [&] {
      writeCheckpointShards(program, runner, comm.rank(), dir, meter);
    });
    onAllRanksOrNone(comm, "committing the checkpoint", [&] {
      if (leader)
        done = commitCheckpoint(program.mesh(), dir, root, step, metadataJson,
                                keep);
    });
  } catch (...) {
    if (leader) // every rank is past its writes: the folder can go
      removeQuietly(dir);
    throw;
  }
  return leader ? done : (fs::path(root) / stepName(step)).string();
}

CheckpointInfo loadCheckpointOnRank(const Program &program, RankRunner &runner,
                                    Communicator &comm, const std::string &path,
                                    IoMeter *meter) {
  CheckpointInfo info;
  std::map<std::string, HostTensor> pieces;
  onAllRanksOrNone(comm, "reading the checkpoint", [&] {
    std::string dir = resolveCheckpoint(path);
    info = readCheckpointInfo(dir);
    pieces = readCheckpointShards(program, runner, comm.rank(), dir, meter);
  });
  // Every rank resolved the same newest checkpoint unless one was committed
  // meanwhile: the steps must agree.
  int64_t lo = 0, hi = 0;
  hostAllReduce(comm, &info.step, &lo, 1, DType::I64, ReduceOp::Min,
                comm.mesh().axisNames());
  hostAllReduce(comm, &info.step, &hi, 1, DType::I64, ReduceOp::Max,
                comm.mesh().axisNames());
  if (lo != hi)
    fail(path + ": the ranks found different newest checkpoints (steps " +
         std::to_string(lo) + " and " + std::to_string(hi) +
         "); a save was committed while loading: name the checkpoint");
  for (auto &[name, piece] : pieces)
    runner.replaceLocalState(name, std::move(piece));
  return info;
}

void loadWeightsOnRank(const Program &program, RankRunner &runner,
                       Communicator &comm, const WeightMap &weights,
                       IoMeter *meter) {
  std::map<std::string, HostTensor> pieces;
  onAllRanksOrNone(comm, "reading the weights", [&] {
    pieces = readWeightShards(program, runner, comm.rank(), weights, meter);
  });
  for (auto &[name, piece] : pieces)
    runner.replaceLocalState(name, std::move(piece));
}

} // namespace ernie::runtime
