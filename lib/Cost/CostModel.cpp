//===- CostModel.cpp - roofline, alpha-beta and the schedule simulator ----===//

#include "ernie/Cost/CostModel.h"
#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Dialect/Ernie/IR/ErnieInterfaces.h"
#include "ernie/Dialect/Ernie/IR/PipelineInfo.h"
#include "ernie/runtime/PipelineSchedule.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"

#include <optional>
#include "llvm/Support/Path.h"

#include <cmath>
#include <set>

using namespace mlir;
using namespace mlir::ernie;
using namespace mlir::ernie::cost;
namespace rt = ::ernie::runtime;

//===----------------------------------------------------------------------===//
// Reading devices and clusters.
//===----------------------------------------------------------------------===//

namespace {

/// Reads one object's fields, each error naming the field's path.
class FieldReader {
public:
  FieldReader(const llvm::json::Value &value, std::string where,
              std::string path = "")
      : object_(value.getAsObject()), where_(std::move(where)),
        path_(std::move(path)) {}

  llvm::Error notAnObject() const {
    return error(path_.empty() ? "expected a JSON object"
                               : path_ + ": expected a JSON object");
  }
  const llvm::json::Object *object() const { return object_; }

  /// A positive number (zero too with allowZero); a missing optional field
  /// keeps `out`.
  llvm::Error number(llvm::StringRef key, double &out, bool required,
                     bool allowZero = false) const {
    const llvm::json::Value *v = object_->get(key);
    if (!v)
      return required ? error(field(key) + ": missing (a number)")
                      : llvm::Error::success();
    std::optional<double> d = v->getAsNumber();
    if (!d || !std::isfinite(*d) || *d < 0 || (*d == 0 && !allowZero))
      return error(field(key) + (allowZero
                                     ? ": expected a non-negative number"
                                     : ": expected a positive number"));
    out = *d;
    return llvm::Error::success();
  }
  llvm::Error fraction(llvm::StringRef key, double &out) const {
    if (llvm::Error e = number(key, out, /*required=*/false))
      return e;
    if (out > 1)
      return error(field(key) + ": expected a fraction in (0, 1]");
    return llvm::Error::success();
  }
  llvm::Error integer(llvm::StringRef key, int64_t &out, bool required,
                      int64_t min) const {
    const llvm::json::Value *v = object_->get(key);
    if (!v)
      return required ? error(field(key) + ": missing (an integer)")
                      : llvm::Error::success();
    std::optional<int64_t> i = v->getAsInteger();
    if (!i || *i < min || *i > (int64_t(1) << 40))
      return error(field(key) + ": expected an integer >= " +
                   std::to_string(min));
    out = *i;
    return llvm::Error::success();
  }
  llvm::Error string(llvm::StringRef key, std::string &out) const {
    const llvm::json::Value *v = object_->get(key);
    if (!v)
      return llvm::Error::success();
    std::optional<llvm::StringRef> s = v->getAsString();
    if (!s)
      return error(field(key) + ": expected a string");
    out = s->str();
    return llvm::Error::success();
  }
  /// Every key is one of `known`.
  llvm::Error onlyKeys(llvm::ArrayRef<llvm::StringRef> known) const {
    for (const auto &kv : *object_)
      if (!llvm::is_contained(known, kv.first.str()))
        return error(field(kv.first.str()) + ": unknown field (expected " +
                     llvm::join(known, ", ") + ")");
    return llvm::Error::success();
  }
  FieldReader child(llvm::StringRef key) const {
    static const llvm::json::Value null(nullptr);
    const llvm::json::Value *v = object_->get(key);
    return FieldReader(v ? *v : null, where_, field(key));
  }
  std::string field(llvm::StringRef key) const {
    return path_.empty() ? key.str() : path_ + "." + key.str();
  }
  llvm::Error error(const llvm::Twine &message) const {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   where_ + ": " + message.str());
  }

private:
  const llvm::json::Object *object_;
  std::string where_, path_;
};

llvm::Error readLink(const FieldReader &parent, llvm::StringRef key,
                     LinkSpec &link) {
  FieldReader r = parent.child(key);
  if (!r.object())
    return r.notAnObject();
  if (llvm::Error e = r.onlyKeys({"bandwidth", "latency"}))
    return e;
  if (llvm::Error e = r.number("bandwidth", link.bandwidth, true))
    return e;
  return r.number("latency", link.latency, true, /*allowZero=*/true);
}

} // namespace

double DeviceSpec::matmulPeak(Type elementType) const {
  std::string key = "f32";
  if (elementType.isBF16())
    key = "bf16";
  else if (elementType.isF16())
    key = "f16";
  else if (isa<Float8E4M3FNType, Float8E5M2Type>(elementType))
    key = "f8";
  auto it = matmulFlops.find(key);
  return it != matmulFlops.end() ? it->second : matmulFlops.lookup("f32");
}

llvm::Expected<DeviceSpec> cost::parseDevice(const llvm::json::Value &value,
                                             llvm::StringRef where) {
  FieldReader r(value, where.str());
  if (!r.object())
    return r.notAnObject();
  DeviceSpec d;
  if (llvm::Error e = r.onlyKeys(
          {"name", "source", "memory_bytes", "memory_bandwidth", "peak_flops",
           "vector_flops", "matmul_efficiency", "memory_efficiency",
           "launch_overhead", "step_overhead", "op_scale", "calibrated"}))
    return std::move(e);
  if (llvm::Error e = r.string("name", d.name))
    return std::move(e);
  if (llvm::Error e = r.integer("memory_bytes", d.memoryBytes, true, 1))
    return std::move(e);
  if (llvm::Error e = r.number("memory_bandwidth", d.memoryBandwidth, true))
    return std::move(e);
  FieldReader peaks = r.child("peak_flops");
  if (!peaks.object())
    return peaks.notAnObject();
  if (llvm::Error e = peaks.onlyKeys({"f32", "bf16", "f16", "f8"}))
    return std::move(e);
  for (llvm::StringRef key : {"f32", "bf16", "f16", "f8"}) {
    double peak = 0;
    if (llvm::Error e = peaks.number(key, peak, key == "f32"))
      return std::move(e);
    if (peak > 0)
      d.matmulFlops[key] = peak;
  }
  d.vectorFlops = d.matmulFlops["f32"];
  if (llvm::Error e = r.number("vector_flops", d.vectorFlops, false))
    return std::move(e);
  if (llvm::Error e = r.fraction("matmul_efficiency", d.matmulEfficiency))
    return std::move(e);
  if (llvm::Error e = r.fraction("memory_efficiency", d.memoryEfficiency))
    return std::move(e);
  if (llvm::Error e = r.number("launch_overhead", d.launchOverhead, false,
                               /*allowZero=*/true))
    return std::move(e);
  if (llvm::Error e = r.number("step_overhead", d.stepOverhead, false,
                               /*allowZero=*/true))
    return std::move(e);
  if (r.object()->get("op_scale")) {
    FieldReader scales = r.child("op_scale");
    if (!scales.object())
      return scales.notAnObject();
    for (const auto &kv : *scales.object()) {
      double scale = 0;
      if (llvm::Error e = scales.number(kv.first, scale, true))
        return std::move(e);
      d.opScale[kv.first] = scale;
    }
  }
  return d;
}

llvm::Expected<ClusterSpec> cost::parseCluster(
    const llvm::json::Value &value, llvm::StringRef where,
    llvm::function_ref<llvm::Expected<DeviceSpec>(llvm::StringRef)>
        resolveDevice) {
  FieldReader r(value, where.str());
  if (!r.object())
    return r.notAnObject();
  ClusterSpec c;
  if (llvm::Error e = r.onlyKeys({"name", "source", "device", "nodes",
                                  "devices_per_node", "intra_node",
                                  "inter_node", "shared_processors",
                                  "sharing_efficiency"}))
    return std::move(e);
  if (llvm::Error e = r.string("name", c.name))
    return std::move(e);
  const llvm::json::Value *device = r.object()->get("device");
  if (!device)
    return r.error("device: missing (a device description or its name)");
  if (std::optional<llvm::StringRef> name = device->getAsString()) {
    llvm::Expected<DeviceSpec> d = resolveDevice(*name);
    if (!d)
      return r.error("device: " + llvm::toString(d.takeError()));
    c.device = std::move(*d);
  } else {
    llvm::Expected<DeviceSpec> d =
        parseDevice(*device, (where + ": device").str());
    if (!d)
      return d.takeError();
    c.device = std::move(*d);
  }
  if (llvm::Error e = r.integer("nodes", c.nodes, true, 1))
    return std::move(e);
  if (llvm::Error e = r.integer("devices_per_node", c.devicesPerNode, true, 1))
    return std::move(e);
  if (llvm::Error e = readLink(r, "intra_node", c.intraNode))
    return std::move(e);
  // One node needs no network.
  if (c.nodes > 1 || r.object()->get("inter_node")) {
    if (llvm::Error e = readLink(r, "inter_node", c.interNode))
      return std::move(e);
  } else {
    c.interNode = c.intraNode;
  }
  if (llvm::Error e =
          r.integer("shared_processors", c.sharedProcessors, false, 0))
    return std::move(e);
  if (llvm::Error e = r.fraction("sharing_efficiency", c.sharingEfficiency))
    return std::move(e);
  return c;
}

static llvm::Expected<llvm::json::Value> readJSON(llvm::StringRef path) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer)
    return llvm::createStringError(buffer.getError(),
                                   path + ": " + buffer.getError().message());
  llvm::Expected<llvm::json::Value> json =
      llvm::json::parse((*buffer)->getBuffer());
  if (!json)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   path + ": not JSON: " +
                                       llvm::toString(json.takeError()));
  return json;
}

llvm::Expected<ClusterSpec> cost::readCluster(const llvm::json::Value &value,
                                              llvm::StringRef where,
                                              llvm::StringRef deviceDir) {
  return parseCluster(value, where, [&](llvm::StringRef name)
                                        -> llvm::Expected<DeviceSpec> {
    llvm::SmallString<256> file(deviceDir);
    llvm::sys::path::append(file, name);
    llvm::Expected<llvm::json::Value> device = readJSON(file);
    if (!device)
      return device.takeError();
    return parseDevice(*device, file);
  });
}

llvm::Expected<ClusterSpec> cost::loadCluster(llvm::StringRef path) {
  llvm::Expected<llvm::json::Value> json = readJSON(path);
  if (!json)
    return json.takeError();
  return readCluster(*json, path, llvm::sys::path::parent_path(path));
}

//===----------------------------------------------------------------------===//
// Instruction and collective times.
//===----------------------------------------------------------------------===//

CostModel::CostModel(const ClusterSpec &cluster, MeshOp mesh)
    : cluster_(cluster) {
  if (!mesh)
    return;
  for (Attribute a : mesh.getAxisNames())
    axisNames_.push_back(cast<StringAttr>(a).getValue().str());
  llvm::append_range(axisSizes_, mesh.getAxisSizes());
  // Ranks time-sliced onto fewer processors each compute at that share.
  if (cluster.sharedProcessors > 0)
    computeSlowdown_ = std::max(
        1.0, double(mesh.getNumRanks()) /
                 (double(cluster.sharedProcessors) * cluster.sharingEfficiency));
}

static bool isGemm(Operation *op) {
  return isa<MatmulOp, MatmulAccumulateOp, ScaledMatmulOp, ExpertMatmulOp,
             ExpertWeightGradOp, AttentionOp, AttentionGradOp>(op);
}

/// An instruction's FLOPs over its peak and bytes over the bandwidth.
static std::pair<double, double> rooflineTimes(CostOpInterface cost,
                                               const DeviceSpec &d) {
  double peak = d.vectorFlops;
  if (isGemm(cost)) {
    Type element = getElementTypeOrSelf(cost->getOperand(0).getType());
    peak = d.matmulPeak(element) * d.matmulEfficiency;
  }
  return {double(cost.getFlops()) / peak,
          double(cost.getBytesAccessed()) /
              (d.memoryBandwidth * d.memoryEfficiency)};
}

double CostModel::computeTime(Operation *op) const {
  auto cost = dyn_cast<CostOpInterface>(op);
  if (!cost)
    return 0;
  const DeviceSpec &d = cluster_.device;
  // A reshape is a view of its operand's bytes (the memory plan gives it
  // the same buffer): no kernel runs, nothing moves.
  if (isa<ReshapeOp>(op))
    return 0;
  auto [arithmetic, memory] = rooflineTimes(cost, d);
  double roofline = std::max(arithmetic, memory);
  auto scale = d.opScale.find(op->getName().getStringRef());
  // matmul_accumulate runs matmul's GEMM (beta = 1), the expert GEMMs
  // matmul's per expert: its measured share too, where a profile saw only
  // matmul.
  if (scale == d.opScale.end() &&
      isa<MatmulAccumulateOp, ExpertMatmulOp, ExpertWeightGradOp>(op))
    scale = d.opScale.find(MatmulOp::getOperationName());
  return computeSlowdown_ *
         (d.launchOverhead +
          (scale != d.opScale.end() ? scale->second : 1) * roofline);
}

double CostModel::arithmeticTime(Operation *op) const {
  auto cost = dyn_cast<CostOpInterface>(op);
  if (!cost || isa<ReshapeOp>(op))
    return 0;
  auto [arithmetic, memory] = rooflineTimes(cost, cluster_.device);
  return arithmetic >= memory ? computeTime(op) : 0;
}

double CostModel::memoryTime(double bytes) const {
  const DeviceSpec &d = cluster_.device;
  return computeSlowdown_ *
         (d.launchOverhead + bytes / (d.memoryBandwidth * d.memoryEfficiency));
}

GroupPlacement CostModel::placement(llvm::ArrayRef<std::string> axes) const {
  // Rank 0's group: every coordinate combination of `axes`, the others 0.
  std::vector<int64_t> members{0};
  for (const std::string &axis : axes) {
    auto it = llvm::find(axisNames_, axis);
    if (it == axisNames_.end())
      continue;
    size_t i = size_t(it - axisNames_.begin());
    int64_t stride = 1;
    for (size_t j = i + 1; j < axisSizes_.size(); ++j)
      stride *= axisSizes_[j];
    std::vector<int64_t> grown;
    grown.reserve(members.size() * size_t(axisSizes_[i]));
    for (int64_t c = 0; c < axisSizes_[i]; ++c)
      for (int64_t m : members)
        grown.push_back(m + c * stride);
    members = std::move(grown);
  }
  std::set<int64_t> nodes;
  for (int64_t m : members)
    nodes.insert(m / cluster_.devicesPerNode);
  return {int64_t(members.size()), int64_t(nodes.size())};
}

const LinkSpec &CostModel::linkOf(const GroupPlacement &group) const {
  return group.nodes > 1 ? cluster_.interNode : cluster_.intraNode;
}

static std::vector<std::string> axesOf(Operation *op) {
  std::vector<std::string> axes;
  if (auto attr = op->getAttrOfType<ArrayAttr>("axes"))
    for (Attribute a : attr)
      axes.push_back(cast<StringAttr>(a).getValue().str());
  return axes;
}

static double bytesOf(Value v) {
  auto t = dyn_cast<ShapedType>(v.getType());
  if (auto future = dyn_cast<FutureType>(v.getType()))
    t = future.getValueType();
  if (!t || !t.hasStaticShape())
    return 0;
  return double(t.getNumElements()) * double(getElementByteSize(t.getElementType()));
}

/// NCCL's two all-reduce algorithms: a ring (2(n-1) steps, each moving
/// 1/n of the tensor) and, across nodes, a tree (latency in log2 of the
/// nodes, the same bandwidth term); NCCL picks the faster. `sent`: the bytes
/// one rank sends, 2(n-1)/n of the tensor.
static double allReduceTime(double sent, const GroupPlacement &g,
                            const LinkSpec &link, const ClusterSpec &c) {
  double n = double(g.size);
  double volume = sent / link.bandwidth;
  double ring = 2 * (n - 1) * link.latency + volume;
  if (g.nodes == 1)
    return ring;
  double perNode = n / double(g.nodes);
  double tree = 2 * (std::ceil(std::log2(double(g.nodes))) *
                         c.interNode.latency +
                     (perNode - 1) * c.intraNode.latency) +
                volume;
  return std::min(ring, tree);
}

/// An all-to-all: every rank sends 1/n of its tensor to each peer at
/// once (NCCL's grouped send/recv), so the bytes bound for the same node
/// cross its fast links while those bound for other nodes cross the
/// network, both concurrently; one round of latency. `sent`: the bytes one
/// rank sends, (n-1)/n of the tensor.
static double allToAllTime(double sent, const GroupPlacement &g,
                           const ClusterSpec &c) {
  double n = double(g.size);
  double perNode = n / double(g.nodes);
  double intra = sent * (perNode - 1) / (n - 1), inter = sent - intra;
  if (g.nodes == 1)
    return c.intraNode.latency + intra / c.intraNode.bandwidth;
  return c.interNode.latency + std::max(intra / c.intraNode.bandwidth,
                                        inter / c.interNode.bandwidth);
}

double CostModel::collectiveTime(ReshardStep::Kind kind, double sent,
                                 const GroupPlacement &group) const {
  if (group.size <= 1)
    return 0;
  const LinkSpec &link = linkOf(group);
  switch (kind) {
  case ReshardStep::Kind::AllReduce:
    return allReduceTime(sent, group, link, cluster_);
  case ReshardStep::Kind::AllToAll:
    return allToAllTime(sent, group, cluster_);
  case ReshardStep::Kind::ReduceScatter:
  case ReshardStep::Kind::AllGather:
    // Rings: n - 1 hops, each moving 1/n of the tensor.
    return double(group.size - 1) * link.latency + sent / link.bandwidth;
  case ReshardStep::Kind::ShardSlice:
  case ReshardStep::Kind::PartialInit:
    return 0;
  }
  llvm_unreachable("unknown reshard step");
}

double CostModel::reshardTime(const ReshardStep &step) const {
  SmallVector<std::string> axes;
  for (StringRef axis : step.axes)
    axes.push_back(axis.str());
  return collectiveTime(step.kind, double(step.bytes), placement(axes));
}

double CostModel::collectiveTime(Operation *op) const {
  std::vector<std::string> axes = axesOf(op);
  if (auto stage = dyn_cast<StageAllReduceOp>(op)) {
    // Replicas on the listed stages, along the pipeline axis.
    GroupPlacement g = placement({"pp"});
    g.size = int64_t(stage.getStages().size());
    double n = double(g.size);
    return collectiveTime(ReshardStep::Kind::AllReduce,
                          2 * (n - 1) / n * bytesOf(stage.getInput()), g);
  }
  if (auto broadcast = dyn_cast<StageBroadcastOp>(op)) {
    GroupPlacement g = placement({"pp"});
    g.size = int64_t(broadcast.getStages().size());
    const LinkSpec &link = linkOf(g);
    return g.size > 1 ? std::ceil(std::log2(double(g.size))) * link.latency +
                            bytesOf(broadcast.getInput()) / link.bandwidth
                      : 0;
  }
  GroupPlacement g = placement(axes);
  if (g.size <= 1)
    return 0;
  // What one rank sends of a whole tensor of `bytes` (an all-reduce's
  // operand, an all-gather's result, a reduce-scatter's or all-to-all's
  // operand).
  double share = double(g.size - 1) / double(g.size);
  using Kind = ReshardStep::Kind;
  if (isa<AllReduceOp>(op))
    return collectiveTime(Kind::AllReduce,
                          2 * share * bytesOf(op->getOperand(0)), g);
  if (isa<AllGatherOp>(op))
    return collectiveTime(Kind::AllGather, share * bytesOf(op->getResult(0)),
                          g);
  if (isa<ReduceScatterOp>(op))
    return collectiveTime(Kind::ReduceScatter,
                          share * bytesOf(op->getOperand(0)), g);
  if (isa<AllToAllOp>(op))
    return collectiveTime(Kind::AllToAll, share * bytesOf(op->getOperand(0)),
                          g);
  if (isa<AllReduceStartOp, ReduceScatterStartOp, AllGatherStartOp>(op)) {
    // A bucket: the blocking op's algorithm over its one message (a gather
    // moves the whole gathered tensors).
    double bytes = double(getBucketBytes(op));
    if (isa<AllReduceStartOp>(op))
      return collectiveTime(Kind::AllReduce, 2 * share * bytes, g);
    return collectiveTime(
        Kind::AllGather,
        share * (isa<AllGatherStartOp>(op) ? bytes * double(g.size) : bytes),
        g);
  }
  if (auto permute = dyn_cast<CollectivePermuteStartOp>(op)) {
    const LinkSpec &link = linkOf(g);
    return permute.getShift() % g.size != 0
               ? link.latency + bytesOf(permute.getInput()) / link.bandwidth
               : 0;
  }
  return 0;
}

void cost::useCluster(MeshShape &mesh, const ClusterSpec &cluster,
                      MeshOp meshOp) {
  auto model = std::make_shared<CostModel>(cluster, meshOp);
  mesh.stepCost = [model](const ReshardStep &step) {
    return model->reshardTime(step);
  };
  mesh.opTime = [model](Operation *op) { return model->arithmeticTime(op); };
  // Costs planned in bytes are no longer this mesh's.
  mesh.costCache =
      std::make_shared<llvm::DenseMap<MeshShape::CostKey, double>>();
}

FailureOr<MeshShape> cost::meshShapeOnCluster(MeshOp mesh,
                                              llvm::StringRef clusterFile,
                                              const ClusterSpec *cluster) {
  MeshShape shape = MeshShape::get(mesh);
  if (!cluster && clusterFile.empty())
    return shape;
  std::optional<ClusterSpec> loaded;
  if (!cluster) {
    llvm::Expected<ClusterSpec> spec = loadCluster(clusterFile);
    if (!spec) {
      mesh.emitError() << llvm::toString(spec.takeError());
      return failure();
    }
    loaded = std::move(*spec);
  }
  const ClusterSpec *spec = cluster ? cluster : &*loaded;
  if (mesh.getNumRanks() > spec->numDevices()) {
    mesh.emitError() << "the mesh has " << mesh.getNumRanks()
                     << " ranks but the cluster '" << spec->name << "' only "
                     << spec->numDevices() << " devices";
    return failure();
  }
  useCluster(shape, *spec, mesh);
  return shape;
}

double CostModel::transferTime(int64_t bytes, llvm::StringRef axis) const {
  GroupPlacement g = placement({axis.str()});
  const LinkSpec &link = linkOf(g);
  return bytes > 0 ? link.latency + double(bytes) / link.bandwidth : 0;
}

//===----------------------------------------------------------------------===//
// One function on a compute and a communication stream.
//===----------------------------------------------------------------------===//

namespace {

/// A function's time on one rank: compute instructions run in order on the
/// compute stream; a blocking collective waits for both streams; an
/// asynchronous one runs on the communication stream from the later of
/// its start and the stream's last transfer, and its wait stalls compute
/// only for what is still in flight.
struct FunctionCost {
  double seconds = 0, compute = 0, recompute = 0;
  std::map<std::string, double> comm, exposed, byOp;
  double modelFlops = 0, recomputeFlops = 0;
  std::map<std::string, double> gemmFlops; // per operand type, for MFU
  int64_t sendBytes = 0;                   // pipeline stage boundaries
};

std::string groupKey(Operation *op) {
  if (isa<StageAllReduceOp, StageBroadcastOp, SendOp, RecvOp>(op))
    return "pp";
  return llvm::join(axesOf(op), ",");
}

std::string gemmTypeKey(Operation *op) {
  Type t = getElementTypeOrSelf(op->getOperand(0).getType());
  if (isa<ScaledMatmulOp>(op) || isa<Float8E4M3FNType, Float8E5M2Type>(t))
    return "f8";
  return t.isBF16() ? "bf16" : t.isF16() ? "f16" : "f32";
}

class FunctionCoster {
public:
  FunctionCoster(ModuleOp module, const CostModel &model)
      : module_(module), model_(model) {}

  FunctionCost cost(func::FuncOp fn) {
    FunctionCost out;
    double computeClock = 0, commClock = 0;
    run(fn, out, computeClock, commClock);
    out.seconds = std::max(computeClock, commClock);
    return out;
  }

private:
  void run(func::FuncOp fn, FunctionCost &out, double &computeClock,
           double &commClock) {
    if (fn.isExternal())
      return;
    for (Operation &op : fn.getBody().front()) {
      if (auto call = dyn_cast<func::CallOp>(op)) {
        if (auto callee = module_.lookupSymbol<func::FuncOp>(call.getCallee()))
          run(callee, out, computeClock, commClock);
        continue;
      }
      if (isa<SendOp>(op)) {
        out.sendBytes += int64_t(bytesOf(op.getOperand(0)));
        continue;
      }
      if (isa<RecvOp>(op))
        continue;
      if (isStartedCollective(&op)) {
        double t = model_.collectiveTime(&op);
        double start = std::max(computeClock, commClock);
        commClock = start + t;
        out.comm[groupKey(&op)] += t;
        for (Value future : op.getResults())
          inFlight_[future] = {commClock, groupKey(&op)};
        continue;
      }
      if (auto wait = dyn_cast<WaitOp>(op)) {
        auto it = inFlight_.find(wait.getFuture());
        if (it != inFlight_.end() && it->second.first > computeClock) {
          out.exposed[it->second.second] += it->second.first - computeClock;
          computeClock = it->second.first;
        }
        continue;
      }
      if (isa<AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp,
              StageAllReduceOp, StageBroadcastOp>(op)) {
        double t = model_.collectiveTime(&op);
        double start = std::max(computeClock, commClock);
        std::string key = groupKey(&op);
        out.comm[key] += t;
        out.exposed[key] += start + t - computeClock;
        computeClock = commClock = start + t;
        continue;
      }
      auto cost = dyn_cast<CostOpInterface>(op);
      if (!cost)
        continue;
      double t = model_.computeTime(&op);
      computeClock += t;
      out.compute += t;
      out.byOp[op.getName().getStringRef().str()] += t;
      if (op.hasAttr(ErnieDialect::kRecomputedAttrName)) {
        out.recompute += t;
        out.recomputeFlops += double(cost.getFlops());
        continue;
      }
      out.modelFlops += double(cost.getFlops());
      if (isGemm(&op))
        out.gemmFlops[gemmTypeKey(&op)] += double(cost.getFlops());
    }
  }

  ModuleOp module_;
  const CostModel &model_;
  llvm::DenseMap<Value, std::pair<double, std::string>> inFlight_;
};

void accumulate(StepCost &step, const FunctionCost &f, double times,
                std::map<std::string, double> &gemmFlops) {
  step.computeSeconds += f.compute * times;
  step.recomputeSeconds += f.recompute * times;
  for (const auto &[k, v] : f.comm)
    step.commSeconds[k] += v * times;
  for (const auto &[k, v] : f.exposed)
    step.exposedCommSeconds[k] += v * times;
  for (const auto &[k, v] : f.gemmFlops)
    gemmFlops[k] += v * times;
  for (const auto &[k, v] : f.byOp)
    step.computeByOp[k] += v * times;
}

/// What the runtime does around each call of a pipeline chunk's function.
/// A gradient the function adds into its running sum (an `ernie.gradient`
/// argument of the result's name) costs the sum's zeroing before the
/// step's first micro-batch: one write, a 1/m share per call. Any other
/// gradient (and fp8 maximum) the runtime adds into the step's running
/// value after the call, reading both and writing one, on every
/// micro-batch but the first (which it keeps as it is). Counted as the
/// function's compute, under its own names.
void addHandOffSums(const CostModel &model, func::FuncOp fn, FunctionCost &f,
                    int64_t microBatches) {
  llvm::StringSet<> summedInside;
  for (unsigned i = 0; i < fn.getNumArguments(); ++i)
    if (auto name = fn.getArgAttrOfType<StringAttr>(
            i, ErnieDialect::kGradientAttrName))
      summedInside.insert(name.getValue());
  for (unsigned i = 0; i < fn.getNumResults(); ++i) {
    auto gradient =
        fn.getResultAttrOfType<StringAttr>(i, ErnieDialect::kGradientAttrName);
    if (!gradient &&
        !fn.getResultAttr(i, ErnieDialect::kMicroBatchMaxAttrName) &&
        !fn.getResultAttr(i, ErnieDialect::kMicroBatchSumAttrName))
      continue;
    auto type = cast<ShapedType>(fn.getResultTypes()[i]);
    double bytes = double(type.getNumElements()) *
                   double(getElementByteSize(type.getElementType()));
    bool inside = gradient && summedInside.contains(gradient.getValue());
    double t = inside ? model.memoryTime(bytes) / double(microBatches)
                      : double(microBatches - 1) / double(microBatches) *
                            model.memoryTime(3 * bytes);
    f.seconds += t;
    f.compute += t;
    f.byOp[inside ? "runtime.zero_gradient_sums" : "runtime.sum_micro_batches"] +=
        t;
  }
}

/// MFU's peak: the device's for the type most GEMM FLOPs use (fp8 GEMMs are
/// measured against the bf16 peak, as published MFUs are).
double mfuPeak(const DeviceSpec &d,
               const std::map<std::string, double> &gemmFlops) {
  std::string key = "f32";
  double most = -1;
  for (const auto &[k, v] : gemmFlops)
    if (v > most)
      most = v, key = k;
  if (key == "f8")
    key = d.matmulFlops.count("bf16") ? "bf16" : "f32";
  double peak = d.matmulFlops.lookup(key);
  return peak > 0 ? peak : d.matmulFlops.lookup("f32");
}

} // namespace

/// The step's estimate under `model`.
static FailureOr<StepCost> estimateWith(ModuleOp module,
                                        const ClusterSpec &cluster,
                                        const CostModel &model, MeshOp mesh) {
  StepCost step;
  step.ranks = mesh ? mesh.getNumRanks() : 1;
  FunctionCoster coster(module, model);
  std::map<std::string, double> gemmFlops;
  auto function = [&](StringRef name) {
    return module.lookupSymbol<func::FuncOp>(name);
  };

  FailureOr<std::optional<PipelineInfo>> pipeline = readPipelineInfo(module);
  if (failed(pipeline))
    return failure();
  if (!*pipeline) {
    func::FuncOp fn = function("train_step");
    if (!fn)
      fn = function("forward_grad");
    if (!fn)
      for (auto f : module.getOps<func::FuncOp>())
        if (!f.isExternal() && !fn)
          fn = f;
    if (!fn)
      return module.emitError() << "the cost model needs a function to cost";
    FunctionCost f = coster.cost(fn);
    accumulate(step, f, 1, gemmFlops);
    step.stepSeconds = f.seconds;
    step.modelFlops = f.modelFlops * double(step.ranks);
    step.recomputeFlops = f.recomputeFlops * double(step.ranks);
  } else {
    const PipelineInfo &info = **pipeline;
    if (!info.isScheduled() || !info.rankSteps)
      return module.emitError()
             << "the cost model needs a scheduled pipeline "
                "(--ernie-pipeline-schedule)";
    rt::PipelineShape shape{info.stages, info.virtualStages,
                            *info.microBatches};
    rt::PipelineSchedule schedule(info.rankSteps->size());
    for (auto [r, text] : llvm::enumerate(*info.rankSteps))
      if (std::string err = rt::parseSteps(text, schedule[r]); !err.empty())
        return module.emitError() << err;
    int64_t chunks = shape.chunks();
    std::vector<FunctionCost> forward(chunks), backward(chunks);
    rt::StepCosts costs;
    int64_t sendBytes = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      func::FuncOp fwd = function(llvm::formatv("train_forward.{0}", c).str());
      func::FuncOp bwd = function(llvm::formatv("train_backward.{0}", c).str());
      if (!fwd || !bwd)
        return module.emitError()
               << "the pipelined program has no train_forward." << c
               << " or train_backward." << c;
      forward[c] = coster.cost(fwd);
      backward[c] = coster.cost(bwd);
      addHandOffSums(model, fwd, forward[c], shape.microBatches);
      addHandOffSums(model, bwd, backward[c], shape.microBatches);
      costs.forward.push_back(forward[c].seconds);
      costs.backward.push_back(backward[c].seconds);
      sendBytes = std::max({sendBytes, forward[c].sendBytes,
                            backward[c].sendBytes});
    }
    costs.transfer = model.transferTime(sendBytes, info.axis);
    // Ranks time-sliced onto shared processors (this machine's CPU): the
    // costs are those of every rank busy; while some stages idle in the
    // bubble the busy ones take their share of the processors.
    const double slowdown = model.computeSlowdown();
    if (slowdown > 1 && cluster.sharedProcessors > 0) {
      double perStage = double(step.ranks / shape.stages);
      double capacity =
          double(cluster.sharedProcessors) * cluster.sharingEfficiency;
      costs.speedup = [=](int64_t busy) {
        return slowdown / std::max(1.0, double(busy) * perStage / capacity);
      };
    }
    rt::ScheduleTimeline timeline;
    if (std::string err =
            rt::simulateSchedule(schedule, shape, costs, timeline);
        !err.empty())
      return module.emitError() << err;
    // The slowest rank: its last step's end plus its update.
    int64_t critical = 0;
    std::vector<FunctionCost> update(shape.stages);
    double worst = -1, flops = 0;
    for (int64_t r = 0; r < shape.stages; ++r) {
      if (func::FuncOp fn =
              function(llvm::formatv("train_update.{0}", r).str()))
        update[r] = coster.cost(fn);
      double end = timeline.ranks[r].empty() ? 0
                                             : timeline.ranks[r].back().end;
      if (end + update[r].seconds > worst)
        worst = end + update[r].seconds, critical = r;
      flops += update[r].modelFlops;
    }
    double recomputed = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      flops += (forward[c].modelFlops + backward[c].modelFlops) *
               double(shape.microBatches);
      recomputed += backward[c].recomputeFlops * double(shape.microBatches);
    }
    step.stepSeconds = worst;
    step.modelFlops = flops * double(step.ranks / shape.stages);
    step.recomputeFlops = recomputed * double(step.ranks / shape.stages);
    double m = double(shape.microBatches);
    // The critical rank's steps as they ran: faster than their costs where
    // shared processors sped them up.
    double costed = 0, ran = 0;
    for (int64_t c = critical; c < chunks; c += shape.stages)
      costed += (forward[c].seconds + backward[c].seconds) * m;
    for (const rt::TimedStep &t : timeline.ranks[critical])
      ran += t.end - t.start;
    double asRan = costed > 0 && ran > 0 ? ran / costed : 1; // <= 1
    double span = update[critical].seconds; // the critical rank's own time
    for (int64_t c = critical; c < chunks; c += shape.stages) {
      accumulate(step, forward[c], m * asRan, gemmFlops);
      accumulate(step, backward[c], m * asRan, gemmFlops);
      span += (forward[c].seconds + backward[c].seconds) * m * asRan;
    }
    accumulate(step, update[critical], 1, gemmFlops);
    // Each forward but the last chunk's sends its activations on, each
    // backward but the first chunk's its gradient back.
    int64_t crossings = 0;
    for (int64_t c = critical; c < chunks; c += shape.stages)
      crossings += (c + 1 < chunks) + (c > 0);
    if (crossings && costs.transfer > 0)
      step.commSeconds["pp"] += costs.transfer * double(crossings) * m;
    step.bubbleSeconds = std::max(0.0, step.stepSeconds - span);
  }
  step.peakFlops = mfuPeak(cluster.device, gemmFlops);

  // Of the compute, what time-slicing ranks onto shared processors adds.
  step.contentionSeconds =
      step.computeSeconds * (1 - 1 / model.computeSlowdown());
  step.overheadSeconds = cluster.device.stepOverhead;
  step.stepSeconds += step.overheadSeconds;
  return step;
}

FailureOr<StepCost> cost::estimateStep(ModuleOp module,
                                       const ClusterSpec &cluster) {
  auto meshes = module.getOps<MeshOp>();
  MeshOp mesh = meshes.empty() ? MeshOp() : *meshes.begin();
  int64_t ranks = mesh ? mesh.getNumRanks() : 1;
  if (ranks > cluster.numDevices())
    return module.emitError()
           << "the program has " << ranks << " ranks but the cluster '"
           << cluster.name << "' only " << cluster.numDevices() << " devices";
  CostModel model(cluster, mesh);
  return estimateWith(module, cluster, model, mesh);
}

llvm::json::Value cost::toJSON(const StepCost &cost) {
  llvm::json::Object comm, exposed, byOp;
  for (const auto &[k, v] : cost.commSeconds)
    comm[k] = v;
  for (const auto &[k, v] : cost.computeByOp)
    byOp[k] = v;
  for (const auto &[k, v] : cost.exposedCommSeconds)
    exposed[k] = v;
  return llvm::json::Object{
      {"step_seconds", cost.stepSeconds},
      {"compute_seconds", cost.computeSeconds},
      {"compute_by_op", std::move(byOp)},
      {"overhead_seconds", cost.overheadSeconds},
      {"recompute_seconds", cost.recomputeSeconds},
      {"bubble_seconds", cost.bubbleSeconds},
      {"contention_seconds", cost.contentionSeconds},
      {"comm_seconds", std::move(comm)},
      {"exposed_comm_seconds", std::move(exposed)},
      {"model_flops", cost.modelFlops},
      {"recompute_flops", cost.recomputeFlops},
      {"hfu", cost.hfu()},
      {"peak_flops", cost.peakFlops},
      {"ranks", cost.ranks},
      {"mfu", cost.mfu()}};
}
