//===- ProgramFile.cpp - writing the runtime's program file -----------------===//

#include "ernie/Export/ProgramFile.h"

#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/PipelineInfo.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Export/MemoryPlan.h"
#include "ernie/InitAll.h"
#include "ernie/program/program_generated.h"
#include "ernie/runtime/PipelineSchedule.h"
#include "ernie/runtime/ProgramFormat.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/CRC.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::ernie;
namespace fb = ::ernie::program;

namespace {

FailureOr<fb::DType> encodeType(Type t, Location loc) {
  if (t.isF64()) return fb::DType::F64;
  if (t.isF32()) return fb::DType::F32;
  if (t.isF16()) return fb::DType::F16;
  if (t.isBF16()) return fb::DType::BF16;
  if (isa<Float8E4M3FNType>(t)) return fb::DType::F8E4M3FN;
  if (isa<Float8E5M2Type>(t)) return fb::DType::F8E5M2;
  if (t.isInteger(64)) return fb::DType::I64;
  if (t.isInteger(32)) return fb::DType::I32;
  if (t.isInteger(1)) return fb::DType::I1;
  return emitError(loc) << "the runtime has no element type " << t;
}

fb::ReduceKind encodeKind(ReduceKind kind) {
  switch (kind) {
  case ReduceKind::sum: return fb::ReduceKind::Sum;
  case ReduceKind::avg: return fb::ReduceKind::Avg;
  case ReduceKind::max: return fb::ReduceKind::Max;
  case ReduceKind::min: return fb::ReduceKind::Min;
  }
  llvm_unreachable("unknown reduce kind");
}

std::string locationString(Location loc) {
  if (auto file = dyn_cast<FileLineColLoc>(loc))
    return (file.getFilename().str() + ":" + std::to_string(file.getLine()) +
            ":" + std::to_string(file.getColumn()));
  if (auto named = dyn_cast<NameLoc>(loc))
    return named.getName().str();
  if (auto fused = dyn_cast<FusedLoc>(loc))
    for (Location inner : fused.getLocations()) {
      std::string s = locationString(inner);
      if (!s.empty())
        return s;
    }
  return "";
}

/// Little-endian bytes of every element, as the runtime stores them.
/// The most constant bytes one program file holds: a FlatBuffer is at most
/// 2 GiB, and the constants are nearly all of it.
constexpr int64_t kMaxConstantBytes = int64_t(1) << 30;

/// The constant's bytes, counted against `budget` (what the file has left).
FailureOr<std::vector<uint8_t>> constantBytes(Attribute value, Location loc,
                                              int64_t &budget) {
  // A scalar constant is a rank-0 tensor to the runtime.
  if (isa<IntegerAttr, FloatAttr>(value)) {
    auto typed = cast<TypedAttr>(value);
    value = DenseElementsAttr::get(RankedTensorType::get({}, typed.getType()),
                                   typed);
  }
  auto dense = dyn_cast<DenseElementsAttr>(value);
  if (!dense)
    return emitError(loc) << "cannot export a constant that is not dense";
  Type element = dense.getElementType();
  int64_t width = storageBytes(element);
  if (width == 0)
    return emitError(loc) << "the runtime has no element type " << element;
  int64_t bytes = 0;
  if (llvm::MulOverflow(dense.getNumElements(), width, bytes) || bytes > budget)
    return emitError(loc) << "constants of more than " << kMaxConstantBytes
                          << " bytes in all do not fit in a program file "
                             "(this one is "
                          << dense.getNumElements() << " x " << width
                          << " bytes)";
  budget -= bytes;
  std::vector<uint8_t> out;
  out.reserve(bytes);
  auto append = [&](const APInt &bits) {
    for (int64_t i = 0; i < width; ++i)
      out.push_back(bits.getBitWidth() == 1
                        ? (i == 0 ? uint8_t(bits.getZExtValue()) : 0)
                        : uint8_t(bits.extractBitsAsZExtValue(8, 8 * i)));
  };
  if (isa<FloatType>(element))
    for (const APFloat &v : dense.getValues<APFloat>())
      append(v.bitcastToAPInt());
  else
    for (const APInt &v : dense.getValues<APInt>())
      append(v);
  return out;
}

class Writer {
public:
  Writer(ModuleOp module, llvm::StringMap<PlanFigures> *planned)
      : module_(module), planned_(planned) {}

  LogicalResult write(raw_ostream &os);

private:
  LogicalResult writeMesh();
  FailureOr<flatbuffers::Offset<fb::Function>> writeFunction(func::FuncOp fn);
  flatbuffers::Offset<fb::Sharding> writeSharding(ShardingAttr sharding);
  FailureOr<flatbuffers::Offset<fb::TensorSpec>>
  writeTensor(Value value, DictionaryAttr attrs, bool isResult,
              const MemoryPlan &plan);
  FailureOr<flatbuffers::Offset<fb::Instruction>>
  writeInstruction(Operation &op, llvm::function_ref<uint32_t(Value)> indexOf);
  FailureOr<flatbuffers::Offset<fb::FusedBody>> writeFusedBody(FusedOp fused);
  FailureOr<flatbuffers::Offset<fb::Attr>> writeAttr(NamedAttribute attr,
                                                     Operation &op);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>>
  writeStrings(ArrayAttr strings);

  /// The size of mesh axis `axis`.
  int64_t axisSize(StringRef axis) const {
    return axisSizes_[llvm::find(axisNames_, axis) - axisNames_.begin()];
  }

  ModuleOp module_;
  llvm::StringMap<PlanFigures> *planned_;
  flatbuffers::FlatBufferBuilder b_{1 << 16};
  int64_t constantBudget_ = kMaxConstantBytes;
  // The program's mesh; a module without one runs on a single rank.
  std::string meshName_ = "mesh";
  SmallVector<std::string> axisNames_ = {"world"};
  SmallVector<int64_t> axisSizes_ = {1};
  MeshOp mesh_;
};

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>>
Writer::writeStrings(ArrayAttr strings) {
  std::vector<flatbuffers::Offset<flatbuffers::String>> out;
  for (Attribute s : strings)
    out.push_back(b_.CreateString(cast<StringAttr>(s).getValue().str()));
  return b_.CreateVector(out);
}

flatbuffers::Offset<fb::Sharding> Writer::writeSharding(ShardingAttr sharding) {
  std::vector<flatbuffers::Offset<fb::DimSharding>> dims;
  for (Attribute d : sharding.getDims())
    dims.push_back(fb::CreateDimSharding(b_, writeStrings(cast<ArrayAttr>(d))));
  std::vector<flatbuffers::Offset<fb::Partial>> partials;
  for (auto [axis, kind] : sharding.getPartials())
    partials.push_back(fb::CreatePartial(b_, b_.CreateString(axis.str()),
                                         encodeKind(kind)));
  return fb::CreateSharding(b_, b_.CreateVector(dims), b_.CreateVector(partials));
}

FailureOr<flatbuffers::Offset<fb::TensorSpec>>
Writer::writeTensor(Value value, DictionaryAttr attrs, bool isResult,
                    const MemoryPlan &plan) {
  RankedTensorType type = storageType(value.getType());
  FailureOr<fb::DType> dtype = encodeType(type.getElementType(), value.getLoc());
  if (failed(dtype))
    return failure();
  std::string name;
  fb::Role role = fb::Role::Input;
  std::string updates;
  if (attrs) {
    if (auto p = attrs.getAs<StringAttr>(ErnieDialect::kParamAttrName)) {
      name = p.getValue().str();
      role = fb::Role::Parameter;
    } else if (auto s = attrs.getAs<StringAttr>(ErnieDialect::kOptStateAttrName)) {
      name = s.getValue().str();
      role = fb::Role::OptimizerState;
    } else if (attrs.get(ErnieDialect::kLearningRateAttrName)) {
      role = fb::Role::LearningRate;
    } else if (attrs.get(ErnieDialect::kStepAttrName)) {
      role = fb::Role::Step;
    } else if (auto r = attrs.getAs<StringAttr>(ErnieDialect::kResidualAttrName)) {
      name = r.getValue().str();
      role = fb::Role::Residual;
    } else if (auto g = attrs.getAs<StringAttr>(ErnieDialect::kGradientAttrName)) {
      name = g.getValue().str();
      role = fb::Role::Gradient;
    } else if (auto m = attrs.getAs<StringAttr>(
                   ErnieDialect::kMicroBatchMaxAttrName)) {
      name = m.getValue().str();
      role = fb::Role::MicroBatchMax;
    } else if (auto m = attrs.getAs<StringAttr>(
                   ErnieDialect::kMicroBatchSumAttrName)) {
      name = m.getValue().str();
      role = fb::Role::MicroBatchSum;
    } else if (auto k =
                   attrs.getAs<IntegerAttr>(ErnieDialect::kInputAttrName)) {
      name = "input." + std::to_string(k.getInt());
    }
    if (auto u = attrs.getAs<StringAttr>(ErnieDialect::kUpdatesAttrName))
      updates = u.getValue().str();
    if (isResult && attrs.get(ErnieDialect::kLossAttrName))
      role = fb::Role::Loss;
    if (auto m = attrs.getAs<StringAttr>(ErnieDialect::kMetricAttrName);
        m && isResult) {
      name = m.getValue().str();
      role = fb::Role::Metric;
    }
    if (isResult && role != fb::Role::Loss && role != fb::Role::Metric &&
        role != fb::Role::Residual &&
        role != fb::Role::Gradient && role != fb::Role::MicroBatchMax &&
        role != fb::Role::MicroBatchSum)
      role = fb::Role::Input;
  }
  std::vector<int64_t> local(type.getShape()), global = local;
  flatbuffers::Offset<fb::Sharding> sharding = 0;
  if (auto shardOf = attrs ? attrs.getAs<ShardingAttr>(kShardOfAttrName)
                           : ShardingAttr()) {
    if (!mesh_ || shardOf.getMesh().getValue() != mesh_.getSymName())
      return emitError(value.getLoc())
             << "names mesh " << shardOf.getMesh() << ", not the program's";
    if (auto shape = attrs.getAs<DenseI64ArrayAttr>(kGlobalShapeAttrName))
      global.assign(shape.asArrayRef().begin(), shape.asArrayRef().end());
    else
      for (int64_t d = 0; d < shardOf.getRank(); ++d)
        for (StringRef axis : shardOf.getDimAxes(d))
          global[d] *= axisSize(axis);
    sharding = writeSharding(shardOf);
  }
  return fb::CreateTensorSpec(
      b_, b_.CreateString(name), role, *dtype, b_.CreateVector(global),
      b_.CreateVector(local), sharding, plan.bufferOf.lookup(value),
      b_.CreateString(updates));
}

FailureOr<flatbuffers::Offset<fb::Attr>> Writer::writeAttr(NamedAttribute attr,
                                                           Operation &op) {
  Attribute a = attr.getValue();
  flatbuffers::Offset<void> value;
  fb::AttrValue kind;
  if (auto flag = dyn_cast<BoolAttr>(a)) {
    kind = fb::AttrValue::BoolValue;
    value = fb::CreateBoolValue(b_, flag.getValue()).Union();
  } else if (isa<UnitAttr>(a)) {
    kind = fb::AttrValue::BoolValue;
    value = fb::CreateBoolValue(b_, true).Union();
  } else if (auto i = dyn_cast<IntegerAttr>(a)) {
    kind = fb::AttrValue::IntValue;
    value = fb::CreateIntValue(b_, i.getValue().getSExtValue()).Union();
  } else if (auto f = dyn_cast<FloatAttr>(a)) {
    kind = fb::AttrValue::FloatValue;
    value = fb::CreateFloatValue(b_, f.getValueAsDouble()).Union();
  } else if (auto s = dyn_cast<StringAttr>(a)) {
    kind = fb::AttrValue::StringValue;
    value = fb::CreateStringValue(b_, b_.CreateString(s.getValue().str())).Union();
  } else if (auto k = dyn_cast<ReduceKindAttr>(a)) {
    kind = fb::AttrValue::StringValue;
    value = fb::CreateStringValue(
                b_, b_.CreateString(stringifyReduceKind(k.getValue()).str()))
                .Union();
  } else if (auto r = dyn_cast<LossReductionAttr>(a)) {
    kind = fb::AttrValue::StringValue;
    value = fb::CreateStringValue(
                b_, b_.CreateString(stringifyLossReduction(r.getValue()).str()))
                .Union();
  } else if (auto t = dyn_cast<TypeAttr>(a)) {
    // An element type (a bucket's `accumulate`), as the runtime spells it.
    std::string spelled;
    llvm::raw_string_ostream os(spelled);
    t.getValue().print(os);
    kind = fb::AttrValue::StringValue;
    value = fb::CreateStringValue(b_, b_.CreateString(spelled)).Union();
  } else if (auto ints = dyn_cast<DenseI64ArrayAttr>(a)) {
    kind = fb::AttrValue::IntsValue;
    value = fb::CreateIntsValue(b_, b_.CreateVector(ints.asArrayRef().vec())).Union();
  } else if (auto list = dyn_cast<ArrayAttr>(a);
             list && llvm::all_of(list, [](Attribute e) { return isa<IntegerAttr>(e); })) {
    std::vector<int64_t> values;
    for (Attribute e : list)
      values.push_back(cast<IntegerAttr>(e).getInt());
    kind = fb::AttrValue::IntsValue;
    value = fb::CreateIntsValue(b_, b_.CreateVector(values)).Union();
  } else {
    return op.emitError() << "cannot export attribute '" << attr.getName()
                          << "' = " << a << " to the program file";
  }
  return fb::CreateAttr(b_, b_.CreateString(attr.getName().str()), kind, value);
}

FailureOr<flatbuffers::Offset<fb::FusedBody>>
Writer::writeFusedBody(FusedOp fused) {
  // Values numbered as the schema says: block arguments, then results.
  llvm::DenseMap<Value, uint32_t> index;
  std::vector<flatbuffers::Offset<fb::Buffer>> values;
  auto number = [&](Value v) -> LogicalResult {
    auto type = cast<RankedTensorType>(v.getType());
    FailureOr<fb::DType> dtype = encodeType(type.getElementType(), v.getLoc());
    if (failed(dtype))
      return failure();
    index[v] = values.size();
    values.push_back(
        fb::CreateBuffer(b_, *dtype, b_.CreateVector(type.getShape().vec())));
    return success();
  };
  Block &body = fused.getBody().front();
  for (BlockArgument arg : body.getArguments())
    if (failed(number(arg)))
      return failure();
  std::vector<flatbuffers::Offset<fb::Instruction>> steps;
  for (Operation &op : body.without_terminator()) {
    for (Value v : op.getResults())
      if (failed(number(v)))
        return failure();
    auto step = writeInstruction(op, [&](Value v) { return index.lookup(v); });
    if (failed(step))
      return failure();
    steps.push_back(*step);
  }
  std::vector<uint32_t> yields;
  for (Value v : body.getTerminator()->getOperands())
    yields.push_back(index.lookup(v));
  return fb::CreateFusedBody(b_, b_.CreateVector(values),
                             b_.CreateVector(steps), b_.CreateVector(yields));
}

FailureOr<flatbuffers::Offset<fb::Instruction>>
Writer::writeInstruction(Operation &op,
                         llvm::function_ref<uint32_t(Value)> indexOf) {
  std::string name = op.getName().getStringRef().str();
  std::vector<uint32_t> operands, results;
  for (Value v : op.getOperands())
    operands.push_back(indexOf(v));
  for (Value v : op.getResults())
    results.push_back(indexOf(v));
  flatbuffers::Offset<fb::FusedBody> body = 0;
  if (auto fused = dyn_cast<FusedOp>(op)) {
    auto written = writeFusedBody(fused);
    if (failed(written))
      return failure();
    body = *written;
  }

  std::vector<flatbuffers::Offset<fb::Attr>> attrs;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> axes = 0;
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> data = 0;
  bool constant = isa<ConstantOp, arith::ConstantOp>(op);
  if (constant)
    name = "ernie.constant";
  // Sorted by name (a dictionary's order), as the schema's key requires.
  for (NamedAttribute attr : op.getAttrs()) {
    StringRef key = attr.getName().getValue();
    if (key.starts_with("ernie.") || key == "mesh")
      continue; // annotations, and the one mesh every collective names
    if (key == "axes" && isa<ArrayAttr>(attr.getValue())) {
      axes = writeStrings(cast<ArrayAttr>(attr.getValue()));
      continue;
    }
    if (constant && key == "value") {
      FailureOr<std::vector<uint8_t>> bytes =
          constantBytes(attr.getValue(), op.getLoc(), constantBudget_);
      if (failed(bytes))
        return failure();
      // Constants reach the arena by memcpy: no alignment beyond a byte.
      data = b_.CreateVector(*bytes);
      continue;
    }
    FailureOr<flatbuffers::Offset<fb::Attr>> a = writeAttr(attr, op);
    if (failed(a))
      return failure();
    attrs.push_back(*a);
  }
  return fb::CreateInstruction(
      b_, b_.CreateString(name), b_.CreateVector(operands),
      b_.CreateVector(results), b_.CreateVector(attrs), axes, data,
      b_.CreateString(locationString(op.getLoc())), body);
}

FailureOr<flatbuffers::Offset<fb::Function>>
Writer::writeFunction(func::FuncOp fn) {
  // Ops have been verified; a signature with no ernie op around a value
  // has not (every buffer must have at least one element).
  auto checkSignature = [&](TypeRange types, StringRef what) -> LogicalResult {
    for (auto [i, type] : llvm::enumerate(types))
      if (hasZeroSizeDimension(type))
        return fn.emitError() << what << " #" << i << " (" << type
                              << ") has a zero-size dimension: ernie tensors "
                                 "have no zero-size dimensions";
    return success();
  };
  if (failed(checkSignature(fn.getArgumentTypes(), "argument")) ||
      failed(checkSignature(fn.getResultTypes(), "result")))
    return failure();
  FailureOr<MemoryPlan> plan = planMemory(fn);
  if (failed(plan))
    return failure();
  if (planned_)
    (*planned_)[fn.getSymName()] =
        PlanFigures{plan->arenaBytes, plan->argumentBytes,
                    plan->livePeakBytes, plan->activationBytes};
  std::vector<flatbuffers::Offset<fb::Buffer>> buffers;
  for (const PlannedBuffer &buffer : plan->buffers) {
    FailureOr<fb::DType> dtype =
        encodeType(buffer.type.getElementType(), fn.getLoc());
    if (failed(dtype))
      return failure();
    buffers.push_back(fb::CreateBuffer(b_, *dtype,
                                       b_.CreateVector(buffer.type.getShape().vec()),
                                       buffer.offset, buffer.bytes));
  }
  Block &body = fn.getBody().front();
  std::vector<flatbuffers::Offset<fb::TensorSpec>> arguments, results;
  for (BlockArgument arg : body.getArguments()) {
    auto spec = writeTensor(arg, fn.getArgAttrDict(arg.getArgNumber()),
                            /*isResult=*/false, *plan);
    if (failed(spec))
      return failure();
    arguments.push_back(*spec);
  }
  for (auto [i, v] : llvm::enumerate(body.getTerminator()->getOperands())) {
    auto spec = writeTensor(v, fn.getResultAttrDict(i), /*isResult=*/true, *plan);
    if (failed(spec))
      return failure();
    results.push_back(*spec);
  }
  std::vector<flatbuffers::Offset<fb::Instruction>> instructions;
  for (Operation &op : body.without_terminator()) {
    if (isa<func::CallOp>(op))
      return op.emitError("calls must be inlined before export");
    if (isa<SplitPointOp>(op))
      return op.emitError("a pipeline split point is left in the program: "
                          "run --ernie-pipeline-split, autodiff and "
                          "--ernie-pipeline-schedule before export");
    auto inst = writeInstruction(
        op, [&](Value v) { return plan->bufferOf.lookup(v); });
    if (failed(inst))
      return failure();
    instructions.push_back(*inst);
  }
  return fb::CreateFunction(b_, b_.CreateString(fn.getSymName().str()),
                            b_.CreateVector(arguments), b_.CreateVector(results),
                            b_.CreateVector(buffers), b_.CreateVector(instructions),
                            plan->arenaBytes, plan->argumentBytes);
}

LogicalResult Writer::write(raw_ostream &os) {
  SmallVector<MeshOp> meshes(module_.getOps<MeshOp>());
  if (meshes.size() > 1)
    return meshes[1].emitError(
        "a program file holds one mesh; this module declares several");
  if (!meshes.empty()) {
    mesh_ = meshes.front();
    meshName_ = mesh_.getSymName().str();
    axisNames_.clear();
    for (StringRef axis : mesh_.getAxisNames().getAsValueRange<StringAttr>())
      axisNames_.push_back(axis.str());
    axisSizes_.assign(mesh_.getAxisSizes().begin(), mesh_.getAxisSizes().end());
  }
  // A pipelined module (--ernie-pipeline-schedule) has a stage per
  // coordinate of its pipeline axis, each with its functions and steps.
  FailureOr<std::optional<PipelineInfo>> read = readPipelineInfo(module_);
  if (failed(read))
    return failure();
  std::optional<PipelineInfo> &pipeline = *read;
  if (pipeline && !pipeline->isScheduled())
    return module_.emitError("the pipeline is split but not scheduled: run "
                             "--ernie-pipeline-schedule");
  int64_t numStages = pipeline ? pipeline->stages : 1;
  std::vector<std::vector<flatbuffers::Offset<fb::Function>>> functions(
      numStages);
  for (auto fn : module_.getOps<func::FuncOp>()) {
    if (fn.isExternal() || fn.isPrivate())
      continue;
    int64_t stage = 0;
    if (auto s = fn->getAttrOfType<IntegerAttr>(
            ErnieDialect::kPipelineStageAttrName))
      stage = s.getInt();
    if (stage >= numStages)
      return fn.emitError() << "runs on pipeline stage " << stage
                            << " of " << numStages;
    auto f = writeFunction(fn);
    if (failed(f))
      return failure();
    functions[stage].push_back(*f);
  }
  if (llvm::all_of(functions, [](const auto &f) { return f.empty(); }))
    return module_.emitError("the module has no public function to export");
  std::vector<flatbuffers::Offset<fb::Axis>> axes;
  for (auto [name, size] : llvm::zip(axisNames_, axisSizes_))
    axes.push_back(fb::CreateAxis(b_, b_.CreateString(name), size));
  if (pipeline && (!pipeline->rankSteps ||
                   pipeline->rankSteps->size() != size_t(numStages)))
    return module_.emitError("the pipeline needs one schedule per stage");
  std::vector<flatbuffers::Offset<fb::Stage>> stages;
  for (int64_t s = 0; s < numStages; ++s) {
    std::vector<flatbuffers::Offset<fb::PipelineStep>> steps;
    if (pipeline) {
      std::vector<::ernie::runtime::PipelineStep> parsed;
      std::string error =
          ::ernie::runtime::parseSteps((*pipeline->rankSteps)[s], parsed);
      if (!error.empty())
        return module_.emitError() << error;
      for (const auto &step : parsed)
        steps.push_back(fb::CreatePipelineStep(
            b_,
            step.action == ::ernie::runtime::PipelineAction::Forward
                ? fb::PipelineAction::Forward
                : fb::PipelineAction::Backward,
            step.chunk, step.microBatch));
    }
    stages.push_back(fb::CreateStage(b_, b_.CreateVector(functions[s]),
                                     pipeline ? b_.CreateVector(steps) : 0));
  }
  flatbuffers::Offset<fb::Pipeline> pipelineInfo = 0;
  std::string stageAxis;
  if (pipeline) {
    stageAxis = pipeline->axis;
    pipelineInfo =
        fb::CreatePipeline(b_, *pipeline->microBatches, pipeline->virtualStages,
                           b_.CreateString(*pipeline->schedule));
  }
  b_.Finish(fb::CreateProgram(
      b_, b_.CreateString(meshName_), b_.CreateVector(axes),
      b_.CreateString(stageAxis), b_.CreateVector(stages),
      b_.CreateString("ernie-translate (format " +
                      std::to_string(fb::kFormatVersion) + ")"),
      pipelineInfo));
  ArrayRef<uint8_t> payload(b_.GetBufferPointer(), b_.GetSize());

  flatbuffers::FlatBufferBuilder envelope(payload.size() + 256);
  // The nested program is read in place: align it like a root buffer.
  envelope.ForceVectorAlignment(payload.size(), sizeof(uint8_t), 16);
  auto program = envelope.CreateVector(payload.data(), payload.size());
  fb::FinishProgramFileBuffer(
      envelope, fb::CreateProgramFile(envelope, fb::kFormatVersion,
                                      llvm::crc32(payload), program));
  os.write(reinterpret_cast<const char *>(envelope.GetBufferPointer()),
           envelope.GetSize());
  return success();
}

} // namespace

LogicalResult mlir::ernie::writeProgramFile(ModuleOp module, raw_ostream &os,
                                           llvm::StringMap<PlanFigures> *planned) {
  // Export a copy with calls inlined: the file holds straight-line lists.
  OwningOpRef<ModuleOp> copy = module.clone();
  PassManager pm(module.getContext());
  pm.addPass(createInlinerPass());
  pm.addPass(createSymbolDCEPass());
  if (failed(pm.run(*copy)))
    return failure();
  return Writer(*copy, planned).write(os);
}

void mlir::ernie::registerProgramFileTranslation() {
  TranslateFromMLIRRegistration registration(
      "ernie-to-program",
      "Write a partitioned ernie module as a runtime program file",
      [](Operation *op, raw_ostream &os) -> LogicalResult {
        auto module = dyn_cast<ModuleOp>(op);
        if (!module)
          return op->emitError("expected a module");
        return writeProgramFile(module, os);
      },
      [](DialectRegistry &registry) { registerAllDialects(registry); });
}
