// The plan report of a dp x mp training step, and the runtime's timeline.
//
// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-plan-report=file=%t.json" -o %t.mlir
// RUN: FileCheck %s --input-file=%t.json
// RUN: ernie-translate --ernie-to-program %t.mlir -o %t.ernie
// RUN: ernie-run %t.ernie --steps 2 --quiet --trace %t.trace.json
// RUN: FileCheck %s --check-prefix=TRACE --input-file=%t.trace.json

ernie.mesh @mesh(dp = 2, mp = 2)
func.func @forward(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %w1: tensor<16x32xf32> {ernie.param = "w1", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
                   %w2: tensor<32x16xf32> {ernie.param = "w2", ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> tensor<f32> {
  %h = ernie.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  %a = ernie.relu %h : tensor<8x32xf32>
  %y = ernie.matmul %a, %w2 : tensor<8x32xf32>, tensor<32x16xf32> -> tensor<8x16xf32>
  %sq = ernie.mul %y, %y : tensor<8x16xf32>
  %l = ernie.reduce_mean %sq axes = [0, 1] : tensor<8x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// Per rank: w1 and w2 are 16x16 f32 halves (1 KiB each), their momentum
// slots alike; the gradients of @forward_grad are the same halves. The
// step's call tree all-reduces the row-parallel output over mp and the
// gradients over dp.
// What the forward keeps for the backward, per rank, where the local loss
// is computed: the 4x16 pre-activation and activation, the all-reduced
// output (the loss's gradient reads it) and the square the loss op is
// reading: 4 x 256 bytes, and the scalar loss. (The 0 and 1/128 splats the
// backward uses are filled where they are read, not held from the top,
// where canonicalization hoists them.)
// CHECK:      "forward_grad": {
// CHECK:        "activation_bytes": 1028,
// CHECK:        "gradient_bytes": 2048,
// CHECK:        "parameter_bytes": 2048
// CHECK:      "train_step": {
// CHECK:        "collectives": {
// CHECK:          "all_reduce[dp]": {
// CHECK-NEXT:       "bytes": {{[0-9]+}},
// CHECK-NEXT:       "count": {{[1-9][0-9]*}}
// CHECK:          "all_reduce[mp]": {
// CHECK:        "optimizer_state_bytes": 2048,
// CHECK-NEXT:   "padding_bytes": 0,
// CHECK-NEXT:   "parameter_bytes": 2048
// CHECK:      "ranks": 4

// Every rank is a process of the timeline, compute and communication on
// their own threads, and the matmuls and all-reduces are there.
// TRACE: "traceEvents"
// TRACE-DAG: "name": "rank 0"
// TRACE-DAG: "name": "rank 3"
// TRACE-DAG: {"ph": "X", "name": "ernie.matmul", "cat": "compute", "pid": 3, "tid": 0,
// TRACE-DAG: {"ph": "X", "name": "ernie.all_reduce", "cat": "collective", "pid": 1, "tid": 1,
