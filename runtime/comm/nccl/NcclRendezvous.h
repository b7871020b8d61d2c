//===- NcclRendezvous.h - what NCCL's set-up computes without a GPU -*- C++ -*-===//
//
// The parts of making NCCL communicators that need no GPU, so that they are
// tested for real on the CPU: the unique id's way through the rendezvous
// store, and each mesh-axis group's ncclCommSplit color and key.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_COMM_NCCL_NCCLRENDEZVOUS_H
#define ERNIE_RUNTIME_COMM_NCCL_NCCLRENDEZVOUS_H

#include "comm/gloo/RendezvousStore.h"

#include "ernie/runtime/Communicator.h"
#include "ernie/runtime/Mesh.h"
#include "ernie/runtime/NcclCommunicator.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ernie::runtime {

/// ncclUniqueId's size (NCCL_UNIQUE_ID_BYTES).
constexpr size_t kNcclUniqueIdBytes = 128;

/// The world's unique id: rank 0 makes it (`make`, ncclGetUniqueId), every
/// rank reads it from the store under `key`. std::runtime_error naming the
/// key when it does not come within the store's timeout or has the wrong
/// size.
std::vector<char> ncclIdThroughStore(RendezvousStore &store,
                                     const std::string &key,
                                     const std::function<std::vector<char>()> &make);

/// ncclCommSplit's arguments for `rank`'s group over `axes`: ranks with the
/// same color (the linear index of the coordinates on the other axes) form
/// the group, ordered by key (the index in the group: Mesh's group order).
struct NcclSplit {
  int color = 0, key = 0;
};
NcclSplit ncclSplitOf(const Mesh &mesh, int64_t rank, const Axes &axes);

/// An NCCL communicator of `rank` whose unique id and aborts go through
/// `store`, which it shares with its process's other users (ProcessGroup.h).
/// `options`' store fields are ignored.
std::unique_ptr<Communicator>
createNcclCommunicator(Mesh mesh, int64_t rank,
                       std::shared_ptr<RendezvousStore> store,
                       NcclOptions options);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_COMM_NCCL_NCCLRENDEZVOUS_H
