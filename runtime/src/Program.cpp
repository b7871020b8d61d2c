//===- Program.cpp - loading and validating program files --------------------===//
//
// Decodes a program file (envelope, checksum, FlatBuffer) and checks every
// function: tensors, buffers, instructions against their signatures
// (OpSignatures.cpp), starts and waits, definitions before uses. Pipelines:
// PipelineDecoding.cpp.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/Program.h"

#include "ProgramDecoding.h"
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
using namespace loader;

std::string masterWeightOf(const std::string &name) {
  const std::string suffix = ":master";
  if (name.size() <= suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return "";
  return name.substr(0, name.size() - suffix.size());
}

bool ShardingSpec::isReplicated() const {
  return partials.empty() &&
         std::all_of(dims.begin(), dims.end(),
                     [](const Axes &axes) { return axes.empty(); });
}

namespace {

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
  case fb::Role::Metric: return Role::Metric;
  }
  check.fail("unknown role code " + std::to_string(int(r)));
}


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
    for (const fb::TensorSpec *t : *f->arguments()) {
      std::string where = at + ", argument " + std::to_string(fn.arguments.size());
      fn.arguments.push_back(decodeTensor(t, fn, mesh, check, where));
      check.require(fn.arguments.back().role != Role::Metric,
                    where + ": a metric is a result, not an argument");
    }
  if (f->results())
    for (const fb::TensorSpec *t : *f->results()) {
      std::string where = at + ", result " + std::to_string(fn.results.size());
      fn.results.push_back(decodeTensor(t, fn, mesh, check, where));
      const TensorSpec &res = fn.results.back();
      check.require(res.role != Role::Metric ||
                        (res.localShape.empty() && isFloat(res.type) &&
                         !res.name.empty()),
                    where + ": a metric must be a named float scalar");
    }
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
  case Role::Metric: return "metric";
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
