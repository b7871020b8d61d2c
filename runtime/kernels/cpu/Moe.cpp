//===- Moe.cpp - CPU kernels of mixture-of-experts routing ------------------===//
//
// Capacity slots, dispatch into the expert buffers, the weighted combine and
// the weights' gradient. Buffers are [experts, groups, capacity, hidden];
// choices (experts, slots, weights) are [groups, tokens, k]. Every index is
// checked: a bad expert or slot is a KernelError naming it, never a stray
// write.
//
//===----------------------------------------------------------------------===//

#include "kernels/common/Registry.h"

#include <cstring>
#include <string>
#include <vector>

namespace ernie::runtime::cpu {

namespace {

/// The shape of one MoE op's operands, read from its views.
struct MoeShape {
  int64_t experts, groups, capacity, tokens, k, hidden;

  /// `choices` [groups, tokens, k]; `buffers` [experts, groups, capacity,
  /// hidden].
  static MoeShape of(const TensorView &choices, const TensorView &buffers) {
    return {buffers.shape[0], choices.shape[0], buffers.shape[2],
            choices.shape[1], choices.shape[2], buffers.shape[3]};
  }

  /// The offset of slot `slot` of `expert` in group `g`, or -1 for a
  /// dropped choice (slot -1); anything else out of range throws.
  int64_t row(const char *op, int64_t g, int64_t expert, int64_t slot) const {
    if (slot == -1)
      return -1;
    if (expert < 0 || expert >= experts)
      throw KernelError(std::string(op) + ": expert " + std::to_string(expert) +
                        " is outside [0, " + std::to_string(experts) + ")");
    if (slot < 0 || slot >= capacity)
      throw KernelError(std::string(op) + ": slot " + std::to_string(slot) +
                        " is outside [0, " + std::to_string(capacity) +
                        ") (or -1 for a dropped choice)");
    return ((expert * groups + g) * capacity + slot) * hidden;
  }
};

/// Calls fn(choice index i = (g * tokens + t) * k + j, g, t, row of its slot
/// or -1) for every choice, in order.
template <typename Fn>
void forEachChoice(const char *op, const MoeShape &s, const TensorView &experts,
                   const TensorView &slots, Fn fn) {
  for (int64_t g = 0, i = 0; g < s.groups; ++g)
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int64_t j = 0; j < s.k; ++j, ++i)
        fn(i, g, t, s.row(op, g, indexAt(experts, i), indexAt(slots, i)));
}

} // namespace

void registerMoeKernels(Registry &r) {
  // Choice rank first, then tokens: each choice takes the next free slot of
  // its expert in its group, or -1 once the expert is full.
  r["ernie.moe_route"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &attrs) {
    expectCount(in, 1, "ernie.moe_route");
    const TensorView &experts = in[0];
    int64_t numExperts = attrs.getInt("num_experts"),
            capacity = attrs.getInt("capacity"), groups = experts.shape[0],
            tokens = experts.shape[1], k = experts.shape[2];
    int64_t *slots = out[0].as<int64_t>();
    std::vector<int64_t> used(numExperts);
    for (int64_t g = 0; g < groups; ++g) {
      std::fill(used.begin(), used.end(), 0);
      for (int64_t j = 0; j < k; ++j)
        for (int64_t t = 0; t < tokens; ++t) {
          int64_t i = (g * tokens + t) * k + j, e = indexAt(experts, i);
          if (e < 0 || e >= numExperts)
            throw KernelError("ernie.moe_route: token " + std::to_string(t) +
                              " of group " + std::to_string(g) +
                              " chose expert " + std::to_string(e) +
                              ", outside [0, " + std::to_string(numExperts) +
                              ")");
          int64_t slot = used[e]++;
          slots[i] = slot < capacity ? slot : -1;
        }
    }
  };
  // Choices sharing a slot add up, so that dispatch is combine's transpose
  // whatever the slots are.
  r["ernie.moe_dispatch"] = [](const std::vector<TensorView> &in,
                               const std::vector<TensorView> &out,
                               const Attrs &) {
    expectCount(in, 4, "ernie.moe_dispatch");
    MoeShape s = MoeShape::of(in[1], out[0]);
    dispatchFloat(out[0].type, [&](auto zero) {
      using T = decltype(zero);
      const T *x = in[0].as<T>(), *w = in[3].as<T>();
      T *buf = out[0].as<T>();
      std::memset(buf, 0, out[0].numElements() * sizeof(T));
      forEachChoice("ernie.moe_dispatch", s, in[1], in[2],
                    [&](int64_t i, int64_t g, int64_t t, int64_t row) {
                      if (row < 0)
                        return;
                      const T *src = x + (g * s.tokens + t) * s.hidden;
                      T *dst = buf + row, weight = w[i];
                      for (int64_t h = 0; h < s.hidden; ++h)
                        dst[h] += weight * src[h];
                    });
    });
  };
  r["ernie.moe_combine"] = [](const std::vector<TensorView> &in,
                              const std::vector<TensorView> &out,
                              const Attrs &) {
    expectCount(in, 4, "ernie.moe_combine");
    MoeShape s = MoeShape::of(in[1], in[0]);
    dispatchFloat(out[0].type, [&](auto zero) {
      using T = decltype(zero);
      const T *buf = in[0].as<T>(), *w = in[3].as<T>();
      T *y = out[0].as<T>();
      std::memset(y, 0, out[0].numElements() * sizeof(T));
      forEachChoice("ernie.moe_combine", s, in[1], in[2],
                    [&](int64_t i, int64_t g, int64_t t, int64_t row) {
                      if (row < 0)
                        return;
                      const T *src = buf + row;
                      T *dst = y + (g * s.tokens + t) * s.hidden, weight = w[i];
                      for (int64_t h = 0; h < s.hidden; ++h)
                        dst[h] += weight * src[h];
                    });
    });
  };
  r["ernie.moe_weights_grad"] = [](const std::vector<TensorView> &in,
                                   const std::vector<TensorView> &out,
                                   const Attrs &) {
    expectCount(in, 4, "ernie.moe_weights_grad");
    MoeShape s = MoeShape::of(in[2], in[1]);
    dispatchFloat(out[0].type, [&](auto zero) {
      using T = decltype(zero);
      const T *tokens = in[0].as<T>(), *buf = in[1].as<T>();
      T *dw = out[0].as<T>();
      forEachChoice("ernie.moe_weights_grad", s, in[2], in[3],
                    [&](int64_t i, int64_t g, int64_t t, int64_t row) {
                      T sum = 0;
                      if (row >= 0) {
                        const T *a = tokens + (g * s.tokens + t) * s.hidden,
                                *b = buf + row;
                        for (int64_t h = 0; h < s.hidden; ++h)
                          sum += a[h] * b[h];
                      }
                      dw[i] = sum;
                    });
    });
  };
}

} // namespace ernie::runtime::cpu
