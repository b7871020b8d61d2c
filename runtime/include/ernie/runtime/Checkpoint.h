//===- Checkpoint.h - distributed checkpoints that reshard on load -*- C++ -*-===//
//
// A checkpoint is a directory `<root>/step-<NNNNNNNN>`:
//
//   rank-<RRRRR>.safetensors   one per rank that owns a piece: its pieces of
//                              the state (a replicated piece written once,
//                              by its lowest-coordinate holder), without
//                              padding, each under the state's name
//   manifest.json              per state its dtype, global shape and pieces
//                              (file, global offsets, shape); the step, the
//                              mesh, and the caller's metadata (JSON)
//
// Saving writes into `<root>/.tmp-step-<N>-<pid>`, fsyncs every file, writes
// the manifest last, fsyncs the directory and renames it into place: a
// directory named step-* is complete. Loading reads, for each piece a rank
// holds, only the byte ranges of the saved pieces that overlap it, found
// by an interval lookup per dimension; its memory is the rank's own pieces
// plus one row of a saved piece at a time.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_CHECKPOINT_H
#define ERNIE_RUNTIME_CHECKPOINT_H

#include "ernie/runtime/Session.h"

#include <string>
#include <vector>

namespace ernie::runtime {

/// Writes the pieces `runner` (rank `rank` of `program`) owns into `dir`.
/// Every rank calls it (with the same `dir`) before commitCheckpoint.
void writeCheckpointShards(const Program &program, const RankRunner &runner,
                           int64_t rank, const std::string &dir);

/// Composes the manifest from the rank files in `dir` (which every rank has
/// written), writes it, and renames `dir` to `<root>/step-<step>`; removes
/// all but the newest `keep` complete checkpoints (0 keeps all). Called
/// once, by one rank. Returns the final directory.
std::string commitCheckpoint(const Mesh &mesh, const std::string &dir,
                             const std::string &root, int64_t step,
                             const std::string &metadataJson, int keep);

/// The temporary directory a save into `root` at `step` writes (created).
std::string beginCheckpoint(const std::string &root, int64_t step);

/// `path` itself when it holds a manifest, else the newest complete
/// checkpoint under it; throws when there is none.
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
/// and global shape; errors name the file and the tensor.
std::map<std::string, HostTensor>
readCheckpointShards(const Program &program, const RankRunner &runner,
                     int64_t rank, const std::string &dir);

/// Checks a checkpoint completely: the manifest, every file, every piece's
/// bytes present, and every tensor's elements covered exactly once. Returns
/// a human-readable summary; throws on the first fault.
std::string verifyCheckpoint(const std::string &dir);

/// What a checkpoint holds: step, mesh, every tensor's dtype, global shape,
/// size and pieces, the caller's metadata.
std::string describeCheckpoint(const std::string &dir);

/// Writes checkpoint `dir` as one safetensors file of global tensors at
/// `out` (one tensor in memory at a time).
void consolidateCheckpoint(const std::string &dir, const std::string &out);

/// A checkpoint `<root>/step-<step>` of the global tensors in safetensors
/// file `file` (one piece each); returns its directory.
std::string importCheckpoint(const std::string &file, const std::string &root,
                             int64_t step);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_CHECKPOINT_H
