// RUN: ernie-opt %s --ernie-memory-plan --split-input-file 2>/dev/null | FileCheck %s
// RUN: ernie-opt %s --ernie-memory-plan --split-input-file 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// A chain of elementwise ops writes over its dying operands. Arguments are
// the caller's tensors, outside the arena (after it, at offsets of their
// own): the add may not write its scratch over %x, so the chain lives in
// one arena buffer.
// REMARK: remark: memory plan: arena 64 bytes per rank (arguments 128 beside it), live peak 64, 3 buffers, 2 written in place
// CHECK-LABEL: func.func @chain
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<16xf32> {ernie.buffer_offset = 64 : i64}
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<16xf32> {ernie.buffer_offset = 128 : i64}
// CHECK-SAME: ernie.arena_bytes = 64 : i64, ernie.argument_bytes = 128 : i64, ernie.live_peak_bytes = 64 : i64
// CHECK: ernie.add {{.*}}ernie.buffer_offsets = array<i64: 0>
// CHECK: ernie.exp {{.*}}ernie.buffer_offsets = array<i64: 0>
// CHECK: ernie.mul {{.*}}ernie.buffer_offsets = array<i64: 0>
func.func @chain(%x: tensor<16xf32>, %y: tensor<16xf32>) -> tensor<16xf32> {
  %a = ernie.add %x, %y : tensor<16xf32>
  %b = ernie.exp %a : tensor<16xf32>
  %c = ernie.mul %b, %y : tensor<16xf32>
  return %c : tensor<16xf32>
}

// -----

// An operand used later is not overwritten (exp keeps %x, matmul's result
// is returned so neg gets fresh bytes: those %x held, dead by then); a
// result of another type never takes an operand's place (compare makes i1);
// matmul is not elementwise. Only add over its dying operand is in place.
// REMARK: remark: memory plan: arena 192 bytes per rank (arguments 64 beside it), live peak 144, 5 buffers, 1 written in place
// CHECK-LABEL: func.func @kept
// CHECK-SAME: {ernie.buffer_offset = 192 : i64}
// CHECK: ernie.exp {{.*}}ernie.buffer_offsets = array<i64: 0>
// CHECK: ernie.compare {{.*}}ernie.buffer_offsets = array<i64: 128>
// CHECK: ernie.matmul {{.*}}ernie.buffer_offsets = array<i64: 64>
// CHECK: ernie.neg {{.*}}ernie.buffer_offsets = array<i64: 0>
// CHECK: ernie.add {{.*}}ernie.buffer_offsets = array<i64: 0>
func.func @kept(%x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xi1>, tensor<4x4xf32>) {
  %e = ernie.exp %x : tensor<4x4xf32>
  %c = ernie.compare gt, %e, %x : tensor<4x4xf32>
  %m = ernie.matmul %e, %x : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %n = ernie.neg %m : tensor<4x4xf32>
  %s = ernie.add %n, %n : tensor<4x4xf32>
  return %s, %c, %m : tensor<4x4xf32>, tensor<4x4xi1>, tensor<4x4xf32>
}

// -----

// Buffers whose lifetimes do not overlap share bytes: the arena is the
// live peak, not the sum (4 x 4 KiB buffers, at most 2 alive at once).
// REMARK: remark: memory plan: arena 8192 bytes per rank (arguments 4096 beside it), live peak 8192, 4 buffers, 0 written in place
func.func @reuse(%x: tensor<32x32xf32>) -> tensor<32x32xf32> {
  %a = ernie.transpose %x, perm = [1, 0] : tensor<32x32xf32> -> tensor<32x32xf32>
  %b = ernie.transpose %a, perm = [1, 0] : tensor<32x32xf32> -> tensor<32x32xf32>
  %c = ernie.transpose %b, perm = [1, 0] : tensor<32x32xf32> -> tensor<32x32xf32>
  return %c : tensor<32x32xf32>
}

// -----

// An asynchronous shift: the received tensor is the future's buffer (no
// copy), and the sent tensor stays untouched until the wait — the exp in
// between may not write over it though it is its last reader. shard_insert
// writes into its dying destination.
ernie.mesh @mesh(mp = 2)
// REMARK: remark: memory plan: arena 256 bytes per rank (arguments 64 beside it), live peak 256, 4 buffers, 1 written in place
// CHECK-LABEL: func.func @async_shift
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<4x4xf32> {ernie.buffer_offset = [[X:[0-9]+]] : i64}
// The fill moves next to its reader (sinkFills), so it is live only there.
// CHECK: ernie.collective_permute_start {{.*}}ernie.buffer_offsets = array<i64: [[F:[0-9]+]]>
// CHECK: ernie.exp {{.*}}ernie.buffer_offsets = array<i64: [[E:[0-9]+]]>
// CHECK: ernie.wait {{.*}}ernie.buffer_offsets = array<i64: [[F]]>
// CHECK: ernie.full {{.*}}ernie.buffer_offsets = array<i64: [[ACC:[0-9]+]]>
// CHECK: ernie.shard_insert {{.*}}ernie.buffer_offsets = array<i64: [[ACC]]>
func.func @async_shift(%x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<8x4xf32>) {
  %acc = ernie.full 0.0 : tensor<8x4xf32>
  %f = ernie.collective_permute_start %x over @mesh[mp] shift = 1 : tensor<4x4xf32>
  %e = ernie.exp %x : tensor<4x4xf32>
  %y = ernie.wait %f : tensor<4x4xf32>
  %r = ernie.shard_insert %y into %acc over @mesh[mp] dim = 0 : tensor<4x4xf32> -> tensor<8x4xf32>
  return %e, %r : tensor<4x4xf32>, tensor<8x4xf32>
}

// -----

// A reshape is a view: its result sits at its operand's offset and moves no
// bytes, and the memory stays taken while any value sharing it lives: the
// neg reads the view %v as it dies, but %r (the same bytes) is read later,
// so the neg gets fresh bytes instead of writing over them. Views of an
// argument are the caller's memory too (after the arena); the tanh may not
// write its scratch over %y, and the add writes over the tanh's.
// REMARK: remark: memory plan: arena 128 bytes per rank (arguments 128 beside it), live peak 128, 6 buffers, 1 written in place
// CHECK-LABEL: func.func @views
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<4x4xf32> {ernie.buffer_offset = [[X:[0-9]+]] : i64}
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<16xf32> {ernie.buffer_offset = [[Y:[0-9]+]] : i64}
// CHECK-SAME: ernie.arena_bytes = 128 : i64
// CHECK: ernie.reshape {{.*}}ernie.buffer_offsets = array<i64: [[X]]>
// CHECK: ernie.reshape {{.*}}ernie.buffer_offsets = array<i64: [[X]]>
// CHECK: ernie.tanh {{.*}}ernie.buffer_offsets = array<i64: [[T:[0-9]+]]>
// CHECK-NOT: array<i64: [[X]]>
// CHECK: ernie.neg
// CHECK: ernie.add {{.*}}ernie.buffer_offsets = array<i64: [[T]]>
func.func @views(%x: tensor<4x4xf32>, %y: tensor<16xf32>) -> (tensor<16xf32>, tensor<2x8xf32>) {
  %r = ernie.reshape %x : tensor<4x4xf32> -> tensor<16xf32>
  %v = ernie.reshape %r : tensor<16xf32> -> tensor<2x8xf32>
  %t = ernie.tanh %y : tensor<16xf32>
  %n = ernie.neg %v : tensor<2x8xf32>
  %s = ernie.add %t, %r : tensor<16xf32>
  return %s, %n : tensor<16xf32>, tensor<2x8xf32>
}

// -----

// A matmul_accumulate writes its result over its dying accumulator (the
// GEMM adds into it): the running sum an argument brings is the result the
// function returns, in the same bytes (the caller's: it donates the sum).
// REMARK: remark: memory plan: arena 64 bytes per rank (arguments 320 beside it), live peak 64, 4 buffers, 1 written in place
// CHECK-LABEL: func.func @accumulate
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<4x8xf32> {ernie.buffer_offset = {{[0-9]+}} : i64}
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<4x8xf32> {ernie.buffer_offset = [[SUM:[0-9]+]] : i64}
// CHECK: ernie.matmul_accumulate {{.*}}ernie.buffer_offsets = array<i64: [[SUM]]>
func.func @accumulate(%x: tensor<4x4xf32>, %y: tensor<4x8xf32>, %sum: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %e = ernie.exp %x : tensor<4x4xf32>
  %g = ernie.matmul_accumulate %e, %y, %sum : tensor<4x4xf32>, tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  return %g : tensor<4x8xf32>
}

// -----

// But not over an accumulator whose memory a factor shares (here the same
// value, dying at the GEMM): the GEMM would write what it still reads.
// REMARK: remark: memory plan: arena 64 bytes per rank (arguments 128 beside it), live peak 64, 3 buffers, 0 written in place
// CHECK-LABEL: func.func @accumulate_into_a_factor
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<4x4xf32> {ernie.buffer_offset = [[S:[0-9]+]] : i64}
// CHECK-NOT: ernie.buffer_offsets = array<i64: [[S]]>
// CHECK: return
func.func @accumulate_into_a_factor(%s: tensor<4x4xf32>, %y: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %g = ernie.matmul_accumulate %s, %y, %s : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  return %g : tensor<4x4xf32>
}

// -----

// An optimizer update writes the new parameter and moments over the old
// ones (each element is read before it is written): the returned state is
// in the caller's tensors, which it donates, and the arena holds none of it.
// Returning only the parameter, the moments get arena bytes: an argument's
// buffer takes no scratch.
// REMARK: remark: memory plan: arena 0 bytes per rank (arguments 1152 beside it), live peak 0, 6 buffers, 3 written in place
// CHECK-LABEL: func.func @update
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<64xf32> {ernie.buffer_offset = [[P:[0-9]+]] : i64}
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<64xf32> {ernie.buffer_offset = {{[0-9]+}} : i64}
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<64xf32> {ernie.buffer_offset = [[M:[0-9]+]] : i64}
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<64xf32> {ernie.buffer_offset = [[V:[0-9]+]] : i64}
// CHECK: ernie.adamw_update {{.*}}ernie.buffer_offsets = array<i64: [[P]], [[M]], [[V]]>
func.func @update(%p: tensor<64xf32>, %g: tensor<64xf32>, %m: tensor<64xf32>, %v: tensor<64xf32>,
                  %lr: tensor<f32>, %t: tensor<i64>) -> (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>) {
  %p2, %m2, %v2 = ernie.adamw_update %p, %g, %m, %v, %lr, %t : tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<i64>
  return %p2, %m2, %v2 : tensor<64xf32>, tensor<64xf32>, tensor<64xf32>
}

// -----

// REMARK: remark: memory plan: arena 640 bytes per rank (arguments 1024 beside it), live peak 524, 8 buffers, 1 written in place
// CHECK-LABEL: func.func @update_parameter_only
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<64xf32> {ernie.buffer_offset = [[P:[0-9]+]] : i64}
// CHECK: ernie.adamw_update {{.*}}ernie.buffer_offsets = array<i64: [[P]], {{[0-9]+}}, {{[0-9]+}}>
func.func @update_parameter_only(%p: tensor<64xf32>, %g: tensor<64xf32>, %m: tensor<64xf32>, %v: tensor<64xf32>) -> tensor<64xf32> {
  %lr = ernie.full 1.0e-3 : tensor<f32>
  %t = ernie.full 1 : tensor<i64>
  %p2, %m2, %v2 = ernie.adamw_update %p, %g, %m, %v, %lr, %t : tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<i64>
  return %p2 : tensor<64xf32>
}

// -----

// A value returned in place of a state (`ernie.updates`) is made in that
// state's argument buffer once the argument is dead: ZeRO-1's gathered
// parameter lands in the parameter the caller donates, not in the arena.
// And a pipeline's gradient sum (`ernie.gradient`) is consumed by the call
// that takes it: scratch may be written over it.
ernie.mesh @mesh(dp = 2)
// REMARK: remark: memory plan: arena 128 bytes per rank (arguments 256 beside it), live peak 128, 4 buffers, 3 written in place
// CHECK-LABEL: func.func @zero1_update
// CHECK-SAME: {ernie.buffer_offset = [[P:[0-9]+]] : i64, ernie.param = "w"}
// CHECK-SAME: {ernie.buffer_offset = [[G:[0-9]+]] : i64, ernie.gradient = "grad.0"}
// CHECK: ernie.exp {{.*}}ernie.buffer_offsets = array<i64: [[G]]>
// CHECK: ernie.all_gather {{.*}}ernie.buffer_offsets = array<i64: [[P]]>
func.func @zero1_update(%p: tensor<8x4xf32> {ernie.param = "w"}, %g: tensor<8x4xf32> {ernie.gradient = "grad.0"})
    -> (tensor<8x4xf32> {ernie.updates = "w"}) {
  %s = ernie.exp %g : tensor<8x4xf32>
  %r = ernie.reduce_scatter %s over @mesh[dp] dim = 0 sum : tensor<8x4xf32> -> tensor<4x4xf32>
  %shard = ernie.shard_slice %p over @mesh[dp] dim = 0 : tensor<8x4xf32> -> tensor<4x4xf32>
  %new = ernie.sub %shard, %r : tensor<4x4xf32>
  %full = ernie.all_gather %new over @mesh[dp] dim = 0 : tensor<4x4xf32> -> tensor<8x4xf32>
  return %full : tensor<8x4xf32>
}
