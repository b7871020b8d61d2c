//===- Checkpoint.h - distributed checkpoints that reshard on load -*- C++ -*-===//
//
// A checkpoint is a directory `<root>/step-<NNNNNNNN>`:
//
//   rank-<RRRRR>.safetensors   one per rank that owns a piece: its pieces of
//                              the state (a replicated piece written once,
//                              by its lowest-coordinate holder), without
//                              padding, each under the state's name
//   manifest.json              per state its dtype, global shape and pieces
//                              (file, global offsets, shape, the XXH3 of
//                              every 1 MiB block of the piece's bytes); each
//                              file's size and header XXH3; the step, the
//                              mesh, and the caller's metadata (JSON)
//
// Saving writes into `<root>/.tmp-step-<N>-<pid>`, fsyncs every file, writes
// the manifest last, fsyncs the directory and renames it into place: a
// directory named step-* is complete. Loading reads, for each piece a rank
// holds, only the byte ranges of the saved pieces that overlap it, found
// by an interval lookup per dimension; its memory is the rank's own pieces
// plus one checksum block of a saved piece at a time. Nothing is handed out
// unverified: every file's size and header checksum, and the checksum of
// every block a read touches, are checked, and a mismatch fails the load
// naming the file, the tensor and the byte range before any state changes
// (the caller replaces state only once every rank read all of its pieces).
// Manifests of version 1 (one zlib CRC-32 per piece) are still read, a
// piece verified whole; those of version 2 (CRC-32C, development builds
// only) are refused naming the version. Every JSON text is read within
// limits (BoundedInput.h).
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_CHECKPOINT_H
#define ERNIE_RUNTIME_CHECKPOINT_H

#include "ernie/runtime/Session.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ernie::runtime {

/// Counts the bytes a save or load moves on every rank of a process and
/// reports progress: `report(done, expected, seconds, final, checksum)`
/// from the thread that crossed the next reporting interval, and once at
/// the end. Ranks announce what they will move (expect) before moving it
/// (add); a load adds the time its ranks spent verifying checksums
/// (`checksum`, seconds summed over the ranks).
class IoMeter {
public:
  using Report = std::function<void(uint64_t done, uint64_t expected,
                                    double seconds, bool final,
                                    double checksumSeconds)>;
  explicit IoMeter(Report report = {},
                   std::chrono::milliseconds interval = std::chrono::milliseconds(500));
  void expect(uint64_t bytes) { expected_ += bytes; }
  void add(uint64_t bytes);
  void addChecksumTime(std::chrono::nanoseconds spent) {
    checksumNanos_ += static_cast<uint64_t>(spent.count());
  }
  double checksumSeconds() const { return checksumNanos_ * 1e-9; }
  /// The final report; returns the seconds since construction.
  double finish();
  /// A report printing `what: 45% (120.0 of 260.0 MB, 230 MB/s)` on
  /// stderr (rewritten in place on a terminal) and the final line
  /// `what: 260.0 MB in 1.13 s (230 MB/s)`, and for a load the checksums'
  /// share `; checksums 0.04 s over the ranks`.
  static Report printer(std::string what);
  uint64_t bytes() const { return done_; }

private:
  Report report_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::milliseconds interval_;
  std::atomic<uint64_t> done_{0}, expected_{0}, checksumNanos_{0};
  std::mutex mutex_;
  std::chrono::steady_clock::time_point lastReport_;
};

/// Writes the pieces `runner` (rank `rank` of `program`) owns into `dir`.
/// Every rank calls it (with the same `dir`) before commitCheckpoint.
void writeCheckpointShards(const Program &program, const RankRunner &runner,
                           int64_t rank, const std::string &dir,
                           IoMeter *meter = nullptr);

/// Composes the manifest from the rank files in `dir` (which every rank has
/// written), writes it, and renames `dir` to `<root>/step-<step>`; of the
/// complete checkpoints at or below `step`, removes all but the newest
/// `keep` (0 keeps all): a higher step under `root` is another run's and is
/// neither counted nor removed, so the checkpoint just written is never
/// removed. Called once, by one rank. Returns the final directory.
std::string commitCheckpoint(const Mesh &mesh, const std::string &dir,
                             const std::string &root, int64_t step,
                             const std::string &metadataJson, int keep);

/// The temporary directory a save into `root` at `step` writes (created).
/// `tag` (default: this process's id) names the directory; the ranks of
/// one save in several processes pass the same tag, agreed beforehand,
/// and it must be the id of a live process on this host while the save
/// runs (a directory whose tag is no live process is a killed save's and
/// the next save into `root` removes it).
std::string beginCheckpoint(const std::string &root, int64_t step,
                            int64_t tag = -1);
/// Removes `dir` and what it holds, ignoring errors: a failed save's or
/// import's temporary directory.
void removeQuietly(const std::string &dir);
/// The name beginCheckpoint gives that directory (nothing created).
std::string checkpointTempDir(const std::string &root, int64_t step,
                              int64_t tag = -1);

/// `path` itself when it holds a manifest, else the newest checkpoint under
/// it whose manifest reads and whose files are all present with the sizes
/// it records (a newer damaged one is skipped, saying so on stderr); throws
/// naming each one skipped when there is none.
std::string resolveCheckpoint(const std::string &path);

/// What a checkpoint's manifest says beside the tensors.
struct CheckpointInfo {
  int64_t step = 0;
  std::string metadataJson; // the caller's, "{}" when none
};

/// The manifest's step and metadata of checkpoint `dir` (resolved).
CheckpointInfo readCheckpointInfo(const std::string &dir);

/// Every state `runner` (rank `rank`) holds, read from checkpoint `dir` (a
/// resolved one) and resharded to the runner's layout: its pieces, to
/// replace the runner's (RankRunner::replaceLocalState) once every rank has
/// read its own. Every state must be in the checkpoint with the same dtype
/// and global shape; errors name the file and the tensor. A weights-only
/// checkpoint (importHfFolder's) must hold every parameter, in any float
/// dtype (converted); a master weight not in it is read from its
/// parameter's pieces, and other states it lacks keep their values.
std::map<std::string, HostTensor>
readCheckpointShards(const Program &program, const RankRunner &runner,
                     int64_t rank, const std::string &dir,
                     IoMeter *meter = nullptr);

/// One piece of a state in a safetensors file that is not an ernie
/// checkpoint (a Hugging Face folder): tensor `tensor` of `file` holds the
/// block of the state at `offsets`, its shape the file's, or with
/// `transposed` (2-D only) the file holds the block's transpose ([out, in]
/// Linears read as [in, out]). Its dtype is the file's; floats convert to
/// the state's (round to nearest even).
struct WeightPiece {
  std::string file, tensor;
  std::vector<int64_t> offsets;
  bool transposed = false;
};
/// Per state name, the pieces covering it exactly once.
using WeightMap = std::map<std::string, std::vector<WeightPiece>>;

/// The pieces of rank `rank` of the states `weights` maps, read from their
/// files and resharded as readCheckpointShards does; a master weight
/// ("<p>:master") not in the map is read from p's pieces. Other states are
/// not returned (they keep their values). Errors name the file and tensor.
std::map<std::string, HostTensor>
readWeightShards(const Program &program, const RankRunner &runner,
                 int64_t rank, const WeightMap &weights,
                 IoMeter *meter = nullptr);

/// Save and load where each rank is a process of its own (Gloo): every
/// rank calls them with the same arguments, in step. Saving agrees on one
/// temporary directory (rank 0's process id), writes each rank's shards and
/// commits on rank 0; loading replaces the runner's state only when every
/// rank read all of its pieces. A failure on any rank fails every rank
/// (nothing replaced, no checkpoint committed).
std::string saveCheckpointOnRank(const Program &program, const RankRunner &runner,
                                 Communicator &comm, const std::string &root,
                                 int64_t step, const std::string &metadataJson,
                                 int keep, IoMeter *meter = nullptr);
CheckpointInfo loadCheckpointOnRank(const Program &program, RankRunner &runner,
                                    Communicator &comm, const std::string &path,
                                    IoMeter *meter = nullptr);
/// readWeightShards on every rank, the pieces replacing the runner's state
/// only when every rank read all of its own.
void loadWeightsOnRank(const Program &program, RankRunner &runner,
                       Communicator &comm, const WeightMap &weights,
                       IoMeter *meter = nullptr);

/// Checks a checkpoint completely: the manifest, every file, every piece's
/// bytes present, and every tensor's elements covered exactly once. Returns
/// a human-readable summary; throws on the first fault.
std::string verifyCheckpoint(const std::string &dir);

/// What a checkpoint holds: step, mesh, every tensor's dtype, global shape,
/// size and pieces, the caller's metadata.
std::string describeCheckpoint(const std::string &dir);

/// Writes checkpoint `dir`'s global tensors (one in memory at a time) as
/// one safetensors file when `out` ends in .safetensors, else as a folder
/// in Hugging Face's layout: model.safetensors, or with `maxShardBytes`
/// numbered shards of at most that size (a larger tensor alone) and
/// model.safetensors.index.json. The names are the checkpoint's.
void consolidateCheckpoint(const std::string &dir, const std::string &out,
                           uint64_t maxShardBytes = 0);

/// A checkpoint `<root>/step-<step>` of the global tensors in `source`: a
/// safetensors file, or a folder as consolidateCheckpoint writes (or Hugging
/// Face does); each tensor one piece. Returns its directory.
std::string importCheckpoint(const std::string &source, const std::string &root,
                             int64_t step);

/// The element type torch's name ("float32", "bfloat16", "float16")
/// names: the floats a Hugging Face folder holds; nullopt otherwise.
std::optional<DType> parseTorchDtype(const std::string &name);

/// Writes checkpoint `dir`'s parameters as a Hugging Face model folder
/// `out` for the model config.json `configPath` describes (HfLayout.h: its
/// names, [out, in] Linears, one tensor per expert, a tied head once, the
/// selection biases; no optimizer state): model.safetensors, or past
/// `maxShardBytes` numbered shards and an index, and config.json with
/// torch_dtype set. Floats are written as `dtype`, else as the config's
/// torch_dtype, else as saved (round to nearest even). One state in memory
/// at a time. A config of another model is an error naming the state and
/// the field.
void exportHfFolder(const std::string &dir, const std::string &out,
                    const std::string &configPath, std::optional<DType> dtype,
                    uint64_t maxShardBytes = 0);

/// A weights-only checkpoint `<root>/step-<step>` of Hugging Face folder
/// `folder` in ernie's names and layout (the inverse of exportHfFolder):
/// a program of any mesh loads it with readCheckpointShards, taking its
/// parameters (converted to the program's dtypes) and keeping its
/// optimizer state as it starts. Returns its directory.
std::string importHfFolder(const std::string &folder, const std::string &root,
                           int64_t step = 0);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_CHECKPOINT_H
