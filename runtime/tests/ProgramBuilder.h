//===- ProgramBuilder.h - program files built in memory, for tests ---------===//
//
// A tiny fluent builder over the generated FlatBuffers API: a mesh, functions
// with buffers, arguments, results and instructions. Buffer offsets (packed,
// kBufferAlignment apart), byte sizes, the arena size, tensor types, local
// and global shapes are computed unless a test sets them (to build a broken
// file on purpose); the envelope carries the format version and the zlib
// CRC-32 of the nested program exactly as lib/Export/ProgramFile.cpp writes
// them.
//
//   ProgramBuilder pb({"x"}, {2});
//   FunctionBuilder &f = pb.function("main");
//   uint32_t in = f.buffer(DType::F32, {2, 3}), out = f.buffer(DType::F32, {4, 3});
//   f.arg(in, Tensor().split({{"x"}, {}}))
//       .op("ernie.all_gather", {in}, {out}, {{"dim", int64_t(0)}}, {"x"})
//       .ret(out);
//   Program program = pb.parse();
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_TESTS_PROGRAMBUILDER_H
#define ERNIE_RUNTIME_TESTS_PROGRAMBUILDER_H

#include "ernie/program/program_generated.h"
#include "ernie/runtime/Program.h"
#include "ernie/runtime/ProgramFormat.h"

#include <zlib.h>

#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace ernie::runtime::testing {

namespace fbs = ::ernie::program;

inline fbs::DType encodeType(DType t) {
  switch (t) {
  case DType::F64: return fbs::DType::F64;
  case DType::F32: return fbs::DType::F32;
  case DType::F16: return fbs::DType::F16;
  case DType::BF16: return fbs::DType::BF16;
  case DType::F8E4M3FN: return fbs::DType::F8E4M3FN;
  case DType::F8E5M2: return fbs::DType::F8E5M2;
  case DType::I64: return fbs::DType::I64;
  case DType::I32: return fbs::DType::I32;
  case DType::I1: return fbs::DType::I1;
  }
  return fbs::DType::F32;
}

inline fbs::Role encodeRole(Role r) {
  switch (r) {
  case Role::Input: return fbs::Role::Input;
  case Role::Parameter: return fbs::Role::Parameter;
  case Role::OptimizerState: return fbs::Role::OptimizerState;
  case Role::LearningRate: return fbs::Role::LearningRate;
  case Role::Step: return fbs::Role::Step;
  case Role::Loss: return fbs::Role::Loss;
  case Role::Residual: return fbs::Role::Residual;
  case Role::Gradient: return fbs::Role::Gradient;
  case Role::MicroBatchMax: return fbs::Role::MicroBatchMax;
  case Role::MicroBatchSum: return fbs::Role::MicroBatchSum;
  case Role::Metric: return fbs::Role::Metric;
  }
  return fbs::Role::Input;
}

inline fbs::ReduceKind encodeKind(ReduceOp k) {
  switch (k) {
  case ReduceOp::Sum: return fbs::ReduceKind::Sum;
  case ReduceOp::Avg: return fbs::ReduceKind::Avg;
  case ReduceOp::Max: return fbs::ReduceKind::Max;
  case ReduceOp::Min: return fbs::ReduceKind::Min;
  }
  return fbs::ReduceKind::Sum;
}

/// The little-endian bytes of `values` (x86: their object representation).
template <typename T> std::vector<uint8_t> bytesOf(const std::vector<T> &values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty())
    std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// What a function argument or result is: by default an unnamed, replicated
/// Input whose type and local shape are its buffer's.
struct Tensor {
  std::string name;
  Role role = Role::Input;
  std::optional<std::vector<Axes>> dims; // absent: no sharding table
  std::vector<std::pair<std::string, ReduceOp>> partials;
  std::string updates;
  std::optional<std::vector<int64_t>> globalShape, localShape;
  std::optional<DType> type;

  Tensor &named(std::string n) { name = std::move(n); return *this; }
  Tensor &as(Role r) { role = r; return *this; }
  /// Per dimension, the axes splitting it (major to minor).
  Tensor &split(std::vector<Axes> d) { dims = std::move(d); return *this; }
  Tensor &partial(std::string axis, ReduceOp kind) {
    partials.emplace_back(std::move(axis), kind);
    return *this;
  }
  Tensor &updating(std::string state) { updates = std::move(state); return *this; }
  Tensor &global(std::vector<int64_t> s) { globalShape = std::move(s); return *this; }
  Tensor &local(std::vector<int64_t> s) { localShape = std::move(s); return *this; }
  Tensor &typed(DType t) { type = t; return *this; }
};

struct BufferDesc {
  DType type;
  std::vector<int64_t> shape;
  std::optional<uint64_t> offset, bytes; // absent: computed
};

using AttrList = std::vector<std::pair<std::string, Attrs::Value>>;

struct InstDesc {
  std::string op;
  std::vector<uint32_t> operands, results;
  AttrList attrs;
  Axes axes;
  std::optional<std::vector<uint8_t>> data;
  std::string location;
};

class FunctionBuilder {
public:
  explicit FunctionBuilder(std::string name) : name(std::move(name)) {}

  /// A new buffer; returns its index.
  uint32_t buffer(DType type, std::vector<int64_t> shape) {
    buffers.push_back({type, std::move(shape), std::nullopt, std::nullopt});
    return static_cast<uint32_t>(buffers.size() - 1);
  }
  FunctionBuilder &arg(uint32_t buffer, Tensor spec = {}) {
    arguments.emplace_back(buffer, std::move(spec));
    return *this;
  }
  FunctionBuilder &ret(uint32_t buffer, Tensor spec = {}) {
    results.emplace_back(buffer, std::move(spec));
    return *this;
  }
  FunctionBuilder &op(std::string name, std::vector<uint32_t> operands,
                      std::vector<uint32_t> results, AttrList attrs = {},
                      Axes axes = {}, std::string location = "") {
    instructions.push_back({std::move(name), std::move(operands),
                            std::move(results), std::move(attrs),
                            std::move(axes), std::nullopt, std::move(location)});
    return *this;
  }
  template <typename T>
  FunctionBuilder &constant(uint32_t buffer, const std::vector<T> &values) {
    instructions.push_back(
        {"ernie.constant", {}, {buffer}, {}, {}, bytesOf(values), ""});
    return *this;
  }

  std::string name;
  std::vector<BufferDesc> buffers;
  std::vector<std::pair<uint32_t, Tensor>> arguments, results;
  std::vector<InstDesc> instructions;
  std::optional<uint64_t> arenaBytes; // absent: the end of the last buffer
  uint64_t argumentBytes = 0;         // the arguments' region after the arena
};

class ProgramBuilder {
public:
  ProgramBuilder(std::vector<std::string> axes, std::vector<int64_t> sizes)
      : axes_(std::move(axes)), sizes_(std::move(sizes)) {}

  ProgramBuilder &stageAxis(std::string axis) {
    stageAxis_ = std::move(axis);
    return *this;
  }
  /// The number of stages written (default: one past the highest stage any
  /// function was added to).
  ProgramBuilder &stages(size_t n) {
    numStages_ = n;
    return *this;
  }
  /// Makes the program pipelined (the Pipeline table).
  ProgramBuilder &pipeline(int64_t microBatches, int64_t virtualStages,
                           std::string schedule) {
    pipeline_ = {microBatches, virtualStages, std::move(schedule)};
    return *this;
  }
  /// `stage`'s schedule (Stage.schedule).
  ProgramBuilder &schedule(size_t stage, std::vector<PipelineStep> steps) {
    schedules_[stage] = std::move(steps);
    return *this;
  }
  /// A new function in `stage`; the reference stays valid.
  FunctionBuilder &function(std::string name, size_t stage = 0) {
    functions_.emplace_back(stage, FunctionBuilder(std::move(name)));
    return functions_.back().second;
  }
  /// The function added as `name` (the first, in any stage), to change it.
  FunctionBuilder &get(const std::string &name) {
    for (auto &entry : functions_)
      if (entry.second.name == name)
        return entry.second;
    throw std::invalid_argument("ProgramBuilder: no function " + name);
  }

  uint32_t formatVersion = program::kFormatVersion;
  std::optional<uint32_t> checksum; // absent: the CRC-32 of the payload
  std::string producer = "ProgramBuilder";

  /// The nested Program buffer.
  std::vector<uint8_t> payload() const {
    flatbuffers::FlatBufferBuilder b(1 << 12);
    size_t stages = numStages_ ? *numStages_ : 0;
    for (const auto &entry : functions_)
      if (!numStages_)
        stages = std::max(stages, entry.first + 1);
    std::vector<std::vector<flatbuffers::Offset<fbs::Function>>> perStage(stages);
    for (const auto &[stage, fn] : functions_)
      if (stage < stages)
        perStage[stage].push_back(writeFunction(b, fn));
    std::vector<flatbuffers::Offset<fbs::Stage>> stageTables;
    for (size_t s = 0; s < perStage.size(); ++s) {
      flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fbs::PipelineStep>>>
          steps = 0;
      auto it = schedules_.find(s);
      if (it != schedules_.end()) {
        std::vector<flatbuffers::Offset<fbs::PipelineStep>> out;
        for (const PipelineStep &step : it->second)
          out.push_back(fbs::CreatePipelineStep(
              b,
              step.action == PipelineAction::Forward
                  ? fbs::PipelineAction::Forward
                  : fbs::PipelineAction::Backward,
              step.chunk, step.microBatch));
        steps = b.CreateVector(out);
      }
      stageTables.push_back(
          fbs::CreateStage(b, b.CreateVector(perStage[s]), steps));
    }
    std::vector<flatbuffers::Offset<fbs::Axis>> axisTables;
    for (size_t i = 0; i < axes_.size(); ++i)
      axisTables.push_back(
          fbs::CreateAxis(b, b.CreateString(axes_[i]), sizes_[i]));
    flatbuffers::Offset<fbs::Pipeline> pipeline = 0;
    if (pipeline_)
      pipeline = fbs::CreatePipeline(b, std::get<0>(*pipeline_),
                                     std::get<1>(*pipeline_),
                                     b.CreateString(std::get<2>(*pipeline_)));
    b.Finish(fbs::CreateProgram(b, b.CreateString("mesh"),
                                b.CreateVector(axisTables),
                                b.CreateString(stageAxis_),
                                b.CreateVector(stageTables),
                                b.CreateString(producer), pipeline));
    return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
  }

  /// The whole file: the envelope around payload(), as ProgramFile.cpp
  /// writes it.
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> program = payload();
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, program.data(), static_cast<uInt>(program.size()));
    flatbuffers::FlatBufferBuilder envelope(program.size() + 256);
    envelope.ForceVectorAlignment(program.size(), sizeof(uint8_t), 16);
    auto nested = envelope.CreateVector(program.data(), program.size());
    fbs::FinishProgramFileBuffer(
        envelope,
        fbs::CreateProgramFile(envelope, formatVersion,
                               checksum ? *checksum : static_cast<uint32_t>(crc),
                               nested));
    return {envelope.GetBufferPointer(),
            envelope.GetBufferPointer() + envelope.GetSize()};
  }

  Program parse(const std::string &source = "test.ernie") const {
    return parseBytes(bytes(), source);
  }

  /// Program::parse on an 8-byte aligned copy of `file`.
  static Program parseBytes(const std::vector<uint8_t> &file,
                            const std::string &source = "test.ernie") {
    std::vector<uint64_t> aligned((file.size() + 7) / 8 + 1);
    if (!file.empty())
      std::memcpy(aligned.data(), file.data(), file.size());
    return Program::parse(aligned.data(), file.size(), source);
  }

  void write(const std::string &path) const {
    std::vector<uint8_t> file = bytes();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char *>(file.data()), file.size());
  }

private:
  int64_t axisSize(const std::string &axis) const {
    for (size_t i = 0; i < axes_.size(); ++i)
      if (axes_[i] == axis)
        return sizes_[i];
    return 1; // an unknown axis: the reader must reject it anyway
  }

  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>>
  strings(flatbuffers::FlatBufferBuilder &b, const Axes &axes) const {
    std::vector<flatbuffers::Offset<flatbuffers::String>> out;
    for (const std::string &s : axes)
      out.push_back(b.CreateString(s));
    return b.CreateVector(out);
  }

  flatbuffers::Offset<fbs::TensorSpec>
  writeTensor(flatbuffers::FlatBufferBuilder &b, const FunctionBuilder &fn,
              uint32_t buffer, const Tensor &t) const {
    const BufferDesc *buf = buffer < fn.buffers.size() ? &fn.buffers[buffer] : nullptr;
    DType type = t.type ? *t.type : buf ? buf->type : DType::F32;
    std::vector<int64_t> local =
        t.localShape ? *t.localShape : buf ? buf->shape : std::vector<int64_t>{};
    std::vector<int64_t> global = local;
    if (t.dims)
      for (size_t d = 0; d < t.dims->size() && d < global.size(); ++d)
        for (const std::string &axis : (*t.dims)[d])
          global[d] *= axisSize(axis);
    if (t.globalShape)
      global = *t.globalShape;
    flatbuffers::Offset<fbs::Sharding> sharding = 0;
    if (t.dims || !t.partials.empty()) {
      std::vector<flatbuffers::Offset<fbs::DimSharding>> dims;
      if (t.dims)
        for (const Axes &axes : *t.dims)
          dims.push_back(fbs::CreateDimSharding(b, strings(b, axes)));
      std::vector<flatbuffers::Offset<fbs::Partial>> partials;
      for (const auto &[axis, kind] : t.partials)
        partials.push_back(
            fbs::CreatePartial(b, b.CreateString(axis), encodeKind(kind)));
      sharding = fbs::CreateSharding(b, b.CreateVector(dims),
                                     b.CreateVector(partials));
    }
    return fbs::CreateTensorSpec(b, b.CreateString(t.name), encodeRole(t.role),
                                 encodeType(type), b.CreateVector(global),
                                 b.CreateVector(local), sharding, buffer,
                                 b.CreateString(t.updates));
  }

  flatbuffers::Offset<fbs::Attr> writeAttr(flatbuffers::FlatBufferBuilder &b,
                                           const std::string &name,
                                           const Attrs::Value &value) const {
    flatbuffers::Offset<void> v;
    fbs::AttrValue kind;
    if (auto *i = std::get_if<int64_t>(&value)) {
      kind = fbs::AttrValue::IntValue;
      v = fbs::CreateIntValue(b, *i).Union();
    } else if (auto *f = std::get_if<double>(&value)) {
      kind = fbs::AttrValue::FloatValue;
      v = fbs::CreateFloatValue(b, *f).Union();
    } else if (auto *flag = std::get_if<bool>(&value)) {
      kind = fbs::AttrValue::BoolValue;
      v = fbs::CreateBoolValue(b, *flag).Union();
    } else if (auto *s = std::get_if<std::string>(&value)) {
      kind = fbs::AttrValue::StringValue;
      v = fbs::CreateStringValue(b, b.CreateString(*s)).Union();
    } else {
      kind = fbs::AttrValue::IntsValue;
      v = fbs::CreateIntsValue(
              b, b.CreateVector(std::get<std::vector<int64_t>>(value)))
              .Union();
    }
    return fbs::CreateAttr(b, b.CreateString(name), kind, v);
  }

  flatbuffers::Offset<fbs::Function> writeFunction(flatbuffers::FlatBufferBuilder &b,
                                                   const FunctionBuilder &fn) const {
    std::vector<flatbuffers::Offset<fbs::Buffer>> buffers;
    uint64_t next = 0, end = 0;
    for (const BufferDesc &buf : fn.buffers) {
      uint64_t elements = 1;
      for (int64_t d : buf.shape)
        elements *= static_cast<uint64_t>(d);
      uint64_t bytes = buf.bytes ? *buf.bytes : elements * byteSize(buf.type);
      uint64_t offset = buf.offset ? *buf.offset : next;
      next = std::max(next, (offset + bytes + program::kBufferAlignment - 1) /
                                program::kBufferAlignment *
                                program::kBufferAlignment);
      end = std::max(end, offset + bytes);
      buffers.push_back(fbs::CreateBuffer(b, encodeType(buf.type),
                                          b.CreateVector(buf.shape), offset,
                                          bytes));
    }
    std::vector<flatbuffers::Offset<fbs::TensorSpec>> args, results;
    for (const auto &[buffer, spec] : fn.arguments)
      args.push_back(writeTensor(b, fn, buffer, spec));
    for (const auto &[buffer, spec] : fn.results)
      results.push_back(writeTensor(b, fn, buffer, spec));
    std::vector<flatbuffers::Offset<fbs::Instruction>> insts;
    for (const InstDesc &inst : fn.instructions) {
      // Sorted by name, as the schema's key requires.
      std::map<std::string, Attrs::Value> sorted(inst.attrs.begin(),
                                                 inst.attrs.end());
      std::vector<flatbuffers::Offset<fbs::Attr>> attrs;
      for (const auto &[name, value] : sorted)
        attrs.push_back(writeAttr(b, name, value));
      insts.push_back(fbs::CreateInstruction(
          b, b.CreateString(inst.op), b.CreateVector(inst.operands),
          b.CreateVector(inst.results), b.CreateVector(attrs),
          inst.axes.empty() ? 0 : strings(b, inst.axes),
          inst.data ? b.CreateVector(*inst.data) : 0,
          b.CreateString(inst.location)));
    }
    return fbs::CreateFunction(b, b.CreateString(fn.name), b.CreateVector(args),
                               b.CreateVector(results), b.CreateVector(buffers),
                               b.CreateVector(insts),
                               fn.arenaBytes ? *fn.arenaBytes : end,
                               fn.argumentBytes);
  }

  std::vector<std::string> axes_;
  std::vector<int64_t> sizes_;
  std::string stageAxis_;
  std::optional<size_t> numStages_;
  std::optional<std::tuple<int64_t, int64_t, std::string>> pipeline_;
  std::map<size_t, std::vector<PipelineStep>> schedules_;
  std::deque<std::pair<size_t, FunctionBuilder>> functions_;
};

} // namespace ernie::runtime::testing

#endif // ERNIE_RUNTIME_TESTS_PROGRAMBUILDER_H
