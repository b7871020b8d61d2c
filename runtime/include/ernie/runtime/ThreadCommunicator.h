//===- ThreadCommunicator.h - every rank a thread of one process -*- C++ -*-===//
//
// The embedded default (`ernie-run --ranks N`): ranks are threads sharing a
// ThreadWorld; a collective is a rendezvous where each member reads the
// others' buffers directly (no copies beyond the result). Reductions run in
// group order, so every rank computes the same bits. Waits have a deadline:
// a peer that never arrives is a CommunicationError, not a hang.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_THREADCOMMUNICATOR_H
#define ERNIE_RUNTIME_THREADCOMMUNICATOR_H

#include "ernie/runtime/Communicator.h"
#include "ernie/runtime/Device.h"

#include <memory>

namespace ernie::runtime {

/// The most ranks one ThreadWorld runs: each rank is a thread of this
/// process (two with its communication thread), and far more than this
/// exhausts the process's threads or memory before anything useful runs.
inline constexpr int64_t kMaxThreadRanks = 1024;

class ThreadWorld {
public:
  /// Throws std::invalid_argument for a mesh of more than kMaxThreadRanks.
  /// On a GPU (`device` not the host) every rank's buffers are on that one
  /// device, which must outlive the world: collectives become device copies
  /// and ordered device reductions, each rank on its own streams (NCCL
  /// cannot put two ranks of one communicator on one GPU).
  ThreadWorld(Mesh mesh,
              std::chrono::milliseconds timeout = std::chrono::seconds(60),
              Device &device = cpuDevice());
  ~ThreadWorld();

  /// The communicator of `rank`, for the thread that runs that rank.
  std::unique_ptr<Communicator> communicator(int64_t rank);
  const Mesh &mesh() const;

  struct State;

private:
  std::shared_ptr<State> state_;
};

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_THREADCOMMUNICATOR_H
