//===- Program.cpp - loading and validating program files --------------------===//

#include "ernie/runtime/Program.h"
#include "ernie/runtime/BoundedInput.h"
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

namespace ernie::runtime {
namespace fb = ernie::program;

bool ShardingSpec::isReplicated() const {
  return partials.empty() &&
         std::all_of(dims.begin(), dims.end(),
                     [](const Axes &axes) { return axes.empty(); });
}

namespace {

/// The ops the executor runs itself, besides constants: how many operands
/// and results each takes and whether it names a group by axes.
struct ExecutorOpSignature {
  const char *op;
  size_t operands, results; // kVariadic: as many results as operands, >= 1
  bool needsAxes;
};

constexpr size_t kVariadic = ~size_t(0);

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

namespace {

} // namespace

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

namespace {

/// Collects the first problem found, prefixed with where it is.
class Checker {
public:
  explicit Checker(std::string source) : source_(std::move(source)) {}
  [[noreturn]] void fail(const std::string &what) const {
    throw ProgramError(source_ + ": " + what);
  }
  void require(bool ok, const std::string &what) const {
    if (!ok)
      fail(what);
  }

private:
  std::string source_;
};

DType decode(fb::DType t, const Checker &check) {
  switch (t) {
  case fb::DType::F64: return DType::F64;
  case fb::DType::F32: return DType::F32;
  case fb::DType::F16: return DType::F16;
  case fb::DType::BF16: return DType::BF16;
  case fb::DType::F8E4M3FN: return DType::F8E4M3FN;
  case fb::DType::F8E5M2: return DType::F8E5M2;
  case fb::DType::I64: return DType::I64;
  case fb::DType::I32: return DType::I32;
  case fb::DType::I1: return DType::I1;
  }
  check.fail("unknown element type code " + std::to_string(int(t)));
}

ReduceOp decode(fb::ReduceKind k, const Checker &check) {
  switch (k) {
  case fb::ReduceKind::Sum: return ReduceOp::Sum;
  case fb::ReduceKind::Avg: return ReduceOp::Avg;
  case fb::ReduceKind::Max: return ReduceOp::Max;
  case fb::ReduceKind::Min: return ReduceOp::Min;
  }
  check.fail("unknown reduce kind code " + std::to_string(int(k)));
}

Role decode(fb::Role r, const Checker &check) {
  switch (r) {
  case fb::Role::Input: return Role::Input;
  case fb::Role::Parameter: return Role::Parameter;
  case fb::Role::OptimizerState: return Role::OptimizerState;
  case fb::Role::LearningRate: return Role::LearningRate;
  case fb::Role::Step: return Role::Step;
  case fb::Role::Loss: return Role::Loss;
  case fb::Role::Residual: return Role::Residual;
  case fb::Role::Gradient: return Role::Gradient;
  case fb::Role::MicroBatchMax: return Role::MicroBatchMax;
  case fb::Role::MicroBatchSum: return Role::MicroBatchSum;
  }
  check.fail("unknown role code " + std::to_string(int(r)));
}

std::string str(const flatbuffers::String *s) { return s ? s->str() : ""; }

std::vector<int64_t> ints(const flatbuffers::Vector<int64_t> *v) {
  return v ? std::vector<int64_t>(v->begin(), v->end()) : std::vector<int64_t>{};
}

Axes strings(const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>> *v) {
  Axes out;
  if (v)
    for (const flatbuffers::String *s : *v)
      out.push_back(s->str());
  return out;
}

/// Why `shape` cannot be a tensor's, or "": every dimension at least 1
/// (ernie has no zero-size tensors; the compiler rejects them too) and the
/// element count, and its bytes of `type`, within int64.
std::string shapeProblem(const std::vector<int64_t> &shape, DType type) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 1)
      return "dimension " + std::to_string(d) + " of " + shapeString(shape) +
             " is " + std::to_string(shape[d]) +
             " (dimensions are at least 1)";
    if (__builtin_mul_overflow(n, shape[d], &n))
      return "the element count of " + shapeString(shape) +
             " overflows 64 bits";
  }
  int64_t bytes;
  if (__builtin_mul_overflow(n, int64_t(byteSize(type)), &bytes))
    return "the byte size of " + shapeString(shape) + "x" +
           std::string(name(type)) + " overflows 64 bits";
  return "";
}

Attrs decodeAttrs(const flatbuffers::Vector<flatbuffers::Offset<fb::Attr>> *attrs,
                  const Checker &check, const std::string &where) {
  Attrs out;
  if (!attrs)
    return out;
  for (const fb::Attr *a : *attrs) {
    const std::string name = a->name()->str();
    switch (a->value_type()) {
    case fb::AttrValue::IntValue:
      out.set(name, int64_t(a->value_as_IntValue()->value()));
      break;
    case fb::AttrValue::FloatValue:
      out.set(name, a->value_as_FloatValue()->value());
      break;
    case fb::AttrValue::BoolValue:
      out.set(name, a->value_as_BoolValue()->value());
      break;
    case fb::AttrValue::StringValue:
      out.set(name, str(a->value_as_StringValue()->value()));
      break;
    case fb::AttrValue::IntsValue:
      out.set(name, ints(a->value_as_IntsValue()->values()));
      break;
    default:
      check.fail(where + ": attribute '" + name + "' has an unknown kind");
    }
  }
  return out;
}

ShardingSpec decodeSharding(const fb::Sharding *s, const Mesh &mesh,
                            const Checker &check, const std::string &where) {
  ShardingSpec spec;
  if (!s)
    return spec;
  auto knownAxis = [&](const std::string &axis) {
    const auto &names = mesh.axisNames();
    check.require(std::find(names.begin(), names.end(), axis) != names.end(),
                  where + ": sharding names axis '" + axis +
                      "', which the mesh does not have");
  };
  if (s->dims())
    for (const fb::DimSharding *d : *s->dims()) {
      spec.dims.push_back(strings(d->axes()));
      for (const std::string &axis : spec.dims.back())
        knownAxis(axis);
    }
  if (s->partials())
    for (const fb::Partial *p : *s->partials()) {
      knownAxis(p->axis()->str());
      spec.partials.emplace_back(p->axis()->str(), decode(p->kind(), check));
    }
  // An axis splits one dimension or holds one pending reduction, once:
  // pieces and groups are computed per axis.
  std::vector<std::string> seen;
  for (const Axes &axes : spec.dims)
    seen.insert(seen.end(), axes.begin(), axes.end());
  for (const auto &partial : spec.partials)
    seen.push_back(partial.first);
  std::sort(seen.begin(), seen.end());
  auto twice = std::adjacent_find(seen.begin(), seen.end());
  check.require(twice == seen.end(),
                where + ": the sharding names axis '" +
                    (twice == seen.end() ? std::string() : *twice) + "' twice");
  return spec;
}

int64_t axesSize(const Mesh &mesh, const Axes &axes) {
  int64_t n = 1;
  for (const std::string &axis : axes)
    n *= mesh.axisSizes()[mesh.axisIndex(axis)];
  return n;
}

TensorSpec decodeTensor(const fb::TensorSpec *t, const Function &fn,
                        const Mesh &mesh, const Checker &check,
                        const std::string &where) {
  TensorSpec spec;
  spec.name = str(t->name());
  spec.role = decode(t->role(), check);
  spec.type = decode(t->dtype(), check);
  spec.globalShape = ints(t->global_shape());
  spec.localShape = ints(t->local_shape());
  spec.sharding = decodeSharding(t->sharding(), mesh, check, where);
  spec.buffer = t->buffer();
  spec.updates = str(t->updates());
  check.require(spec.buffer < fn.buffers.size(),
                where + ": buffer " + std::to_string(spec.buffer) +
                    " does not exist");
  std::string problem = shapeProblem(spec.globalShape, spec.type);
  check.require(problem.empty(), where + ": global shape: " + problem);
  // The runtime feeds these as scalars it makes itself (Session).
  if (spec.role == Role::LearningRate || spec.role == Role::Step)
    check.require(spec.localShape.empty() && spec.globalShape.empty() &&
                      (spec.role == Role::Step || isFloat(spec.type)),
                  where + ": a " + roleName(spec.role) + " must be a " +
                      (spec.role == Role::Step ? "" : "float ") +
                      "scalar, not " + shapeString(spec.localShape) + "x" +
                      std::string(name(spec.type)));
  const BufferSpec &b = fn.buffers[spec.buffer];
  check.require(b.shape == spec.localShape && b.type == spec.type,
                where + ": local " + shapeString(spec.localShape) + "x" +
                    std::string(name(spec.type)) + " does not match its buffer " +
                    shapeString(b.shape) + "x" + std::string(name(b.type)));
  check.require(spec.globalShape.size() == spec.localShape.size(),
                where + ": global and local ranks differ");
  check.require(spec.sharding.dims.empty() ||
                    spec.sharding.dims.size() == spec.localShape.size(),
                where + ": the sharding has the wrong number of dimensions");
  // A dimension split `parts` ways holds ceil(global / parts) on every
  // rank, the last pieces padded (GSPMD's convention for uneven shards).
  for (size_t d = 0; d < spec.localShape.size(); ++d) {
    int64_t parts =
        spec.sharding.dims.empty() ? 1 : axesSize(mesh, spec.sharding.dims[d]);
    int64_t global = spec.globalShape[d];
    check.require(spec.localShape[d] == global / parts + (global % parts != 0),
                  where + ": global " + shapeString(spec.globalShape) +
                      " split by its sharding is not local " +
                      shapeString(spec.localShape) +
                      " (a dimension split n ways holds ceil(global / n))");
  }
  return spec;
}

/// Why the executor could not run collective `inst` on its buffers (the
/// dialect verifier's shape rules: the executor writes the result from
/// them), or "" when it can.
/// Why a reducing collective's `kind` is not one the executor knows.
std::string reduceKindProblem(const Attrs &attrs) {
  std::string kind;
  try {
    kind = attrs.getString("kind", "sum");
  } catch (const KernelError &) {
    return "'kind' is not a string";
  }
  if (kind != "sum" && kind != "avg" && kind != "max" && kind != "min")
    return "unknown reduce kind '" + kind + "'";
  return "";
}

std::string collectiveShapeProblem(const Instruction &inst, const Function &fn,
                                   const Mesh &mesh) {
  if (const char *bucketOf = bucketedCollective(inst.op)) {
    const std::string blocking = bucketOf;
    // A bucket: each operand and its result as the blocking collective
    // takes them, every operand of the first's element type.
    const DType type = fn.buffers[inst.operands[0]].type;
    Instruction one;
    one.op = blocking;
    one.attrs = inst.attrs;
    one.axes = inst.axes;
    for (size_t k = 0; k < inst.operands.size(); ++k) {
      if (fn.buffers[inst.operands[k]].type != type)
        return "operand " + std::to_string(k) +
               " must have the first operand's element type";
      one.operands = {inst.operands[k]};
      one.results = {inst.results[k]};
      if (std::string problem = collectiveShapeProblem(one, fn, mesh);
          !problem.empty())
        return "operand " + std::to_string(k) + ": " + problem;
    }
    if (blocking == "ernie.all_gather")
      return "";
    std::string accumulate;
    try {
      accumulate = inst.attrs.getString("accumulate", "");
    } catch (const KernelError &) {
      return "'accumulate' is not a string";
    }
    if (!accumulate.empty() && accumulate != "f32")
      return "accumulates in '" + accumulate + "': only f32 (or the "
             "operands' own type) is known";
    return "";
  }
  const BufferSpec &out = fn.buffers[inst.results[0]];
  if (inst.op == "ernie.axis_index")
    return out.type == DType::I64 && elementCount(out.shape) == 1
               ? ""
               : "the result must be one i64";
  // The operand the result is shaped from (shard_insert: the destination).
  const BufferSpec &in =
      fn.buffers[inst.operands
                     [inst.op == "ernie.shard_insert" ? kShardInsertDest : 0]];
  if (in.type != out.type || in.shape.size() != out.shape.size())
    return "the result must keep the operand's rank and element type";
  int64_t n = axesSize(mesh, inst.axes), rank = in.shape.size();
  std::vector<int64_t> want = in.shape;
  auto dim = [&](const char *key, int64_t &d) {
    try {
      d = inst.attrs.getInt(key);
    } catch (const KernelError &) {
      return false; // missing, or not an integer
    }
    return d >= 0 && d < rank;
  };
  auto divide = [&](int64_t d) {
    if (want[d] % n != 0)
      return false;
    want[d] /= n;
    return true;
  };
  // The result's bytes must stay a valid size (Program::load checked the
  // result buffer's own; this guards the comparison against a wrap).
  auto multiply = [&](int64_t d) {
    return !__builtin_mul_overflow(want[d], n, &want[d]);
  };
  // The reduce kind, where the op reduces (the executor's reduceKind()).
  if (inst.op == "ernie.all_reduce" || inst.op == "ernie.reduce_scatter" ||
      inst.op == "ernie.partial_init")
    if (std::string problem = reduceKindProblem(inst.attrs); !problem.empty())
      return problem;
  // `shift`: an integer, required by the permute, optional (0) elsewhere.
  bool shifted = inst.op == "ernie.collective_permute_start" ||
                 inst.op == "ernie.shard_slice" ||
                 inst.op == "ernie.shard_insert";
  if (shifted && (inst.attrs.has("shift") ||
                  inst.op == "ernie.collective_permute_start")) {
    try {
      inst.attrs.getInt("shift");
    } catch (const KernelError &) {
      return "'shift' is missing or not an integer";
    }
  }
  int64_t d = 0, concat = 0;
  if (inst.op == "ernie.all_gather" || inst.op == "ernie.reduce_scatter" ||
      inst.op == "ernie.shard_slice") {
    if (!dim("dim", d))
      return "'dim' is missing or out of range";
    if (inst.op == "ernie.all_gather") {
      if (!multiply(d))
        return "the gathered dimension overflows 64 bits";
    } else if (!divide(d))
      return "dimension " + std::to_string(d) + " does not divide over " +
             std::to_string(n) + " ranks";
  } else if (inst.op == "ernie.shard_insert") {
    // out is dest; the piece is dest's n-th part along `dim`.
    if (!dim("dim", d))
      return "'dim' is missing or out of range";
    const BufferSpec &piece = fn.buffers[inst.operands[kShardInsertPiece]];
    std::vector<int64_t> part = in.shape;
    if (part[d] % n != 0)
      return "dimension " + std::to_string(d) + " does not divide over " +
             std::to_string(n) + " ranks";
    part[d] /= n;
    if (piece.type != in.type || piece.shape != part)
      return "the piece must be " + shapeString(part) + "x" +
             std::string(name(in.type)) + " (the destination " +
             shapeString(in.shape) + " split " + std::to_string(n) +
             " ways along dimension " + std::to_string(d) + "), not " +
             shapeString(piece.shape) + "x" + std::string(name(piece.type));
  } else if (inst.op == "ernie.all_to_all") {
    if (!dim("split_dim", d) || !dim("concat_dim", concat))
      return "'split_dim' or 'concat_dim' is missing or out of range";
    // The executor cuts split_dim into n chunks even when it is concat_dim.
    if (want[d] % n != 0)
      return "split_dim " + std::to_string(d) + " does not divide over " +
             std::to_string(n) + " ranks";
    if (d != concat) {
      divide(d);
      if (!multiply(concat))
        return "the concatenated dimension overflows 64 bits";
    }
  }
  if (out.shape != want)
    return "the result must be " + shapeString(want) + ", not " +
           shapeString(out.shape);
  return "";
}

/// Why the executor could not run pipeline op `inst` (its attributes, and
/// for the stage collectives the result against the operand), or "". What
/// depends on the stage (peers, member lists) is checked per stage later.
std::string stageOpProblem(const Instruction &inst, const Function &fn) {
  auto integer = [&](const char *key, bool nonNegative) -> std::string {
    int64_t v;
    try {
      v = inst.attrs.getInt(key);
    } catch (const KernelError &) {
      return std::string("'") + key + "' is missing or not an integer";
    }
    if (nonNegative && v < 0)
      return std::string("'") + key + "' is negative";
    return "";
  };
  std::string problem = integer("channel", true);
  if (!problem.empty())
    return problem;
  if (inst.op == "ernie.send" || inst.op == "ernie.recv")
    return integer("peer", false);
  try {
    inst.attrs.getInts("stages");
  } catch (const KernelError &) {
    return "'stages' is missing or not a list of integers";
  }
  const BufferSpec &in = fn.buffers[inst.operands[0]];
  const BufferSpec &out = fn.buffers[inst.results[0]];
  if (in.type != out.type || in.shape != out.shape)
    return "the result must be " + shapeString(in.shape) + "x" +
           std::string(name(in.type)) + " like the operand, not " +
           shapeString(out.shape) + "x" + std::string(name(out.type));
  return "";
}

/// The two buffers share arena bytes.
bool overlap(const BufferSpec &a, const BufferSpec &b) {
  return a.bytes && b.bytes && a.offset < b.offset + b.bytes &&
         b.offset < a.offset + a.bytes;
}

/// Every ernie.wait takes the result of an earlier
/// ernie.collective_permute_start, and every start has exactly one later
/// wait. Between the two the communication thread reads the start's operand
/// and writes its result, so no instruction in between may write memory of
/// either or read memory of the result: the executor would race with the
/// transfer.
void checkStartsAndWaits(const Function &fn, const std::string &at,
                         const Checker &check) {
  auto where = [&](size_t index) {
    return at + ", instruction #" + std::to_string(index) + " (" +
           fn.instructions[index].op + ")";
  };
  auto buffer = [](uint32_t b) { return "buffer " + std::to_string(b); };
  auto isStart = [](const std::string &op) {
    return op == "ernie.collective_permute_start" ||
           bucketedCollective(op) != nullptr;
  };
  // A start's result -> the start's index, until the result's wait; a
  // start's operands are read until the first of its waits (the transfer is
  // over then), so they are in flight while the start is `reading`.
  std::map<uint32_t, size_t> inFlight;
  std::set<size_t> reading;
  for (size_t i = 0; i < fn.instructions.size(); ++i) {
    const Instruction &inst = fn.instructions[i];
    if (inst.op == "ernie.wait") {
      auto it = inFlight.find(inst.operands[0]);
      check.require(it != inFlight.end(),
                    where(i) + ": its operand (" + buffer(inst.operands[0]) +
                        ") is not the result of an earlier started "
                        "collective (ernie.*_start) awaiting its wait");
      reading.erase(it->second);
      inFlight.erase(it); // Its result is written now: checked below.
    }
    if (isStart(inst.op))
      for (uint32_t result : inst.results) {
        auto it = inFlight.find(result);
        if (it != inFlight.end())
          check.fail(where(i) + ": its result (" + buffer(result) +
                     ") is still in flight from instruction #" +
                     std::to_string(it->second));
      }
    auto conflict = [&](uint32_t b, const char *verb, uint32_t other,
                        const char *role, size_t start) {
      check.fail(where(i) + ": " + verb + " " + buffer(b) +
                 ", whose memory overlaps " + buffer(other) + ", the " + role +
                 " of the " + fn.instructions[start].op + " at instruction #" +
                 std::to_string(start) + ", which is in flight until its "
                 "ernie.wait");
    };
    const std::vector<uint32_t> none,
        &written = isView(fn, inst) ? none : inst.results;
    for (const auto &[result, start] : inFlight) {
      for (uint32_t b : written)
        if (overlap(fn.buffers[b], fn.buffers[result]))
          conflict(b, "writes", result, "result", start);
      for (uint32_t b : inst.operands)
        if (overlap(fn.buffers[b], fn.buffers[result]))
          conflict(b, "reads", result, "result", start);
    }
    for (size_t start : reading)
      for (uint32_t operand : fn.instructions[start].operands)
        for (uint32_t b : written)
          if (overlap(fn.buffers[b], fn.buffers[operand]))
            conflict(b, "writes", operand, "operand", start);
    if (isStart(inst.op)) {
      for (uint32_t result : inst.results)
        inFlight[result] = i;
      reading.insert(i);
    }
  }
  for (const auto &[result, start] : inFlight)
    check.fail(where(start) + ": no later ernie.wait takes its result (" +
               buffer(result) + ")");
}

/// Every buffer an instruction reads, and every result the function
/// returns, holds a value by then: an argument's, or an earlier
/// instruction's result (in-place results reuse a written buffer). A
/// buffer nothing wrote would hand on whatever bytes the arena held.
void checkDefinedBeforeUse(const Function &fn, const std::string &at,
                           const Checker &check) {
  std::vector<bool> written(fn.buffers.size(), false);
  // Each argument has a buffer of its own, written only in place (by an
  // instruction reading it) or with a value the function returns there (a
  // state it replaces): the executor binds an argument's buffer to the
  // caller's tensor, which nothing else may reach.
  std::vector<bool> argument(fn.buffers.size(), false), returned(fn.buffers.size(), false);
  for (const TensorSpec &res : fn.results)
    if (res.buffer < returned.size())
      returned[res.buffer] = true;
  for (size_t i = 0; i < fn.arguments.size(); ++i) {
    uint32_t b = fn.arguments[i].buffer;
    check.require(!argument[b], at + ", argument " + std::to_string(i) +
                                    ": buffer " + std::to_string(b) +
                                    " is an earlier argument's");
    argument[b] = written[b] = true;
  }
  for (size_t i = 0; i < fn.instructions.size(); ++i) {
    const Instruction &inst = fn.instructions[i];
    for (uint32_t b : inst.operands)
      check.require(written[b], at + ", instruction #" + std::to_string(i) +
                                    " (" + inst.op + "): reads buffer " +
                                    std::to_string(b) +
                                    ", which no argument or earlier "
                                    "instruction wrote");
    for (uint32_t b : inst.results) {
      check.require(!argument[b] || returned[b] ||
                        std::find(inst.operands.begin(), inst.operands.end(),
                                  b) != inst.operands.end(),
                    at + ", instruction #" + std::to_string(i) + " (" +
                        inst.op + "): writes argument buffer " +
                        std::to_string(b) + " without reading it (only an "
                        "in-place result, or a value the function returns "
                        "there, may take an argument's buffer)");
      written[b] = true;
    }
  }
  for (size_t i = 0; i < fn.results.size(); ++i)
    check.require(written[fn.results[i].buffer],
                  at + ", result " + std::to_string(i) + ": buffer " +
                      std::to_string(fn.results[i].buffer) +
                      " is not an argument's and no instruction writes it");
}

/// Every buffer in the arguments' region is an argument's, or a view of
/// one: the executor gives that region no memory of its own, only the
/// caller's tensors (or staged copies) bound per call, so a buffer there
/// that no argument binds would have no memory at all.
void checkArgumentRegion(const Function &fn, const std::string &at,
                         const Checker &check) {
  std::vector<uint32_t> root(fn.buffers.size());
  for (uint32_t b = 0; b < root.size(); ++b)
    root[b] = b;
  for (const Instruction &inst : fn.instructions)
    if (isView(fn, inst))
      root[inst.results[0]] = root[inst.operands[0]];
  std::vector<bool> argument(fn.buffers.size(), false);
  for (const TensorSpec &arg : fn.arguments)
    argument[arg.buffer] = true;
  for (uint32_t b = 0; b < fn.buffers.size(); ++b)
    check.require(!fn.inArgumentRegion(b) || argument[root[b]],
                  at + ", buffer " + std::to_string(b) +
                      " lies in the arguments' region but is no argument's "
                      "buffer nor a view of one");
}

/// An "ernie.fused" instruction's body, compiled into its kernel; its
/// operand and result buffers must hold the body's inputs and yields.
void decodeFused(const fb::Instruction *i, Instruction &inst,
                 const Function &fn, const Checker &check,
                 const std::string &where) {
  const fb::FusedBody *b = i->body();
  check.require(b && b->values() && b->steps() && b->yields(),
                where + ": a fused instruction without its body");
  auto body = std::make_shared<FusedBody>();
  body->inputs = inst.operands.size();
  for (const fb::Buffer *v : *b->values()) {
    FusedValue value{decode(v->dtype(), check), ints(v->shape())};
    std::string problem = shapeProblem(value.shape, value.type);
    check.require(problem.empty(), where + ", fused value " +
                                       std::to_string(body->values.size()) +
                                       ": " + problem);
    body->values.push_back(std::move(value));
  }
  for (const fb::Instruction *s : *b->steps()) {
    FusedStep step;
    step.op = s->op()->str();
    const std::string at = where + ", fused step #" +
                           std::to_string(body->steps.size()) + " (" +
                           step.op + ")";
    if (s->operands())
      step.operands.assign(s->operands()->begin(), s->operands()->end());
    if (s->results())
      step.results.assign(s->results()->begin(), s->results()->end());
    check.require(!s->body() && !s->data() && !s->axes(),
                  at + ": a fused step is one elementwise op");
    step.attrs = decodeAttrs(s->attrs(), check, at);
    body->steps.push_back(std::move(step));
  }
  body->yields.assign(b->yields()->begin(), b->yields()->end());
  check.require(body->values.size() >= body->inputs &&
                    body->yields.size() == inst.results.size(),
                where + ": the fused body does not match the instruction's " +
                    "operands and results");
  auto matches = [&](uint32_t buffer, uint32_t value) {
    const BufferSpec &spec = fn.buffers[buffer];
    return value < body->values.size() &&
           spec.type == body->values[value].type &&
           spec.shape == body->values[value].shape;
  };
  for (size_t k = 0; k < inst.operands.size(); ++k)
    check.require(matches(inst.operands[k], k),
                  where + ": operand " + std::to_string(k) +
                      " is not the fused body's input " + std::to_string(k));
  for (size_t k = 0; k < inst.results.size(); ++k)
    check.require(matches(inst.results[k], body->yields[k]),
                  where + ": result " + std::to_string(k) +
                      " is not the value the fused body yields there");
  try {
    inst.fusedKernel = std::make_shared<const Kernel>(makeCpuFusedKernel(*body));
  } catch (const KernelError &e) {
    check.fail(where + ": " + e.what());
  }
  inst.kernel = inst.fusedKernel.get();
  inst.body = std::move(body);
}

Function decodeFunction(const fb::Function *f, const Mesh &mesh,
                        const Checker &check) {
  Function fn;
  fn.name = f->name()->str();
  fn.arenaBytes = f->arena_bytes();
  fn.argumentBytes = f->argument_bytes();
  const std::string at = "function @" + fn.name;
  // Far past any machine, and small enough that rounding it up to the
  // buffer alignment cannot wrap.
  constexpr uint64_t kMaxArenaBytes = uint64_t(1) << 48;
  check.require(fn.arenaBytes <= kMaxArenaBytes,
                at + ": an arena of " + std::to_string(fn.arenaBytes) +
                    " bytes is past the limit of 2^48");
  check.require(fn.argumentBytes <= kMaxArenaBytes,
                at + ": an arguments' region of " +
                    std::to_string(fn.argumentBytes) +
                    " bytes is past the limit of 2^48");
  const uint64_t addressable = fn.arenaBytes + fn.argumentBytes;
  if (f->buffers())
    for (const fb::Buffer *b : *f->buffers()) {
      BufferSpec spec{decode(b->dtype(), check), ints(b->shape()), b->offset(),
                      b->bytes()};
      const std::string where =
          at + ", buffer " + std::to_string(fn.buffers.size());
      std::string problem = shapeProblem(spec.shape, spec.type);
      check.require(problem.empty(), where + ": " + problem);
      check.require(uint64_t(elementCount(spec.shape)) * byteSize(spec.type) ==
                        spec.bytes,
                    where + ": " + std::to_string(spec.bytes) +
                        " bytes do not hold " + shapeString(spec.shape) + "x" +
                        std::string(name(spec.type)));
      check.require(spec.offset % program::kBufferAlignment == 0,
                    where + ": offset is not aligned");
      check.require(spec.offset <= addressable &&
                        spec.bytes <= addressable - spec.offset,
                    where + ": lies outside the arena of " +
                        std::to_string(fn.arenaBytes) +
                        " bytes and the arguments' region of " +
                        std::to_string(fn.argumentBytes));
      fn.buffers.push_back(std::move(spec));
    }
  if (f->arguments())
    for (const fb::TensorSpec *t : *f->arguments())
      fn.arguments.push_back(decodeTensor(
          t, fn, mesh, check,
          at + ", argument " + std::to_string(fn.arguments.size())));
  if (f->results())
    for (const fb::TensorSpec *t : *f->results())
      fn.results.push_back(decodeTensor(
          t, fn, mesh, check,
          at + ", result " + std::to_string(fn.results.size())));
  if (f->instructions())
    for (const fb::Instruction *i : *f->instructions()) {
      Instruction inst;
      inst.op = i->op()->str();
      inst.location = str(i->location());
      const std::string where = at + ", instruction #" +
                                std::to_string(fn.instructions.size()) + " (" +
                                inst.op + ")";
      if (i->operands())
        inst.operands.assign(i->operands()->begin(), i->operands()->end());
      if (i->results())
        inst.results.assign(i->results()->begin(), i->results()->end());
      for (uint32_t b : inst.operands)
        check.require(b < fn.buffers.size(),
                      where + ": operand buffer " + std::to_string(b) +
                          " does not exist");
      for (uint32_t b : inst.results)
        check.require(b < fn.buffers.size(),
                      where + ": result buffer " + std::to_string(b) +
                          " does not exist");
      inst.attrs = decodeAttrs(i->attrs(), check, where);
      inst.axes = strings(i->axes());
      for (const std::string &axis : inst.axes) {
        const auto &names = mesh.axisNames();
        check.require(std::find(names.begin(), names.end(), axis) != names.end(),
                      where + ": names axis '" + axis +
                          "', which the mesh does not have");
      }
      if (i->data())
        inst.data.assign(i->data()->begin(), i->data()->end());
      {
        // A group names each axis once (Mesh::group refuses repeats).
        Axes sorted = inst.axes;
        std::sort(sorted.begin(), sorted.end());
        check.require(std::adjacent_find(sorted.begin(), sorted.end()) ==
                          sorted.end(),
                      where + ": names a mesh axis twice");
      }
      if (inst.op == "ernie.fused") {
        decodeFused(i, inst, fn, check, where);
      } else if (!isExecutorOp(inst.op)) {
        inst.kernel = findCpuKernel(inst.op);
        check.require(inst.kernel != nullptr,
                      where + ": the CPU backend has no kernel for '" +
                          inst.op + "'");
        std::string problem = kernelSignatureProblem(inst, fn);
        check.require(problem.empty(), where + ": " + problem);
      } else if (inst.op == "ernie.constant") {
        check.require(inst.operands.empty() && inst.results.size() == 1 &&
                          inst.data.size() == fn.buffers[inst.results[0]].bytes,
                      where + ": the constant's data does not fill its buffer");
      } else {
        const ExecutorOpSignature &signature = *executorOpSignature(inst.op);
        check.require(signature.operands == kVariadic
                          ? !inst.operands.empty() &&
                                inst.results.size() == inst.operands.size()
                          : inst.results.size() == signature.results &&
                                inst.operands.size() == signature.operands,
                      where + ": wrong number of operands or results");
        check.require(!inst.axes.empty() || !signature.needsAxes,
                      where + ": a collective needs mesh axes");
        std::string problem = isStageOp(inst.op)
                                  ? stageOpProblem(inst, fn)
                                  : collectiveShapeProblem(inst, fn, mesh);
        check.require(problem.empty(), where + ": " + problem);
      }
      fn.instructions.push_back(std::move(inst));
    }
  // Waits first: their message names the missing start.
  checkStartsAndWaits(fn, at, check);
  checkDefinedBeforeUse(fn, at, check);
  checkArgumentRegion(fn, at, check);
  return fn;
}

/// k for an input named "input.<k>" (decimal, no sign, no leading zeros),
/// else -1.
int64_t batchInputIndex(const std::string &name) {
  const std::string prefix = "input.";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix))
    return -1;
  std::string digits = name.substr(prefix.size());
  if (digits.size() > 9 || (digits.size() > 1 && digits[0] == '0') ||
      !std::all_of(digits.begin(), digits.end(),
                   [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

/// A program without a Pipeline table has no pipeline roles or ops.
void checkNotPipelined(const std::vector<std::vector<Function>> &stages,
                       const Checker &check) {
  for (size_t s = 0; s < stages.size(); ++s)
    for (const Function &fn : stages[s]) {
      const std::string at = "function @" + fn.name;
      auto roles = [&](const std::vector<TensorSpec> &specs, const char *what) {
        for (size_t i = 0; i < specs.size(); ++i)
          check.require(specs[i].role != Role::Residual &&
                            specs[i].role != Role::Gradient &&
                            !isMicroBatchReduced(specs[i].role),
                        at + ", " + what + " " + std::to_string(i) +
                            ": the role " + roleName(specs[i].role) +
                            " belongs to pipelined programs (this one has "
                            "no pipeline)");
      };
      roles(fn.arguments, "argument");
      roles(fn.results, "result");
      for (size_t i = 0; i < fn.instructions.size(); ++i)
        check.require(!isStageOp(fn.instructions[i].op),
                      at + ", instruction #" + std::to_string(i) + " (" +
                          fn.instructions[i].op +
                          "): only pipelined programs talk between stages");
    }
}

/// Decodes and checks the Pipeline table and everything a pipelined
/// program's stages must hold (Program.h, program.fbs).
PipelineSpec decodePipeline(const fb::Program *p,
                            const std::vector<std::vector<Function>> &stages,
                            const std::string &stageAxis,
                            const Checker &check) {
  const fb::Pipeline *fp = p->pipeline();
  PipelineSpec spec;
  spec.microBatches = fp->micro_batches();
  spec.virtualStages = fp->virtual_stages();
  spec.schedule = str(fp->schedule());
  constexpr int64_t kLimit = int64_t(1) << 30;
  check.require(spec.microBatches >= 1 && spec.microBatches <= kLimit,
                "has a pipeline of " + std::to_string(spec.microBatches) +
                    " micro-batches; it needs at least 1");
  check.require(spec.virtualStages >= 1 && spec.virtualStages <= kLimit,
                "has a pipeline of " + std::to_string(spec.virtualStages) +
                    " virtual stages per stage; it needs at least 1");
  const int64_t S = static_cast<int64_t>(stages.size());
  const int64_t C = S * spec.virtualStages;

  // The schedule: one list per stage, then the schedule checker.
  for (int64_t s = 0; s < S; ++s) {
    const fb::Stage *stage = p->stages()->Get(static_cast<flatbuffers::uoffset_t>(s));
    std::vector<PipelineStep> steps;
    if (stage->schedule())
      for (const fb::PipelineStep *step : *stage->schedule()) {
        PipelineAction action;
        switch (step->action()) {
        case fb::PipelineAction::Forward: action = PipelineAction::Forward; break;
        case fb::PipelineAction::Backward: action = PipelineAction::Backward; break;
        default:
          check.fail("stage " + std::to_string(s) +
                     "'s schedule has an unknown action code " +
                     std::to_string(int(step->action())));
        }
        steps.push_back({action, step->chunk(), step->micro_batch()});
      }
    spec.steps.push_back(std::move(steps));
  }
  PipelineShape shape;
  shape.stages = S;
  shape.virtualStages = spec.virtualStages;
  shape.microBatches = spec.microBatches;
  std::string problem = checkSchedule(spec.steps, shape);
  check.require(problem.empty(), "has a pipeline schedule (" + spec.schedule +
                                     ") that cannot run: " + problem);

  std::map<int64_t, const TensorSpec *> inputs; // k -> first spec seen
  std::map<int64_t, std::string> inputWhere;
  for (int64_t s = 0; s < S; ++s) {
    const std::vector<Function> &fns = stages[s];
    const std::string inStage = " (stage " + std::to_string(s) + ")";
    auto find = [&](const std::string &name) -> const Function * {
      for (const Function &fn : fns)
        if (fn.name == name)
          return &fn;
      return nullptr;
    };
    auto need = [&](const std::string &name) -> const Function & {
      const Function *fn = find(name);
      if (!fn)
        check.fail("stage " + std::to_string(s) + " has no @" + name +
                   ", which its pipeline needs");
      return *fn;
    };
    auto at = [&](const Function &fn) { return "function @" + fn.name + inStage; };
    auto argAt = [&](const Function &fn, size_t i, const char *what) {
      return at(fn) + ", " + what + " " + std::to_string(i);
    };
    /// Argument or result `i` of `fn` (`spec`) has one of the `allowed` roles.
    auto requireRole = [&](const Function &fn, size_t i, const TensorSpec &spec,
                           std::initializer_list<Role> allowed, const char *what) {
      check.require(std::find(allowed.begin(), allowed.end(), spec.role) !=
                        allowed.end(),
                    argAt(fn, i, what) + ": a " + roleName(spec.role) + " " +
                        what + " has no place here");
    };
    /// Every argument's role is one of `allowed`.
    auto argRoles = [&](const Function &fn, std::initializer_list<Role> allowed) {
      for (size_t i = 0; i < fn.arguments.size(); ++i) {
        const TensorSpec &arg = fn.arguments[i];
        requireRole(fn, i, arg, allowed, "argument");
        if (arg.role == Role::Parameter || arg.role == Role::OptimizerState ||
            arg.role == Role::Residual || arg.role == Role::Gradient ||
            isMicroBatchReduced(arg.role))
          check.require(!arg.name.empty(), argAt(fn, i, "argument") +
                                               ": a " + roleName(arg.role) +
                                               " needs a name");
        if (arg.role == Role::Input) {
          int64_t k = batchInputIndex(arg.name);
          check.require(k >= 0, argAt(fn, i, "argument") + ": a batch input "
                                                           "is named input.<k>, "
                                                           "not '" +
                                    arg.name + "'");
          check.require(!arg.globalShape.empty(),
                        argAt(fn, i, "argument") +
                            ": a batch input needs a dimension 0 to split "
                            "into micro-batches");
          auto [it, fresh] = inputs.emplace(k, &arg);
          if (fresh)
            inputWhere[k] = argAt(fn, i, "argument");
          else
            check.require(it->second->globalShape == arg.globalShape,
                          argAt(fn, i, "argument") + ": micro-batch " +
                              shapeString(arg.globalShape) + " of " + arg.name +
                              " differs from " + inputWhere[k] + "'s " +
                              shapeString(it->second->globalShape));
        }
      }
    };
    /// The number of `role` results; each is a replicated scalar if a loss.
    auto countResults = [&](const Function &fn, Role role) {
      int64_t n = 0;
      for (size_t i = 0; i < fn.results.size(); ++i) {
        const TensorSpec &res = fn.results[i];
        if (res.role != role)
          continue;
        ++n;
        if (role == Role::Loss)
          check.require(elementCount(res.localShape) == 1 &&
                            elementCount(res.globalShape) == 1 &&
                            res.sharding.partials.empty(),
                        argAt(fn, i, "result") +
                            ": a pipelined loss must be a replicated scalar "
                            "(no pending reduction)");
      }
      return n;
    };
    auto onlyResults = [&](const Function &fn, std::initializer_list<Role> allowed) {
      for (size_t i = 0; i < fn.results.size(); ++i)
        requireRole(fn, i, fn.results[i], allowed, "result");
    };
    auto sameLocal = [](const TensorSpec &a, const TensorSpec &b) {
      return a.type == b.type && a.localShape == b.localShape;
    };
    auto typeString = [](const TensorSpec &t) {
      return shapeString(t.localShape) + "x" + std::string(name(t.type));
    };

    // What this stage's forwards and backwards hand to its update: gradients
    // (summed over micro-batches), maxima and batch sums, by name.
    std::map<std::string, const TensorSpec *> handed;
    auto hand = [&](const Function &fn, size_t i,
                    std::set<std::string> &own) {
      const TensorSpec &res = fn.results[i];
      const std::string what = roleName(res.role);
      check.require(!res.name.empty(),
                    argAt(fn, i, "result") + ": a " + what + " needs a name");
      check.require(own.insert(res.name).second,
                    argAt(fn, i, "result") + ": a second " + what + " '" +
                        res.name + "'");
      auto [it, fresh] = handed.emplace(res.name, &res);
      check.require(fresh || (it->second->role == res.role &&
                              sameLocal(*it->second, res)),
                    argAt(fn, i, "result") + ": the " + what + " '" +
                        res.name + "' is " + typeString(res) + " here but a " +
                        roleName(it->second->role) + " of " +
                        typeString(*it->second) +
                        " in another chunk of the stage");
    };
    for (int64_t c = s; c < C; c += S) {
      const bool last = c == C - 1;
      const Function &fwd = need(pipelineFunction("train_forward", c));
      const Function &bwd = need(pipelineFunction("train_backward", c));
      const Function &ev = need(pipelineFunction("eval_forward", c));
      // State the chunks read (fp8 amax histories) is updated once per
      // step, by the update.
      argRoles(fwd, {Role::Parameter, Role::OptimizerState, Role::Input});
      onlyResults(fwd, {Role::Residual, Role::Loss, Role::MicroBatchMax,
                        Role::MicroBatchSum});
      std::set<std::string> fwdOwn;
      for (size_t i = 0; i < fwd.results.size(); ++i)
        if (isMicroBatchReduced(fwd.results[i].role))
          hand(fwd, i, fwdOwn);
      int64_t losses = countResults(fwd, Role::Loss);
      if (last)
        check.require(losses == 1, at(fwd) + ": the last chunk's forward "
                                             "needs exactly one loss result, "
                                             "not " + std::to_string(losses));
      else
        check.require(losses == 0, at(fwd) + ": only the last chunk's (" +
                                       std::to_string(C - 1) +
                                       ") forward has a loss");
      std::map<std::string, const TensorSpec *> residuals;
      for (size_t i = 0; i < fwd.results.size(); ++i) {
        const TensorSpec &res = fwd.results[i];
        if (res.role != Role::Residual)
          continue;
        check.require(!res.name.empty(), argAt(fwd, i, "result") +
                                             ": a residual needs a name");
        check.require(residuals.emplace(res.name, &res).second,
                      argAt(fwd, i, "result") + ": a second residual named '" +
                          res.name + "'");
      }
      argRoles(bwd, {Role::Parameter, Role::OptimizerState, Role::Input,
                     Role::Residual, Role::Gradient});
      std::set<std::string> sums;
      for (size_t i = 0; i < bwd.arguments.size(); ++i) {
        const TensorSpec &arg = bwd.arguments[i];
        if (arg.role == Role::Gradient) {
          check.require(sums.insert(arg.name).second,
                        argAt(bwd, i, "argument") +
                            ": a second running sum of gradient '" + arg.name +
                            "'");
          // The running sum the backward adds its micro-batch into and
          // returns as the result of the same name.
          auto res = std::find_if(
              bwd.results.begin(), bwd.results.end(), [&](const TensorSpec &r) {
                return r.role == Role::Gradient && r.name == arg.name;
              });
          check.require(res != bwd.results.end(),
                        argAt(bwd, i, "argument") + ": @" + bwd.name +
                            " takes the running sum of gradient '" + arg.name +
                            "' but returns no gradient of that name");
          check.require(sameLocal(*res, arg),
                        argAt(bwd, i, "argument") + ": the running sum '" +
                            arg.name + "' is " + typeString(arg) +
                            " but the gradient it sums is " +
                            typeString(*res));
          continue;
        }
        if (arg.role != Role::Residual)
          continue;
        auto it = residuals.find(arg.name);
        check.require(it != residuals.end(),
                      argAt(bwd, i, "argument") + ": @" + fwd.name +
                          " has no residual named '" + arg.name + "'");
        check.require(sameLocal(*it->second, arg),
                      argAt(bwd, i, "argument") + ": residual '" + arg.name +
                          "' is " + typeString(arg) + " here but @" + fwd.name +
                          " makes it " + typeString(*it->second));
      }
      onlyResults(bwd,
                  {Role::Gradient, Role::MicroBatchMax, Role::MicroBatchSum});
      std::set<std::string> bwdOwn;
      for (size_t i = 0; i < bwd.results.size(); ++i)
        hand(bwd, i, bwdOwn);
      // It reads state too (MoE routing's selection bias), updating none.
      argRoles(ev, {Role::Parameter, Role::OptimizerState, Role::Input});
      int64_t evalLosses = countResults(ev, Role::Loss);
      if (last)
        check.require(evalLosses == 1, at(ev) + ": the last chunk's eval "
                                                "forward needs exactly one "
                                                "loss result, not " +
                                           std::to_string(evalLosses));
    }
    const Function &update = need(pipelineFunction("train_update", s));
    argRoles(update, {Role::Parameter, Role::Gradient, Role::MicroBatchMax,
                      Role::MicroBatchSum, Role::OptimizerState,
                      Role::LearningRate, Role::Step});
    for (size_t i = 0; i < update.arguments.size(); ++i) {
      const TensorSpec &arg = update.arguments[i];
      if (arg.role != Role::Gradient && !isMicroBatchReduced(arg.role))
        continue;
      auto it = handed.find(arg.name);
      check.require(it != handed.end() && it->second->role == arg.role,
                    argAt(update, i, "argument") + ": no forward or backward "
                        "of stage " + std::to_string(s) + " makes the " +
                        roleName(arg.role) + " '" + arg.name + "'");
      check.require(sameLocal(*it->second, arg),
                    argAt(update, i, "argument") + ": the " +
                        roleName(arg.role) + " '" + arg.name + "' is " +
                        typeString(arg) + " here but the stage makes " +
                        typeString(*it->second));
    }
    if (const Function *init = find(pipelineFunction("init", s)))
      argRoles(*init, {Role::Parameter});

    // Across stages only through the pipeline's own ops: no sharding or
    // collective names the stage axis; peers and members are other stages.
    for (const Function &fn : fns) {
      auto noStageAxis = [&](const std::vector<TensorSpec> &specs,
                             const char *what) {
        if (stageAxis.empty())
          return;
        for (size_t i = 0; i < specs.size(); ++i) {
          bool named = false;
          for (const Axes &axes : specs[i].sharding.dims)
            named |= std::find(axes.begin(), axes.end(), stageAxis) != axes.end();
          for (const auto &partial : specs[i].sharding.partials)
            named |= partial.first == stageAxis;
          check.require(!named, argAt(fn, i, what) +
                                    ": its sharding names the stage axis '" +
                                    stageAxis + "'");
        }
      };
      noStageAxis(fn.arguments, "argument");
      noStageAxis(fn.results, "result");
      for (size_t i = 0; i < fn.instructions.size(); ++i) {
        const Instruction &inst = fn.instructions[i];
        const std::string where = at(fn) + ", instruction #" +
                                  std::to_string(i) + " (" + inst.op + ")";
        check.require(stageAxis.empty() ||
                          std::find(inst.axes.begin(), inst.axes.end(),
                                    stageAxis) == inst.axes.end(),
                      where + ": a collective over the stage axis '" +
                          stageAxis + "' (stages talk through ernie.send, "
                                      "ernie.recv and the stage collectives)");
        if (inst.op == "ernie.send" || inst.op == "ernie.recv") {
          int64_t peer = inst.attrs.getInt("peer");
          check.require(peer >= 0 && peer < C,
                        where + ": peer chunk " + std::to_string(peer) +
                            " is not one of the " + std::to_string(C) +
                            " chunks");
          check.require(peer % S != s, where + ": peer chunk " +
                                           std::to_string(peer) +
                                           " is on this stage");
        } else if (inst.op == "ernie.stage_all_reduce" ||
                   inst.op == "ernie.stage_broadcast") {
          std::vector<int64_t> members = inst.attrs.getInts("stages");
          bool sorted = true;
          for (size_t j = 1; j < members.size(); ++j)
            sorted &= members[j - 1] < members[j];
          check.require(sorted && !members.empty() && members.front() >= 0 &&
                            members.back() < S,
                        where + ": 'stages' must be distinct stages in [0, " +
                            std::to_string(S) + "), ascending");
          check.require(std::find(members.begin(), members.end(), s) !=
                            members.end(),
                        where + ": 'stages' does not hold this stage");
        }
      }
    }
  }
  // Every send meets exactly one receive on the peer's stage (and the other
  // way round) in the same part of the step, on the same channel, with as
  // many bytes; every stage collective meets its twin on each member stage.
  // A mismatch would otherwise wait out a timeout, or fail one side. The
  // executor finds a peer by its stage (peer mod stages), so that is what
  // pairs; a chunk's functions name chunks, the update and init name stages.
  enum Phase { Train, Eval, Init };
  struct Place {
    Phase phase;
    int64_t chunk; // -1: the stage's update or init, run once per step
  };
  auto placeOf = [&](const Function &fn, int64_t s) -> std::optional<Place> {
    for (int64_t c = s; c < C; c += S) {
      if (fn.name == pipelineFunction("train_forward", c) ||
          fn.name == pipelineFunction("train_backward", c))
        return Place{Train, c};
      if (fn.name == pipelineFunction("eval_forward", c))
        return Place{Eval, c};
    }
    if (fn.name == pipelineFunction("train_update", s))
      return Place{Train, -1};
    if (fn.name == pipelineFunction("init", s))
      return Place{Init, -1};
    return std::nullopt;
  };
  struct Transfer {
    Phase phase;
    int64_t from, to, fromStage, toStage, channel;
    bool perMicroBatch; // in a chunk's function: once per micro-batch
    uint64_t bytes;
    std::string where;
  };
  struct StageCollective {
    Phase phase;
    int64_t stage, channel;
    std::string op;
    std::vector<int64_t> members;
    uint64_t bytes;
    std::string where;
  };
  std::vector<Transfer> sends, recvs;
  std::vector<StageCollective> stageCollectives;
  for (int64_t s = 0; s < S; ++s)
    for (const Function &fn : stages[s]) {
      std::optional<Place> place = placeOf(fn, s);
      for (size_t i = 0; i < fn.instructions.size(); ++i) {
        const Instruction &inst = fn.instructions[i];
        if (!isStageOp(inst.op))
          continue;
        std::string where = "function @" + fn.name + " (stage " +
                            std::to_string(s) + "), instruction #" +
                            std::to_string(i) + " (" + inst.op + ")";
        check.require(place.has_value(),
                      where + ": only a chunk's functions, the update and "
                              "init talk between stages");
        int64_t self = place->chunk >= 0 ? place->chunk : s;
        int64_t channel = inst.attrs.getInt("channel");
        bool perMicroBatch = place->chunk >= 0;
        if (inst.op == "ernie.send") {
          int64_t peer = inst.attrs.getInt("peer");
          sends.push_back({place->phase, self, peer, s, peer % S, channel,
                           perMicroBatch, fn.buffers[inst.operands[0]].bytes,
                           where});
        } else if (inst.op == "ernie.recv") {
          int64_t peer = inst.attrs.getInt("peer");
          recvs.push_back({place->phase, peer, self, peer % S, s, channel,
                           perMicroBatch, fn.buffers[inst.results[0]].bytes,
                           where});
        } else {
          stageCollectives.push_back({place->phase, s, channel, inst.op,
                                      inst.attrs.getInts("stages"),
                                      fn.buffers[inst.operands[0]].bytes,
                                      where});
        }
      }
    }
  auto match = [&](const std::vector<Transfer> &mine,
                   const std::vector<Transfer> &theirs, const char *other,
                   bool sending) {
    for (const Transfer &t : mine) {
      const Transfer *partner = nullptr;
      for (const Transfer &u : theirs) {
        if (u.phase != t.phase || u.fromStage != t.fromStage ||
            u.toStage != t.toStage || u.channel != t.channel)
          continue;
        if (partner)
          check.fail(t.where + ": both " + partner->where + " and " + u.where +
                     " match it");
        partner = &u;
        check.require(u.bytes == t.bytes,
                      t.where + ": moves " + std::to_string(t.bytes) +
                          " bytes on channel " + std::to_string(t.channel) +
                          ", but " + u.where + " " + std::to_string(u.bytes));
      }
      check.require(partner != nullptr,
                    t.where + ": no " + other + " in chunk " +
                        std::to_string(sending ? t.to : t.from) +
                        "'s functions matches it (chunk " +
                        std::to_string(t.from) + " to chunk " +
                        std::to_string(t.to) + ", channel " +
                        std::to_string(t.channel) + ")");
      // A receive per micro-batch fed by one send per step would wait for
      // the micro-batches after the first.
      const Transfer &recv = sending ? *partner : t, &send = sending ? t : *partner;
      check.require(!recv.perMicroBatch || send.perMicroBatch,
                    recv.where + ": receives once per micro-batch, but " +
                        send.where + " sends once per step");
    }
  };
  match(sends, recvs, "ernie.recv", true);
  match(recvs, sends, "ernie.send", false);
  for (const StageCollective &c : stageCollectives)
    for (int64_t t : c.members) {
      if (t == c.stage)
        continue;
      int64_t twins = 0;
      for (const StageCollective &d : stageCollectives)
        if (d.stage == t && d.phase == c.phase && d.channel == c.channel) {
          ++twins;
          check.require(d.op == c.op && d.members == c.members &&
                            d.bytes == c.bytes,
                        c.where + ": " + d.where + " on channel " +
                            std::to_string(c.channel) +
                            " differs in its op, stages or bytes");
        }
      check.require(twins == 1, c.where + ": member stage " +
                                    std::to_string(t) + " has " +
                                    std::to_string(twins) +
                                    " stage collectives on channel " +
                                    std::to_string(c.channel) + ", not one");
    }

  for (const auto &[k, first] : inputs) {
    check.require(k == static_cast<int64_t>(spec.inputs.size()),
                  "has no function taking batch input input." +
                      std::to_string(spec.inputs.size()) +
                      " (inputs are numbered from 0 without gaps)");
    spec.inputs.push_back(*first);
  }
  return spec;
}

} // namespace

const char *roleName(Role role) {
  switch (role) {
  case Role::Input: return "input";
  case Role::Parameter: return "parameter";
  case Role::OptimizerState: return "optimizer state";
  case Role::LearningRate: return "learning rate";
  case Role::Step: return "step";
  case Role::Loss: return "loss";
  case Role::Residual: return "residual";
  case Role::Gradient: return "gradient";
  case Role::MicroBatchMax: return "micro-batch max";
  case Role::MicroBatchSum: return "micro-batch sum";
  }
  return "?";
}

std::string pipelineFunction(const std::string &kind, int64_t index) {
  return kind + "." + std::to_string(index);
}

Program Program::parse(const void *data, size_t size,
                       const std::string &source) {
  Checker check(source);
  auto *bytes = static_cast<const uint8_t *>(data);
  check.require(size >= 8 && fb::ProgramFileBufferHasIdentifier(bytes),
                size < 8 ? "is truncated: " + std::to_string(size) + " bytes"
                         : "is not an ernie program file (no 'ERNP' identifier)");
  flatbuffers::Verifier envelopeVerifier(bytes, size);
  check.require(fb::VerifyProgramFileBuffer(envelopeVerifier),
                "is truncated or corrupted (the file structure does not verify)");
  const fb::ProgramFile *file = fb::GetProgramFile(bytes);
  check.require(file->format_version() == program::kFormatVersion,
                "has format version " + std::to_string(file->format_version()) +
                    "; this runtime reads version " +
                    std::to_string(program::kFormatVersion));
  check.require(file->program() != nullptr, "holds no program");
  const uint8_t *payload = file->program()->data();
  size_t payloadSize = file->program()->size();
  // Nothing follows the program but the writer's alignment padding: bytes
  // appended to a file are damage, not data to ignore.
  const uint8_t *tail = payload + payloadSize, *fileEnd = bytes + size;
  check.require(tail <= fileEnd &&
                    size_t(fileEnd - tail) < program::kPayloadAlignment &&
                    std::all_of(tail, fileEnd, [](uint8_t b) { return b == 0; }),
                "has " + std::to_string(fileEnd - tail) +
                    " bytes after its program (a file ends with its program "
                    "and at most " +
                    std::to_string(program::kPayloadAlignment - 1) +
                    " zero bytes of padding)");
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, payload, static_cast<uInt>(payloadSize));
  check.require(crc == file->checksum(),
                "is corrupted: the checksum does not match its contents");
  flatbuffers::Verifier verifier(payload, payloadSize);
  check.require(verifier.VerifyBuffer<fb::Program>(nullptr),
                "is corrupted: the program does not verify");
  const fb::Program *p = flatbuffers::GetRoot<fb::Program>(payload);

  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  if (p->axes())
    for (const fb::Axis *a : *p->axes()) {
      names.push_back(a->name()->str());
      sizes.push_back(a->size());
    }
  check.require(!names.empty(), "has a mesh without axes");
  std::optional<Mesh> mesh;
  try {
    mesh.emplace(names, sizes);
  } catch (const std::invalid_argument &e) {
    check.fail(e.what());
  }
  Program program(*mesh);
  program.source_ = source;
  program.producer_ = str(p->producer());
  program.stageAxis_ = str(p->stage_axis());
  if (!program.stageAxis_.empty()) {
    check.require(std::find(names.begin(), names.end(), program.stageAxis_) !=
                      names.end(),
                  "names stage axis '" + program.stageAxis_ +
                      "', which the mesh does not have");
  }
  if (p->stages())
    for (const fb::Stage *s : *p->stages()) {
      std::vector<Function> fns;
      if (s->functions())
        for (const fb::Function *f : *s->functions())
          fns.push_back(decodeFunction(f, program.mesh_, check));
      program.stages_.push_back(std::move(fns));
    }
  int64_t expectedStages =
      program.stageAxis_.empty()
          ? 1
          : program.mesh_.axisSizes()[program.mesh_.axisIndex(program.stageAxis_)];
  check.require(program.numStages() == expectedStages,
                "has " + std::to_string(program.numStages()) +
                    " stages; its mesh needs " + std::to_string(expectedStages));
  if (p->pipeline())
    program.pipeline_ =
        decodePipeline(p, program.stages_, program.stageAxis_, check);
  else
    checkNotPipelined(program.stages_, check);
  return program;
}

/// The largest program file read (FlatBuffers address 2 GiB at most).
constexpr uint64_t kMaxProgramBytes = uint64_t(2) << 30;

Program Program::load(const std::string &path) {
  // A FIFO or device is refused before a read could block on it.
  std::string bytes;
  try {
    bytes = RegularFile(path).readAll(kMaxProgramBytes);
  } catch (const std::runtime_error &e) {
    std::string why = e.what();
    if (why.rfind(path + ": ", 0) == 0)
      why.erase(0, path.size() + 2);
    throw ProgramError(path + ": cannot open the program file: " + why);
  }
  return fromBytes(bytes, path);
}

Program Program::fromBytes(std::string_view bytes, const std::string &source) {
  std::vector<uint64_t> aligned((bytes.size() + 7) / 8);
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char *>(aligned.data()));
  return parse(aligned.data(), bytes.size(), source);
}

int64_t Program::stageOf(int64_t rank) const {
  if (stageAxis_.empty())
    return 0;
  return mesh_.coordinates(rank)[mesh_.axisIndex(stageAxis_)];
}

std::vector<int64_t> Program::chunksOf(int64_t stage) const {
  std::vector<int64_t> chunks;
  for (int64_t c = stage; c < numChunks(); c += numStages())
    chunks.push_back(c);
  return chunks;
}

int64_t Program::numChunks() const {
  return numStages() * (pipeline_ ? pipeline_->virtualStages : 1);
}

int64_t Program::rankInStage(int64_t rank, int64_t stage) const {
  if (stageAxis_.empty())
    return rank;
  std::vector<int64_t> coords = mesh_.coordinates(rank);
  coords[mesh_.axisIndex(stageAxis_)] = stage;
  return mesh_.rankOf(coords);
}

bool isView(const Function &fn, const Instruction &inst) {
  return inst.op == "ernie.reshape" && inst.operands.size() == 1 &&
         inst.results.size() == 1 &&
         fn.buffers[inst.results[0]].offset ==
             fn.buffers[inst.operands[0]].offset;
}

static bool takesState(const Function &fn, const std::string &name) {
  for (const TensorSpec &arg : fn.arguments)
    if (arg.name == name &&
        (arg.role == Role::Parameter || arg.role == Role::OptimizerState))
      return true;
  return false;
}

std::vector<int64_t> Program::stagesHolding(const std::string &name) const {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < numStages(); ++s)
    for (const Function &fn : stages_[s])
      if (takesState(fn, name)) {
        out.push_back(s);
        break;
      }
  return out;
}

std::vector<std::string> Program::stateNames() const {
  std::set<std::string> names;
  for (const auto &fns : stages_)
    for (const Function &fn : fns)
      for (const TensorSpec &arg : fn.arguments)
        if (arg.role == Role::Parameter || arg.role == Role::OptimizerState)
          names.insert(arg.name);
  return {names.begin(), names.end()};
}

const Function *Program::function(int64_t stage, const std::string &name) const {
  for (const Function &fn : stages_.at(stage))
    if (fn.name == name)
      return &fn;
  return nullptr;
}

const Function &Program::requireFunction(int64_t stage,
                                         const std::string &name) const {
  if (const Function *fn = function(stage, name))
    return *fn;
  std::string known;
  for (const Function &fn : stages_.at(stage))
    known += (known.empty() ? "@" : ", @") + fn.name;
  throw std::invalid_argument("the program has no function @" + name +
                              " (it has " + (known.empty() ? "none" : known) +
                              ")");
}

std::string callProblem(const Program &program, const std::string &fn,
                        const std::vector<HostTensor> &inputs, double lr,
                        int64_t step) {
  if (!std::isfinite(lr))
    return "@" + fn + ": the learning rate must be finite, not " +
           std::to_string(lr);
  if (step < 1)
    return "@" + fn + ": the step is counted from 1, not " +
           std::to_string(step);
  // The global batch inputs the call takes, as Session feeds them.
  std::vector<TensorSpec> want;
  if (const PipelineSpec *pipeline = program.pipeline()) {
    if (fn != "train_step" && fn != "eval_step")
      return "a pipelined program runs train_step and eval_step, not '" + fn +
             "'";
    for (TensorSpec spec : pipeline->inputs) {
      spec.globalShape[0] *= pipeline->microBatches; // load bounds both
      want.push_back(std::move(spec));
    }
  } else {
    const Function *f = program.function(0, fn);
    if (!f)
      return "the program has no function @" + fn;
    for (const TensorSpec &arg : f->arguments)
      if (arg.role == Role::Input || arg.role == Role::Loss)
        want.push_back(arg);
  }
  if (inputs.size() != want.size())
    return "@" + fn + " takes " + std::to_string(want.size()) +
           " batch inputs, not " + std::to_string(inputs.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const HostTensor &t = inputs[i];
    const TensorSpec &spec = want[i];
    std::string what = "@" + fn + " input " + std::to_string(i) +
                       (spec.name.empty() ? "" : " ('" + spec.name + "')");
    if (t.shape != spec.globalShape) {
      std::string micro;
      if (const PipelineSpec *pipeline = program.pipeline())
        micro = " (" + std::to_string(pipeline->microBatches) +
                " micro-batches of " +
                shapeString(pipeline->inputs[i].globalShape) + ")";
      return what + " must have shape " + shapeString(spec.globalShape) +
             micro + ", not " + shapeString(t.shape);
    }
    if (t.type != spec.type)
      return what + " must be " + std::string(name(spec.type)) + ", not " +
             std::string(name(t.type)) +
             (isFloat(t.type) != isFloat(spec.type)
                  ? " (integers and floats are not converted into each other)"
                  : "");
  }
  return "";
}

} // namespace ernie::runtime
