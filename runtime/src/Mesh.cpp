//===- Mesh.cpp - ranks as coordinates on a named N-D mesh -------------------===//

#include "ernie/runtime/Mesh.h"

#include <algorithm>
#include <stdexcept>

namespace ernie::runtime {

Mesh::Mesh(std::vector<std::string> axisNames, std::vector<int64_t> axisSizes)
    : names_(std::move(axisNames)), sizes_(std::move(axisSizes)) {
  if (names_.size() != sizes_.size() || names_.empty())
    throw std::invalid_argument("a mesh needs one size per axis name");
  for (size_t i = 0; i < sizes_.size(); ++i) {
    if (names_[i].empty())
      throw std::invalid_argument("mesh axis " + std::to_string(i) +
                                  " has an empty name");
    if (sizes_[i] < 1)
      throw std::invalid_argument("mesh axis '" + names_[i] +
                                  "' must have a positive size");
    if (std::count(names_.begin(), names_.end(), names_[i]) != 1)
      throw std::invalid_argument("mesh axis '" + names_[i] +
                                  "' is declared twice");
    // sizes_[i] >= 1 and numRanks_ <= kMaxRanks, so the product cannot
    // overflow before the comparison.
    if (sizes_[i] > kMaxRanks || numRanks_ * sizes_[i] > kMaxRanks)
      throw std::invalid_argument(
          "the mesh has more than " + std::to_string(kMaxRanks) +
          " ranks (axis '" + names_[i] + "' of size " +
          std::to_string(sizes_[i]) + " takes it past the limit)");
    numRanks_ *= sizes_[i];
  }
}

size_t Mesh::axisIndex(const std::string &axis) const {
  auto it = std::find(names_.begin(), names_.end(), axis);
  if (it == names_.end())
    throw std::invalid_argument("the mesh has no axis '" + axis + "'");
  return it - names_.begin();
}

std::vector<int64_t> Mesh::coordinates(int64_t rank) const {
  std::vector<int64_t> coords(sizes_.size());
  for (size_t i = sizes_.size(); i-- > 0;) {
    coords[i] = rank % sizes_[i];
    rank /= sizes_[i];
  }
  return coords;
}

int64_t Mesh::rankOf(const std::vector<int64_t> &coordinates) const {
  int64_t rank = 0;
  for (size_t i = 0; i < sizes_.size(); ++i)
    rank = rank * sizes_[i] + coordinates[i];
  return rank;
}

std::vector<int64_t> Mesh::group(int64_t rank,
                                 const std::vector<std::string> &axes) const {
  std::vector<size_t> dims;
  int64_t members = 1;
  for (const std::string &axis : axes) {
    dims.push_back(axisIndex(axis));
    // A repeated axis would list ranks twice: the group would wait for
    // members that never come.
    if (std::count(dims.begin(), dims.end(), dims.back()) != 1)
      throw std::invalid_argument("axis '" + axis + "' is named twice");
    members *= sizes_[dims.back()];
  }
  std::vector<int64_t> base = coordinates(rank), out;
  for (int64_t flat = 0; flat < members; ++flat) {
    std::vector<int64_t> c = base;
    int64_t rest = flat;
    for (size_t i = dims.size(); i-- > 0;) {
      c[dims[i]] = rest % sizes_[dims[i]];
      rest /= sizes_[dims[i]];
    }
    out.push_back(rankOf(c));
  }
  return out;
}

int64_t Mesh::indexInGroup(int64_t rank,
                           const std::vector<std::string> &axes) const {
  std::vector<int64_t> c = coordinates(rank);
  int64_t index = 0;
  for (const std::string &axis : axes) {
    size_t d = axisIndex(axis);
    index = index * sizes_[d] + c[d];
  }
  return index;
}

std::string Mesh::str() const {
  std::string text = "[";
  for (size_t d = 0; d < names_.size(); ++d)
    text += (d ? ", " : "") + names_[d] + "=" + std::to_string(sizes_[d]);
  return text + "]";
}

} // namespace ernie::runtime
