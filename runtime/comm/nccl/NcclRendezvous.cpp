//===- NcclRendezvous.cpp - NCCL's set-up that needs no GPU -----------------===//

#include "NcclRendezvous.h"

#include "ernie/runtime/Communicator.h"
#include "ernie/runtime/Device.h"
#include "ernie/runtime/NcclCommunicator.h"

#include <algorithm>
#include <stdexcept>

namespace ernie::runtime {

std::vector<char> ncclIdThroughStore(
    RendezvousStore &store, const std::string &key,
    const std::function<std::vector<char>()> &make) {
  std::vector<char> id = store.exchange(key, [&] {
    std::vector<char> made = make();
    if (made.size() != kNcclUniqueIdBytes)
      throw std::runtime_error("an NCCL unique id of " +
                               std::to_string(made.size()) + " bytes");
    return made;
  });
  if (id.size() != kNcclUniqueIdBytes)
    throw std::runtime_error("the store's '" + key + "' holds " +
                             std::to_string(id.size()) +
                             " bytes, not an NCCL unique id");
  return id;
}

NcclSplit ncclSplitOf(const Mesh &mesh, int64_t rank, const Axes &axes) {
  const std::vector<std::string> &names = mesh.axisNames();
  const std::vector<int64_t> &sizes = mesh.axisSizes();
  std::vector<int64_t> at = mesh.coordinates(rank);
  int64_t color = 0;
  for (size_t d = 0; d < names.size(); ++d)
    if (std::find(axes.begin(), axes.end(), names[d]) == axes.end())
      color = color * sizes[d] + at[d];
  return {static_cast<int>(color),
          static_cast<int>(mesh.indexInGroup(rank, axes))};
}

#ifndef ERNIE_HAVE_CUDA
std::unique_ptr<Communicator> createNcclCommunicator(Mesh, int64_t,
                                                     NcclOptions) {
  throw DeviceError("the NCCL backend: built without CUDA (configure with "
                    "-DERNIE_ENABLE_CUDA=ON where the CUDA toolkit and NCCL "
                    "are installed)");
}
std::unique_ptr<Communicator>
createNcclCommunicator(Mesh mesh, int64_t rank,
                       std::shared_ptr<RendezvousStore>, NcclOptions options) {
  return createNcclCommunicator(std::move(mesh), rank, std::move(options));
}
#endif

} // namespace ernie::runtime
