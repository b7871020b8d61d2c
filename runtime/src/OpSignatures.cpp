//===- OpSignatures.cpp - what each op's instruction must look like ------===//
//
// The executor's own ops and every kernel's operand, result and attribute
// rules, as the loader checks them (the dialect's rules as far as each kernel
// relies on them; test/Unit/OpSignatureTest.cpp keeps the counts equal to
// the dialect's).
//
//===----------------------------------------------------------------------===//

#include "ProgramDecoding.h"

#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/PipelineSchedule.h"

#include "ernie/program/program_generated.h"
#include "ernie/runtime/ProgramFormat.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

namespace ernie::runtime::loader {

constexpr ExecutorOpSignature kExecutorOps[] = {
    {"ernie.all_reduce", 1, 1, true},
    {"ernie.all_gather", 1, 1, true},
    {"ernie.reduce_scatter", 1, 1, true},
    {"ernie.all_to_all", 1, 1, true},
    {"ernie.collective_permute_start", 1, 1, true},
    {"ernie.all_reduce_start", kVariadic, kVariadic, true},
    {"ernie.reduce_scatter_start", kVariadic, kVariadic, true},
    {"ernie.all_gather_start", kVariadic, kVariadic, true},
    {"ernie.wait", 1, 1, false},
    {"ernie.shard_slice", 1, 1, true},
    {"ernie.shard_insert", 2, 1, true},
    {"ernie.partial_init", 1, 1, true},
    {"ernie.axis_index", 0, 1, false},
    // Pipelines: point to point between stages (Program.h).
    {"ernie.send", 1, 0, false},
    {"ernie.recv", 0, 1, false},
    {"ernie.stage_all_reduce", 1, 1, false},
    {"ernie.stage_broadcast", 1, 1, false},
};

/// The pipeline's point-to-point ops: they talk across stages.
bool isStageOp(const std::string &op) {
  return op == "ernie.send" || op == "ernie.recv" ||
         op == "ernie.stage_all_reduce" || op == "ernie.stage_broadcast";
}

const ExecutorOpSignature *executorOpSignature(const std::string &op) {
  for (const ExecutorOpSignature &s : kExecutorOps)
    if (op == s.op)
      return &s;
  return nullptr;
}

} // namespace ernie::runtime::loader

namespace ernie::runtime {

using namespace loader;

namespace {

//===----------------------------------------------------------------------===//
// Kernel signatures: what each CPU kernel reads and writes, checked at load
//===----------------------------------------------------------------------===//

/// A kernel instruction's buffers broke its op's rule (the message says how).
struct SignatureProblem {
  std::string what;
};

std::string typeString(const BufferSpec &b) {
  return shapeString(b.shape) + "x" + std::string(name(b.type));
}

bool isIndexType(DType t) { return t == DType::I32 || t == DType::I64; }
bool isNumericType(DType t) { return isFloat(t) || isIndexType(t); }

/// `a * b` into `out`; false on int64 overflow.
bool mulChecked(int64_t a, int64_t b, int64_t &out) {
  return !__builtin_mul_overflow(a, b, &out);
}

/// One kernel instruction's buffers and attributes, with the checks the
/// signature table composes. Every failure throws a SignatureProblem.
class OpCheck {
public:
  OpCheck(const Instruction &inst, const Function &fn) : inst_(inst) {
    for (uint32_t b : inst.operands)
      in_.push_back(&fn.buffers[b]);
    for (uint32_t b : inst.results)
      out_.push_back(&fn.buffers[b]);
  }

  [[noreturn]] void fail(const std::string &what) const {
    throw SignatureProblem{what};
  }
  void require(bool ok, const std::string &what) const {
    if (!ok)
      fail(what);
  }

  size_t numIn() const { return in_.size(); }
  size_t numOut() const { return out_.size(); }
  const BufferSpec &in(size_t i) const { return *in_[i]; }
  const BufferSpec &out(size_t i) const { return *out_[i]; }
  int64_t rankOf(const BufferSpec &b) const {
    return static_cast<int64_t>(b.shape.size());
  }

  // Attributes, converting the Attrs getters' errors.
  bool has(const char *key) const { return inst_.attrs.has(key); }
  int64_t integer(const char *key) const {
    return attr(key, [&] { return inst_.attrs.getInt(key); });
  }
  int64_t integer(const char *key, int64_t fallback) const {
    return inst_.attrs.has(key) ? integer(key) : fallback;
  }
  bool flag(const char *key) const {
    return attr(key, [&] { return inst_.attrs.getBool(key); });
  }
  double number(const char *key, double fallback) const {
    return attr(key, [&] { return inst_.attrs.getFloat(key, fallback); });
  }
  std::vector<int64_t> integers(const char *key) const {
    return attr(key, [&] { return inst_.attrs.getInts(key); });
  }
  std::string string(const char *key, const std::string &fallback) const {
    return attr(key, [&] { return inst_.attrs.getString(key, fallback); });
  }
  /// An axis attribute naming a dimension of a rank-`rank` buffer.
  int64_t axis(const char *key, int64_t rank) const {
    int64_t a = integer(key);
    require(a >= 0 && a < rank, std::string("'") + key + "' = " +
                                    std::to_string(a) +
                                    " is not a dimension of a rank-" +
                                    std::to_string(rank) + " operand");
    return a;
  }

  /// Buffer `b` (`what`) has an element type `allowed` accepts.
  void type(const BufferSpec &b, const char *what, bool (*allowed)(DType),
            const char *kinds) const {
    require(allowed(b.type), std::string(what) + " is " + typeString(b) +
                                 "; it must hold " + kinds);
  }
  void floats(const BufferSpec &b, const char *what) const {
    type(b, what, isFloat, "floats");
  }
  void numbers(const BufferSpec &b, const char *what) const {
    type(b, what, isNumericType, "numbers (floats, i32 or i64)");
  }
  void indices(const BufferSpec &b, const char *what) const {
    type(b, what, isIndexType, "indices (i32 or i64)");
  }
  /// `b` is exactly `shape` x `t`.
  void is(const BufferSpec &b, const char *what,
          const std::vector<int64_t> &shape, DType t) const {
    require(b.shape == shape && b.type == t,
            std::string(what) + " must be " + shapeString(shape) + "x" +
                std::string(name(t)) + ", not " + typeString(b));
  }
  void like(const BufferSpec &b, const char *what, const BufferSpec &model,
            const char *modelWhat) const {
    require(b.shape == model.shape && b.type == model.type,
            std::string(what) + " (" + typeString(b) + ") must be " +
                typeString(model) + " like " + modelWhat);
  }
  void sameShape(const BufferSpec &b, const char *what,
                 const BufferSpec &model, const char *modelWhat) const {
    require(b.shape == model.shape,
            std::string(what) + " (" + typeString(b) + ") must have the shape " +
                shapeString(model.shape) + " of " + modelWhat);
  }
  void scalar(const BufferSpec &b, const char *what) const {
    require(b.shape.empty(),
            std::string(what) + " must be a scalar, not " + typeString(b));
  }

  /// Every operand and the result: one shape and type (elementwise ops).
  void elementwise(bool (*allowed)(DType), const char *kinds) const {
    type(in(0), "operand 0", allowed, kinds);
    for (size_t i = 1; i < numIn(); ++i)
      require(in(i).shape == in(0).shape && in(i).type == in(0).type,
              "operand " + std::to_string(i) + " (" + typeString(in(i)) +
                  ") must be " + typeString(in(0)) + " like operand 0");
    like(out(0), "the result", in(0), "the operands");
  }

private:
  template <typename Get>
  auto attr(const char *key, Get get) const -> decltype(get()) {
    try {
      return get();
    } catch (const KernelError &e) {
      fail(std::string("attribute '") + key + "': " + e.what());
    }
  }

  const Instruction &inst_;
  std::vector<const BufferSpec *> in_, out_;
};

/// The matmul result shape (ErnieOps.cpp's matmulShape) of `a` x `b`.
std::vector<int64_t> matmulShape(const OpCheck &c, const BufferSpec &a,
                                 const BufferSpec &b) {
  bool ta = c.flag("transpose_a"), tb = c.flag("transpose_b");
  int64_t ra = c.rankOf(a), rb = c.rankOf(b);
  c.require(ra >= 2 && rb >= 2, "matmul operands need rank >= 2, got " +
                                    typeString(a) + " and " + typeString(b));
  int64_t m = a.shape[ra - 2], ka = a.shape[ra - 1];
  if (ta)
    std::swap(m, ka);
  int64_t kb = b.shape[rb - 2], n = b.shape[rb - 1];
  if (tb)
    std::swap(kb, n);
  c.require(ka == kb, "the contraction sizes differ: " + typeString(a) +
                          (ta ? " (transposed)" : "") + " by " + typeString(b) +
                          (tb ? " (transposed)" : ""));
  std::vector<int64_t> batch(a.shape.begin(), a.shape.end() - 2);
  c.require(rb == 2 || std::vector<int64_t>(b.shape.begin(), b.shape.end() - 2) ==
                           batch,
            "the batch dimensions differ: " + typeString(a) + " by " +
                typeString(b) + " (only a rank-2 rhs is applied to every batch)");
  batch.push_back(m);
  batch.push_back(n);
  return batch;
}

void checkMatmul(OpCheck &c) {
  c.numbers(c.in(0), "lhs");
  c.require(c.in(1).type == c.in(0).type,
            "lhs and rhs have different element types");
  c.is(c.out(0), "the result", matmulShape(c, c.in(0), c.in(1)), c.in(0).type);
}

/// acc + lhs x rhs, accumulated in the accumulator's type: the operands'
/// own, or f32 for f16 and bf16 ones.
void checkMatmulAccumulate(OpCheck &c) {
  c.type(c.in(0), "lhs",
         [](DType t) {
           return t == DType::F64 || t == DType::F32 || t == DType::F16 ||
                  t == DType::BF16;
         },
         "f64, f32, f16 or bf16 (fp8 GEMMs are scaled_matmul)");
  c.require(c.in(1).type == c.in(0).type,
            "lhs and rhs have different element types");
  DType sum = c.in(2).type;
  c.require(sum == c.in(0).type ||
                (sum == DType::F32 && (c.in(0).type == DType::BF16 ||
                                       c.in(0).type == DType::F16)),
            "the accumulator (" + typeString(c.in(2)) +
                ") must have the operands' element type, or f32 for bf16 "
                "or f16 operands");
  c.is(c.in(2), "the accumulator", matmulShape(c, c.in(0), c.in(1)), sum);
  c.like(c.out(0), "the result", c.in(2), "the accumulator");
}

void checkScaledMatmul(OpCheck &c) {
  auto fp8 = [](DType t) {
    return t == DType::F8E4M3FN || t == DType::F8E5M2;
  };
  c.type(c.in(0), "lhs", fp8, "fp8 codes");
  c.type(c.in(1), "rhs", fp8, "fp8 codes");
  c.is(c.in(2), "lhs_scale_inv", {}, DType::F32);
  c.is(c.in(3), "rhs_scale_inv", {}, DType::F32);
  c.require(c.out(0).type == DType::F32 || c.out(0).type == DType::BF16,
            "the result must be f32 or bf16, not " + typeString(c.out(0)));
  c.is(c.out(0), "the result", matmulShape(c, c.in(0), c.in(1)),
       c.out(0).type);
}

void checkReduce(OpCheck &c, bool floatOnly) {
  const BufferSpec &x = c.in(0);
  if (floatOnly)
    c.floats(x, "the input");
  else
    c.numbers(x, "the input");
  std::vector<int64_t> axes = c.integers("axes");
  bool keepdim = c.flag("keepdim");
  for (size_t i = 0; i < axes.size(); ++i) {
    c.require(axes[i] >= 0 && axes[i] < c.rankOf(x),
              "axis " + std::to_string(axes[i]) + " is not a dimension of " +
                  typeString(x));
    c.require(i == 0 || axes[i - 1] < axes[i],
              "the axes must be sorted and distinct, got " + shapeString(axes));
  }
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < c.rankOf(x); ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced)
      shape.push_back(x.shape[d]);
    else if (keepdim)
      shape.push_back(1);
  }
  c.is(c.out(0), "the result", shape, x.type);
}

void checkSoftmax(OpCheck &c) {
  c.elementwise(isFloat, "floats");
  c.axis("axis", c.rankOf(c.in(0)));
}

void checkNorm(OpCheck &c) {
  const BufferSpec &x = c.in(0);
  c.floats(x, "the input");
  c.require(c.rankOf(x) >= 1, "the input must have rank >= 1");
  const char *names[] = {"the input", "the weight", "the bias"};
  for (size_t i = 1; i < c.numIn(); ++i)
    c.is(c.in(i), names[i], {x.shape.back()}, x.type);
  double eps = c.number("epsilon", 0.0);
  c.require(eps >= 0.0, "epsilon must be non-negative, got " +
                            std::to_string(eps));
  c.like(c.out(0), "the result", x, "the input");
}

void checkReshape(OpCheck &c) {
  c.require(c.out(0).type == c.in(0).type &&
                c.out(0).bytes == c.in(0).bytes,
            "the result " + typeString(c.out(0)) +
                " must hold as many elements of the same type as the input " +
                typeString(c.in(0)));
}

void checkTranspose(OpCheck &c) {
  const BufferSpec &x = c.in(0);
  std::vector<int64_t> perm = c.integers("perm"), shape;
  std::vector<bool> seen(x.shape.size(), false);
  bool ok = perm.size() == x.shape.size();
  for (int64_t p : perm) {
    ok = ok && p >= 0 && p < c.rankOf(x) && !seen[p];
    if (!ok)
      break;
    seen[p] = true;
    shape.push_back(x.shape[p]);
  }
  c.require(ok, "perm " + shapeString(perm) + " is not a permutation of " +
                    std::to_string(x.shape.size()) + " dimensions");
  c.is(c.out(0), "the result", shape, x.type);
}

void checkBroadcast(OpCheck &c) {
  const BufferSpec &x = c.in(0), &y = c.out(0);
  std::vector<int64_t> dims = c.integers("dims");
  c.require(y.type == x.type, "the result " + typeString(y) +
                                  " must keep the input's element type");
  c.require(dims.size() == x.shape.size(),
            "dims " + shapeString(dims) + " needs one entry per input "
                                          "dimension of " + typeString(x));
  for (size_t i = 0; i < dims.size(); ++i) {
    c.require(dims[i] >= 0 && dims[i] < c.rankOf(y) &&
                  (i == 0 || dims[i - 1] < dims[i]),
              "dims " + shapeString(dims) + " must be increasing dimensions "
                                            "of the result " + typeString(y));
    c.require(x.shape[i] == 1 || x.shape[i] == y.shape[dims[i]],
              "input dimension " + std::to_string(i) + " of " + typeString(x) +
                  " cannot broadcast to " + typeString(y));
  }
}

void checkSlice(OpCheck &c) {
  const BufferSpec &x = c.in(0);
  std::vector<int64_t> start = c.integers("start"), limit = c.integers("limit"),
                       step = c.integers("step"), shape;
  size_t rank = x.shape.size();
  c.require(start.size() == rank && limit.size() == rank && step.size() == rank,
            "start, limit and step need one entry per dimension of " +
                typeString(x));
  for (size_t d = 0; d < rank; ++d) {
    c.require(start[d] >= 0 && start[d] <= limit[d] && limit[d] <= x.shape[d] &&
                  step[d] >= 1,
              "the range " + std::to_string(start[d]) + ":" +
                  std::to_string(limit[d]) + ":" + std::to_string(step[d]) +
                  " does not fit dimension " + std::to_string(d) + " of " +
                  typeString(x));
    int64_t span = limit[d] - start[d];
    shape.push_back(span / step[d] + (span % step[d] != 0));
  }
  c.is(c.out(0), "the result", shape, x.type);
}

void checkPad(OpCheck &c) {
  const BufferSpec &x = c.in(0);
  std::vector<int64_t> low = c.integers("low"), high = c.integers("high"),
                       interior = c.integers("interior"), shape;
  size_t rank = x.shape.size();
  c.require(low.size() == rank && high.size() == rank && interior.size() == rank,
            "low, high and interior need one entry per dimension of " +
                typeString(x));
  for (size_t d = 0; d < rank; ++d) {
    c.require(low[d] >= 0 && high[d] >= 0 && interior[d] >= 0,
              "the padding of dimension " + std::to_string(d) +
                  " must be non-negative");
    int64_t gaps, size;
    bool ok = mulChecked(x.shape[d] - 1, interior[d], gaps) &&
              !__builtin_add_overflow(gaps, x.shape[d], &size) &&
              !__builtin_add_overflow(size, low[d], &size) &&
              !__builtin_add_overflow(size, high[d], &size);
    c.require(ok, "the padded dimension " + std::to_string(d) +
                      " overflows 64 bits");
    shape.push_back(size);
  }
  c.is(c.out(0), "the result", shape, x.type);
}

/// concat's inputs or split's results (`pieces`) against the whole `all`.
void checkPieces(OpCheck &c, const BufferSpec &all,
                 const std::vector<const BufferSpec *> &pieces,
                 const char *what) {
  int64_t axis = c.axis("axis", c.rankOf(all)), total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const BufferSpec &p = *pieces[i];
    bool ok = p.type == all.type && p.shape.size() == all.shape.size();
    for (size_t d = 0; ok && d < all.shape.size(); ++d)
      ok = static_cast<int64_t>(d) == axis || p.shape[d] == all.shape[d];
    c.require(ok, std::string(what) + " " + std::to_string(i) + " (" +
                      typeString(p) + ") must match " + typeString(all) +
                      " but along axis " + std::to_string(axis));
    total += p.shape[axis]; // each at most all.shape[axis]: no overflow
    c.require(total <= all.shape[axis], "the pieces along axis " +
                                            std::to_string(axis) +
                                            " exceed " + typeString(all));
  }
  c.require(total == all.shape[axis],
            std::string("the ") + what + "s along axis " +
                std::to_string(axis) + " add up to " + std::to_string(total) +
                ", not to the " + std::to_string(all.shape[axis]) + " of " +
                typeString(all));
}

void checkSplit(OpCheck &c) {
  std::vector<const BufferSpec *> pieces;
  for (size_t i = 0; i < c.numOut(); ++i)
    pieces.push_back(&c.out(i));
  checkPieces(c, c.in(0), pieces, "result");
  // The kernel reads the result shapes; `sizes`, when given, agrees.
  if (c.has("sizes")) {
    std::vector<int64_t> sizes = c.integers("sizes"), got;
    int64_t axis = c.integer("axis");
    for (const BufferSpec *p : pieces)
      got.push_back(p->shape[axis]);
    c.require(sizes == got, "sizes " + shapeString(sizes) +
                                " differ from the results' " + shapeString(got));
  }
}

void checkConcat(OpCheck &c) {
  std::vector<const BufferSpec *> pieces;
  for (size_t i = 0; i < c.numIn(); ++i)
    pieces.push_back(&c.in(i));
  checkPieces(c, c.out(0), pieces, "input");
}

/// The shape of gather(x, indices) along `axis`.
std::vector<int64_t> gatheredShape(const BufferSpec &x, const BufferSpec &idx,
                                   int64_t axis) {
  std::vector<int64_t> shape(x.shape.begin(), x.shape.begin() + axis);
  shape.insert(shape.end(), idx.shape.begin(), idx.shape.end());
  shape.insert(shape.end(), x.shape.begin() + axis + 1, x.shape.end());
  return shape;
}

void checkGather(OpCheck &c) {
  const BufferSpec &x = c.in(0), &idx = c.in(1);
  c.indices(idx, "the indices");
  int64_t axis = c.axis("axis", c.rankOf(x));
  c.is(c.out(0), "the result", gatheredShape(x, idx, axis), x.type);
}

void checkEmbedding(OpCheck &c) {
  const BufferSpec &idx = c.in(0), &table = c.in(1);
  c.indices(idx, "the indices");
  c.floats(table, "the table");
  c.require(c.rankOf(table) == 2,
            "the table must be [vocab, hidden], not " + typeString(table));
  if (int64_t pad = c.integer("padding_idx", 0);
      c.has("padding_idx") && (pad < 0 || pad >= table.shape[0]))
    c.fail("padding_idx " + std::to_string(pad) +
           " is outside the vocabulary of " + std::to_string(table.shape[0]));
  std::vector<int64_t> shape = idx.shape;
  shape.push_back(table.shape[1]);
  c.is(c.out(0), "the result", shape, table.type);
}

void checkIndexAdd(OpCheck &c) {
  const BufferSpec &base = c.in(0), &idx = c.in(1), &updates = c.in(2);
  c.numbers(base, "the base");
  c.indices(idx, "the indices");
  int64_t axis = c.axis("axis", c.rankOf(base));
  c.is(updates, "the updates", gatheredShape(base, idx, axis), base.type);
  c.like(c.out(0), "the result", base, "the base");
}

void checkTopk(OpCheck &c) {
  const BufferSpec &x = c.in(0);
  c.numbers(x, "the input");
  int64_t axis = c.axis("axis", c.rankOf(x)), k = c.integer("k");
  c.require(k >= 1 && k <= x.shape[axis],
            "k = " + std::to_string(k) + " is outside [1, " +
                std::to_string(x.shape[axis]) + "]");
  std::vector<int64_t> shape = x.shape;
  shape[axis] = k;
  c.is(c.out(0), "the values", shape, x.type);
  c.is(c.out(1), "the indices", shape, DType::I64);
}

/// The [groups, tokens, k] choices of an MoE op: `choices` are index
/// buffers of one shape, `weights` (when given) float of the same shape.
void checkChoices(OpCheck &c, std::initializer_list<size_t> choices,
                  const BufferSpec *weights) {
  const BufferSpec &first = c.in(*choices.begin());
  c.indices(first, "the experts");
  c.require(c.rankOf(first) == 3, "the experts must be [groups, tokens, k], "
                                  "not " + typeString(first));
  for (size_t i : choices) {
    c.indices(c.in(i), "the slots");
    c.sameShape(c.in(i), "the slots", first, "the experts");
  }
  if (weights) {
    c.floats(*weights, "the weights");
    c.sameShape(*weights, "the weights", first, "the experts");
  }
}

/// Buffers [experts, groups, capacity, hidden] of `choices`' groups.
void checkExpertBuffers(OpCheck &c, const BufferSpec &b, const char *what,
                        const BufferSpec &choices) {
  c.floats(b, what);
  c.require(c.rankOf(b) == 4 && b.shape[1] == choices.shape[0] &&
                b.shape[0] >= choices.shape[2],
            std::string(what) + " must be [experts >= k, groups = " +
                std::to_string(choices.shape[0]) +
                ", capacity, hidden], not " + typeString(b));
}

void checkMoeRoute(OpCheck &c) {
  checkChoices(c, {0}, nullptr);
  const BufferSpec &e = c.in(0);
  int64_t experts = c.integer("num_experts"), capacity = c.integer("capacity");
  c.require(experts >= e.shape[2] && capacity >= 1,
            "num_experts = " + std::to_string(experts) + " and capacity = " +
                std::to_string(capacity) + " must be >= k = " +
                std::to_string(e.shape[2]) + " and >= 1");
  c.is(c.out(0), "the slots", e.shape, DType::I64);
}

void checkMoeDispatch(OpCheck &c) {
  checkChoices(c, {1, 2}, &c.in(3));
  const BufferSpec &x = c.in(0), &e = c.in(1);
  c.floats(x, "the input");
  c.require(c.rankOf(x) == 3 && x.shape[0] == e.shape[0] &&
                x.shape[1] == e.shape[1],
            "the input must be [groups, tokens, hidden] like the experts " +
                typeString(e) + ", not " + typeString(x));
  c.require(c.in(3).type == x.type, "the weights " + typeString(c.in(3)) +
                                        " must have the input's type");
  checkExpertBuffers(c, c.out(0), "the result", e);
  c.require(c.out(0).type == x.type && c.out(0).shape[3] == x.shape[2],
            "the result " + typeString(c.out(0)) +
                " must hold the input's hidden size and type");
}

void checkMoeCombine(OpCheck &c) {
  checkChoices(c, {1, 2}, &c.in(3));
  const BufferSpec &y = c.in(0), &e = c.in(1);
  checkExpertBuffers(c, y, "the input", e);
  c.require(c.in(3).type == y.type, "the weights " + typeString(c.in(3)) +
                                        " must have the input's type");
  c.is(c.out(0), "the result", {e.shape[0], e.shape[1], y.shape[3]}, y.type);
}

void checkMoeWeightsGrad(OpCheck &c) {
  checkChoices(c, {2, 3}, nullptr);
  const BufferSpec &a = c.in(0), &b = c.in(1), &e = c.in(2);
  checkExpertBuffers(c, b, "the buffers", e);
  c.is(a, "the tokens", {e.shape[0], e.shape[1], b.shape[3]}, b.type);
  c.is(c.out(0), "the result", e.shape, b.type);
}

/// Buffers [experts, groups, capacity, features] and their filled rows
/// [experts, groups].
void checkExpertGemmBuffers(OpCheck &c, const BufferSpec &b, const char *what,
                            const BufferSpec &rows) {
  c.floats(b, what);
  c.require(c.rankOf(b) == 4,
            std::string(what) + " must be [experts, groups, capacity, "
                                "features], not " + typeString(b));
  c.indices(rows, "the rows");
  c.require(rows.shape.size() == 2 && rows.shape[0] == b.shape[0] &&
                rows.shape[1] == b.shape[1],
            "the rows must be [experts, groups] of " + typeString(b) +
                ", not " + typeString(rows));
  double fill = c.number("fill", 1.0);
  c.require(fill > 0 && fill <= 1,
            "fill must be in (0, 1], not " + std::to_string(fill));
}

void checkExpertMatmul(OpCheck &c) {
  const BufferSpec &x = c.in(0), &w = c.in(1);
  checkExpertGemmBuffers(c, x, "the input", c.in(2));
  bool t = c.flag("transpose_weight");
  c.require(w.type == x.type && c.rankOf(w) == 3 && w.shape[0] == x.shape[0] &&
                w.shape[t ? 2 : 1] == x.shape[3],
            "the weight must be [experts, " + std::string(t ? "out, in" : "in, out") +
                "] of the input's type with experts = " +
                std::to_string(x.shape[0]) + " and in = " +
                std::to_string(x.shape[3]) + ", not " + typeString(w));
  c.is(c.out(0), "the result",
       {x.shape[0], x.shape[1], x.shape[2], w.shape[t ? 1 : 2]}, x.type);
}

void checkExpertWeightGrad(OpCheck &c) {
  const BufferSpec &x = c.in(0), &dy = c.in(1);
  checkExpertGemmBuffers(c, x, "the input", c.in(2));
  c.require(dy.type == x.type && c.rankOf(dy) == 4 &&
                std::equal(x.shape.begin(), x.shape.begin() + 3,
                           dy.shape.begin()),
            "the gradient must be [experts, groups, capacity] of the input " +
                typeString(x) + " x out, not " + typeString(dy));
  c.is(c.out(0), "the result", {x.shape[0], x.shape[3], dy.shape[3]}, x.type);
}

void checkRope(OpCheck &c) {
  const BufferSpec &x = c.in(0), &pos = c.in(1);
  c.floats(x, "the input");
  c.require(c.rankOf(x) == 4 && x.shape[3] % 2 == 0,
            "the input must be [batch, seq, heads, head_dim] with an even "
            "head_dim, not " + typeString(x));
  c.indices(pos, "the positions");
  std::vector<int64_t> batched = {x.shape[0], x.shape[1]}, flat = {x.shape[1]};
  c.require(pos.shape == batched || pos.shape == flat,
            "the positions must be [seq] or [batch, seq] = " +
                shapeString(batched) + ", not " + typeString(pos));
  double theta = c.number("theta", 10000.0);
  c.require(theta > 0.0, "theta must be positive");
  c.like(c.out(0), "the result", x, "the input");
}

/// attention(q, k, v)'s result shape (ErnieOps.cpp's inferAttentionType).
std::vector<int64_t> attentionShape(OpCheck &c) {
  const BufferSpec &q = c.in(0), &k = c.in(1), &v = c.in(2);
  c.floats(q, "the query");
  c.require(c.rankOf(q) == 4 && c.rankOf(k) == 4 && c.rankOf(v) == 4,
            "query, key and value must be [batch, seq, heads, head_dim]");
  c.require(k.type == q.type && v.type == q.type,
            "query, key and value must have one element type");
  c.require(k.shape[0] == q.shape[0] && v.shape[0] == q.shape[0] &&
                k.shape[1] == v.shape[1] && k.shape[2] == v.shape[2],
            "key " + typeString(k) + " and value " + typeString(v) +
                " must agree with each other on batch, seq and heads, and "
                "with the query " + typeString(q) + " on batch");
  c.require(k.shape[3] == q.shape[3], "the query's and the key's head_dim "
                                      "differ");
  c.require(q.shape[2] % k.shape[2] == 0,
            "query heads must be a multiple of key/value heads");
  c.require(!c.flag("causal") || k.shape[1] == q.shape[1],
            "causal attention needs query and key sequences of one length");
  c.require(!c.has("scale") || c.number("scale", 1.0) > 0.0,
            "scale must be positive");
  c.require(!c.has("window") || (c.flag("causal") && c.integer("window") >= 1),
            "a sliding window needs causal attention and at least one key");
  return {q.shape[0], q.shape[1], q.shape[2], v.shape[3]};
}

void checkAttention(OpCheck &c) {
  c.is(c.out(0), "the result", attentionShape(c), c.in(0).type);
}

void checkAttentionGrad(OpCheck &c) {
  c.is(c.in(3), "dout", attentionShape(c), c.in(0).type);
  c.like(c.out(0), "dquery", c.in(0), "the query");
  c.like(c.out(1), "dkey", c.in(1), "the key");
  c.like(c.out(2), "dvalue", c.in(2), "the value");
}

/// The loss shape of cross_entropy(logits, labels).
std::vector<int64_t> lossShape(OpCheck &c) {
  const BufferSpec &logits = c.in(0), &labels = c.in(1);
  c.floats(logits, "the logits");
  c.require(c.rankOf(logits) >= 1, "the logits need a vocabulary dimension");
  c.indices(labels, "the labels");
  std::vector<int64_t> tokens(logits.shape.begin(), logits.shape.end() - 1);
  c.require(labels.shape == tokens,
            "the labels must be " + shapeString(tokens) +
                " (the logits' shape without the vocabulary), not " +
                typeString(labels));
  c.integer("ignore_index", -100);
  std::string reduction = c.string("reduction", "mean");
  c.require(reduction == "mean" || reduction == "sum" || reduction == "none",
            "unknown reduction '" + reduction + "'");
  return reduction == "none" ? tokens : std::vector<int64_t>{};
}

void checkCrossEntropy(OpCheck &c) {
  c.is(c.out(0), "the loss", lossShape(c), c.in(0).type);
}

void checkCrossEntropyGrad(OpCheck &c) {
  c.is(c.in(2), "dloss", lossShape(c), c.in(0).type);
  c.like(c.out(0), "the result", c.in(0), "the logits");
}

void checkCrossEntropyAndGrad(OpCheck &c) {
  std::vector<int64_t> loss = lossShape(c);
  c.is(c.in(2), "dloss", loss, c.in(0).type);
  c.is(c.out(0), "the loss", loss, c.in(0).type);
  c.like(c.out(1), "the gradient", c.in(0), "the logits");
}

/// An optimizer update: `states` buffers after the parameter have its
/// shape; results are the parameter and the states, each in its own type.
void checkOptimizer(OpCheck &c, size_t states, bool withStep) {
  const BufferSpec &param = c.in(0);
  c.floats(param, "the parameter");
  for (size_t i = 1; i <= states; ++i) {
    c.floats(c.in(i), "a gradient or state operand");
    c.sameShape(c.in(i), "a gradient or state operand", param,
                "the parameter");
  }
  c.floats(c.in(states + 1), "the learning rate");
  c.scalar(c.in(states + 1), "the learning rate");
  if (withStep) {
    c.indices(c.in(states + 2), "the step");
    c.scalar(c.in(states + 2), "the step");
  }
  c.like(c.out(0), "the new parameter", param, "the parameter");
  // Results 1.. are the states after the gradient (operand 1).
  for (size_t i = 1; i < c.numOut(); ++i)
    c.like(c.out(i), "a new state", c.in(i + 1), "its state operand");
  for (const char *key : {"momentum", "weight_decay", "beta1", "beta2",
                          "epsilon"})
    c.number(key, 0.0);
}

/// How many operands and results a kernel takes (-1: one or more) and how
/// its buffers and attributes must look. The rules are the dialect's
/// (ErnieOps.cpp) as far as the kernel relies on them: what it reads and
/// writes then stays inside its buffers.
struct KernelSignature {
  const char *op;
  int operands, results;
  void (*check)(OpCheck &);
};

#define ERNIE_FLOAT_UNARY(OP)                                                  \
  {OP, 1, 1, [](OpCheck &c) { c.elementwise(isFloat, "floats"); }}
#define ERNIE_NUMERIC(OP, N)                                                   \
  {OP, N, 1, [](OpCheck &c) {                                                  \
     c.elementwise(isNumericType, "numbers (floats, i32 or i64)");             \
   }}

const KernelSignature kKernelSignatures[] = {
    ERNIE_FLOAT_UNARY("ernie.exp"),
    ERNIE_FLOAT_UNARY("ernie.log"),
    ERNIE_FLOAT_UNARY("ernie.sqrt"),
    ERNIE_FLOAT_UNARY("ernie.rsqrt"),
    ERNIE_FLOAT_UNARY("ernie.tanh"),
    ERNIE_FLOAT_UNARY("ernie.erf"),
    ERNIE_FLOAT_UNARY("ernie.reciprocal"),
    ERNIE_FLOAT_UNARY("ernie.sigmoid"),
    ERNIE_FLOAT_UNARY("ernie.silu"),
    {"ernie.gelu", 1, 1,
     [](OpCheck &c) {
       c.elementwise(isFloat, "floats");
       c.flag("approximate");
     }},
    ERNIE_NUMERIC("ernie.neg", 1),
    ERNIE_NUMERIC("ernie.abs", 1),
    ERNIE_NUMERIC("ernie.relu", 1),
    ERNIE_NUMERIC("ernie.add", 2),
    ERNIE_NUMERIC("ernie.sub", 2),
    ERNIE_NUMERIC("ernie.mul", 2),
    ERNIE_NUMERIC("ernie.div", 2),
    ERNIE_NUMERIC("ernie.maximum", 2),
    ERNIE_NUMERIC("ernie.minimum", 2),
    {"ernie.pow", 2, 1, [](OpCheck &c) { c.elementwise(isFloat, "floats"); }},
    {"ernie.compare", 2, 1,
     [](OpCheck &c) {
       c.require(c.in(1).shape == c.in(0).shape && c.in(1).type == c.in(0).type,
                 "the operands " + typeString(c.in(0)) + " and " +
                     typeString(c.in(1)) + " differ");
       c.is(c.out(0), "the result", c.in(0).shape, DType::I1);
       int64_t direction = c.integer("direction");
       c.require(direction >= 0 && direction <= 5,
                 "unknown compare direction " + std::to_string(direction));
     }},
    {"ernie.select", 3, 1,
     [](OpCheck &c) {
       c.is(c.in(0), "the condition", c.in(1).shape, DType::I1);
       c.like(c.in(2), "on_false", c.in(1), "on_true");
       c.like(c.out(0), "the result", c.in(1), "on_true");
     }},
    {"ernie.cast", 1, 1,
     [](OpCheck &c) {
       c.sameShape(c.out(0), "the result", c.in(0), "the operand");
     }},
    {"ernie.stop_gradient", 1, 1,
     [](OpCheck &c) {
       c.like(c.out(0), "the result", c.in(0), "the operand");
     }},
    {"ernie.full", 0, 1, [](OpCheck &c) { c.number("value", 0.0); }},
    {"ernie.iota", 0, 1,
     [](OpCheck &c) {
       c.numbers(c.out(0), "the result");
       c.axis("dimension", c.rankOf(c.out(0)));
     }},
    {"ernie.matmul", 2, 1, checkMatmul},
    {"ernie.scaled_matmul", 4, 1, checkScaledMatmul},
    {"ernie.matmul_accumulate", 3, 1, checkMatmulAccumulate},
    {"ernie.reduce_sum", 1, 1, [](OpCheck &c) { checkReduce(c, false); }},
    {"ernie.reduce_mean", 1, 1, [](OpCheck &c) { checkReduce(c, true); }},
    {"ernie.reduce_max", 1, 1, [](OpCheck &c) { checkReduce(c, false); }},
    {"ernie.softmax", 1, 1, checkSoftmax},
    {"ernie.log_softmax", 1, 1, checkSoftmax},
    {"ernie.rms_norm", 2, 1, checkNorm},
    {"ernie.layer_norm", 3, 1, checkNorm},
    {"ernie.reshape", 1, 1, checkReshape},
    {"ernie.transpose", 1, 1, checkTranspose},
    {"ernie.broadcast", 1, 1, checkBroadcast},
    {"ernie.slice", 1, 1, checkSlice},
    {"ernie.pad", 1, 1, checkPad},
    {"ernie.split", 1, -1, checkSplit},
    {"ernie.concat", -1, 1, checkConcat},
    {"ernie.gather", 2, 1, checkGather},
    {"ernie.embedding", 2, 1, checkEmbedding},
    {"ernie.index_add", 3, 1, checkIndexAdd},
    {"ernie.topk", 1, 2, checkTopk},
    {"ernie.moe_route", 1, 1, checkMoeRoute},
    {"ernie.moe_dispatch", 4, 1, checkMoeDispatch},
    {"ernie.moe_combine", 4, 1, checkMoeCombine},
    {"ernie.expert_matmul", 3, 1, checkExpertMatmul},
    {"ernie.expert_weight_grad", 3, 1, checkExpertWeightGrad},
    {"ernie.moe_weights_grad", 4, 1, checkMoeWeightsGrad},
    {"ernie.rope", 2, 1, checkRope},
    {"ernie.attention", 3, 1, checkAttention},
    {"ernie.attention_grad", 4, 3, checkAttentionGrad},
    {"ernie.cross_entropy", 2, 1, checkCrossEntropy},
    {"ernie.cross_entropy_grad", 3, 1, checkCrossEntropyGrad},
    {"ernie.cross_entropy_and_grad", 3, 2, checkCrossEntropyAndGrad},
    {"ernie.sgd_update", 4, 2,
     [](OpCheck &c) {
       checkOptimizer(c, 2, false);
       c.flag("nesterov");
     }},
    {"ernie.adamw_update", 6, 3,
     [](OpCheck &c) { checkOptimizer(c, 3, true); }},
};

#undef ERNIE_FLOAT_UNARY
#undef ERNIE_NUMERIC

const KernelSignature *kernelSignature(const std::string &op) {
  for (const KernelSignature &s : kKernelSignatures)
    if (op == s.op)
      return &s;
  return nullptr;
}

} // namespace

std::string kernelSignatureProblem(const Instruction &inst, const Function &fn) {
  const KernelSignature *signature = kernelSignature(inst.op);
  if (!signature)
    return "the runtime has no signature check for '" + inst.op + "'";
  auto count = [](int want, size_t got, const char *what) -> std::string {
    if (want < 0 ? got >= 1 : got == size_t(want))
      return "";
    return "takes " +
           (want < 0 ? std::string("one or more") : std::to_string(want)) +
           " " + what + (want == 1 ? "" : "s") + ", not " +
           std::to_string(got);
  };
  std::string problem = count(signature->operands, inst.operands.size(), "operand");
  if (problem.empty())
    problem = count(signature->results, inst.results.size(), "result");
  if (!problem.empty())
    return problem;
  try {
    OpCheck check(inst, fn);
    signature->check(check);
  } catch (const SignatureProblem &p) {
    return p.what;
  }
  return "";
}

std::vector<RuntimeOp> runtimeOps() {
  std::vector<RuntimeOp> ops;
  for (const KernelSignature &s : kKernelSignatures)
    ops.push_back({s.op, s.operands, s.results, /*executor=*/false});
  for (const ExecutorOpSignature &s : kExecutorOps) {
    auto count = [](size_t n) { return n == kVariadic ? -1 : int(n); };
    ops.push_back({s.op, count(s.operands), count(s.results), /*executor=*/true});
  }
  ops.push_back({"ernie.constant", 0, 1, /*executor=*/true});
  return ops;
}

bool isExecutorOp(const std::string &op) {
  return op == "ernie.constant" || executorOpSignature(op) != nullptr;
}

const char *bucketedCollective(const std::string &op) {
  static constexpr const char *kBuckets[][2] = {
      {"ernie.all_reduce_start", "ernie.all_reduce"},
      {"ernie.reduce_scatter_start", "ernie.reduce_scatter"},
      {"ernie.all_gather_start", "ernie.all_gather"}};
  for (const auto &[start, blocking] : kBuckets)
    if (op == start)
      return blocking;
  return nullptr;
}

} // namespace ernie::runtime
