//===- Executor.cpp - running one rank's instructions ------------------------===//

#include "ernie/runtime/Executor.h"
#include "ernie/runtime/FloatConvert.h"

#include "ernie/runtime/ProgramFormat.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ernie::runtime {

/// One function's memory: a single aligned block, every buffer at its offset.
namespace {
bool isBlockingCollective(const std::string &op);
} // namespace

/// A function's memory and its instructions' operand lists, made once:
/// every buffer sits at a fixed offset, so the views each kernel gets never
/// change, and running an instruction allocates nothing.
struct Executor::Arena {
  explicit Arena(const Function &fn) {
    uint64_t bytes = fn.arenaBytes;
    // Program::load bounds `bytes` far below where this rounding could wrap.
    if (bytes > UINT64_MAX - program::kBufferAlignment)
      throw std::bad_alloc();
    uint64_t size = (bytes + program::kBufferAlignment - 1) /
                    program::kBufferAlignment * program::kBufferAlignment;
    data = static_cast<uint8_t *>(
        std::aligned_alloc(program::kBufferAlignment, size ? size : 64));
    if (!data)
      throw std::bad_alloc();
    buffers.reserve(fn.buffers.size());
    for (const BufferSpec &b : fn.buffers)
      buffers.push_back({data + b.offset, b.type, b.shape});
    inputs.resize(fn.instructions.size());
    outputs.resize(fn.instructions.size());
    blocking.resize(fn.instructions.size());
    for (size_t i = 0; i < fn.instructions.size(); ++i) {
      const Instruction &inst = fn.instructions[i];
      blocking[i] = isBlockingCollective(inst.op);
      if (!inst.kernel)
        continue;
      for (uint32_t b : inst.operands)
        inputs[i].push_back(buffers[b]);
      for (uint32_t b : inst.results)
        outputs[i].push_back(buffers[b]);
    }
  }
  ~Arena() { std::free(data); }
  Arena(const Arena &) = delete;
  Arena &operator=(const Arena &) = delete;
  uint8_t *data = nullptr;
  std::vector<TensorView> buffers;
  /// Per instruction: a kernel's operand and result views.
  std::vector<std::vector<TensorView>> inputs, outputs;
  std::vector<bool> blocking; // per instruction: isBlockingCollective
};

Executor::Executor(const Program &program, Communicator &comm,
                   ExecutorOptions options)
    : program_(program), comm_(comm), options_(options), rank_(comm.rank()),
      stage_(program.stageOf(comm.rank())) {
  if (comm.mesh().numRanks() != program.mesh().numRanks() ||
      comm.mesh().axisSizes() != program.mesh().axisSizes())
    throw std::invalid_argument(
        "the communicator's mesh does not match the program's");
}

// run() leaves nothing started; this only guards the arenas against an
// unforeseen exit.
Executor::~Executor() { abandonStarted(); }

const Function &Executor::function(const std::string &name) const {
  return program_.requireFunction(stage_, name);
}

namespace {

int64_t nowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// The collectives that block the calling thread on the group. (A start
/// communicates too, but on the communication thread; shard_slice,
/// shard_insert, partial_init and axis_index only read the rank's
/// position.)
bool isBlockingCollective(const std::string &op) {
  return op == "ernie.all_reduce" || op == "ernie.all_gather" ||
         op == "ernie.reduce_scatter" || op == "ernie.all_to_all" ||
         op == "ernie.send" || op == "ernie.recv" ||
         op == "ernie.stage_all_reduce" || op == "ernie.stage_broadcast";
}

ReduceOp reduceKind(const Attrs &attrs) {
  std::string kind = attrs.getString("kind", "sum");
  if (kind == "sum")
    return ReduceOp::Sum;
  if (kind == "avg")
    return ReduceOp::Avg;
  if (kind == "max")
    return ReduceOp::Max;
  if (kind == "min")
    return ReduceOp::Min;
  throw KernelError("unknown reduce kind '" + kind + "'");
}

size_t bytesOf(const TensorView &v) { return v.numElements() * byteSize(v.type); }

/// Product of the dimensions before `dim`: 1 when the chunks along `dim`
/// are already contiguous and need no packing.
int64_t outerSize(const std::vector<int64_t> &shape, int64_t dim) {
  int64_t n = 1;
  for (int64_t d = 0; d < dim; ++d)
    n *= shape[d];
  return n;
}

std::vector<int64_t> offsetAlong(size_t rank, int64_t dim, int64_t offset) {
  std::vector<int64_t> offsets(rank, 0);
  offsets[dim] = offset;
  return offsets;
}

bool isFinite(const TensorView &v) {
  for (int64_t i = 0; i < v.numElements(); ++i) {
    double x;
    switch (v.type) {
    case DType::F64: x = v.as<double>()[i]; break;
    case DType::F32: x = v.as<float>()[i]; break;
    default: {
      // Narrow floats: widen through the cast kernel, element by element
      // would be slow; losses are scalars or small, so widen the whole view.
      HostTensor wide(DType::F64, v.shape);
      (*findCpuKernel("ernie.cast"))({v}, {wide.view()}, Attrs{});
      for (int64_t j = 0; j < wide.numElements(); ++j)
        if (!std::isfinite(wide.as<double>()[j]))
          return false;
      return true;
    }
    }
    if (!std::isfinite(x))
      return false;
  }
  return true;
}

} // namespace

void Executor::runCollective(const Instruction &inst, const TensorView &in,
                             const TensorView &out) {
  const std::string &op = inst.op;
  const Axes &axes = inst.axes;
  const Mesh &mesh = program_.mesh();
  int64_t members = static_cast<int64_t>(mesh.group(rank_, axes).size());
  int64_t me = mesh.indexInGroup(rank_, axes);
  size_t elementBytes = byteSize(out.type);

  if (op == "ernie.all_reduce") {
    comm_.allReduce(in.data, out.data, in.numElements(), in.type,
                    reduceKind(inst.attrs), axes);
  } else if (op == "ernie.all_gather") {
    int64_t dim = inst.attrs.getInt("dim");
    if (outerSize(in.shape, dim) == 1) {
      comm_.allGather(in.data, out.data, bytesOf(in), axes);
      return;
    }
    scratch_.resize(bytesOf(out));
    comm_.allGather(in.data, scratch_.data(), bytesOf(in), axes);
    for (int64_t j = 0; j < members; ++j)
      insertBlock(scratch_.data() + j * bytesOf(in), in.shape,
                  static_cast<uint8_t *>(out.data), out.shape,
                  offsetAlong(in.shape.size(), dim, j * in.shape[dim]),
                  elementBytes);
  } else if (op == "ernie.reduce_scatter") {
    int64_t dim = inst.attrs.getInt("dim");
    ReduceOp kind = reduceKind(inst.attrs);
    if (outerSize(in.shape, dim) == 1) {
      comm_.reduceScatter(in.data, out.data, out.numElements(), in.type, kind,
                          axes);
      return;
    }
    scratch_.resize(bytesOf(in));
    for (int64_t j = 0; j < members; ++j)
      extractBlock(static_cast<const uint8_t *>(in.data), in.shape,
                   offsetAlong(in.shape.size(), dim, j * out.shape[dim]),
                   scratch_.data() + j * bytesOf(out), out.shape, elementBytes);
    comm_.reduceScatter(scratch_.data(), out.data, out.numElements(), in.type,
                        kind, axes);
  } else if (op == "ernie.all_to_all") {
    int64_t split = inst.attrs.getInt("split_dim");
    int64_t concat = inst.attrs.getInt("concat_dim");
    std::vector<int64_t> chunk = in.shape;
    chunk[split] /= members;
    size_t chunkBytes = bytesOf(in) / members;
    // Send buffer: the chunks along `split`, contiguous in member order.
    scratch_.resize(2 * bytesOf(in));
    uint8_t *send = scratch_.data(), *recv = scratch_.data() + bytesOf(in);
    for (int64_t j = 0; j < members; ++j)
      extractBlock(static_cast<const uint8_t *>(in.data), in.shape,
                   offsetAlong(in.shape.size(), split, j * chunk[split]),
                   send + j * chunkBytes, chunk, elementBytes);
    comm_.allToAll(send, recv, chunkBytes, axes);
    for (int64_t j = 0; j < members; ++j)
      insertBlock(recv + j * chunkBytes, chunk, static_cast<uint8_t *>(out.data),
                  out.shape,
                  offsetAlong(out.shape.size(), concat, j * chunk[concat]),
                  elementBytes);
  } else if (op == "ernie.shard_slice") {
    int64_t dim = inst.attrs.getInt("dim");
    int64_t piece = shiftedIndex(me, inst.attrs.getInt("shift", 0), members);
    extractBlock(static_cast<const uint8_t *>(in.data), in.shape,
                 offsetAlong(in.shape.size(), dim, piece * out.shape[dim]),
                 static_cast<uint8_t *>(out.data), out.shape, elementBytes);
  } else if (op == "ernie.partial_init") {
    // A pending sum starts on the first member; max/min/avg hold the value
    // on every member.
    if (reduceKind(inst.attrs) == ReduceOp::Sum && me != 0)
      std::memset(out.data, 0, bytesOf(out));
    else if (out.data != in.data)
      std::memmove(out.data, in.data, bytesOf(out));
  } else {
    throw KernelError("unknown executor op");
  }
}

int64_t Executor::peerRank(int64_t stage) const {
  return program_.rankInStage(rank_, stage);
}

void Executor::runStageOp(const Instruction &inst,
                          std::vector<TensorView> &buffers) {
  const PipelineSpec *pipeline = program_.pipeline();
  if (!pipeline) // Program::load rules this out.
    throw KernelError("only pipelined programs talk between stages");
  const int64_t m = pipeline->microBatches, S = program_.numStages();
  const int64_t channel = inst.attrs.getInt("channel");
  if (inst.op == "ernie.send" || inst.op == "ernie.recv") {
    const int64_t tag = channel * m + microBatch_;
    const int64_t peer = peerRank(inst.attrs.getInt("peer") % S);
    if (inst.op == "ernie.send") {
      const TensorView &in = buffers[inst.operands[0]];
      comm_.send(in.data, bytesOf(in), peer, tag);
    } else {
      const TensorView &out = buffers[inst.results[0]];
      comm_.recv(out.data, bytesOf(out), peer, tag);
    }
    return;
  }
  // The stage collectives: members in `stages` order, tagged as micro-batch 0.
  const int64_t tag = channel * m;
  const std::vector<int64_t> stages = inst.attrs.getInts("stages");
  const TensorView &in = buffers[inst.operands[0]];
  const TensorView &out = buffers[inst.results[0]];
  const size_t bytes = bytesOf(in);
  if (inst.op == "ernie.stage_broadcast") {
    if (stages.front() == stage_) {
      for (int64_t t : stages)
        if (t != stage_)
          comm_.send(in.data, bytes, peerRank(t), tag);
      if (out.data != in.data)
        std::memmove(out.data, in.data, bytes);
    } else {
      comm_.recv(out.data, bytes, peerRank(stages.front()), tag);
    }
    return;
  }
  // ernie.stage_all_reduce: every member sends its value to every other and
  // sums all of them in member order, so every member gets the same bits.
  for (int64_t t : stages)
    if (t != stage_)
      comm_.send(in.data, bytes, peerRank(t), tag);
  std::vector<std::vector<uint8_t>> received(stages.size());
  std::vector<const void *> values;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i] == stage_) {
      values.push_back(in.data);
      continue;
    }
    received[i].resize(bytes);
    comm_.recv(received[i].data(), bytes, peerRank(stages[i]), tag);
    values.push_back(received[i].data());
  }
  // reduceInOrder reads every input before it writes `out`.
  reduceInOrder(values, out.data, in.numElements(), in.type, ReduceOp::Sum);
}

/// out = dest with piece (i + shift) mod n along `dim` replaced by `piece`,
/// i this rank's index in the group of n.
void Executor::insertShard(const Instruction &inst, const TensorView &dest,
                           const TensorView &piece, const TensorView &out) {
  int64_t members =
      static_cast<int64_t>(program_.mesh().group(rank_, inst.axes).size());
  int64_t me = program_.mesh().indexInGroup(rank_, inst.axes);
  int64_t dim = inst.attrs.getInt("dim");
  int64_t at = shiftedIndex(me, inst.attrs.getInt("shift", 0), members);
  const uint8_t *src = static_cast<const uint8_t *>(piece.data);
  uint8_t *dst = static_cast<uint8_t *>(out.data);
  std::vector<uint8_t> copy; // the piece, when copying dest would clobber it
  if (src < dst + bytesOf(out) && dst < src + bytesOf(piece)) {
    copy.assign(src, src + bytesOf(piece));
    src = copy.data();
  }
  if (out.data != dest.data)
    std::memmove(out.data, dest.data, bytesOf(out));
  insertBlock(src, piece.shape, dst, out.shape,
              offsetAlong(out.shape.size(), dim, at * piece.shape[dim]),
              byteSize(out.type));
}

void Executor::start(const Function &fn, size_t index, const TensorView &in,
                     const TensorView &out) {
  const Instruction &inst = fn.instructions[index];
  const void *src = in.data;
  void *dst = out.data;
  size_t bytes = bytesOf(in);
  int64_t shift = inst.attrs.getInt("shift");
  // The program outlives this executor, and run() waits for every transfer
  // before it returns or throws: the references and the arena stay valid.
  const Axes &axes = inst.axes;
  const std::string &op = inst.op, &function = fn.name;
  bool trace = options_.trace;
  AsyncHandle handle = comm_.start([this, src, dst, bytes, shift, trace, &axes,
                                    &op, &function] {
    int64_t begin = trace ? nowMicros() : 0;
    comm_.permute(src, dst, bytes, shift, axes);
    if (trace)
      record({op, function, /*collective=*/true, begin, nowMicros() - begin});
  });
  started_[inst.results[0]] = {std::move(handle), index};
}

void Executor::startBucket(const Function &fn, size_t index,
                           const std::vector<TensorView> &buffers) {
  const Instruction &inst = fn.instructions[index];
  std::vector<TensorView> in, out;
  for (uint32_t b : inst.operands)
    in.push_back(buffers[b]);
  for (uint32_t b : inst.results)
    out.push_back(buffers[b]);
  // One message: the inputs packed (narrow floats widened to f32 when the
  // bucket accumulates in f32), reduced in one collective, unpacked.
  const DType type = in[0].type;
  const DType wire = isNarrowFloat(type) &&
                             inst.attrs.getString("accumulate", "") == "f32"
                         ? DType::F32
                         : type;
  ReduceOp kind = reduceKind(inst.attrs);
  const Axes &axes = inst.axes;
  const std::string &op = inst.op, &function = fn.name;
  bool trace = options_.trace;
  AsyncHandle handle = comm_.start([this, in, out, type, wire, kind, trace,
                                    &axes, &op, &function] {
    int64_t begin = trace ? nowMicros() : 0;
    size_t count = 0;
    for (const TensorView &v : in)
      count += v.numElements();
    const size_t unit = byteSize(wire);
    std::vector<uint8_t> packed(count * unit), reduced(count * unit);
    size_t at = 0;
    for (const TensorView &v : in) {
      size_t n = v.numElements();
      if (wire != type)
        narrowToFloat(type, v.data,
                      reinterpret_cast<float *>(packed.data() + at * unit), n);
      else
        std::memcpy(packed.data() + at * unit, v.data, n * unit);
      at += n;
    }
    comm_.allReduce(packed.data(), reduced.data(), count, wire, kind, axes);
    at = 0;
    for (const TensorView &v : out) {
      size_t n = v.numElements();
      const uint8_t *from = reduced.data() + at * unit;
      if (wire != type)
        floatToNarrow(type, reinterpret_cast<const float *>(from), v.data, n);
      else
        std::memcpy(v.data, from, n * unit);
      at += n;
    }
    if (trace)
      record({op, function, /*collective=*/true, begin, nowMicros() - begin});
  });
  for (uint32_t b : inst.results)
    started_[b] = {handle, index};
}

void Executor::wait(const Instruction &inst, std::vector<TensorView> &buffers) {
  auto it = started_.find(inst.operands[0]);
  if (it == started_.end()) // Program::load rules this out.
    throw KernelError("nothing was started into buffer " +
                      std::to_string(inst.operands[0]));
  AsyncHandle handle = std::move(it->second.handle);
  started_.erase(it);
  handle.wait();
  const TensorView &received = buffers[inst.operands[0]];
  const TensorView &out = buffers[inst.results[0]];
  if (out.data != received.data)
    std::memmove(out.data, received.data, bytesOf(out));
}

void Executor::waitForStarted(const Function &fn, const std::string &why,
                              bool forget) {
  std::vector<std::pair<size_t, uint32_t>> oldestFirst;
  for (auto &[buffer, started] : started_)
    if (started.handle.valid())
      oldestFirst.emplace_back(started.instruction, buffer);
  if (oldestFirst.empty()) {
    if (forget)
      started_.clear();
    return;
  }
  std::sort(oldestFirst.begin(), oldestFirst.end());
  int64_t begin = options_.trace ? nowMicros() : 0;
  for (const auto &[index, buffer] : oldestFirst) {
    try {
      started_[buffer].handle.wait();
    } catch (const CommunicationError &e) {
      fail(fn, index, e.what(), /*inCollective=*/true);
    } catch (const std::exception &e) {
      fail(fn, index, e.what(), /*inCollective=*/false);
    }
  }
  if (forget)
    started_.clear();
  if (options_.trace)
    record({"ernie.wait (" + why + ")", fn.name, /*collective=*/false, begin,
            nowMicros() - begin});
}

void Executor::execute(const Function &fn, size_t index, Arena &arena) {
  const Instruction &inst = fn.instructions[index];
  if (inst.kernel) {
    (*inst.kernel)(arena.inputs[index], arena.outputs[index], inst.attrs);
    return;
  }
  std::vector<TensorView> &buffers = arena.buffers;
  if (program_.isPipelined() &&
      (inst.op == "ernie.send" || inst.op == "ernie.recv" ||
       inst.op == "ernie.stage_all_reduce" ||
       inst.op == "ernie.stage_broadcast")) {
    runStageOp(inst, buffers);
    return;
  }
  TensorView &out = buffers[inst.results[0]];
  if (inst.op == "ernie.constant") {
    std::memcpy(out.data, inst.data.data(), inst.data.size());
  } else if (inst.op == "ernie.axis_index") {
    int64_t index = inst.axes.empty()
                        ? 0
                        : program_.mesh().indexInGroup(rank_, inst.axes);
    if (out.type != DType::I64)
      throw KernelError("axis_index must produce i64");
    *out.as<int64_t>() = index;
  } else if (inst.op == "ernie.collective_permute_start") {
    start(fn, index, buffers[inst.operands[0]], out);
  } else if (inst.op == "ernie.all_reduce_start") {
    startBucket(fn, index, buffers);
  } else if (inst.op == "ernie.wait") {
    wait(inst, buffers);
  } else if (inst.op == "ernie.shard_insert") {
    insertShard(inst, buffers[inst.operands[kShardInsertDest]],
                buffers[inst.operands[kShardInsertPiece]], out);
  } else {
    runCollective(inst, buffers[inst.operands[0]], out);
  }
}

void Executor::fail(const Function &fn, size_t index, const std::string &cause,
                    bool inCollective) {
  const Instruction &inst = fn.instructions[index];
  std::ostringstream os;
  os << "rank " << rank_ << ": @" << fn.name << " instruction #" << index
     << " '" << inst.op << "'";
  if (!inst.location.empty())
    os << " at " << inst.location;
  os << ": " << cause;
  std::string message = os.str();
  comm_.abort(message);
  abandonStarted();
  throw ExecutionError(message, inCollective);
}

void Executor::abandonStarted() {
  // Transfers still in flight write into the arena: let them end before it
  // may be reused or freed. After an abort those waiting for a peer fail at
  // once (threads) or when the peer's process exits or the timeout passes
  // (Gloo).
  for (auto &entry : started_) {
    try {
      entry.second.handle.wait();
    } catch (...) {
    }
  }
  started_.clear();
}

std::vector<HostTensor> Executor::run(const std::string &name,
                                      const std::vector<HostTensor> &inputs,
                                      int64_t microBatch) {
  std::vector<const HostTensor *> views;
  for (const HostTensor &t : inputs)
    views.push_back(&t);
  return run(name, views, microBatch);
}

std::vector<HostTensor> Executor::run(const std::string &name,
                                      const std::vector<const HostTensor *> &inputs,
                                      int64_t microBatch) {
  const Function &fn = function(name);
  const PipelineSpec *pipeline = program_.pipeline();
  if (microBatch < 0 ||
      microBatch >= (pipeline ? pipeline->microBatches : int64_t(1)))
    throw std::invalid_argument(
        "@" + name + ": micro-batch " + std::to_string(microBatch) +
        " is out of range (the program has " +
        std::to_string(pipeline ? pipeline->microBatches : 1) + ")");
  microBatch_ = microBatch;
  if (inputs.size() != fn.arguments.size())
    throw std::invalid_argument("@" + name + " takes " +
                                std::to_string(fn.arguments.size()) +
                                " arguments, not " +
                                std::to_string(inputs.size()));
  std::unique_ptr<Arena> &arena = arenas_[name];
  if (!arena)
    arena = std::make_unique<Arena>(fn);
  const std::vector<TensorView> &buffers = arena->buffers;

  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorSpec &arg = fn.arguments[i];
    const HostTensor &input = *inputs[i];
    if (input.type != arg.type || input.shape != arg.localShape) {
      std::ostringstream os;
      os << "@" << name << " argument " << i
         << (arg.name.empty() ? "" : " ('" + arg.name + "')")
         << " must be a local " << runtime::name(arg.type) << " tensor of "
         << arg.localShape.size() << " dimensions matching the program";
      throw std::invalid_argument(os.str());
    }
    std::memcpy(buffers[arg.buffer].data, input.bytes.data(),
                input.bytes.size());
  }

  for (size_t i = 0; i < fn.instructions.size(); ++i) {
    const Instruction &inst = fn.instructions[i];
    bool blocking = arena->blocking[i];
    if (blocking)
      waitForStarted(fn, "before " + inst.op, /*forget=*/false);
    try {
      int64_t begin = options_.trace ? nowMicros() : 0;
      execute(fn, i, *arena);
      // A start's transfer is recorded where it runs (start()); here it is
      // the moment compute handed it over.
      if (options_.trace)
        record({inst.op, fn.name, blocking, begin, nowMicros() - begin});
    } catch (const CommunicationError &e) {
      fail(fn, i, e.what(), /*inCollective=*/true);
    } catch (const std::exception &e) {
      fail(fn, i, e.what(), /*inCollective=*/false);
    }
  }
  waitForStarted(fn, "end of @" + name, /*forget=*/true);

  std::vector<HostTensor> results;
  for (size_t i = 0; i < fn.results.size(); ++i) {
    const TensorSpec &res = fn.results[i];
    const TensorView &v = buffers[res.buffer];
    if (options_.checkFinite && res.role == Role::Loss && !isFinite(v)) {
      std::string message = "rank " + std::to_string(rank_) + ": @" + name +
                            " result " + std::to_string(i) +
                            " (the loss) is not finite";
      comm_.abort(message);
      throw ExecutionError(message, /*inCollective=*/false);
    }
    HostTensor out(res.type, res.localShape);
    std::memcpy(out.bytes.data(), v.data, out.bytes.size());
    results.push_back(std::move(out));
  }
  return results;
}

void Executor::recordSpan(const std::string &name, const std::string &function,
                          int64_t startMicros, int64_t endMicros) {
  if (options_.trace)
    record({name, function, /*collective=*/false, startMicros,
            endMicros - startMicros});
}

int64_t traceClockMicros() { return nowMicros(); }

void Executor::record(TraceEvent event) {
  std::lock_guard<std::mutex> lock(traceMutex_);
  trace_.push_back(std::move(event));
}

std::vector<TraceEvent> Executor::traceEvents() const {
  std::lock_guard<std::mutex> lock(traceMutex_);
  return trace_;
}

namespace {
std::string jsonEscape(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20)
      out += c;
  }
  return out;
}
} // namespace

void writeChromeTrace(const std::string &path,
                      const std::vector<std::vector<TraceEvent>> &events,
                      int64_t firstRank) {
  std::ofstream out(path);
  if (!out)
    throw std::runtime_error(path + ": cannot write the trace");
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto comma = [&] {
    if (!first)
      out << ",\n";
    first = false;
  };
  for (size_t r = 0; r < events.size(); ++r) {
    int64_t rank = firstRank + static_cast<int64_t>(r);
    comma();
    out << "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " << rank
        << ", \"args\": {\"name\": \"rank " << rank << "\"}}";
    for (int tid = 0; tid < 2; ++tid) {
      comma();
      out << "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": " << rank
          << ", \"tid\": " << tid << ", \"args\": {\"name\": \""
          << (tid ? "communication" : "compute") << "\"}}";
    }
    for (const TraceEvent &e : events[r]) {
      comma();
      out << "{\"ph\": \"X\", \"name\": \"" << jsonEscape(e.name)
          << "\", \"cat\": \"" << (e.collective ? "collective" : "compute")
          << "\", \"pid\": " << rank << ", \"tid\": " << (e.collective ? 1 : 0)
          << ", \"ts\": " << e.startMicros << ", \"dur\": " << e.durationMicros
          << ", \"args\": {\"function\": \"" << jsonEscape(e.function) << "\"}}";
    }
  }
  out << "\n]}\n";
  if (!out)
    throw std::runtime_error(path + ": write failed");
}

} // namespace ernie::runtime
