//===- Executor.cpp - running one rank's instructions ------------------------===//

#include "ernie/runtime/Executor.h"
#include "ernie/runtime/FloatConvert.h"

#include "ernie/runtime/ProgramFormat.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
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
  Arena(const Function &fn, uint8_t *base, Device &device,
        const std::vector<const Kernel *> &kernels, const Mesh &mesh,
        int64_t rank)
      : device(device), kernels(kernels), base(base) {
    buffers.reserve(fn.buffers.size());
    for (uint32_t b = 0; b < fn.buffers.size(); ++b) {
      const BufferSpec &spec = fn.buffers[b];
      // The arguments' region has no memory until a call binds it.
      external.push_back(fn.inArgumentRegion(b));
      buffers.push_back({external.back() ? nullptr : base + spec.offset,
                         spec.type, spec.shape});
      offsets.push_back(spec.offset);
    }
    staging.resize(fn.buffers.size());
    inputs.resize(fn.instructions.size());
    outputs.resize(fn.instructions.size());
    blocking.resize(fn.instructions.size());
    constantAt.assign(fn.instructions.size(), nullptr);
    slots.resize(fn.buffers.size());
    size_t constantBytes = 0;
    for (size_t i = 0; i < fn.instructions.size(); ++i) {
      const Instruction &inst = fn.instructions[i];
      blocking[i] = isBlockingCollective(inst.op);
      if (inst.op == "ernie.constant" || inst.op == "ernie.axis_index")
        constantBytes += roundUp(constantOf(inst, mesh, rank).size());
      if (!kernels[i])
        continue;
      for (uint32_t b : inst.operands) {
        slots[b].push_back({&inputs[i], inputs[i].size()});
        inputs[i].push_back(buffers[b]);
      }
      for (uint32_t b : inst.results) {
        slots[b].push_back({&outputs[i], outputs[i].size()});
        outputs[i].push_back(buffers[b]);
      }
    }
    // Views (a reshape whose result sits at its operand's offset: the
    // memory plan's) join their operand's group; any other result is a
    // write into its group's memory.
    root.resize(fn.buffers.size());
    for (uint32_t b = 0; b < root.size(); ++b)
      root[b] = b;
    written.assign(fn.buffers.size(), false);
    for (const Instruction &inst : fn.instructions) {
      if (isView(fn, inst))
        root[inst.results[0]] = root[inst.operands[0]];
      else
        for (uint32_t b : inst.results)
          written[root[b]] = true;
    }
    members.resize(fn.buffers.size());
    for (uint32_t b = 0; b < root.size(); ++b)
      members[root[b]].push_back(b);
    // On a GPU the constants (and this rank's axis indices) are uploaded
    // once and copied on the device each call; the host copies them from
    // the program.
    if (device.hostAddressable() || constantBytes == 0)
      return;
    constants = DeviceBuffer(device, constantBytes);
    size_t at = 0;
    for (size_t i = 0; i < fn.instructions.size(); ++i) {
      const Instruction &inst = fn.instructions[i];
      if (inst.op != "ernie.constant" && inst.op != "ernie.axis_index")
        continue;
      std::vector<uint8_t> bytes = constantOf(inst, mesh, rank);
      uint8_t *where = static_cast<uint8_t *>(constants.data()) + at;
      device.upload(where, bytes.data(), bytes.size());
      constantAt[i] = where;
      at += roundUp(bytes.size());
    }
  }
  ~Arena() {
    for (Event e : timing)
      device.destroyEvent(e);
  }
  Arena(const Arena &) = delete;
  Arena &operator=(const Arena &) = delete;

  /// Puts buffer `b` and its views (which share its offset) at `data`
  /// instead of the arena, for one call: an argument whose memory the
  /// caller's tensor is. The caller's memory is written only where the
  /// function writes `b` (a donated running sum or state); read-only
  /// arguments are bound as they are.
  void bind(uint32_t b, const void *data) {
    for (uint32_t v : members[root[b]])
      place(v, const_cast<void *>(data));
  }
  /// Back to the arena (after the call that bound it); the arguments'
  /// region back to no memory.
  void unbind(uint32_t b) {
    for (uint32_t v : members[root[b]])
      place(v, external[v] ? nullptr : base + offsets[v]);
  }
  /// Whether `b` lies in the arguments' region: bound, or staged, per call.
  bool isExternal(uint32_t b) const { return external[b]; }
  /// Binds `b`'s group to a copy of its own, made on first use and kept
  /// (an argument given from the host, or one the call may not write).
  void stage(uint32_t b) {
    DeviceBuffer &copy = staging[root[b]];
    const TensorView &v = buffers[root[b]];
    copy.reserve(device, v.numElements() * byteSize(v.type));
    bind(b, copy.data());
  }
  /// Whether no instruction writes `b`'s memory (through it or a view).
  bool readOnly(uint32_t b) const { return !written[root[b]]; }
  /// Whether `b` is no view of another buffer (so may be bound).
  bool isRoot(uint32_t b) const { return root[b] == b; }

  static size_t roundUp(size_t n) {
    return (n + program::kBufferAlignment - 1) / program::kBufferAlignment *
           program::kBufferAlignment;
  }
  /// The bytes a constant or axis_index instruction writes.
  static std::vector<uint8_t> constantOf(const Instruction &inst,
                                         const Mesh &mesh, int64_t rank) {
    if (inst.op == "ernie.constant")
      return inst.data;
    int64_t axisIndex = inst.axes.empty() ? 0 : mesh.indexInGroup(rank, inst.axes);
    std::vector<uint8_t> bytes(sizeof(int64_t));
    std::memcpy(bytes.data(), &axisIndex, sizeof axisIndex);
    return bytes;
  }

  Device &device;
  DeviceBuffer constants;
  std::vector<TensorView> buffers;
  /// Per instruction: its kernel on the device (null: the executor's op),
  /// a kernel's operand and result views, whether it is a blocking
  /// collective, and its bytes on the device (constants on a GPU).
  const std::vector<const Kernel *> &kernels;
  std::vector<std::vector<TensorView>> inputs, outputs;
  std::vector<bool> blocking;
  std::vector<const void *> constantAt;
  /// Tracing on a device: an event before each instruction and one after
  /// the last, made on the first traced call.
  std::vector<Event> timing;

private:
  /// Per buffer, each instruction's view of it (operand or result list and
  /// position), and its offset in the arena.
  struct Slot {
    std::vector<TensorView> *list;
    size_t index;
  };
  std::vector<std::vector<Slot>> slots;
  /// The rank's arena (shared by its functions: one runs at a time), each
  /// buffer's offset in it, and which buffers lie in the arguments' region
  /// instead, with the copies staged for them.
  uint8_t *base;
  std::vector<uint64_t> offsets;
  std::vector<bool> external;
  std::vector<DeviceBuffer> staging;
  /// Per buffer, the buffer whose memory it views (itself if none); per
  /// such root, its views and whether an instruction writes them.
  std::vector<uint32_t> root;
  std::vector<std::vector<uint32_t>> members;
  std::vector<bool> written;

  void place(uint32_t v, void *data) {
    buffers[v].data = data;
    for (const Slot &slot : slots[v])
      (*slot.list)[slot.index].data = data;
  }
};

uint64_t largestArena(const Program &program, int64_t stage) {
  uint64_t bytes = 0;
  for (const Function &fn : program.functions(stage))
    bytes = std::max(bytes, fn.arenaBytes);
  return bytes;
}

uint64_t deviceBytesNeeded(const Program &program, int64_t stage) {
  uint64_t bytes = largestArena(program, stage);
  std::map<std::string, uint64_t> state;
  for (const Function &fn : program.functions(stage)) {
    for (const TensorSpec &arg : fn.arguments)
      if (arg.role == Role::Parameter || arg.role == Role::OptimizerState) {
        uint64_t b = elementCount(arg.localShape) * byteSize(arg.type);
        state[arg.name] = std::max(state[arg.name], b);
      }
  }
  for (const auto &entry : state)
    bytes += entry.second;
  return bytes;
}

namespace {
/// Every group any rank's instructions (and the runner's gathers: every
/// axis, every axis but the stage axis) use, sorted: the same list on every
/// rank.
std::vector<Axes> groupsOf(const Program &program) {
  std::set<Axes> groups;
  for (int64_t s = 0; s < program.numStages(); ++s)
    for (const Function &fn : program.functions(s))
      for (const Instruction &inst : fn.instructions)
        if (!inst.axes.empty())
          groups.insert(inst.axes);
  Axes all = program.mesh().axisNames(), inStage;
  for (const std::string &axis : all)
    if (axis != program.stageAxis())
      inStage.push_back(axis);
  for (const Axes &axes : {all, inStage})
    if (!axes.empty())
      groups.insert(axes);
  return {groups.begin(), groups.end()};
}

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / 1073741824.0);
  return text;
}
} // namespace

Executor::Executor(const Program &program, Communicator &comm,
                   ExecutorOptions options)
    : program_(program), comm_(comm), device_(comm.device()),
      options_(options), rank_(comm.rank()),
      stage_(program.stageOf(comm.rank())) {
  if (comm.mesh().numRanks() != program.mesh().numRanks() ||
      comm.mesh().axisSizes() != program.mesh().axisSizes())
    throw std::invalid_argument(
        "the communicator's mesh does not match the program's");
  // Every kernel on this device, before anything runs: an op without one
  // is a load error naming it, never a failure mid-step.
  for (const Function &fn : program.functions(stage_)) {
    Kernels &k = kernels_[fn.name];
    for (size_t i = 0; i < fn.instructions.size(); ++i) {
      const Instruction &inst = fn.instructions[i];
      const Kernel *kernel = nullptr;
      if (inst.kernel) {
        std::shared_ptr<const Kernel> holder;
        kernel = device_.kernelFor(inst, holder);
        if (!kernel)
          throw ProgramError(program.source() + ": @" + fn.name +
                             " instruction #" + std::to_string(i) + " '" +
                             inst.op + "': " + device_.describe() +
                             " has no kernel for " + inst.op +
                             " (docs/architecture.md lists the ops each "
                             "device runs)");
        if (holder)
          k.held.push_back(std::move(holder));
      }
      k.kernel.push_back(kernel);
    }
  }
  if (std::optional<DeviceMemory> memory = device_.memory()) {
    uint64_t needed = deviceBytesNeeded(program, stage_);
    if (needed > memory->free)
      throw DeviceError(
          "rank " + std::to_string(rank_) + ": the program needs " +
          std::to_string(needed) + " bytes (" + gib(needed) +
          ") of device memory (arenas and state); " + device_.describe() +
          " has " + std::to_string(memory->free) + " bytes (" +
          gib(memory->free) + ") free of " + std::to_string(memory->total));
  }
  compute_ = device_.createStream();
  communication_ = device_.createStream();
  comm_.prepareGroups(groupsOf(program));
}

// run() leaves nothing started; this only guards the arenas against an
// unforeseen exit.
Executor::~Executor() {
  abandonStarted();
  arenas_.clear();
  for (auto &entry : transferEvents_) {
    device_.destroyEvent(entry.second.first);
    device_.destroyEvent(entry.second.second);
  }
  device_.destroyStream(compute_);
  device_.destroyStream(communication_);
}

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

bool isFinite(const HostTensor &t) {
  HostTensor wide = t.type == DType::F64 ? t : convert(t, DType::F64);
  for (int64_t i = 0; i < wide.numElements(); ++i)
    if (!std::isfinite(wide.as<double>()[i]))
      return false;
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
    uint8_t *all = scratch(bytesOf(out));
    comm_.allGather(in.data, all, bytesOf(in), axes);
    for (int64_t j = 0; j < members; ++j)
      device_.insertBlock(all + j * bytesOf(in), in.shape, out.data, out.shape,
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
    uint8_t *packed = scratch(bytesOf(in));
    for (int64_t j = 0; j < members; ++j)
      device_.extractBlock(in.data, in.shape,
                           offsetAlong(in.shape.size(), dim, j * out.shape[dim]),
                           packed + j * bytesOf(out), out.shape, elementBytes);
    comm_.reduceScatter(packed, out.data, out.numElements(), in.type, kind,
                        axes);
  } else if (op == "ernie.all_to_all") {
    int64_t split = inst.attrs.getInt("split_dim");
    int64_t concat = inst.attrs.getInt("concat_dim");
    std::vector<int64_t> chunk = in.shape;
    chunk[split] /= members;
    size_t chunkBytes = bytesOf(in) / members;
    // Send buffer: the chunks along `split`, contiguous in member order.
    uint8_t *send = scratch(2 * bytesOf(in)), *recv = send + bytesOf(in);
    for (int64_t j = 0; j < members; ++j)
      device_.extractBlock(in.data, in.shape,
                           offsetAlong(in.shape.size(), split, j * chunk[split]),
                           send + j * chunkBytes, chunk, elementBytes);
    comm_.allToAll(send, recv, chunkBytes, axes);
    for (int64_t j = 0; j < members; ++j)
      device_.insertBlock(recv + j * chunkBytes, chunk, out.data, out.shape,
                          offsetAlong(out.shape.size(), concat, j * chunk[concat]),
                          elementBytes);
  } else if (op == "ernie.shard_slice") {
    int64_t dim = inst.attrs.getInt("dim");
    int64_t piece = shiftedIndex(me, inst.attrs.getInt("shift", 0), members);
    device_.extractBlock(in.data, in.shape,
                         offsetAlong(in.shape.size(), dim, piece * out.shape[dim]),
                         out.data, out.shape, elementBytes);
  } else if (op == "ernie.partial_init") {
    // A pending sum starts on the first member; max/min/avg hold the value
    // on every member.
    if (reduceKind(inst.attrs) == ReduceOp::Sum && me != 0)
      device_.fill(out.data, 0, bytesOf(out));
    else
      device_.copy(out.data, in.data, bytesOf(out));
  } else {
    throw KernelError("unknown executor op");
  }
}

uint8_t *Executor::scratch(size_t bytes) {
  scratch_.reserve(device_, bytes);
  return static_cast<uint8_t *>(scratch_.data());
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
      device_.copy(out.data, in.data, bytes);
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
  uint8_t *received = scratch(bytes * stages.size());
  std::vector<const void *> values;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i] == stage_) {
      values.push_back(in.data);
      continue;
    }
    comm_.recv(received + i * bytes, bytes, peerRank(stages[i]), tag);
    values.push_back(received + i * bytes);
  }
  // reduceInOrder reads every input before it writes `out`.
  device_.reduceInOrder(values, {out.data}, in.numElements(), in.type,
                        ReduceOp::Sum);
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
  // The piece, when copying dest would clobber it.
  if (src < dst + bytesOf(out) && dst < src + bytesOf(piece)) {
    uint8_t *copy = scratch(bytesOf(piece));
    device_.copy(copy, src, bytesOf(piece));
    src = copy;
  }
  device_.copy(out.data, dest.data, bytesOf(out));
  device_.insertBlock(src, piece.shape, dst, out.shape,
                      offsetAlong(out.shape.size(), dim, at * piece.shape[dim]),
                      byteSize(out.type));
}

std::pair<Event, Event> Executor::transferEvents(uint32_t buffer) {
  auto it = transferEvents_.find(buffer);
  if (it == transferEvents_.end())
    it = transferEvents_
             .emplace(buffer,
                      std::make_pair(device_.createEvent(), device_.createEvent()))
             .first;
  return it->second;
}

void Executor::start(const Function &fn, size_t index, const TensorView &in,
                     const TensorView &out) {
  const Instruction &inst = fn.instructions[index];
  const void *src = in.data;
  void *dst = out.data;
  size_t bytes = bytesOf(in);
  int64_t shift = inst.attrs.getInt("shift");
  // The transfer runs on the communication stream after what the compute
  // stream has done so far (`ready`), and the compute stream's work after
  // its wait runs after it (`done`).
  auto [ready, done] = transferEvents(inst.results[0]);
  device_.record(ready, compute_);
  // The program outlives this executor, and run() waits for every transfer
  // before it returns or throws: the references and the arena stay valid.
  const Axes &axes = inst.axes;
  const std::string &op = inst.op, &function = fn.name;
  bool trace = options_.trace;
  AsyncHandle handle = comm_.start([this, src, dst, bytes, shift, trace, &axes,
                                    &op, &function, ready = ready,
                                    done = done] {
    StreamGuard guard(communication_);
    device_.wait(communication_, ready);
    int64_t begin = trace ? nowMicros() : 0;
    comm_.permute(src, dst, bytes, shift, axes);
    device_.record(done, communication_);
    if (trace)
      record({op, function, /*collective=*/true, begin, nowMicros() - begin});
  });
  started_[inst.results[0]] = {std::move(handle), index, done};
}

void Executor::startBucket(const Function &fn, size_t index,
                           const std::vector<TensorView> &buffers) {
  const Instruction &inst = fn.instructions[index];
  std::vector<TensorView> in, out;
  for (uint32_t b : inst.operands)
    in.push_back(buffers[b]);
  for (uint32_t b : inst.results)
    out.push_back(buffers[b]);
  // One message carries the collective of every operand. Narrow floats a
  // bucket reduces in f32 are widened first (`staged`) and rounded once.
  const std::string blocking = bucketedCollective(inst.op); // a bucket op
  const bool scatters = blocking == "ernie.reduce_scatter",
             gathers = blocking == "ernie.all_gather";
  const DType type = in[0].type;
  const DType wire = !gathers && isNarrowFloat(type) &&
                             inst.attrs.getString("accumulate", "") == "f32"
                         ? DType::F32
                         : type;
  const int64_t members =
      static_cast<int64_t>(program_.mesh().group(rank_, inst.axes).size());
  const int64_t dim = gathers || scatters ? inst.attrs.getInt("dim") : 0;
  size_t count = 0; // elements this rank puts in
  for (const TensorView &v : in)
    count += v.numElements();
  const size_t unit = byteSize(wire);
  const size_t collected = scatters  ? count / members
                           : gathers ? count * members
                                     : count;
  const size_t staged = scatters && wire != type ? count : 0;
  // [staged | packed | collected], made at the bucket's first start.
  DeviceBuffer &message = buckets_[{fn.name, index}];
  message.reserve(device_, (staged + count + collected) * unit);
  uint8_t *widened = static_cast<uint8_t *>(message.data());
  uint8_t *packed = widened + staged * unit;
  uint8_t *result = packed + count * unit;
  auto [ready, done] = transferEvents(inst.results[0]);
  device_.record(ready, compute_);
  ReduceOp kind = gathers ? ReduceOp::Sum : reduceKind(inst.attrs);
  const Axes &axes = inst.axes;
  const std::string &op = inst.op, &function = fn.name;
  bool trace = options_.trace;
  AsyncHandle handle = comm_.start([this, in, out, type, wire, unit, count,
                                    members, dim, scatters, gathers, widened,
                                    packed, result, kind, trace, &axes, &op,
                                    &function, ready = ready, done = done] {
    StreamGuard guard(communication_);
    device_.wait(communication_, ready);
    int64_t begin = trace ? nowMicros() : 0;
    // Each operand in the wire type, back to back (into `packed`, or for a
    // scatter into `widened` when it must widen, and as they are if not).
    std::vector<const uint8_t *> source;
    size_t at = 0;
    for (const TensorView &v : in) {
      size_t n = v.numElements();
      uint8_t *to = (scatters ? widened : packed) + at * unit;
      if (wire != type)
        device_.convert(v.data, type, to, wire, n);
      else if (!scatters)
        device_.copy(to, v.data, n * unit);
      source.push_back(wire != type || !scatters
                           ? to
                           : static_cast<const uint8_t *>(v.data));
      at += n;
    }
    if (scatters) {
      // By destination: member j's piece of every operand, then j + 1's.
      at = 0;
      for (int64_t j = 0; j < members; ++j)
        for (size_t k = 0; k < in.size(); ++k) {
          std::vector<int64_t> piece = out[k].shape;
          device_.extractBlock(source[k], in[k].shape,
                               offsetAlong(piece.size(), dim, j * piece[dim]),
                               packed + at * unit, piece, unit);
          at += out[k].numElements();
        }
      comm_.reduceScatter(packed, result, count / members, wire, kind, axes);
    } else if (gathers) {
      comm_.allGather(packed, result, count * unit, axes);
    } else {
      comm_.allReduce(packed, result, count, wire, kind, axes);
    }
    // This rank's part of the message, operand by operand.
    at = 0;
    for (size_t k = 0; k < out.size(); ++k) {
      const TensorView &v = out[k];
      if (gathers) {
        // Member j's copy of operand k sits at j * count + at.
        for (int64_t j = 0; j < members; ++j)
          device_.insertBlock(result + (j * count + at) * unit, in[k].shape,
                              v.data, v.shape,
                              offsetAlong(v.shape.size(), dim,
                                          j * in[k].shape[dim]),
                              unit);
        at += in[k].numElements();
        continue;
      }
      size_t n = v.numElements();
      if (wire != type)
        device_.convert(result + at * unit, wire, v.data, type, n);
      else
        device_.copy(v.data, result + at * unit, n * unit);
      at += n;
    }
    device_.record(done, communication_);
    if (trace)
      record({op, function, /*collective=*/true, begin, nowMicros() - begin});
  });
  for (uint32_t b : inst.results)
    started_[b] = {handle, index, done};
}

void Executor::wait(const Instruction &inst, std::vector<TensorView> &buffers) {
  auto it = started_.find(inst.operands[0]);
  if (it == started_.end()) // Program::load rules this out.
    throw KernelError("nothing was started into buffer " +
                      std::to_string(inst.operands[0]));
  AsyncHandle handle = std::move(it->second.handle);
  Event done = it->second.done;
  started_.erase(it);
  handle.wait();
  device_.wait(compute_, done);
  const TensorView &received = buffers[inst.operands[0]];
  const TensorView &out = buffers[inst.results[0]];
  device_.copy(out.data, received.data, bytesOf(out));
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
      device_.wait(compute_, started_[buffer].done);
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
  if (const Kernel *kernel = arena.kernels[index]) {
    (*kernel)(arena.inputs[index], arena.outputs[index],
              fn.instructions[index].attrs);
    return;
  }
  const Instruction &inst = fn.instructions[index];
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
    if (arena.constantAt[index])
      device_.copy(out.data, arena.constantAt[index], inst.data.size());
    else
      device_.upload(out.data, inst.data.data(), inst.data.size());
  } else if (inst.op == "ernie.axis_index") {
    if (out.type != DType::I64)
      throw KernelError("axis_index must produce i64");
    if (arena.constantAt[index]) {
      device_.copy(out.data, arena.constantAt[index], sizeof(int64_t));
    } else {
      int64_t at = inst.axes.empty()
                       ? 0
                       : program_.mesh().indexInGroup(rank_, inst.axes);
      device_.upload(out.data, &at, sizeof at);
    }
  } else if (inst.op == "ernie.collective_permute_start") {
    start(fn, index, buffers[inst.operands[0]], out);
  } else if (bucketedCollective(inst.op)) {
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

const char *finiteCheckName(FiniteCheck check) {
  switch (check) {
  case FiniteCheck::Off: return "off";
  case FiniteCheck::Results: return "results";
  case FiniteCheck::Tensors: return "tensors";
  }
  return "?";
}

FiniteCheck parseFiniteCheck(const std::string &name) {
  for (FiniteCheck c :
       {FiniteCheck::Off, FiniteCheck::Results, FiniteCheck::Tensors})
    if (name == finiteCheckName(c))
      return c;
  throw std::invalid_argument("unknown finite check '" + name +
                              "' (expected off, results or tensors)");
}

void Executor::checkWritten(const Function &fn, size_t index,
                            const Arena &arena) {
  const Instruction &inst = fn.instructions[index];
  // A started transfer is checked where its ernie.wait completes it.
  if (inst.op == "ernie.collective_permute_start" ||
      bucketedCollective(inst.op))
    return;
  device_.synchronize(compute_); // the instruction's results are written
  for (size_t k = 0; k < inst.results.size(); ++k) {
    const TensorView &v = arena.buffers[inst.results[k]];
    if (!isFloat(v.type) || v.numElements() == 0)
      continue;
    HostTensor written(v.type, v.shape);
    device_.download(written.bytes.data(), v.data, written.bytes.size());
    if (!isFinite(written))
      fail(fn, index,
           "result " + std::to_string(k) + " (" + shapeString(v.shape) + "x" +
               std::string(name(v.type)) +
               ") is the first tensor of the call that is not finite",
           /*inCollective=*/false);
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
  try {
    device_.synchronize(communication_);
    device_.synchronize(compute_);
  } catch (...) {
  }
}

std::vector<HostTensor> Executor::run(const std::string &name,
                                      const std::vector<HostTensor> &inputs,
                                      int64_t microBatch) {
  std::vector<Argument> args(inputs.begin(), inputs.end());
  std::vector<HostTensor> host;
  runOnDevice(name, args, microBatch, {}, &host);
  return host;
}

std::vector<DeviceTensor>
Executor::runOnDevice(const std::string &name,
                      const std::vector<Argument> &inputs, int64_t microBatch,
                      const std::vector<DeviceTensor *> &into,
                      std::vector<HostTensor> *host,
                      const std::vector<bool> &toHost) {
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
  StreamGuard guard(compute_);
  std::unique_ptr<Arena> &arena = arenas_[name];
  if (!arena) {
    // One arena for all of the rank's functions, as large as the largest:
    // they run one at a time, and no transfer outlives its call.
    if (!arenaMemory_.data())
      arenaMemory_ = DeviceBuffer(device_, largestArena(program_, stage_));
    arena = std::make_unique<Arena>(
        fn, static_cast<uint8_t *>(arenaMemory_.data()), device_,
        kernels_.at(name).kernel, program_.mesh(), rank_);
  }
  const std::vector<TensorView> &buffers = arena->buffers;

  // Device arguments are bound where they are, for this call, when the
  // function never writes them, or when the same tensor is the target of a
  // result the function writes over that argument (donated: a running
  // gradient sum). Either way nothing is copied in, and a donated result
  // is not copied out.
  std::vector<uint32_t> bound;
  std::vector<const DeviceTensor *> boundTensors;
  struct Unbind {
    Arena &arena;
    std::vector<uint32_t> &bound;
    ~Unbind() {
      for (uint32_t b : bound)
        arena.unbind(b);
    }
  } unbind{*arena, bound};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DeviceTensor *given = inputs[i].device;
    const TensorSpec &arg = fn.arguments[i];
    uint32_t b = arg.buffer;
    // (Program::load gives every argument a buffer of its own, never a
    // view's; one tensor given twice is bound once, the rest copied.)
    if (!given || given->type != arg.type || given->shape != arg.localShape ||
        &given->device() != &device_ || !arena->isRoot(b) ||
        std::find(boundTensors.begin(), boundTensors.end(), given) !=
            boundTensors.end())
      continue;
    bool donated = false, target = false;
    for (size_t j = 0; j < into.size() && j < fn.results.size(); ++j) {
      target |= into[j] == given;
      donated |= into[j] == given && fn.results[j].buffer == b;
    }
    // A read-only argument that another result overwrites at the end
    // would be copied out after that: it stays a copy. A pipeline's
    // gradient sum is consumed by the call that takes it (Role::Gradient):
    // bound even where the call writes scratch over it.
    if (donated || arg.role == Role::Gradient ||
        (arena->readOnly(b) && !target)) {
      arena->bind(b, given->buffer.data());
      bound.push_back(b);
      boundTensors.push_back(given);
    }
  }

  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorSpec &arg = fn.arguments[i];
    const Argument &input = inputs[i];
    DType type = input.host ? input.host->type : input.device->type;
    const std::vector<int64_t> &shape =
        input.host ? input.host->shape : input.device->shape;
    if (type != arg.type || shape != arg.localShape ||
        (input.device && &input.device->device() != &device_)) {
      std::ostringstream os;
      os << "@" << name << " argument " << i
         << (arg.name.empty() ? "" : " ('" + arg.name + "')")
         << " must be a local " << runtime::name(arg.type) << " tensor of "
         << arg.localShape.size() << " dimensions matching the program"
         << (input.device ? " on " + device_.describe() : "");
      throw std::invalid_argument(os.str());
    }
    // An argument in the arguments' region that is not bound gets a copy.
    if (arena->isExternal(arg.buffer) &&
        std::find(bound.begin(), bound.end(), arg.buffer) == bound.end()) {
      arena->stage(arg.buffer);
      bound.push_back(arg.buffer);
    }
    void *dst = buffers[arg.buffer].data;
    if (input.device && dst == input.device->buffer.data())
      continue; // bound: already there
    if (input.host)
      device_.upload(dst, input.host->bytes.data(), input.host->bytes.size());
    else
      device_.copy(dst, input.device->buffer.data(), input.device->bytes());
  }

  // On a device the host clock sees launches; kernels are timed by events
  // on the compute stream, placed on the host clock after the function.
  const bool timed = options_.trace && !device_.hostAddressable();
  if (timed && arena->timing.empty())
    for (size_t i = 0; i <= fn.instructions.size(); ++i)
      arena->timing.push_back(device_.createEvent());
  int64_t runBegin = 0;
  std::vector<TraceEvent> launched;
  for (size_t i = 0; i < fn.instructions.size(); ++i) {
    const Instruction &inst = fn.instructions[i];
    bool blocking = arena->blocking[i];
    if (blocking)
      waitForStarted(fn, "before " + inst.op, /*forget=*/false);
    try {
      if (timed) {
        device_.record(arena->timing[i], compute_);
        if (i == 0)
          runBegin = nowMicros();
      }
      int64_t begin = options_.trace ? nowMicros() : 0;
      execute(fn, i, *arena);
      // A start's transfer is recorded where it runs (start()); here it is
      // the moment compute handed it over.
      if (timed)
        launched.push_back({inst.op, fn.name, blocking, 0, 0});
      else if (options_.trace)
        record({inst.op, fn.name, blocking, begin, nowMicros() - begin});
    } catch (const CommunicationError &e) {
      fail(fn, i, e.what(), /*inCollective=*/true);
    } catch (const std::exception &e) {
      fail(fn, i, e.what(), /*inCollective=*/false);
    }
    if (options_.checkFinite == FiniteCheck::Tensors)
      checkWritten(fn, i, *arena);
  }
  if (timed && !fn.instructions.empty())
    device_.record(arena->timing[fn.instructions.size()], compute_);
  waitForStarted(fn, "end of @" + name, /*forget=*/true);

  std::vector<DeviceTensor> results;
  results.reserve(fn.results.size());
  if (host)
    host->resize(fn.results.size());
  try {
    for (size_t i = 0; i < fn.results.size(); ++i) {
      const TensorSpec &res = fn.results[i];
      const TensorView &v = buffers[res.buffer];
      DeviceTensor *target = i < into.size() ? into[i] : nullptr;
      if (target && (target->empty() || &target->device() != &device_ ||
                     target->type != res.type ||
                     target->shape != res.localShape))
        target = nullptr;
      const bool download = host && (toHost.empty() || toHost[i]);
      if (download) {
        HostTensor &out = (*host)[i];
        out = HostTensor(res.type, res.localShape);
        device_.download(out.bytes.data(), v.data, out.bytes.size());
        results.emplace_back();
      } else if (target) {
        if (target->buffer.data() != v.data) // (donated: written in place)
          device_.copy(target->buffer.data(), v.data, bytesOf(v));
        results.emplace_back();
      } else {
        results.emplace_back(device_, res.type, res.localShape);
        device_.copy(results.back().buffer.data(), v.data, bytesOf(v));
      }
    }
    device_.synchronize(compute_);
  } catch (const std::exception &e) {
    std::string message = "rank " + std::to_string(rank_) + ": @" + name +
                          ": copying the results out: " + e.what();
    comm_.abort(message);
    throw ExecutionError(message, /*inCollective=*/false);
  }
  try {
    comm_.raiseAsyncError();
  } catch (const CommunicationError &e) {
    std::string message =
        "rank " + std::to_string(rank_) + ": @" + name + ": " + e.what();
    comm_.abort(message);
    throw ExecutionError(message, /*inCollective=*/true);
  }
  if (timed && !fn.instructions.empty())
    for (size_t i = 0; i < launched.size(); ++i) {
      float from = device_.elapsedMilliseconds(arena->timing[0], arena->timing[i]);
      float to = device_.elapsedMilliseconds(arena->timing[0], arena->timing[i + 1]);
      launched[i].startMicros = runBegin + int64_t(from * 1000);
      launched[i].durationMicros = int64_t((to - from) * 1000);
      record(std::move(launched[i]));
    }
  if (options_.checkFinite != FiniteCheck::Off)
    for (size_t i = 0; i < fn.results.size(); ++i) {
      const TensorSpec &res = fn.results[i];
      if (res.role != Role::Loss && res.role != Role::Metric)
        continue;
      HostTensor value = !results[i].empty() ? results[i].download()
                         : host && (toHost.empty() || toHost[i]) ? (*host)[i]
                                                                  : into[i]->download();
      if (isFinite(value))
        continue;
      std::string message =
          "rank " + std::to_string(rank_) + ": @" + name + " result " +
          std::to_string(i) +
          (res.role == Role::Loss ? std::string(" (the loss)")
                                  : " (the metric '" + res.name + "')") +
          " is not finite";
      comm_.abort(message);
      throw ExecutionError(message, /*inCollective=*/false);
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
