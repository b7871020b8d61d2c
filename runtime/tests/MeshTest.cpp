//===- MeshTest.cpp - ranks, coordinates and groups --------------------------===//

#include "ernie/runtime/Mesh.h"

#include <gtest/gtest.h>

using namespace ernie::runtime;

TEST(Mesh, RowMajorCoordinates) {
  Mesh mesh({"dp", "mp"}, {2, 4});
  EXPECT_EQ(mesh.numRanks(), 8);
  EXPECT_EQ(mesh.coordinates(6), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(mesh.rankOf({1, 2}), 6);
}

TEST(Mesh, GroupsFollowTheNamedAxesInOrder) {
  Mesh mesh({"x", "y", "z"}, {2, 2, 2});
  // Rank 5 = (1, 0, 1).
  EXPECT_EQ(mesh.group(5, {"y"}), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(mesh.group(5, {"x", "z"}), (std::vector<int64_t>{0, 1, 4, 5}));
  // Axis order sets the group order: z major, x minor.
  EXPECT_EQ(mesh.group(5, {"z", "x"}), (std::vector<int64_t>{0, 4, 1, 5}));
  EXPECT_EQ(mesh.indexInGroup(5, {"x", "z"}), 3);
  EXPECT_EQ(mesh.indexInGroup(5, {"z", "x"}), 3);
  EXPECT_EQ(mesh.indexInGroup(4, {"z", "x"}), 1);
}

TEST(Mesh, RejectsBadMeshes) {
  EXPECT_THROW(Mesh({"a", "a"}, {2, 2}), std::invalid_argument);
  EXPECT_THROW(Mesh({"a"}, {0}), std::invalid_argument);
  EXPECT_THROW(Mesh({"a"}, {2, 2}), std::invalid_argument);
  Mesh mesh({"a"}, {2});
  EXPECT_THROW(mesh.group(0, {"b"}), std::invalid_argument);
}
