//===- Checkpoint.cpp - distributed checkpoints that reshard on load -------===//

#include "ernie/runtime/Checkpoint.h"

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
constexpr int kVersion = 1;

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
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(path.string() + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    fail(path.string() + ": not a JSON object");
  return j;
}

int64_t volume(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
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

/// A manifest read and checked: per tensor its dtype, global shape and
/// pieces, with a per-dimension index of the pieces' starts.
struct Piece {
  std::string file;
  std::vector<int64_t> offsets, shape;
  uint32_t crc = 0;
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
  std::map<std::string, SavedTensor> tensors;
};

Manifest readManifest(const fs::path &dir) {
  fs::path path = dir / kManifest;
  json j = readJson(path);
  std::string where = path.string();
  if (j.value("format", "") != kFormat || j.value("version", 0) != kVersion)
    fail(where + ": not an ernie checkpoint manifest (format " + kFormat +
         " version " + std::to_string(kVersion) + ")");
  Manifest m;
  m.dir = dir;
  try {
    m.step = j.at("step").get<int64_t>();
    m.metadata = j.value("metadata", json::object());
    for (auto &[name, t] : j.at("tensors").items()) {
      SavedTensor saved;
      if (!parseSafetensorsDtype(t.at("dtype").get<std::string>(), saved.type))
        fail(where + ": tensor '" + name + "' has an unknown dtype");
      saved.globalShape = t.at("global_shape").get<std::vector<int64_t>>();
      size_t rank = saved.globalShape.size();
      saved.starts.resize(rank);
      int64_t covered = 0;
      for (const json &p : t.at("pieces")) {
        Piece piece{p.at("file").get<std::string>(),
                    p.at("offsets").get<std::vector<int64_t>>(),
                    p.at("shape").get<std::vector<int64_t>>(),
                    p.at("crc32").get<uint32_t>()};
        if (piece.file.find('/') != std::string::npos || piece.file == "..")
          fail(where + ": tensor '" + name + "' names file '" + piece.file +
               "' outside the checkpoint");
        if (piece.offsets.size() != rank || piece.shape.size() != rank)
          fail(where + ": tensor '" + name + "' has a piece of the wrong rank");
        for (size_t d = 0; d < rank; ++d)
          if (piece.offsets[d] < 0 || piece.shape[d] < 1 ||
              piece.offsets[d] + piece.shape[d] > saved.globalShape[d])
            fail(where + ": tensor '" + name + "' has a piece outside its "
                 "global shape");
        for (size_t d = 0; d < rank; ++d)
          saved.starts[d].push_back(piece.offsets[d]);
        if (!saved.byStart.emplace(piece.offsets, saved.pieces.size()).second)
          fail(where + ": tensor '" + name + "' has two pieces at one place");
        covered += volume(piece.shape);
        saved.pieces.push_back(std::move(piece));
      }
      // Distinct, in-bounds pieces of the right total volume on a grid of
      // starts cover the tensor exactly once.
      if (covered != volume(saved.globalShape))
        fail(where + ": the pieces of tensor '" + name + "' cover " +
             std::to_string(covered) + " of its " +
             std::to_string(volume(saved.globalShape)) + " elements");
      for (auto &s : saved.starts) {
        std::sort(s.begin(), s.end());
        s.erase(std::unique(s.begin(), s.end()), s.end());
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

std::string beginCheckpoint(const std::string &root, int64_t step) {
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
  fs::path tmp = fs::path(root) /
                 (".tmp-" + stepName(step) + "-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  return tmp.string();
}

void writeCheckpointShards(const Program &program, const RankRunner &runner,
                           int64_t rank, const std::string &dir) {
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
    uint32_t crc = withBlock(o, [](const std::vector<uint8_t> &bytes) {
      return static_cast<uint32_t>(::crc32(0L, bytes.data(), bytes.size()));
    });
    pieces[o.name] = {{"offsets", o.offsets},
                      {"global_shape", o.spec->globalShape},
                      {"crc32", crc}};
    header.push_back({o.name, o.spec->type, o.real});
  }
  SafetensorsWriter writer((fs::path(dir) / rankFile(rank)).string(), header,
                           {{kPiecesKey, pieces.dump()}});
  for (const Owned &o : owned)
    withBlock(o, [&](const std::vector<uint8_t> &bytes) {
      writer.append(bytes.data(), bytes.size());
    });
  writer.finish();
}

std::string commitCheckpoint(const Mesh &mesh, const std::string &dir,
                             const std::string &root, int64_t step,
                             const std::string &metadataJson, int keep) {
  json tensors = json::object();
  std::vector<fs::path> files;
  for (const auto &entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const fs::path &path : files) {
    SafetensorsFile file(path.string());
    auto it = file.metadata().find(kPiecesKey);
    json pieces = it == file.metadata().end()
                      ? json()
                      : json::parse(it->second, nullptr, false);
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
                             {"crc32", p.at("crc32")}});
    }
  }
  json metadata = json::parse(metadataJson.empty() ? "{}" : metadataJson,
                              nullptr, false);
  if (metadata.is_discarded())
    fail("checkpoint metadata is not JSON");
  json manifest = {{"format", kFormat},
                   {"version", kVersion},
                   {"step", step},
                   {"mesh", {{"axes", mesh.axisNames()}, {"sizes", mesh.axisSizes()}}},
                   {"metadata", metadata},
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
    std::vector<std::pair<int64_t, fs::path>> complete;
    for (const auto &entry : fs::directory_iterator(root))
      if (int64_t s = stepOf(entry.path());
          s >= 0 && fs::exists(entry.path() / kManifest))
        complete.emplace_back(s, entry.path());
    std::sort(complete.begin(), complete.end());
    for (size_t i = 0; i + keep < complete.size(); ++i)
      discard(complete[i].second);
  }
  return final.string();
}

std::string resolveCheckpoint(const std::string &path) {
  if (fs::exists(fs::path(path) / kManifest))
    return path;
  if (!fs::is_directory(path))
    fail(path + ": no such checkpoint directory");
  int64_t best = -1;
  fs::path found;
  for (const auto &entry : fs::directory_iterator(path))
    if (int64_t s = stepOf(entry.path());
        s > best && fs::exists(entry.path() / kManifest)) {
      best = s;
      found = entry.path();
    }
  if (best < 0)
    fail(path + ": no complete checkpoint (no step-* directory with a " +
         kManifest + ")");
  return found.string();
}

CheckpointInfo readCheckpointInfo(const std::string &dir) {
  Manifest m = readManifest(dir);
  return {m.step, m.metadata.dump()};
}

std::map<std::string, HostTensor>
readCheckpointShards(const Program &program, const RankRunner &runner,
                     int64_t rank, const std::string &dir) {
  Manifest m = readManifest(dir);
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  auto open = [&](const std::string &name) -> SafetensorsFile & {
    auto &f = files[name];
    if (!f)
      f = std::make_unique<SafetensorsFile>((m.dir / name).string());
    return *f;
  };
  std::map<std::string, HostTensor> out;
  for (const std::string &name : runner.stateNames()) {
    const TensorSpec &spec = runner.stateSpec(name);
    auto it = m.tensors.find(name);
    if (it == m.tensors.end())
      fail(m.dir.string() + ": the checkpoint has no tensor '" + name + "'");
    const SavedTensor &saved = it->second;
    if (saved.type != spec.type || saved.globalShape != spec.globalShape)
      fail(m.dir.string() + ": tensor '" + name + "' is " +
           std::string(runtime::name(saved.type)) + shapeString(saved.globalShape) +
           " in the checkpoint, the program wants " +
           std::string(runtime::name(spec.type)) + shapeString(spec.globalShape));
    HostTensor piece(spec.type, spec.localShape);
    std::vector<int64_t> lo = pieceOffsets(spec, program.mesh(), rank);
    std::vector<int64_t> real = realExtent(spec, lo);
    if (real.empty() && !spec.localShape.empty()) {
      out.emplace(name, std::move(piece));
      continue;
    }
    std::vector<int64_t> hi(lo.size());
    for (size_t d = 0; d < lo.size(); ++d)
      hi[d] = lo[d] + real[d];
    // Interval lookup per dimension: the saved starts overlapping [lo, hi).
    std::vector<std::pair<size_t, size_t>> ranges;
    for (size_t d = 0; d < lo.size(); ++d) {
      const auto &s = saved.starts[d];
      size_t first = std::upper_bound(s.begin(), s.end(), lo[d]) - s.begin();
      first = first == 0 ? 0 : first - 1;
      size_t last = std::lower_bound(s.begin(), s.end(), hi[d]) - s.begin();
      ranges.emplace_back(first, last);
    }
    size_t elementBytes = byteSize(spec.type);
    std::vector<size_t> k;
    for (auto [first, last] : ranges)
      k.push_back(first);
    while (true) {
      std::vector<int64_t> start(lo.size());
      for (size_t d = 0; d < lo.size(); ++d)
        start[d] = saved.starts[d][k[d]];
      auto p = saved.byStart.find(start);
      if (p == saved.byStart.end())
        fail(m.dir.string() + ": tensor '" + name +
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
        SafetensorsFile &file = open(src.file);
        const SafetensorsEntry *entry = file.find(name);
        if (!entry || entry->type != spec.type || entry->shape != src.shape)
          fail(file.path() + ": tensor '" + name +
               "' is missing or not the piece the manifest lists");
        forEachRun(a, b, src.offsets, src.shape, lo, spec.localShape,
                   [&](int64_t from, int64_t to, int64_t n) {
                     file.readBytes(name, from * elementBytes, n * elementBytes,
                                    piece.bytes.data() + to * elementBytes);
                   });
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
    out.emplace(name, std::move(piece));
  }
  return out;
}

std::string verifyCheckpoint(const std::string &dir) {
  Manifest m = readManifest(dir);
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  std::ostringstream summary;
  uint64_t bytes = 0;
  for (const auto &[name, saved] : m.tensors) {
    for (const Piece &p : saved.pieces) {
      auto &f = files[p.file];
      if (!f)
        f = std::make_unique<SafetensorsFile>((m.dir / p.file).string());
      const SafetensorsEntry *e = f->find(name);
      if (!e || e->type != saved.type || e->shape != p.shape)
        fail(f->path() + ": tensor '" + name +
             "' is missing or not the piece the manifest lists");
      HostTensor t = f->read(name);
      if (::crc32(0L, t.bytes.data(), t.bytes.size()) != p.crc)
        fail(f->path() + ": tensor '" + name + "': checksum mismatch");
      bytes += t.bytes.size();
    }
    summary << name << " " << safetensorsDtype(saved.type)
            << shapeString(saved.globalShape) << " in " << saved.pieces.size()
            << " piece(s)\n";
  }
  for (const auto &entry : fs::directory_iterator(m.dir))
    if (entry.path().extension() == ".safetensors" &&
        !files.count(entry.path().filename().string()))
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
    uint64_t bytes = volume(saved.globalShape) * byteSize(saved.type);
    total += bytes;
    for (const Piece &p : saved.pieces)
      fileBytes[p.file] += volume(p.shape) * byteSize(saved.type);
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

void consolidateCheckpoint(const std::string &dir, const std::string &out) {
  Manifest m = readManifest(dir);
  std::vector<SafetensorsWriter::Tensor> header;
  for (const auto &[name, saved] : m.tensors)
    header.push_back({name, saved.type, saved.globalShape});
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  SafetensorsWriter writer(out, header, metadata);
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  // One tensor in memory at a time.
  for (const auto &[name, saved] : m.tensors) {
    HostTensor whole(saved.type, saved.globalShape);
    for (const Piece &p : saved.pieces) {
      auto &f = files[p.file];
      if (!f)
        f = std::make_unique<SafetensorsFile>((m.dir / p.file).string());
      HostTensor piece = f->read(name);
      if (piece.shape != p.shape || piece.type != saved.type)
        fail(f->path() + ": tensor '" + name +
             "' is not the piece the manifest lists");
      insertBlock(piece.bytes.data(), p.shape, whole.bytes.data(),
                  saved.globalShape, p.offsets, byteSize(saved.type));
    }
    writer.append(whole.bytes.data(), whole.bytes.size());
  }
  writer.finish();
}

std::string importCheckpoint(const std::string &file, const std::string &root,
                             int64_t step) {
  SafetensorsFile in(file);
  std::string dir = beginCheckpoint(root, step);
  std::vector<SafetensorsWriter::Tensor> header;
  json pieces = json::object();
  std::vector<HostTensor> values;
  for (const SafetensorsEntry &e : in.tensors()) {
    HostTensor t = in.read(e.name);
    pieces[e.name] = {{"offsets", std::vector<int64_t>(e.shape.size(), 0)},
                      {"global_shape", e.shape},
                      {"crc32", ::crc32(0L, t.bytes.data(), t.bytes.size())}};
    header.push_back({e.name, e.type, e.shape});
  }
  SafetensorsWriter writer((fs::path(dir) / rankFile(0)).string(), header,
                           {{kPiecesKey, pieces.dump()}});
  for (const SafetensorsEntry &e : in.tensors()) {
    HostTensor t = in.read(e.name);
    writer.append(t.bytes.data(), t.bytes.size());
  }
  writer.finish();
  return commitCheckpoint(Mesh({"world"}, {1}), dir, root, step, "{}", 0);
}

} // namespace ernie::runtime
