//===- Resharding.cpp - the cheapest way between two shardings --------------===//
//
// Dijkstra over shardings: each edge is one single-axis step (ReshardStep),
// weighted by the mesh's step cost (the bytes a rank sends, or seconds on a
// cluster). Steps only ever touch the minor-most
// axis of a dimension, which is what makes each of them one collective with
// a contiguous layout. The state space is tiny (a handful of axes), so the
// search is exhaustive and the plan optimal for this step set.
//
//===----------------------------------------------------------------------===//

#include "ernie/Sharding/Resharding.h"

#include "llvm/ADT/StringMap.h"

#include <queue>

using namespace mlir;
using namespace mlir::ernie;

int64_t mlir::ernie::localDimSize(int64_t size, int64_t parts) {
  return llvm::divideCeil(size, parts);
}

bool mlir::ernie::isAlignedSplit(int64_t size, int64_t coarse, int64_t fine) {
  return coarse == 1 ||
         localDimSize(size, fine) * (fine / coarse) == localDimSize(size, coarse);
}

FailureOr<RankedTensorType> mlir::ernie::getLocalType(RankedTensorType type,
                                                      ShardingAttr sharding,
                                                      const MeshShape &mesh) {
  if (!sharding)
    return type;
  if (sharding.getRank() != type.getRank())
    return failure();
  SmallVector<int64_t> shape(type.getShape());
  for (int64_t d = 0; d < type.getRank(); ++d) {
    int64_t parts = mesh.product(sharding.getDimAxes(d));
    if (shape[d] % parts != 0 && !mesh.allowUneven)
      return failure();
    shape[d] = localDimSize(shape[d], parts);
  }
  return RankedTensorType::get(shape, type.getElementType());
}

namespace {

/// A sharding under search, as plain data.
struct State {
  SmallVector<SmallVector<StringRef, 2>> dims;
  SmallVector<std::pair<StringRef, ReduceKind>, 2> partial; // sorted by axis

  static State of(ShardingAttr s) {
    State state;
    for (int64_t d = 0; d < s.getRank(); ++d) {
      auto &dim = state.dims.emplace_back();
      for (StringRef axis : s.getDimAxes(d))
        dim.push_back(axis);
    }
    for (auto p : s.getPartials())
      state.partial.push_back(p);
    llvm::sort(state.partial);
    return state;
  }

  ShardingAttr toAttr(MLIRContext *context, FlatSymbolRefAttr mesh) const {
    SmallVector<SmallVector<StringRef>> d;
    for (const auto &axes : dims)
      d.emplace_back(axes.begin(), axes.end());
    return ShardingAttr::get(context, mesh, d, partial);
  }

  std::string key() const {
    std::string k;
    for (const auto &axes : dims) {
      for (StringRef axis : axes)
        (k += axis) += ',';
      k += '|';
    }
    for (auto [axis, kind] : partial)
      (k += axis) += ":" + std::to_string(static_cast<int>(kind)) + ",";
    return k;
  }

  bool uses(StringRef axis) const {
    for (const auto &axes : dims)
      if (llvm::is_contained(axes, axis))
        return true;
    return llvm::any_of(partial, [&](auto p) { return p.first == axis; });
  }

  std::optional<ReduceKind> partialKind(StringRef axis) const {
    for (auto [a, kind] : partial)
      if (a == axis)
        return kind;
    return std::nullopt;
  }
};

bool isPrefix(ArrayRef<StringRef> prefix, ArrayRef<StringRef> of) {
  return prefix.size() <= of.size() &&
         llvm::equal(prefix, of.take_front(prefix.size()));
}

} // namespace

FailureOr<SmallVector<ReshardStep>>
mlir::ernie::planReshard(ShardingAttr from, ShardingAttr to,
                         RankedTensorType type, const MeshShape &mesh) {
  MLIRContext *context = type.getContext();
  if (from == to)
    return SmallVector<ReshardStep>{};
  State goal = State::of(to);
  if (failed(getLocalType(type, to, mesh)))
    return failure();

  int64_t elementBytes =
      getElementByteSize(type.getElementType());
  auto parts = [&](ArrayRef<StringRef> axes) {
    return mesh.product(SmallVector<StringRef>(axes.begin(), axes.end()));
  };
  // Bytes of one rank's (padded) piece, or -1 when the state is not a
  // sharding this mesh allows.
  auto localBytes = [&](const State &s) -> int64_t {
    int64_t bytes = elementBytes;
    for (auto [d, axes] : llvm::enumerate(s.dims)) {
      int64_t n = parts(axes);
      if (type.getDimSize(d) % n != 0 && !mesh.allowUneven)
        return -1;
      bytes *= localDimSize(type.getDimSize(d), n);
    }
    return bytes;
  };
  // Whether dimension `d` split over `axes` has padding.
  auto uneven = [&](size_t d, ArrayRef<StringRef> axes) {
    return type.getDimSize(d) % parts(axes) != 0;
  };
  // A step adds or removes the minor axis of a dimension. Unevenly split,
  // the pieces before and after must still nest (every coarse piece made of
  // whole fine ones), else no single collective moves between them.
  auto nests = [&](const State &a, const State &b) {
    for (auto [d, axes] : llvm::enumerate(a.dims)) {
      int64_t p = parts(axes), q = parts(b.dims[d]);
      if (p != q && !isAlignedSplit(type.getDimSize(d), std::min(p, q),
                                    std::max(p, q)))
        return false;
    }
    return true;
  };

  struct Node {
    double cost;
    int64_t order; // Insertion order breaks ties deterministically.
    std::string key;
    bool operator>(const Node &o) const {
      return std::tie(cost, order) > std::tie(o.cost, o.order);
    }
  };
  llvm::StringMap<State> states;
  llvm::StringMap<double> best;
  llvm::StringMap<std::pair<std::string, ReshardStep>> cameFrom;
  std::priority_queue<Node, std::vector<Node>, std::greater<Node>> queue;
  int64_t order = 0;

  State start = State::of(from);
  states[start.key()] = start;
  best[start.key()] = 0;
  queue.push({0, order++, start.key()});
  std::string goalKey = goal.key();

  auto relax = [&](const std::string &fromKey, double cost, State next,
                   ReshardStep step) {
    if (localBytes(next) < 0 || !nests(states[fromKey], next))
      return;
    std::string key = next.key();
    auto it = best.find(key);
    double total = cost + mesh.costOf(step);
    if (it != best.end() && !isCheaper(total, it->second))
      return;
    best[key] = total;
    states[key] = std::move(next);
    cameFrom[key] = {fromKey, step};
    queue.push({total, order++, key});
  };

  constexpr int64_t kMaxStates = 100000;
  while (!queue.empty() && order < kMaxStates) {
    Node node = queue.top();
    queue.pop();
    if (node.cost > best[node.key])
      continue;
    if (node.key == goalKey)
      break;
    const State cur = states[node.key];
    int64_t bytes = localBytes(cur);

    // Pending reductions the goal does not keep.
    for (auto [axis, kind] : cur.partial) {
      if (goal.partialKind(axis) == kind)
        continue;
      int64_t n = mesh.axisSize(axis);
      State done = cur;
      llvm::erase_if(done.partial, [&](auto p) { return p.first == axis; });
      relax(node.key, node.cost, done,
            {ReshardStep::Kind::AllReduce, {axis}, -1, -1, kind,
             2 * bytes * (n - 1) / n});
      for (size_t e = 0; e < done.dims.size(); ++e) {
        State next = done;
        next.dims[e].push_back(axis);
        relax(node.key, node.cost, next,
              {ReshardStep::Kind::ReduceScatter, {axis},
               static_cast<int64_t>(e), -1, kind, bytes * (n - 1) / n});
      }
    }
    // Splits in the wrong place: the minor-most one leaves its dimension.
    // (A split on the goal's path may leave too, to make room.)
    for (auto [d, axes] : llvm::enumerate(cur.dims)) {
      if (axes.empty() || axes == goal.dims[d])
        continue;
      StringRef axis = axes.back();
      int64_t n = mesh.axisSize(axis);
      State gathered = cur;
      gathered.dims[d].pop_back();
      relax(node.key, node.cost, gathered,
            {ReshardStep::Kind::AllGather, {axis}, static_cast<int64_t>(d), -1,
             ReduceKind::sum, bytes * (n - 1)});
      // Unevenly split over several axes, the pieces after one axis leaves
      // need not nest: gather the minor axes together (one group, the
      // flat layout), as far as the whole.
      if (uneven(d, axes))
        for (size_t k = 2; k <= axes.size(); ++k) {
          State wide = cur;
          wide.dims[d].resize(axes.size() - k);
          ArrayRef<StringRef> group = ArrayRef<StringRef>(axes).take_back(k);
          relax(node.key, node.cost, wide,
                {ReshardStep::Kind::AllGather,
                 SmallVector<StringRef, 2>(group.begin(), group.end()),
                 static_cast<int64_t>(d), -1, ReduceKind::sum,
                 bytes * (parts(group) - 1)});
        }
      // Moving it to another dimension, even one the goal does not split
      // by it, can free a dimension more cheaply than a gather.
      for (size_t e = 0; e < cur.dims.size(); ++e) {
        if (e == d)
          continue;
        State moved = gathered;
        moved.dims[e].push_back(axis);
        relax(node.key, node.cost, moved,
              {ReshardStep::Kind::AllToAll, {axis}, static_cast<int64_t>(d),
               static_cast<int64_t>(e), ReduceKind::sum,
               bytes * (n - 1) / n});
      }
    }
    // Splits the goal adds, by slicing (the axis must be free).
    for (auto [e, target] : llvm::enumerate(goal.dims)) {
      const auto &axes = cur.dims[e];
      if (!isPrefix(axes, target) || axes.size() == target.size())
        continue;
      StringRef axis = target[axes.size()];
      if (cur.uses(axis))
        continue;
      State next = cur;
      next.dims[e].push_back(axis);
      relax(node.key, node.cost, next,
            {ReshardStep::Kind::ShardSlice, {axis}, static_cast<int64_t>(e), -1,
             ReduceKind::sum, 0});
      // The mirror of a wide gather: slice several goal axes at once.
      if (uneven(e, target))
        for (size_t k = 2; axes.size() + k <= target.size(); ++k) {
          ArrayRef<StringRef> group =
              ArrayRef<StringRef>(target).slice(axes.size(), k);
          if (llvm::any_of(group, [&](StringRef a) { return cur.uses(a); }))
            break;
          State wide = cur;
          llvm::append_range(wide.dims[e], group);
          relax(node.key, node.cost, wide,
                {ReshardStep::Kind::ShardSlice,
                 SmallVector<StringRef, 2>(group.begin(), group.end()),
                 static_cast<int64_t>(e), -1, ReduceKind::sum, 0});
        }
    }
    // Pending reductions the goal adds.
    for (auto [axis, kind] : goal.partial) {
      if (cur.uses(axis))
        continue;
      State next = cur;
      next.partial.emplace_back(axis, kind);
      llvm::sort(next.partial);
      relax(node.key, node.cost, next,
            {ReshardStep::Kind::PartialInit, {axis}, -1, -1, kind, 0});
    }
  }

  if (!best.count(goalKey))
    return failure();
  SmallVector<ReshardStep> plan;
  for (std::string key = goalKey; key != start.key();) {
    auto &[prev, step] = cameFrom[key];
    step.after = states[key].toAttr(context, mesh.name);
    plan.push_back(step);
    key = prev;
  }
  std::reverse(plan.begin(), plan.end());
  return plan;
}
