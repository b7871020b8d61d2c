//===- Mesh.h - ranks as coordinates on a named N-D mesh ---------*- C++ -*-===//
//
// The runtime's view of a program's mesh: named axes, row-major ranks, and
// the communication groups a collective over some axes uses. A group is
// every rank that differs from this one only along the named axes, ordered
// by the linear coordinate over those axes (major to minor) — exactly the
// order the compiler's collectives assume.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_MESH_H
#define ERNIE_RUNTIME_MESH_H

#include <cstdint>
#include <string>
#include <vector>

namespace ernie::runtime {

/// The most ranks a mesh may have (the product of its axis sizes), checked
/// without overflow wherever a mesh is built. Header-only so that the
/// compiler can include it and refuse the same meshes.
inline constexpr int64_t kMaxRanks = int64_t(1) << 20;

class Mesh {
public:
  /// Throws std::invalid_argument for no axes, an empty or repeated name,
  /// a size below 1, or more than kMaxRanks ranks.
  Mesh(std::vector<std::string> axisNames, std::vector<int64_t> axisSizes);

  int64_t numRanks() const { return numRanks_; }
  const std::vector<std::string> &axisNames() const { return names_; }
  const std::vector<int64_t> &axisSizes() const { return sizes_; }
  /// The index of `axis`; throws std::invalid_argument for an unknown one.
  size_t axisIndex(const std::string &axis) const;

  /// `rank`'s coordinate along every axis.
  std::vector<int64_t> coordinates(int64_t rank) const;
  int64_t rankOf(const std::vector<int64_t> &coordinates) const;

  /// The members of `rank`'s group over `axes`, in group order.
  std::vector<int64_t> group(int64_t rank,
                             const std::vector<std::string> &axes) const;
  /// `rank`'s position in its group over `axes`.
  int64_t indexInGroup(int64_t rank, const std::vector<std::string> &axes) const;

  /// "[dp=2, mp=2]", for messages.
  std::string str() const;

private:
  std::vector<std::string> names_;
  std::vector<int64_t> sizes_;
  int64_t numRanks_ = 1;
};

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_MESH_H
