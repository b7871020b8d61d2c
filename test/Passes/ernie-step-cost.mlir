// RUN: ernie-opt %s --split-input-file "--ernie-step-cost=cluster=%S/Inputs/cost-one-node.json" -o /dev/null | FileCheck %s
// RUN: ernie-opt %s --split-input-file "--ernie-step-cost=cluster=%S/Inputs/cost-two-nodes.json" -o /dev/null | FileCheck %s --check-prefix=NODES

// The cost model's numbers worked by hand. The device (Inputs/cost-device.json):
// 1e12 GEMM FLOP/s, 1e11 elementwise FLOP/s, 1e11 B/s, 1 us per instruction.
//
// The matmul: 2·128·64·256 = 4194304 FLOPs (4.194304 us) against 229376
// bytes (2.29 us): compute-bound, 1 + 4.194304 = 5.194304 us.
// One node of four (10 GB/s, 10 us): the ring all-reduce of 32768 bytes
// over 4 ranks takes 2·3·10 us + 2·3/4·32768 B / 1e10 B/s = 64.9152 us.
// Two nodes of two: dp = 4 spans both, whose 1 GB/s network makes the ring
// 60 + 49.152 = 109.152 us; NCCL's tree (one hop between the nodes, one in
// each) takes 2·(10 + 1) + 49.152 = 71.152 us, and wins.
ernie.mesh @mesh(dp = 4)
// CHECK: "comm_seconds": {
// CHECK-NEXT: "dp": 6.491{{[0-9]+}}e-05
// CHECK: "compute_by_op": {
// CHECK-NEXT: "ernie.matmul": 5.194{{[0-9]+}}e-06
// CHECK: "compute_seconds": 5.194{{[0-9]+}}e-06
// CHECK: "exposed_comm_seconds": {
// CHECK-NEXT: "dp": 6.491{{[0-9]+}}e-05
// CHECK: "mfu": 0.059825
// CHECK: "model_flops": 16777216
// CHECK: "peak_flops": 1000000000000
// CHECK: "ranks": 4
// CHECK: "step_seconds": 7.010{{[0-9]+}}e-05
// NODES: "dp": 7.115{{[0-9]+}}e-05
// NODES: "step_seconds": 7.634{{[0-9]+}}e-05
func.func @train_step(%x: tensor<128x256xf32>, %w: tensor<256x64xf32>) -> tensor<128x64xf32> {
  %y = ernie.matmul %x, %w : tensor<128x256xf32>, tensor<256x64xf32> -> tensor<128x64xf32>
  %r = ernie.all_reduce %y over @mesh[dp] sum : tensor<128x64xf32>
  return %r : tensor<128x64xf32>
}

// -----

// Asynchronous: the exp (1 + 262144 B / 1e11 B/s = 3.62144 us) runs while
// the all-reduce flies; the wait stalls for the rest, 64.9152 - 3.62144 =
// 61.29376 us, and the step is as long as the blocking one.
ernie.mesh @mesh(dp = 4)
// CHECK: "compute_seconds": 8.815{{[0-9]+}}e-06
// CHECK: "exposed_comm_seconds": {
// CHECK-NEXT: "dp": 6.129{{[0-9]+}}e-05
// CHECK: "step_seconds": 7.010{{[0-9]+}}e-05
// NODES: "step_seconds": 7.634{{[0-9]+}}e-05
func.func @train_step(%x: tensor<128x256xf32>, %w: tensor<256x64xf32>) -> (tensor<128x64xf32>, tensor<128x256xf32>) {
  %y = ernie.matmul %x, %w : tensor<128x256xf32>, tensor<256x64xf32> -> tensor<128x64xf32>
  %f = ernie.all_reduce_start %y over @mesh[dp] sum : tensor<128x64xf32>
  %e = ernie.exp %x : tensor<128x256xf32>
  %r = ernie.wait %f : tensor<128x64xf32>
  return %r, %e : tensor<128x64xf32>, tensor<128x256xf32>
}

// -----

// Which links a group crosses: ranks are row-major (rank = 2·dp + mp), so
// on two nodes of two an mp group stays in its node (10 GB/s, 1 us: 2 +
// 3.2768 us) and a dp group crosses the network (20 + 32.768 us, ring and
// tree alike). On one node both take 2·10 + 3.2768 us.
ernie.mesh @mesh(dp = 2, mp = 2)
// CHECK: "comm_seconds": {
// CHECK-NEXT: "dp": 2.327{{[0-9]+}}e-05
// CHECK-NEXT: "mp": 2.327{{[0-9]+}}e-05
// NODES: "comm_seconds": {
// NODES-NEXT: "dp": 5.276{{[0-9]+}}e-05
// NODES-NEXT: "mp": 5.276{{[0-9]+}}e-06
func.func @train_step(%y: tensor<128x64xf32>) -> (tensor<128x64xf32>, tensor<128x64xf32>) {
  %a = ernie.all_reduce %y over @mesh[mp] sum : tensor<128x64xf32>
  %b = ernie.all_reduce %y over @mesh[dp] sum : tensor<128x64xf32>
  return %a, %b : tensor<128x64xf32>, tensor<128x64xf32>
}

// -----

// An all-to-all sends 3/4 of its 32768 bytes (24576 B) to its three peers
// at once: one round of latency. One node of four: 10 us + 24576 B / 1e10
// B/s = 12.4576 us (as a ring it was 3·10 + 2.4576 us). Two nodes of two:
// a third of it (8192 B) stays in the node while 16384 B cross the 1 GB/s
// network concurrently: 10 + max(0.8192, 16.384) = 26.384 us.
ernie.mesh @mesh(ep = 4)
// CHECK: "comm_seconds": {
// CHECK-NEXT: "ep": 1.245{{[0-9]+}}e-05
// NODES: "comm_seconds": {
// NODES-NEXT: "ep": 2.638{{[0-9]+}}e-05
func.func @train_step(%y: tensor<128x64xf32>) -> tensor<512x16xf32> {
  %a = ernie.all_to_all %y over @mesh[ep] split_dim = 1, concat_dim = 0 : tensor<128x64xf32> -> tensor<512x16xf32>
  return %a : tensor<512x16xf32>
}

// -----

// A bf16 GEMM against the bf16 peak (4e12: 1.048576 us) is memory-bound
// now: 114688 bytes / 1e11 B/s = 1.14688 us, + 1 us. MFU is measured
// against the bf16 peak.
// CHECK: "compute_seconds": 2.146{{[0-9]+}}e-06
// CHECK: "peak_flops": 4000000000000
// CHECK: "ranks": 1
func.func @train_step(%x: tensor<128x256xbf16>, %w: tensor<256x64xbf16>) -> tensor<128x64xbf16> {
  %y = ernie.matmul %x, %w : tensor<128x256xbf16>, tensor<256x64xbf16> -> tensor<128x64xbf16>
  return %y : tensor<128x64xbf16>
}

// -----

// The expert GEMMs count the rows routing fills (fill = 1/4): the forward's
// 2·(16384/4)·32 = 262144 FLOPs (0.262 us) against 4·(16384 weight + 16384
// result + 8192/4 input) = 139264 bytes (1.39264 us): memory-bound, 1 +
// 1.39264 = 2.39264 us. The weight gradient: the same FLOPs against
// 4·(16384 + (8192 + 16384)/4) = 90112 bytes, 1.90112 us. Every rank's
// model FLOPs: 4·2·262144.
ernie.mesh @mesh(dp = 4)
// CHECK: "compute_by_op": {
// CHECK-NEXT: "ernie.expert_matmul": 2.3926{{[0-9]+}}e-06
// CHECK-NEXT: "ernie.expert_weight_grad": 1.9011{{[0-9]+}}e-06
// CHECK: "model_flops": 2097152
func.func @train_step(%x: tensor<8x2x16x32xf32>, %w: tensor<8x32x64xf32>, %rows: tensor<8x2xi64>) -> (tensor<8x2x16x64xf32>, tensor<8x32x64xf32>) {
  %y = ernie.expert_matmul %x, %w, %rows {fill = 0.25} : tensor<8x2x16x32xf32>, tensor<8x32x64xf32>, tensor<8x2xi64> -> tensor<8x2x16x64xf32>
  %dw = ernie.expert_weight_grad %x, %y, %rows {fill = 0.25} : tensor<8x2x16x32xf32>, tensor<8x2x16x64xf32>, tensor<8x2xi64> -> tensor<8x32x64xf32>
  return %y, %dw : tensor<8x2x16x64xf32>, tensor<8x32x64xf32>
}
