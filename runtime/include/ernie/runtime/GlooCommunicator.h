//===- GlooCommunicator.h - one process per rank over TCP --------*- C++ -*-===//
//
// Ranks in separate processes (or hosts) talking over TCP through Gloo.
// Contexts are created per communication group, lazily, the first time the
// group is used: every member reaches that first use in the same program
// order, so creation never deadlocks. Rendezvous goes through a directory
// every rank can reach (Gloo's file store).
//
// Reductions are made deterministic by construction: members exchange their
// inputs (all-gather, all-to-all) and each reduces in group order, exactly
// as the thread engine does, so both give the same bits.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_GLOOCOMMUNICATOR_H
#define ERNIE_RUNTIME_GLOOCOMMUNICATOR_H

#include "ernie/runtime/Communicator.h"

#include <memory>

namespace ernie::runtime {

struct GlooOptions {
  /// A directory shared by every rank, for the rendezvous and aborts; fresh
  /// for every run (a stale one holds old keys).
  std::string storePath;
  /// The address this rank listens on.
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

std::unique_ptr<Communicator> createGlooCommunicator(Mesh mesh, int64_t rank,
                                                     GlooOptions options);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_GLOOCOMMUNICATOR_H
