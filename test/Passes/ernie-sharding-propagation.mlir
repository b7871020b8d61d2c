// RUN: ernie-opt %s --split-input-file --ernie-sharding-propagation | FileCheck %s

// Megatron's MLP: column-parallel then row-parallel matmul. The only
// communication is one reshard of the row-parallel result (an all-reduce
// over mp), and batch stays split over dp throughout.
ernie.mesh @mesh(dp = 2, mp = 4)
// CHECK-LABEL: func.func @megatron_mlp
// CHECK-SAME: -> (tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>})
// CHECK: %[[H:.+]] = ernie.matmul {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {mp}]>]
// CHECK: ernie.gelu {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {mp}]>]
// CHECK: %[[Y:.+]] = ernie.matmul {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}], partial = {mp = sum}>]
// CHECK: %[[R:.+]] = ernie.reshard %[[Y]] <@mesh, [{dp}, {}]>
// CHECK-NOT: ernie.reshard
// CHECK: ernie.add %[[R]]
func.func @megatron_mlp(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                        %w1: tensor<16x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
                        %w2: tensor<64x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> tensor<8x16xf32> {
  %h = ernie.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x64xf32> -> tensor<8x64xf32>
  %g = ernie.gelu %h : tensor<8x64xf32>
  %y = ernie.matmul %g, %w2 : tensor<8x64xf32>, tensor<64x16xf32> -> tensor<8x16xf32>
  %z = ernie.add %y, %x : tensor<8x16xf32>
  return %z : tensor<8x16xf32>
}

// -----

// Attention with heads split over mp (grouped-query: 4 query heads, 2 kv
// heads): one reshard, after the output projection.
ernie.mesh @mesh(dp = 2, mp = 2)
// CHECK-LABEL: func.func @megatron_attention
// CHECK: ernie.rope {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}, {mp}, {}]>]
// CHECK: ernie.attention {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}, {mp}, {}]>]
// CHECK: ernie.matmul {{.*}}partial = {mp = sum}
// CHECK-COUNT-1: ernie.reshard
// CHECK-NOT: ernie.reshard
func.func @megatron_attention(%x: tensor<4x16x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}, {}]>},
    %wq: tensor<64x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
    %wk: tensor<64x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
    %wv: tensor<64x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
    %wo: tensor<64x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> tensor<4x16x64xf32> {
  %q = ernie.matmul %x, %wq : tensor<4x16x64xf32>, tensor<64x64xf32> -> tensor<4x16x64xf32>
  %k = ernie.matmul %x, %wk : tensor<4x16x64xf32>, tensor<64x32xf32> -> tensor<4x16x32xf32>
  %v = ernie.matmul %x, %wv : tensor<4x16x64xf32>, tensor<64x32xf32> -> tensor<4x16x32xf32>
  %q4 = ernie.reshape %q : tensor<4x16x64xf32> -> tensor<4x16x4x16xf32>
  %k4 = ernie.reshape %k : tensor<4x16x32xf32> -> tensor<4x16x2x16xf32>
  %v4 = ernie.reshape %v : tensor<4x16x32xf32> -> tensor<4x16x2x16xf32>
  %pos = ernie.iota dim = 0 : tensor<16xi64>
  %qr = ernie.rope %q4, %pos, theta = 10000.0 : tensor<4x16x4x16xf32>, tensor<16xi64>
  %kr = ernie.rope %k4, %pos, theta = 10000.0 : tensor<4x16x2x16xf32>, tensor<16xi64>
  %att = ernie.attention %qr, %kr, %v4 {causal} : tensor<4x16x4x16xf32>, tensor<4x16x2x16xf32>, tensor<4x16x2x16xf32> -> tensor<4x16x4x16xf32>
  %att2 = ernie.reshape %att : tensor<4x16x4x16xf32> -> tensor<4x16x64xf32>
  %o = ernie.matmul %att2, %wo : tensor<4x16x64xf32>, tensor<64x64xf32> -> tensor<4x16x64xf32>
  %h = ernie.add %x, %o : tensor<4x16x64xf32>
  return %h : tensor<4x16x64xf32>
}

// -----

// A data-parallel batch split runs through a whole Llama layer (norms, fused
// QKV, RoPE, grouped-query attention, SwiGLU) with no communication at all.
ernie.mesh @mesh(dp = 2, mp = 4)
// CHECK-LABEL: func.func @data_parallel_layer
// CHECK-NOT: ernie.reshard
// CHECK: ernie.attention {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}, {}, {}]>]
// CHECK-NOT: ernie.reshard
// CHECK: return
func.func @data_parallel_layer(%h0: tensor<4x16x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}, {}]>},
    %ln1: tensor<64xf32>, %wqkv: tensor<64x128xf32>, %wo: tensor<64x64xf32>, %ln2: tensor<64xf32>,
    %wgu: tensor<64x256xf32>, %wdown: tensor<128x64xf32>) -> tensor<4x16x64xf32> {
  %x = ernie.rms_norm %h0, %ln1, epsilon = 1.0e-6 : tensor<4x16x64xf32>, tensor<64xf32>
  %qkv = ernie.matmul %x, %wqkv : tensor<4x16x64xf32>, tensor<64x128xf32> -> tensor<4x16x128xf32>
  %q, %k, %v = ernie.split %qkv axis = 2, sizes = [64, 32, 32] : tensor<4x16x128xf32> -> tensor<4x16x64xf32>, tensor<4x16x32xf32>, tensor<4x16x32xf32>
  %q4 = ernie.reshape %q : tensor<4x16x64xf32> -> tensor<4x16x4x16xf32>
  %k4 = ernie.reshape %k : tensor<4x16x32xf32> -> tensor<4x16x2x16xf32>
  %v4 = ernie.reshape %v : tensor<4x16x32xf32> -> tensor<4x16x2x16xf32>
  %pos = ernie.iota dim = 0 : tensor<16xi64>
  %qr = ernie.rope %q4, %pos, theta = 10000.0 : tensor<4x16x4x16xf32>, tensor<16xi64>
  %kr = ernie.rope %k4, %pos, theta = 10000.0 : tensor<4x16x2x16xf32>, tensor<16xi64>
  %att = ernie.attention %qr, %kr, %v4 {causal} : tensor<4x16x4x16xf32>, tensor<4x16x2x16xf32>, tensor<4x16x2x16xf32> -> tensor<4x16x4x16xf32>
  %att2 = ernie.reshape %att : tensor<4x16x4x16xf32> -> tensor<4x16x64xf32>
  %o = ernie.matmul %att2, %wo : tensor<4x16x64xf32>, tensor<64x64xf32> -> tensor<4x16x64xf32>
  %h1 = ernie.add %h0, %o : tensor<4x16x64xf32>
  %y = ernie.rms_norm %h1, %ln2, epsilon = 1.0e-6 : tensor<4x16x64xf32>, tensor<64xf32>
  %gu = ernie.matmul %y, %wgu : tensor<4x16x64xf32>, tensor<64x256xf32> -> tensor<4x16x256xf32>
  %gate, %up = ernie.split %gu axis = 2, sizes = [128, 128] : tensor<4x16x256xf32> -> tensor<4x16x128xf32>, tensor<4x16x128xf32>
  %act = ernie.silu %gate : tensor<4x16x128xf32>
  %mix = ernie.mul %act, %up : tensor<4x16x128xf32>
  %down = ernie.matmul %mix, %wdown : tensor<4x16x128xf32>, tensor<128x64xf32> -> tensor<4x16x64xf32>
  %h2 = ernie.add %h1, %down : tensor<4x16x64xf32>
  return %h2 : tensor<4x16x64xf32>
}

// -----

// Transposes on a 2-D mesh move each axis with its dimension.
ernie.mesh @mesh(x = 2, y = 2)
// CHECK-LABEL: func.func @transpose_2d
// CHECK: ernie.transpose {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{y}, {}, {x}]>]
// CHECK: ernie.transpose {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{x}, {y}, {}]>]
// CHECK-NOT: ernie.reshard
func.func @transpose_2d(%a: tensor<4x6x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{x}, {}, {y}]>}) -> tensor<4x8x6xf32> {
  %0 = ernie.transpose %a, perm = [2, 1, 0] : tensor<4x6x8xf32> -> tensor<8x6x4xf32>
  %1 = ernie.transpose %0, perm = [2, 0, 1] : tensor<8x6x4xf32> -> tensor<4x8x6xf32>
  return %1 : tensor<4x8x6xf32>
}

// -----

// Backwards: a result placement reaches the arguments.
ernie.mesh @mesh(dp = 4)
// CHECK-LABEL: func.func @backwards
// CHECK-SAME: (%{{[a-z0-9]+}}: tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}, %{{[a-z0-9]+}}: tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>})
// CHECK-NOT: ernie.reshard
func.func @backwards(%a: tensor<8x4xf32>, %b: tensor<8x4xf32>)
    -> (tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}) {
  %0 = ernie.mul %a, %b : tensor<8x4xf32>
  %1 = ernie.tanh %0 : tensor<8x4xf32>
  return %1 : tensor<8x4xf32>
}

// -----

// Conflicting user annotations: the batch split meets a constraint asking
// for a replicated reduction. The one reshard sits on the small reduced
// tensor, not on the large input.
ernie.mesh @mesh(dp = 4)
// CHECK-LABEL: func.func @conflict
// CHECK: %[[S:.+]] = ernie.reduce_sum {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{dp}]>]
// CHECK: %[[R:.+]] = ernie.reshard %[[S]] <@mesh, [{}]> : tensor<1024xf32>
// CHECK-NOT: ernie.reshard
// CHECK-NOT: ernie.sharding_constraint
// CHECK: ernie.exp %[[R]] {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{}]>]
func.func @conflict(%x: tensor<1024x256xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}) -> tensor<1024xf32> {
  %s = ernie.reduce_sum %x axes = [1] : tensor<1024x256xf32> -> tensor<1024xf32>
  %c = ernie.sharding_constraint %s <@mesh, [{}]> : tensor<1024xf32>
  %e = ernie.exp %c : tensor<1024xf32>
  return %e : tensor<1024xf32>
}

// -----

// Priorities: the strongest annotation (0) settles the shared chain first;
// the weaker one (1) gets a reshard where it is.
ernie.mesh @mesh(x = 2, y = 2)
// CHECK-LABEL: func.func @priorities
// CHECK: ernie.exp {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{y}, {}]>]
// CHECK: %[[R:.+]] = ernie.reshard %{{.*}} <@mesh, [{x}, {}]>
// CHECK: ernie.neg %[[R]] {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{x}, {}]>]
// CHECK: ernie.tanh {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{y}, {}]>]
func.func @priorities(%a: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>) {
  %0 = ernie.exp %a : tensor<8x8xf32>
  %weak = ernie.sharding_constraint %0 <@mesh, [{x}, {}]> {priority = 1} : tensor<8x8xf32>
  %1 = ernie.neg %weak : tensor<8x8xf32>
  %strong = ernie.sharding_constraint %0 <@mesh, [{y}, {}]> : tensor<8x8xf32>
  %2 = ernie.tanh %strong : tensor<8x8xf32>
  return %1, %2 : tensor<8x8xf32>, tensor<8x8xf32>
}

// -----

// Through calls: the callee's arguments and results take the caller's
// placements, and the caller's values take the callee's.
ernie.mesh @mesh(dp = 2)
// CHECK-LABEL: func.func @caller
// CHECK: call @callee({{.*}}) {ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}]>]}
// CHECK-LABEL: func.func @callee
// CHECK-SAME: {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}
// CHECK: ernie.sigmoid {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}]>]
func.func @caller(%x: tensor<4x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}) -> tensor<4x4xf32> {
  %0 = func.call @callee(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %1 = ernie.exp %0 : tensor<4x4xf32>
  return %1 : tensor<4x4xf32>
}
func.func @callee(%y: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %0 = ernie.sigmoid %y : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// A mesh but no annotation: every value is replicated, nothing moves.
ernie.mesh @mesh(dp = 2)
// CHECK-LABEL: func.func @unannotated
// CHECK-SAME: {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}
// CHECK: ernie.exp {{.*}}ernie.shardings = [#ernie.sharding<@mesh, [{}, {}]>]
// CHECK-NOT: ernie.reshard
func.func @unannotated(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %0 = ernie.exp %x : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// An external function's signature is a placement like any other.
ernie.mesh @mesh(dp = 2)
func.func private @ext(tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}) -> (tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {dp}]>})
// CHECK-LABEL: func.func @calls_external
// CHECK: %[[R:.+]] = ernie.reshard %{{.*}} <@mesh, [{dp}, {}]>
// CHECK: call @ext(%[[R]]) {ernie.shardings = [#ernie.sharding<@mesh, [{}, {dp}]>]}
// CHECK: ernie.exp {{.*}}[#ernie.sharding<@mesh, [{}, {dp}]>]
func.func @calls_external(%x: tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}) -> tensor<8x4xf32> {
  %0 = func.call @ext(%x) : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %1 = ernie.exp %0 : tensor<8x4xf32>
  return %1 : tensor<8x4xf32>
}

// -----

// A weight gradient ZeRO-2 wants split over dp: the matmul over the
// batch-split activations yields a pending sum, reduce-scattered where it
// is returned. The result's wanted layout does not pull the activations to
// another split (that took an all-to-all and a gather per gradient).
ernie.mesh @mesh(dp = 2)
// CHECK-LABEL: func.func @zero2_weight_gradient
// CHECK-NOT: ernie.reshard %arg
// CHECK: %[[G:.+]] = ernie.matmul {{.*}}partial = {dp = sum}
// CHECK-NEXT: %[[S:.+]] = ernie.reshard %[[G]] <@mesh, [{dp}, {}]>
// CHECK-NEXT: return %[[S]]
func.func @zero2_weight_gradient(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}, %dy: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}) -> (tensor<16x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}) {
  %0 = ernie.matmul %x, %dy {transpose_a} : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<16x16xf32>
  return %0 : tensor<16x16xf32>
}

// -----

// Megatron's sequence-parallel embedding: the table split over hidden, the
// output wanted split over the sequence. Each rank looks up every token in
// its hidden slice and the output is exchanged all-to-all (s x h), rather
// than the tokens split and the whole [vocabulary, hidden] table gathered.
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @sequence_parallel_embedding
// CHECK-NOT: ernie.reshard %arg1
// CHECK: %[[E:.+]] = ernie.embedding %arg0, %arg1 {ernie.shardings = [#ernie.sharding<@mesh, [{}, {}, {mp}]>]}
// CHECK-NEXT: %[[S:.+]] = ernie.reshard %[[E]] <@mesh, [{}, {mp}, {}]>
// CHECK-NEXT: return %[[S]]
func.func @sequence_parallel_embedding(%ids: tensor<1x128xi64>, %w: tensor<4096x256xbf16> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>}) -> tensor<1x128x256xbf16> {
  %0 = ernie.embedding %ids, %w : tensor<1x128xi64>, tensor<4096x256xbf16> -> tensor<1x128x256xbf16>
  %1 = ernie.sharding_constraint %0 <@mesh, [{}, {mp}, {}]> {priority = 1 : i64} : tensor<1x128x256xbf16>
  return %1 : tensor<1x128x256xbf16>
}

// -----

// Its gradient: the sequence-split output gradient summed into the table
// by token would leave a whole [vocabulary, hidden] pending sum to
// reduce-scatter; the table's gradient is wanted hidden-split (autodiff's
// constraint), so the output gradient is exchanged all-to-all instead and
// each rank sums into its own hidden slice.
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @sequence_parallel_embedding_gradient
// CHECK: %[[G:.+]] = ernie.reshard %arg2 <@mesh, [{}, {}, {mp}]>
// CHECK: ernie.index_add %{{.+}}, %{{.+}}, %[[G]] axis = 0 {ernie.shardings = [#ernie.sharding<@mesh, [{}, {mp}]>]}
// CHECK-NOT: partial
// CHECK: return
func.func @sequence_parallel_embedding_gradient(%ids: tensor<1x128xi64>, %w: tensor<4096x256xbf16> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>}, %dy: tensor<1x128x256xbf16> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}, {}]>}) -> tensor<4096x256xbf16> {
  %z = ernie.full 0.000000e+00 : tensor<4096x256xbf16>
  %0 = ernie.index_add %z, %ids, %dy axis = 0 : tensor<4096x256xbf16>, tensor<1x128xi64>, tensor<1x128x256xbf16> -> tensor<4096x256xbf16>
  %1 = ernie.sharding_constraint %0 <@mesh, [{}, {mp}]> {priority = 1 : i64} : tensor<4096x256xbf16>
  return %1 : tensor<4096x256xbf16>
}

// -----

// The same under data parallelism: the batch's sum over dp is not the
// producer's to avoid, so it stays pending (all-reduced over dp as every
// gradient is) while the sum over mp's sequence pieces is avoided.
ernie.mesh @mesh(dp = 2, mp = 2)
// CHECK-LABEL: func.func @sequence_parallel_embedding_gradient_dp
// CHECK: %[[G:.+]] = ernie.reshard %arg2 <@mesh, [{dp}, {}, {mp}]>
// CHECK: %[[T:.+]] = ernie.index_add %{{.+}}, %{{.+}}, %[[G]] axis = 0 {ernie.shardings = [#ernie.sharding<@mesh, [{}, {mp}], partial = {dp = sum}>]}
// CHECK-NEXT: %[[R:.+]] = ernie.reshard %[[T]] <@mesh, [{}, {mp}]>
// CHECK-NEXT: return %[[R]]
func.func @sequence_parallel_embedding_gradient_dp(%ids: tensor<2x128xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}, %w: tensor<4096x256xbf16> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>}, %dy: tensor<2x128x256xbf16> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {mp}, {}]>}) -> tensor<4096x256xbf16> {
  %z = ernie.full 0.000000e+00 : tensor<4096x256xbf16>
  %0 = ernie.index_add %z, %ids, %dy axis = 0 : tensor<4096x256xbf16>, tensor<2x128xi64>, tensor<2x128x256xbf16> -> tensor<4096x256xbf16>
  %1 = ernie.sharding_constraint %0 <@mesh, [{}, {mp}]> {priority = 1 : i64} : tensor<4096x256xbf16>
  return %1 : tensor<4096x256xbf16>
}
