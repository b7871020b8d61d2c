//===- GlooCommunicator.h - one process per rank over TCP --------*- C++ -*-===//
//
// Ranks in separate processes (or hosts) talking over TCP through Gloo.
// Contexts are created per communication group, lazily, the first time the
// group is used: every member reaches that first use in the same program
// order, so creation never deadlocks. Rendezvous goes through a directory
// every rank can reach (Gloo's file store) or through a small TCP key-value
// store that rank 0 serves (for hosts without a shared file system).
//
// Reductions are made deterministic by construction: members exchange their
// inputs (all-to-all) and each reduces its slice in group order, exactly as
// the thread engine does, so both give the same bits (an all-reduce is that
// reduce-scatter, then an all-gather of the slices). A permute posts its
// receive and its send on the group's context before waiting for either
// (blocking sends around a ring would deadlock), under a slot prefix of its
// own numbered per group.
//
// Point-to-point sends are eager: send() copies the data, posts the send on
// the pair's context and returns; a sender thread waits for each posted send
// to complete (within the timeout) and frees its copy. A failed send is
// reported by this rank's next send, recv or barrier; a barrier first waits
// for every posted send; the destructor waits for them too, except after an
// abort (this rank's or a peer's), when it gives them up and closes its
// pairs at once, so peers waiting inside Gloo for this rank wake.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_GLOOCOMMUNICATOR_H
#define ERNIE_RUNTIME_GLOOCOMMUNICATOR_H

#include "ernie/runtime/Communicator.h"

#include <memory>

namespace ernie::runtime {

/// Set exactly one of storePath and storeAddress.
struct GlooOptions {
  /// A directory shared by every rank, for the rendezvous and aborts; fresh
  /// for every run (a stale one holds old keys).
  std::string storePath;
  /// "host:port" ("[v6]:port") of the TCP store, for the rendezvous and
  /// aborts. Rank 0 serves it, bound to that address (so it must be rank
  /// 0's own); every rank connects to it when its communicator is created,
  /// retrying until `timeout` while rank 0 is not up yet. Destroying rank
  /// 0's communicator waits (at most `timeout`) for the peers' communicators
  /// to be gone, then stops the server: contexts are made on first use, so a
  /// group first used after that, or an abort published after that, finds
  /// no store.
  std::string storeAddress;
  /// The address this rank listens on.
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

/// std::invalid_argument for a bad rank, store choice or address;
/// CommunicationError if the TCP store cannot be served (rank 0) or reached
/// within the timeout.
std::unique_ptr<Communicator> createGlooCommunicator(Mesh mesh, int64_t rank,
                                                     GlooOptions options);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_GLOOCOMMUNICATOR_H
