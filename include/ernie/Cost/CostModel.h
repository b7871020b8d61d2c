//===- CostModel.h - step time from a device and a cluster ------*- C++ -*-===//
//
// The cost model of a partitioned, scheduled program: each instruction's
// time from a roofline of the device, each collective's from an alpha-beta
// model of the links its group crosses, asynchronous transfers overlapping
// the compute that runs while they fly, and a pipelined program's steps
// through the runtime's schedule simulator. Devices and clusters are data
// (JSON files, docs/architecture.md "The cost model" gives the fields).
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_COST_COSTMODEL_H
#define ERNIE_COST_COSTMODEL_H

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Sharding/Resharding.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <map>
#include <string>

namespace mlir::ernie::cost {

/// What a device's roofline needs.
struct DeviceSpec {
  std::string name;
  int64_t memoryBytes = 0;
  /// Bytes per second between the device's memory and its cores.
  double memoryBandwidth = 0;
  /// Dense GEMM peak FLOP/s per operand type: "f32", "bf16", "f16", "f8".
  llvm::StringMap<double> matmulFlops;
  /// FLOP/s of everything that is not a GEMM (elementwise, reductions).
  double vectorFlops = 0;
  /// The share of the peaks real kernels reach (cuBLAS on large GEMMs, a
  /// streaming kernel's bandwidth), in (0, 1].
  double matmulEfficiency = 1, memoryEfficiency = 1;
  /// Seconds each instruction costs beyond its roofline (a kernel launch, or
  /// the CPU runtime's dispatch).
  double launchOverhead = 0;
  /// Host time each step costs outside the instructions (staging inputs,
  /// returning the loss).
  double stepOverhead = 0;
  /// Per op name ("ernie.adamw_update"): what a profile measured over what
  /// the roofline predicts, scaling that op's roofline time (calibration).
  llvm::StringMap<double> opScale;

  /// The GEMM peak for operands of `elementType` (fp8 types share "f8");
  /// falls back to "f32" when the device names no peak for it.
  double matmulPeak(Type elementType) const;
};

/// One kind of link: per-rank bandwidth (bytes/s each way) and latency.
struct LinkSpec {
  double bandwidth = 0, latency = 0;
};

struct ClusterSpec {
  std::string name;
  DeviceSpec device;
  int64_t nodes = 1, devicesPerNode = 1;
  LinkSpec intraNode, interNode;
  /// 0: every device computes on its own. n > 0: the devices share n
  /// processors (CPU thread ranks on one machine), so a step takes at least
  /// every rank's compute divided by n.
  int64_t sharedProcessors = 0;
  /// The share of `sharedProcessors` that oversubscribed ranks keep (time
  /// slicing, caches shared): measured, in (0, 1].
  double sharingEfficiency = 1;

  int64_t numDevices() const { return nodes * devicesPerNode; }
};

/// Reads a device description; errors name the field ("<where>: peak_flops.
/// bf16: expected a positive number").
llvm::Expected<DeviceSpec> parseDevice(const llvm::json::Value &value,
                                       llvm::StringRef where);
/// Reads a cluster description. Its "device" is an object (a device
/// description) or a string, which `resolveDevice` turns into one.
llvm::Expected<ClusterSpec>
parseCluster(const llvm::json::Value &value, llvm::StringRef where,
             llvm::function_ref<llvm::Expected<DeviceSpec>(llvm::StringRef)>
                 resolveDevice);
/// Reads a cluster description whose "device" string names a device file
/// relative to `deviceDir`.
llvm::Expected<ClusterSpec> readCluster(const llvm::json::Value &value,
                                        llvm::StringRef where,
                                        llvm::StringRef deviceDir);
/// Reads a cluster file; a "device" string names a device file, relative to
/// the cluster file's directory.
llvm::Expected<ClusterSpec> loadCluster(llvm::StringRef path);

/// A collective's group on the cluster: its size, and how many nodes it
/// spans (1: it stays on the intra-node links).
struct GroupPlacement {
  int64_t size = 1, nodes = 1;
};

class CostModel {
public:
  /// Ranks are placed on the cluster's devices in the mesh's row-major
  /// order, node after node. `mesh` may be null (one rank).
  CostModel(const ClusterSpec &cluster, MeshOp mesh);

  const ClusterSpec &cluster() const { return cluster_; }

  /// The roofline time of a compute instruction: launch overhead plus the
  /// larger of its FLOPs over the peak and its bytes over the bandwidth.
  double computeTime(Operation *op) const;
  /// computeTime for an instruction its FLOPs bound, 0 for one its bytes
  /// bound: what dividing it over ranks can save. A memory-bound op's
  /// bytes are fused away with its neighbours' later, and dividing it
  /// moves as many (the slices, the gather over links no faster than
  /// memory) as it saves.
  double arithmeticTime(Operation *op) const;
  /// A memory-bound pass the runtime makes between instructions (summing a
  /// micro-batch's gradients into the step's): launch overhead plus
  /// `bytes` read and written over the bandwidth.
  double memoryTime(double bytes) const;

  /// How much slower each rank computes than alone: ranks over the shared
  /// processors they are time-sliced onto (1 on dedicated devices).
  double computeSlowdown() const { return computeSlowdown_; }

  GroupPlacement placement(llvm::ArrayRef<std::string> axes) const;
  /// Seconds for one collective of `kind` over `group` where one rank sends
  /// `sent` bytes: the links' latency once per hop plus `sent` over their
  /// bandwidth. All-reduces take the faster of NCCL's ring and tree; the
  /// rest run as rings. Local steps (slices) cost nothing.
  double collectiveTime(ReshardStep::Kind kind, double sent,
                        const GroupPlacement &group) const;
  /// Seconds for a collective op of the program.
  double collectiveTime(Operation *op) const;
  /// Seconds for one step of a resharding plan (the planner's edge cost
  /// on this cluster).
  double reshardTime(const ReshardStep &step) const;
  /// A point-to-point transfer of `bytes` across `axis` (pipeline sends).
  double transferTime(int64_t bytes, llvm::StringRef axis) const;

private:
  const LinkSpec &linkOf(const GroupPlacement &group) const;

  ClusterSpec cluster_;
  std::vector<std::string> axisNames_;
  std::vector<int64_t> axisSizes_;
  double computeSlowdown_ = 1;
};

/// One step's time and where it goes, per rank of the slowest stage.
struct StepCost {
  double stepSeconds = 0;
  /// Compute on the critical rank (recomputation included), of which
  /// `recomputeSeconds` recomputes activations.
  double computeSeconds = 0, recomputeSeconds = 0;
  /// The critical rank's compute per op name.
  std::map<std::string, double> computeByOp;
  /// Host time per step (the device's step_overhead).
  double overheadSeconds = 0;
  /// Idle pipeline time on the critical rank, and the part of the compute
  /// that time-slicing ranks onto shared processors adds (CPU threads).
  double bubbleSeconds = 0, contentionSeconds = 0;
  /// Per group ("dp", "dp,mp", "pp"): the communication time a step spends,
  /// and the part of it no compute hides.
  std::map<std::string, double> commSeconds, exposedCommSeconds;
  /// The step's FLOPs summed over every rank, without recomputation (the
  /// model FLOPs MFU counts), and the peak they are measured against.
  double modelFlops = 0, peakFlops = 0;
  /// The FLOPs recomputation adds (hardware FLOPs = model + these).
  double recomputeFlops = 0;
  int64_t ranks = 1;

  double mfu() const {
    return stepSeconds > 0 ? modelFlops / (stepSeconds * peakFlops * ranks)
                           : 0;
  }
  /// Hardware FLOPs utilisation: recomputed FLOPs counted too, as
  /// Narayanan et al. (2021) count their TFLOP/s per GPU.
  double hfu() const {
    return stepSeconds > 0 ? (modelFlops + recomputeFlops) /
                                 (stepSeconds * peakFlops * ranks)
                           : 0;
  }
};

/// Makes `mesh`'s reshard costs this cluster's seconds (MeshShape::
/// stepCost), the mesh's ranks placed on the cluster as CostModel places
/// them: propagation and partition then choose layouts and plans by time,
/// latency included, instead of by bytes, and may weigh an op's compute
/// (MeshShape::opTime) against the collectives that divide it.
void useCluster(MeshShape &mesh, const ClusterSpec &cluster, MeshOp meshOp);
/// The shape of `mesh` costed on `cluster` when given, else on the cluster
/// file `clusterFile` (both absent: in bytes). An unreadable or malformed
/// file, or a cluster with fewer devices than the mesh has ranks, is an
/// error on the mesh.
FailureOr<MeshShape> meshShapeOnCluster(MeshOp mesh,
                                        llvm::StringRef clusterFile,
                                        const ClusterSpec *cluster = nullptr);

/// Estimates one training step (train_step, or the pipeline's chunk and
/// update functions under its schedule; without them forward_grad or the
/// first function). Fails with a diagnostic on the module for a program it
/// cannot cost (no function, a pipeline without a schedule).
FailureOr<StepCost> estimateStep(ModuleOp module, const ClusterSpec &cluster);

llvm::json::Value toJSON(const StepCost &cost);

} // namespace mlir::ernie::cost

#endif // ERNIE_COST_COSTMODEL_H
