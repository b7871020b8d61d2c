// RUN: ernie-opt %s --ernie-autodiff=optimizer=adamw --ernie-zero-sharding=level=1 | FileCheck %s --check-prefix=L1
// RUN: ernie-opt %s --ernie-autodiff=optimizer=adamw --ernie-zero-sharding=level=2 | FileCheck %s --check-prefix=L2
// RUN: ernie-opt %s --ernie-autodiff=optimizer=adamw --ernie-zero-sharding=level=3 | FileCheck %s --check-prefix=L3
// RUN: ernie-opt %s --ernie-autodiff=optimizer=adamw --ernie-zero-sharding=level=2 --ernie-auto-parallel-pipeline | FileCheck %s --check-prefix=PART
// RUN: not ernie-opt %s --ernie-zero-sharding 2>&1 | FileCheck %s --check-prefix=NOSTEP
// RUN: not ernie-opt %s --ernie-autodiff=optimizer=sgd "--ernie-zero-sharding=axis=pp" 2>&1 | FileCheck %s --check-prefix=NOAXIS
// RUN: not ernie-opt %s --ernie-autodiff=optimizer=sgd "--ernie-zero-sharding=level=4" 2>&1 | FileCheck %s --check-prefix=LEVEL

ernie.mesh @mesh(dp = 2, mp = 2)
func.func @forward(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %w: tensor<16x8xf32> {ernie.param = "w", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
                   %b: tensor<3xf32> {ernie.param = "odd"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<8x16xf32>, tensor<16x8xf32> -> tensor<8x8xf32>
  %s = ernie.reduce_sum %h axes = [0, 1] : tensor<8x8xf32> -> tensor<f32>
  %t = ernie.reduce_sum %b axes = [0] : tensor<3xf32> -> tensor<f32>
  %l = ernie.add %s, %t : tensor<f32>
  return %l : tensor<f32>
}

// Level 1: the slots of w split on dim 0 over dp (its mp split kept); the
// parameter stays as it was; a 3-element slot splits unevenly (2 + 1, the
// second piece padded);
// gradients are constrained to their parameter's layout — whole over dp
// (all-reduced), their mp split kept — before the update.
// L1-LABEL: func.func @train_step
// L1-SAME: {ernie.param = "w", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>}
// L1-SAME: {ernie.opt_state = "w:moment1", ernie.sharding = #ernie.sharding<@mesh, [{dp}, {mp}]>}
// L1-SAME: {ernie.opt_state = "w:moment2", ernie.sharding = #ernie.sharding<@mesh, [{dp}, {mp}]>}
// L1-SAME: %{{[a-z0-9]+}}: tensor<3xf32> {ernie.opt_state = "odd:moment1", ernie.sharding = #ernie.sharding<@mesh, [{dp}]>}
// L1-SAME: tensor<16x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {mp}]>, ernie.updates = "w:moment1"}
// L1: ernie.sharding_constraint %{{.*}}#1 <@mesh, [{}, {mp}]>

// Level 2: the gradient function returns w's gradient split like its
// slots (autodiff's own constraint there, laying it out like w, is weaker),
// and the step adds no gradient constraint.
// L2-LABEL: func.func @forward_grad
// L2-SAME: -> (tensor<f32> {ernie.loss}, tensor<16x8xf32> {ernie.grad_of = "w", ernie.sharding = #ernie.sharding<@mesh, [{dp}, {mp}]>}
// L2: ernie.sharding_constraint {{.*}}<@mesh, [{}, {mp}]> {priority = 1 : i64}
// L2-LABEL: func.func @train_step
// L2-NOT: ernie.sharding_constraint

// Level 3: the parameter itself is split.
// L3-LABEL: func.func @train_step
// L3-SAME: {ernie.param = "w", ernie.sharding = #ernie.sharding<@mesh, [{dp}, {mp}]>}
// The evaluation takes it as the step keeps it (the runtime holds one
// layout per state; a whole parameter would gather the model into it).
// L3-LABEL: func.func @eval_step
// L3-SAME: {ernie.param = "w", ernie.sharding = #ernie.sharding<@mesh, [{dp}, {mp}]>}

// After partition at level 2: each rank updates an 8x4 shard of w.
// PART-LABEL: func.func @train_step
// PART: ernie.adamw_update {{.*}} : tensor<8x4xf32>

// NOSTEP: error: no function @train_step to shard (run --ernie-autodiff with an optimizer first)
// NOAXIS: error: the mesh has no axis 'pp' to shard over
// LEVEL: error: ZeRO level must be 1, 2 or 3, not 4
