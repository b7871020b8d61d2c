// Every verifier and type-inference rule of the ernie dialect, broken once.
// RUN: ernie-opt %s --split-input-file --verify-diagnostics

func.func @exp_of_integers(%x: tensor<4xi32>) {
  // expected-error @+1 {{operand #0 must be statically shaped tensor of}}
  %0 = ernie.exp %x : tensor<4xi32>
  return
}

// -----

func.func @dynamic_shape(%x: tensor<?xf32>) {
  // expected-error @+1 {{must be statically shaped tensor}}
  %0 = ernie.neg %x : tensor<?xf32>
  return
}

// -----

func.func @unsupported_element_type(%x: tensor<4xi16>) {
  // expected-error @+1 {{must be statically shaped tensor of}}
  %0 = ernie.add %x, %x : tensor<4xi16>
  return
}

// -----

func.func @unaddressable(%x: tensor<4611686018427387904x4xf32>) {
  // expected-error @+1 {{must be statically shaped tensor of}}
  %0 = ernie.neg %x : tensor<4611686018427387904x4xf32>
  return
}

// -----

// Addressable as bf16 (2^63 - 2^33 bytes) but not as the f32 a pass would
// make of it (a pipeline's main gradient, a norm's statistics): the bound
// is at 8 bytes an element, so no retyping leaves it (ernie-fuzz-mlir
// aborted building such an f32 sum).
func.func @unaddressable_widened(%x: tensor<2147483647x2147483647xbf16>) {
  // expected-error @+1 {{operand #0 must be statically shaped tensor of 64-bit float or 32-bit float or 16-bit float or bfloat16 type or f8E4M3FN type or f8E5M2 type or 64-bit signless integer or 32-bit signless integer values with fewer than 2^60 elements, but got 'tensor<2147483647x2147483647xbf16>'}}
  %0 = ernie.neg %x : tensor<2147483647x2147483647xbf16>
  return
}

// -----

// 2^60 - 1 elements of f64: the largest shape there is.
func.func @largest(%x: tensor<1152921504606846975xf64>) {
  %0 = ernie.neg %x : tensor<1152921504606846975xf64>
  return
}

// -----

func.func @binary_type_mismatch(%x: tensor<4xf32>, %y: tensor<4xf64>) {
  // expected-error @+1 {{requires the same type for all operands and results}}
  %0 = "ernie.add"(%x, %y) : (tensor<4xf32>, tensor<4xf64>) -> tensor<4xf32>
  return
}

// -----

func.func @binary_shape_mismatch(%x: tensor<4xf32>, %y: tensor<8xf32>) {
  // expected-error @+1 {{all non-scalar operands/results must have the same shape and base type}}
  %0 = "ernie.mul"(%x, %y) : (tensor<4xf32>, tensor<8xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @binary_operand_count(%x: tensor<4xf32>) {
  // expected-error @+1 {{expected 2 operands, but found 1}}
  %0 = "ernie.sub"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @cast_shape(%x: tensor<4xf32>) {
  // expected-error @+1 {{all non-scalar operands/results must have the same shape and base type}}
  %0 = ernie.cast %x : tensor<4xf32> -> tensor<8xbf16>
  return
}

// -----

func.func @compare_mismatch(%x: tensor<4xf32>, %y: tensor<4xf64>) {
  // expected-error @+1 {{requires all operands to have the same type}}
  %0 = "ernie.compare"(%x, %y) {direction = 2 : i32} : (tensor<4xf32>, tensor<4xf64>) -> tensor<4xi1>
  return
}

// -----

func.func @compare_bad_result(%x: tensor<4xf32>) {
  // expected-error @+1 {{result #0 must be statically shaped tensor of 1-bit signless integer values with fewer than 2^60 elements, but got 'tensor<4xf32>'}}
  %0 = "ernie.compare"(%x, %x) {direction = 0 : i32} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @compare_unknown_direction(%x: tensor<4xf32>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'direction' [eq, ne, lt, le, gt, ge]}}
  %0 = ernie.compare lq, %x, %x : tensor<4xf32>
  return
}

// -----

func.func @select_cond_shape(%c: tensor<2xi1>, %x: tensor<4xf32>) {
  // expected-error @+1 {{all of {cond, result} have same shape}}
  %0 = ernie.select %c, %x, %x : tensor<2xi1>, tensor<4xf32>
  return
}

// -----

func.func @select_branch_types(%c: tensor<4xi1>, %x: tensor<4xf32>, %y: tensor<4xf16>) {
  // expected-error @+1 {{all of {on_true, on_false, result} have same type}}
  %0 = "ernie.select"(%c, %x, %y) : (tensor<4xi1>, tensor<4xf32>, tensor<4xf16>) -> tensor<4xf32>
  return
}

// -----

func.func @constant_type_mismatch() {
  // expected-error @+1 {{all of {value, result} have same type}}
  %0 = "ernie.constant"() {value = dense<1.0> : tensor<2xf32>} : () -> tensor<3xf32>
  return
}

// -----

func.func @full_value_type() {
  // expected-error @+1 {{fill value has type 'f64' but the result's element type is 'f32'}}
  %0 = "ernie.full"() {value = 1.0 : f64} : () -> tensor<2xf32>
  return
}

// -----

func.func @full_typed_literal() {
  // expected-error @+1 {{fill value has type 'f16' but the result's element type is 'f32'}}
  %0 = ernie.full (0x7C00 : f16) : tensor<2xf32>
  return
}

// -----

func.func @full_int_overflow() {
  // expected-error @+1 {{fill value 2 does not fit in 'i1'}}
  %0 = ernie.full 2 : tensor<2xi1>
  return
}

// -----

func.func @full_int_overflow_i32() {
  // expected-error @+1 {{fill value 4294967296 does not fit in 'i32'}}
  %0 = ernie.full 4294967296 : tensor<2xi32>
  return
}

// -----

func.func @full_float_into_int() {
  // expected-error @+1 {{expected an integer to fill 'tensor<2xi64>'}}
  %0 = ernie.full 1.5 : tensor<2xi64>
  return
}

// -----

func.func @iota_out_of_range() {
  // expected-error @+1 {{dimension 2 is out of range for a tensor of rank 2}}
  %0 = ernie.iota dim = 2 : tensor<2x3xi64>
  return
}

// -----

func.func @iota_negative() {
  // expected-error @+1 {{attribute 'dimension' failed to satisfy constraint: 64-bit signless integer attribute whose value is non-negative}}
  %0 = ernie.iota dim = -1 : tensor<2x3xi64>
  return
}

// -----

func.func @matmul_rank(%a: tensor<4xf32>, %b: tensor<4x4xf32>) {
  // expected-error @+1 {{matmul operands need rank >= 2, got 1 and 2}}
  %0 = ernie.matmul %a, %b : tensor<4xf32>, tensor<4x4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @matmul_contraction(%a: tensor<2x3xf32>, %b: tensor<4x5xf32>) {
  // expected-error @+1 {{matmul contraction sizes differ: lhs has 3, rhs has 4}}
  %0 = ernie.matmul %a, %b : tensor<2x3xf32>, tensor<4x5xf32> -> tensor<2x5xf32>
  return
}

// -----

func.func @matmul_accumulate_shape(%a: tensor<2x3xbf16>, %b: tensor<3x5xbf16>, %acc: tensor<2x4xf32>) {
  // expected-error @+1 {{the accumulator must have the product's shape [2, 5], got [2, 4]}}
  %0 = ernie.matmul_accumulate %a, %b, %acc : tensor<2x3xbf16>, tensor<3x5xbf16>, tensor<2x4xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @matmul_accumulate_narrow_sum(%a: tensor<2x3xf32>, %b: tensor<3x5xf32>, %acc: tensor<2x5xbf16>) {
  // expected-error @+1 {{matmul_accumulate accumulates 'f32' products in 'f32', not 'bf16'}}
  %0 = ernie.matmul_accumulate %a, %b, %acc : tensor<2x3xf32>, tensor<3x5xf32>, tensor<2x5xbf16> -> tensor<2x5xbf16>
  return
}

// -----

func.func @matmul_accumulate_result(%a: tensor<2x3xbf16>, %b: tensor<3x5xbf16>, %acc: tensor<2x5xf32>) {
  // expected-error @+2 {{inferred type(s) 'tensor<2x5xf32>' are incompatible with return type(s) of operation 'tensor<2x5xbf16>'}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = ernie.matmul_accumulate %a, %b, %acc : tensor<2x3xbf16>, tensor<3x5xbf16>, tensor<2x5xf32> -> tensor<2x5xbf16>
  return
}

// -----

func.func @matmul_transposed_contraction(%a: tensor<2x3xf32>, %b: tensor<3x5xf32>) {
  // expected-error @+1 {{matmul contraction sizes differ: lhs has 2, rhs has 3}}
  %0 = ernie.matmul %a, %b {transpose_a} : tensor<2x3xf32>, tensor<3x5xf32> -> tensor<3x5xf32>
  return
}

// -----

func.func @matmul_batch(%a: tensor<2x4x3xf32>, %b: tensor<3x3x5xf32>) {
  // expected-error @+1 {{matmul batch dimensions differ: [2] vs [3]}}
  %0 = ernie.matmul %a, %b : tensor<2x4x3xf32>, tensor<3x3x5xf32> -> tensor<2x4x5xf32>
  return
}

// -----

func.func @matmul_element_types(%a: tensor<2x3xf32>, %b: tensor<3x5xbf16>) {
  // expected-error @+1 {{matmul operands have different element types: 'f32' and 'bf16'}}
  %0 = ernie.matmul %a, %b : tensor<2x3xf32>, tensor<3x5xbf16> -> tensor<2x5xf32>
  return
}

// -----

func.func @matmul_result(%a: tensor<2x3xf32>, %b: tensor<3x5xf32>) {
  // expected-error @+2 {{inferred type(s) 'tensor<2x5xf32>' are incompatible with return type(s) of operation 'tensor<5x2xf32>'}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = ernie.matmul %a, %b : tensor<2x3xf32>, tensor<3x5xf32> -> tensor<5x2xf32>
  return
}

// -----

func.func @reduce_axis_range(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{axis 2 is out of range for a tensor of rank 2}}
  %0 = ernie.reduce_sum %x axes = [2] : tensor<2x3xf32> -> tensor<2x3xf32>
  return
}

// -----

func.func @reduce_axes_unsorted(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{reduction axes must be sorted and distinct, got [1, 0]}}
  %0 = ernie.reduce_max %x axes = [1, 0] : tensor<2x3xf32> -> tensor<f32>
  return
}

// -----

func.func @reduce_axes_repeated(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{reduction axes must be sorted and distinct, got [1, 1]}}
  %0 = ernie.reduce_max %x axes = [1, 1] : tensor<2x3xf32> -> tensor<2xf32>
  return
}

// -----

func.func @reduce_result(%x: tensor<2x3xf32>) {
  // expected-error @+2 {{inferred type(s) 'tensor<2x1xf32>' are incompatible with return type(s) of operation 'tensor<2xf32>'}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = ernie.reduce_mean %x axes = [1] keepdim : tensor<2x3xf32> -> tensor<2xf32>
  return
}

// -----

func.func @reduce_mean_integers(%x: tensor<2x3xi32>) {
  // expected-error @+1 {{operand #0 must be statically shaped tensor of}}
  %0 = ernie.reduce_mean %x axes = [1] : tensor<2x3xi32> -> tensor<2xi32>
  return
}

// -----

func.func @softmax_axis(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{axis 2 is out of range for a tensor of rank 2}}
  %0 = ernie.softmax %x, axis = 2 : tensor<2x3xf32>
  return
}

// -----

func.func @log_softmax_axis(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{axis 5 is out of range for a tensor of rank 2}}
  %0 = ernie.log_softmax %x, axis = 5 : tensor<2x3xf32>
  return
}

// -----

func.func @rms_norm_weight(%x: tensor<2x8xf32>, %w: tensor<4xf32>) {
  // expected-error @+1 {{weight must have shape [8] (the input's last dimension), got [4]}}
  %0 = ernie.rms_norm %x, %w, epsilon = 1.0e-6 : tensor<2x8xf32>, tensor<4xf32>
  return
}

// -----

func.func @rms_norm_scalar(%x: tensor<f32>, %w: tensor<1xf32>) {
  // expected-error @+1 {{input must have rank >= 1}}
  %0 = ernie.rms_norm %x, %w, epsilon = 1.0e-6 : tensor<f32>, tensor<1xf32>
  return
}

// -----

func.func @rms_norm_epsilon(%x: tensor<2x8xf32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{epsilon must be non-negative, got -1}}
  %0 = ernie.rms_norm %x, %w, epsilon = -1.0 : tensor<2x8xf32>, tensor<8xf32>
  return
}

// -----

func.func @layer_norm_bias(%x: tensor<2x8xf32>, %w: tensor<8xf32>, %b: tensor<2x8xf32>) {
  // expected-error @+1 {{all of {weight, bias} have same type}}
  %0 = "ernie.layer_norm"(%x, %w, %b) {epsilon = 1.0e-5 : f64} : (tensor<2x8xf32>, tensor<8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @layer_norm_weight(%x: tensor<2x8xf32>, %w: tensor<1x8xf32>) {
  // expected-error @+1 {{weight must have shape [8] (the input's last dimension), got [1, 8]}}
  %0 = ernie.layer_norm %x, %w, %w, epsilon = 1.0e-5 : tensor<2x8xf32>, tensor<1x8xf32>
  return
}

// -----

func.func @reshape_count(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{element count changes from 16 [2, 8] to 15 [3, 5]}}
  %0 = ernie.reshape %x : tensor<2x8xf32> -> tensor<3x5xf32>
  return
}

// -----

func.func @reshape_element_type(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{cannot change the element type ('f32' to 'f16'); use ernie.cast}}
  %0 = ernie.reshape %x : tensor<2x8xf32> -> tensor<16xf16>
  return
}

// -----

func.func @transpose_repeated(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{perm [0, 0] is not a permutation of 2 dimensions}}
  %0 = ernie.transpose %x, perm = [0, 0] : tensor<2x3xf32> -> tensor<2x2xf32>
  return
}

// -----

func.func @transpose_length(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{perm [1, 0, 2] is not a permutation of 2 dimensions}}
  %0 = ernie.transpose %x, perm = [1, 0, 2] : tensor<2x3xf32> -> tensor<3x2xf32>
  return
}

// -----

func.func @transpose_result(%x: tensor<2x3xf32>) {
  // expected-error @+2 {{inferred type(s) 'tensor<3x2xf32>' are incompatible with return type(s) of operation 'tensor<2x3xf32>'}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = ernie.transpose %x, perm = [1, 0] : tensor<2x3xf32> -> tensor<2x3xf32>
  return
}

// -----

func.func @broadcast_dims_count(%x: tensor<4xf32>) {
  // expected-error @+1 {{dims has 2 entries but the input has rank 1}}
  %0 = ernie.broadcast %x, dims = [0, 1] : tensor<4xf32> -> tensor<4x4xf32>
  return
}

// -----

func.func @broadcast_dims_range(%x: tensor<4xf32>) {
  // expected-error @+1 {{dims[0] = 2 is out of range for a result of rank 2}}
  %0 = ernie.broadcast %x, dims = [2] : tensor<4xf32> -> tensor<3x4xf32>
  return
}

// -----

func.func @broadcast_dims_order(%x: tensor<4x4xf32>) {
  // expected-error @+1 {{dims must be strictly increasing, got [1, 0]}}
  %0 = ernie.broadcast %x, dims = [1, 0] : tensor<4x4xf32> -> tensor<4x4xf32>
  return
}

// -----

func.func @broadcast_size(%x: tensor<3xf32>) {
  // expected-error @+1 {{input dimension 0 of size 3 cannot broadcast to result dimension 1 of size 4}}
  %0 = ernie.broadcast %x, dims = [1] : tensor<3xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @broadcast_element_type(%x: tensor<4xf32>) {
  // expected-error @+1 {{cannot change the element type ('f32' to 'f64')}}
  %0 = ernie.broadcast %x, dims = [1] : tensor<4xf32> -> tensor<2x4xf64>
  return
}

// -----

func.func @slice_rank(%x: tensor<4x4xf32>) {
  // expected-error @+1 {{slice needs one range per dimension (2), got 1}}
  %0 = ernie.slice %x [0:2] : tensor<4x4xf32> -> tensor<2xf32>
  return
}

// -----

func.func @slice_limit(%x: tensor<4xf32>) {
  // expected-error @+1 {{slice range 0:5:1 is invalid for dimension 0 of size 4}}
  %0 = ernie.slice %x [0:5] : tensor<4xf32> -> tensor<5xf32>
  return
}

// -----

func.func @slice_step(%x: tensor<4xf32>) {
  // expected-error @+1 {{slice range 0:4:0 is invalid for dimension 0 of size 4}}
  %0 = ernie.slice %x [0:4:0] : tensor<4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @slice_reversed(%x: tensor<4xf32>) {
  // expected-error @+1 {{slice range 3:1:1 is invalid for dimension 0 of size 4}}
  %0 = ernie.slice %x [3:1] : tensor<4xf32> -> tensor<1xf32>
  return
}

// -----

func.func @concat_empty() {
  // expected-error @+1 {{concat needs at least one input}}
  %0 = "ernie.concat"() {axis = 0 : i64} : () -> tensor<4xf32>
  return
}

// -----

func.func @concat_axis(%x: tensor<4xf32>) {
  // expected-error @+1 {{axis 1 is out of range for a tensor of rank 1}}
  %0 = ernie.concat %x, %x axis = 1 : tensor<4xf32>, tensor<4xf32> -> tensor<8xf32>
  return
}

// -----

func.func @concat_dims(%x: tensor<2x4xf32>, %y: tensor<3x5xf32>) {
  // expected-error @+1 {{concat input 1 differs in dimension 0 (3 vs 2)}}
  %0 = ernie.concat %x, %y axis = 1 : tensor<2x4xf32>, tensor<3x5xf32> -> tensor<2x9xf32>
  return
}

// -----

func.func @concat_types(%x: tensor<4xf32>, %y: tensor<4xf16>) {
  // expected-error @+1 {{concat input 1 has type 'tensor<4xf16>', incompatible with 'tensor<4xf32>'}}
  %0 = ernie.concat %x, %y axis = 0 : tensor<4xf32>, tensor<4xf16> -> tensor<8xf32>
  return
}

// -----

func.func @split_sum(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{split sizes [3, 4] add up to 7, not to the size 8 of axis 1}}
  %0:2 = ernie.split %x axis = 1, sizes = [3, 4] : tensor<2x8xf32> -> tensor<2x3xf32>, tensor<2x4xf32>
  return
}

// -----

func.func @split_negative(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{split sizes must be non-negative, got [10, -2]}}
  %0:2 = ernie.split %x axis = 1, sizes = [10, -2] : tensor<2x8xf32> -> tensor<2x10xf32>, tensor<2x1xf32>
  return
}

// -----

func.func @split_results(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{inferred type(s) 'tensor<2x4xf32>', 'tensor<2x4xf32>' are incompatible with return type(s) of operation 'tensor<2x8xf32>'}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = ernie.split %x axis = 1, sizes = [4, 4] : tensor<2x8xf32> -> tensor<2x8xf32>
  return
}

// -----

func.func @gather_axis(%x: tensor<4x6xf32>, %i: tensor<3xi64>) {
  // expected-error @+1 {{axis 2 is out of range for a tensor of rank 2}}
  %0 = ernie.gather %x[%i] axis = 2 : tensor<4x6xf32>, tensor<3xi64> -> tensor<4x3xf32>
  return
}

// -----

func.func @gather_float_indices(%x: tensor<4x6xf32>, %i: tensor<3xf32>) {
  // expected-error @+1 {{operand #1 must be statically shaped tensor of 64-bit signless integer or 32-bit signless integer values}}
  %0 = "ernie.gather"(%x, %i) {axis = 0 : i64} : (tensor<4x6xf32>, tensor<3xf32>) -> tensor<3x6xf32>
  return
}

// -----

func.func @embedding_rank(%i: tensor<3xi64>, %w: tensor<4x6x2xf32>) {
  // expected-error @+1 {{embedding table must be [vocab, hidden], got rank 3}}
  %0 = ernie.embedding %i, %w : tensor<3xi64>, tensor<4x6x2xf32> -> tensor<3x6xf32>
  return
}

// -----

func.func @embedding_padding(%i: tensor<3xi64>, %w: tensor<4x6xf32>) {
  // expected-error @+1 {{padding_idx 4 is outside the vocabulary of 4}}
  %0 = ernie.embedding %i, %w {padding_idx = 4 : i64} : tensor<3xi64>, tensor<4x6xf32> -> tensor<3x6xf32>
  return
}

// -----

func.func @topk_k(%x: tensor<4x6xf32>) {
  // expected-error @+1 {{k = 7 exceeds the size 6 of axis 1}}
  %0:2 = ernie.topk %x, k = 7, axis = 1 : tensor<4x6xf32> -> tensor<4x7xf32>, tensor<4x7xi64>
  return
}

// -----

func.func @topk_zero(%x: tensor<4x6xf32>) {
  // expected-error @+1 {{attribute 'k' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  %0:2 = ernie.topk %x, k = 0, axis = 1 : tensor<4x6xf32> -> tensor<4x0xf32>, tensor<4x0xi64>
  return
}

// -----

func.func @topk_axis(%x: tensor<4x6xf32>) {
  // expected-error @+1 {{axis 2 is out of range for a tensor of rank 2}}
  %0:2 = ernie.topk %x, k = 1, axis = 2 : tensor<4x6xf32> -> tensor<4x6xf32>, tensor<4x6xi64>
  return
}

// -----

func.func @rope_rank(%x: tensor<2x16x32xf32>, %p: tensor<16xi64>) {
  // expected-error @+1 {{input must be [batch, seq, heads, head_dim], got [2, 16, 32]}}
  %0 = ernie.rope %x, %p, theta = 10000.0 : tensor<2x16x32xf32>, tensor<16xi64>
  return
}

// -----

func.func @rope_odd_head_dim(%x: tensor<2x16x4x7xf32>, %p: tensor<16xi64>) {
  // expected-error @+1 {{head_dim must be even, got 7}}
  %0 = ernie.rope %x, %p, theta = 10000.0 : tensor<2x16x4x7xf32>, tensor<16xi64>
  return
}

// -----

func.func @rope_positions(%x: tensor<2x16x4x8xf32>, %p: tensor<8xi64>) {
  // expected-error @+1 {{positions must be [seq] or [batch, seq] = [2, 16], got [8]}}
  %0 = ernie.rope %x, %p, theta = 10000.0 : tensor<2x16x4x8xf32>, tensor<8xi64>
  return
}

// -----

func.func @rope_theta(%x: tensor<2x16x4x8xf32>, %p: tensor<16xi64>) {
  // expected-error @+1 {{theta must be positive, got 0}}
  %0 = ernie.rope %x, %p, theta = 0.0 : tensor<2x16x4x8xf32>, tensor<16xi64>
  return
}

// -----

func.func @attention_rank(%q: tensor<2x16x32xf32>) {
  // expected-error @+1 {{attention operands must be [batch, seq, heads, head_dim]}}
  %0 = ernie.attention %q, %q, %q : tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32> -> tensor<2x16x32xf32>
  return
}

// -----

func.func @attention_types(%q: tensor<2x16x4x8xf32>, %k: tensor<2x16x4x8xbf16>) {
  // expected-error @+1 {{query, key and value must have one element type}}
  %0 = ernie.attention %q, %k, %k : tensor<2x16x4x8xf32>, tensor<2x16x4x8xbf16>, tensor<2x16x4x8xbf16> -> tensor<2x16x4x8xf32>
  return
}

// -----

func.func @attention_batch(%q: tensor<2x16x4x8xf32>, %k: tensor<3x16x4x8xf32>) {
  // expected-error @+1 {{attention batch sizes differ}}
  %0 = ernie.attention %q, %k, %k : tensor<2x16x4x8xf32>, tensor<3x16x4x8xf32>, tensor<3x16x4x8xf32> -> tensor<2x16x4x8xf32>
  return
}

// -----

func.func @attention_kv(%q: tensor<2x16x4x8xf32>, %k: tensor<2x16x4x8xf32>, %v: tensor<2x12x4x8xf32>) {
  // expected-error @+1 {{key [2, 16, 4, 8] and value [2, 12, 4, 8] must agree on batch, seq and heads}}
  %0 = ernie.attention %q, %k, %v : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x12x4x8xf32> -> tensor<2x16x4x8xf32>
  return
}

// -----

func.func @attention_head_dim(%q: tensor<2x16x4x8xf32>, %k: tensor<2x16x4x16xf32>) {
  // expected-error @+1 {{query head_dim 8 differs from key head_dim 16}}
  %0 = ernie.attention %q, %k, %k : tensor<2x16x4x8xf32>, tensor<2x16x4x16xf32>, tensor<2x16x4x16xf32> -> tensor<2x16x4x16xf32>
  return
}

// -----

func.func @attention_groups(%q: tensor<2x16x6x8xf32>, %k: tensor<2x16x4x8xf32>) {
  // expected-error @+1 {{query heads (6) must be a multiple of key/value heads (4)}}
  %0 = ernie.attention %q, %k, %k : tensor<2x16x6x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32> -> tensor<2x16x6x8xf32>
  return
}

// -----

func.func @attention_window_without_causal(%q: tensor<2x16x4x8xf32>) {
  // expected-error @+1 {{a sliding window needs causal attention and at least one key, got window 4 without causal}}
  %0 = ernie.attention %q, %q, %q {window = 4 : i64} : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32> -> tensor<2x16x4x8xf32>
  return
}

// -----

func.func @attention_empty_window(%q: tensor<2x16x4x8xf32>) {
  // expected-error @+1 {{a sliding window needs causal attention and at least one key, got window 0}}
  %0 = ernie.attention %q, %q, %q {causal, window = 0 : i64} : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32> -> tensor<2x16x4x8xf32>
  return
}

// -----

func.func @attention_causal(%q: tensor<2x16x4x8xf32>, %k: tensor<2x12x4x8xf32>) {
  // expected-error @+1 {{causal attention needs query and key sequences of one length, got 16 and 12}}
  %0 = ernie.attention %q, %k, %k {causal} : tensor<2x16x4x8xf32>, tensor<2x12x4x8xf32>, tensor<2x12x4x8xf32> -> tensor<2x16x4x8xf32>
  return
}

// -----

func.func @attention_scale(%q: tensor<2x16x4x8xf32>) {
  // expected-error @+1 {{scale must be positive}}
  %0 = ernie.attention %q, %q, %q {scale = -1.0 : f64} : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32> -> tensor<2x16x4x8xf32>
  return
}

// -----

func.func @cross_entropy_labels(%l: tensor<2x16x100xf32>, %y: tensor<2x8xi64>) {
  // expected-error @+1 {{labels [2, 8] must have the logits' shape without the vocabulary dimension, [2, 16]}}
  %0 = ernie.cross_entropy %l, %y : tensor<2x16x100xf32>, tensor<2x8xi64> -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_scalar_logits(%l: tensor<f32>, %y: tensor<i64>) {
  // expected-error @+1 {{logits need a vocabulary dimension}}
  %0 = ernie.cross_entropy %l, %y : tensor<f32>, tensor<i64> -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_result(%l: tensor<2x100xf32>, %y: tensor<2xi64>) {
  // expected-error @+2 {{inferred type(s) 'tensor<2xf32>' are incompatible with return type(s) of operation 'tensor<f32>'}}
  // expected-error @+1 {{failed to infer returned types}}
  %0 = ernie.cross_entropy %l, %y {reduction = #ernie<loss_reduction none>} : tensor<2x100xf32>, tensor<2xi64> -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_and_grad_seed(%l: tensor<2x100xf32>, %y: tensor<2xi64>, %d: tensor<2xf32>) {
  // expected-error @+1 {{dloss must have the loss type 'tensor<f32>', got 'tensor<2xf32>'}}
  %0, %1 = ernie.cross_entropy_and_grad %l, %y, %d : tensor<2x100xf32>, tensor<2xi64>, tensor<2xf32> -> tensor<f32>, tensor<2x100xf32>
  return
}

// -----

// expected-error @+1 {{'ernie.param' on argument #0 must be a non-empty string}}
func.func @param_not_string(%w: tensor<4xf32> {ernie.param = 3 : i64}) {
  return
}

// -----

// expected-error @+1 {{'ernie.param' on argument #1 must be a non-empty string}}
func.func @param_empty(%x: tensor<4xf32>, %w: tensor<4xf32> {ernie.param = ""}) {
  return
}

// -----

// expected-error @+1 {{unknown ernie argument attribute 'ernie.parm' on argument #0}}
func.func @param_typo(%w: tensor<4xf32> {ernie.parm = "w"}) {
  return
}

// -----

// expected-error @+1 {{argument #0 is tied ('embed') but is not a parameter (no 'ernie.param')}}
func.func @tied_without_param(%w: tensor<4xf32> {ernie.tied = "embed"}) {
  return
}

// -----

func.func @pad_negative(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{padding of dimension 1 must be non-negative}}
  %0 = ernie.pad %x low = [0, -1], high = [0, 0], interior = [0, 0] : tensor<2x3xf32> -> tensor<2x2xf32>
  return
}

// -----

func.func @pad_rank(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{pad needs low, high and interior for each of the 2 dimensions}}
  %0 = ernie.pad %x low = [0], high = [0], interior = [0] : tensor<2x3xf32> -> tensor<2x3xf32>
  return
}

// -----

func.func @index_add_updates(%t: tensor<10x4xf32>, %ids: tensor<3xi64>, %u: tensor<3x5xf32>) {
  // expected-error @+1 {{updates must be 'tensor<3x4xf32>' (what gather would produce), got 'tensor<3x5xf32>'}}
  %0 = ernie.index_add %t, %ids, %u axis = 0 : tensor<10x4xf32>, tensor<3xi64>, tensor<3x5xf32> -> tensor<10x4xf32>
  return
}

// -----

func.func @attention_grad_dout(%q: tensor<2x16x4x8xf32>, %d: tensor<2x16x4x4xf32>) {
  // expected-error @+1 {{dout must have attention's result type 'tensor<2x16x4x8xf32>', got 'tensor<2x16x4x4xf32>'}}
  %0:3 = ernie.attention_grad %q, %q, %q, %d : tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x4xf32> -> tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>, tensor<2x16x4x8xf32>
  return
}

// -----

func.func @cross_entropy_grad_dloss(%l: tensor<2x100xf32>, %y: tensor<2xi64>, %d: tensor<2xf32>) {
  // expected-error @+1 {{dloss must have the loss type 'tensor<f32>', got 'tensor<2xf32>'}}
  %0 = ernie.cross_entropy_grad %l, %y, %d : tensor<2x100xf32>, tensor<2xi64>, tensor<2xf32> -> tensor<2x100xf32>
  return
}

// -----

func.func @sgd_state_shape(%p: tensor<4xf32>, %m: tensor<8xf32>, %lr: tensor<f32>) {
  // expected-error @+1 {{optimizer state must have the parameter's shape [4], got [8]}}
  %0:2 = ernie.sgd_update %p, %p, %m, %lr : tensor<4xf32>, tensor<8xf32>, tensor<f32>
  return
}

// -----

func.func @adamw_lr_scalar(%p: tensor<4xf32>, %lr: tensor<1xf32>, %t: tensor<i64>) {
  // expected-error @+1 {{learning rate and step must be scalar tensors, got 'tensor<1xf32>'}}
  %0:3 = ernie.adamw_update %p, %p, %p, %p, %lr, %t : tensor<4xf32>, tensor<4xf32>, tensor<1xf32>, tensor<i64>
  return
}

// -----

func.func @adamw_beta(%p: tensor<4xf32>, %lr: tensor<f32>, %t: tensor<i64>) {
  // expected-error @+1 {{beta1 must be in [0, 1), got 1}}
  %0:3 = ernie.adamw_update %p, %p, %p, %p, %lr, %t {beta1 = 1.0 : f64} : tensor<4xf32>, tensor<4xf32>, tensor<f32>, tensor<i64>
  return
}

// -----

func.func @sgd_decay(%p: tensor<4xf32>, %lr: tensor<f32>) {
  // expected-error @+1 {{weight_decay must be non-negative, got -1}}
  %0:2 = ernie.sgd_update %p, %p, %p, %lr {weight_decay = -1.0 : f64} : tensor<4xf32>, tensor<4xf32>, tensor<f32>
  return
}

// -----

func.func @ignore_index_too_wide(%l: tensor<4x16xf32>, %y: tensor<4xi32>) {
  // expected-error @+1 {{ignore_index 4294967296 does not fit in the labels' type 'i32'}}
  %0 = ernie.cross_entropy %l, %y {ignore_index = 4294967296 : i64} : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>
  return
}

// -----

// An op reading values outside a function: the module's body is a graph
// region, where a value may be its own operand (ernie-fuzz-mlir seed 42,
// input 63378: the canonicalizer folded -(-x) to x forever). The mesh,
// reading nothing, lives there.
ernie.mesh @mesh(mp = 2)
// expected-error @+1 {{'ernie.neg' op reads values, so it belongs in a function's body, not in the graph region of 'builtin.module', where a value may be its own operand}}
%0 = ernie.neg %0 : tensor<4xf32>

// -----

// Ernie tensors have no zero-size dimensions: operands, results and
// parameters say so before any shape rule reads them.
func.func @zero_size_operand(%x: tensor<4x0xf32>, %w: tensor<0x8xf32>) {
  // expected-error @+1 {{'ernie.matmul' op operand #0 has a zero-size dimension ('tensor<4x0xf32>'): ernie tensors have no zero-size dimensions}}
  %0 = ernie.matmul %x, %w : tensor<4x0xf32>, tensor<0x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @zero_size_result(%x: tensor<4xf32>) {
  // expected-error @+1 {{'ernie.slice' op result #0 has a zero-size dimension ('tensor<0xf32>')}}
  %0 = ernie.slice %x [2:2] : tensor<4xf32> -> tensor<0xf32>
  return
}

// -----

func.func @zero_size_full() {
  // expected-error @+1 {{'ernie.full' op result #0 has a zero-size dimension ('tensor<3x0xi64>')}}
  %0 = ernie.full 1 : tensor<3x0xi64>
  return
}

// -----

func.func @zero_size_norm(%x: tensor<2x0xf32>, %w: tensor<0xf32>) {
  // expected-error @+1 {{'ernie.rms_norm' op operand #0 has a zero-size dimension}}
  %y = ernie.rms_norm %x, %w, epsilon = 1.0e-6 : tensor<2x0xf32>, tensor<0xf32>
  return
}

// -----

// expected-error @+1 {{parameter argument #1 ('w') has a zero-size dimension ('tensor<16x0xf32>'): ernie tensors have no zero-size dimensions}}
func.func @zero_size_parameter(%x: tensor<8x16xf32>, %w: tensor<16x0xf32> {ernie.param = "w"}) {
  return
}

// -----

// Shared-weight replicas are named by their parameter.
// expected-error @+1 {{argument #0 has 'ernie.pipeline_stages' but is not a parameter (no 'ernie.param')}}
func.func @pipeline_stages_without_param(%b: tensor<8xf32> {ernie.pipeline_stages = array<i64: 0, 1>}) {
  return
}

// -----

// expected-error @+1 {{argument #0 has 'ernie.shared_stages' but is not a parameter (no 'ernie.param')}}
func.func @shared_stages_without_param(%b: tensor<8xf32> {ernie.shared_stages = array<i64: 0, 1>}) {
  return
}

// -----

func.func @moe_topk_above_experts(%e: tensor<2x16x4xi64>) {
  // expected-error @+1 {{top-4 routing needs at least 4 experts, num_experts is 2}}
  %0 = ernie.moe_route %e {num_experts = 2, capacity = 4} : tensor<2x16x4xi64> -> tensor<2x16x4xi64>
  return
}

// -----

func.func @moe_route_rank(%e: tensor<16x2xi64>) {
  // expected-error @+1 {{'experts' must be [groups, tokens, k], got 'tensor<16x2xi64>'}}
  %0 = ernie.moe_route %e {num_experts = 8, capacity = 4} : tensor<16x2xi64> -> tensor<16x2xi64>
  return
}

// -----

func.func @moe_route_capacity(%e: tensor<2x16x2xi64>) {
  // expected-error @+1 {{attribute 'capacity' failed to satisfy constraint}}
  %0 = ernie.moe_route %e {num_experts = 8, capacity = 0} : tensor<2x16x2xi64> -> tensor<2x16x2xi64>
  return
}

// -----

func.func @moe_dispatch_slots(%x: tensor<2x16x32xf32>, %e: tensor<2x16x2xi64>, %s: tensor<2x8x2xi64>, %w: tensor<2x16x2xf32>) {
  // expected-error @+1 {{'slots' must be [2, 16, 2] like the expert choices, got [2, 8, 2]}}
  %0 = ernie.moe_dispatch %x, %e, %s, %w {num_experts = 8, capacity = 4} : tensor<2x16x32xf32>, tensor<2x16x2xi64>, tensor<2x8x2xi64>, tensor<2x16x2xf32> -> tensor<8x2x4x32xf32>
  return
}

// -----

func.func @moe_dispatch_tokens(%x: tensor<2x8x32xf32>, %e: tensor<2x16x2xi64>, %w: tensor<2x16x2xf32>) {
  // expected-error @+1 {{input must be [groups, tokens, hidden] = [2, 16] x hidden like the choices, got 'tensor<2x8x32xf32>'}}
  %0 = ernie.moe_dispatch %x, %e, %e, %w {num_experts = 8, capacity = 4} : tensor<2x8x32xf32>, tensor<2x16x2xi64>, tensor<2x16x2xi64>, tensor<2x16x2xf32> -> tensor<8x2x4x32xf32>
  return
}

// -----

func.func @moe_combine_groups(%y: tensor<8x4x4x32xf32>, %e: tensor<2x16x2xi64>, %w: tensor<2x16x2xf32>) {
  // expected-error @+1 {{'input' has 4 groups, the choices 2}}
  %0 = ernie.moe_combine %y, %e, %e, %w : tensor<8x4x4x32xf32>, tensor<2x16x2xi64>, tensor<2x16x2xi64>, tensor<2x16x2xf32> -> tensor<2x16x32xf32>
  return
}

// -----

func.func @moe_combine_weights(%y: tensor<8x2x4x32xf32>, %e: tensor<2x16x2xi64>, %w: tensor<2x16x2xf64>) {
  // expected-error @+1 {{weights must have the input's element type 'f32'}}
  %0 = ernie.moe_combine %y, %e, %e, %w : tensor<8x2x4x32xf32>, tensor<2x16x2xi64>, tensor<2x16x2xi64>, tensor<2x16x2xf64> -> tensor<2x16x32xf32>
  return
}

// -----

func.func @expert_matmul_rank(%x: tensor<8x32x32xf32>, %w: tensor<8x32x64xf32>, %r: tensor<8x2xi64>) {
  // expected-error @+1 {{'input' must be [experts, groups, capacity, features], got 'tensor<8x32x32xf32>'}}
  %0 = ernie.expert_matmul %x, %w, %r : tensor<8x32x32xf32>, tensor<8x32x64xf32>, tensor<8x2xi64> -> tensor<8x32x64xf32>
  return
}

// -----

func.func @expert_matmul_rows(%x: tensor<8x2x16x32xf32>, %w: tensor<8x32x64xf32>, %r: tensor<8x4xi64>) {
  // expected-error @+1 {{rows must be [experts, groups] = [8, 2], got [8, 4]}}
  %0 = ernie.expert_matmul %x, %w, %r : tensor<8x2x16x32xf32>, tensor<8x32x64xf32>, tensor<8x4xi64> -> tensor<8x2x16x64xf32>
  return
}

// -----

func.func @expert_matmul_weight(%x: tensor<8x2x16x32xf32>, %w: tensor<4x32x64xf32>, %r: tensor<8x2xi64>) {
  // expected-error @+1 {{weight must be [experts, in, out] = [8, 32, out] for input}}
  %0 = ernie.expert_matmul %x, %w, %r : tensor<8x2x16x32xf32>, tensor<4x32x64xf32>, tensor<8x2xi64> -> tensor<8x2x16x64xf32>
  return
}

// -----

func.func @expert_matmul_transposed_weight(%x: tensor<8x2x16x32xf32>, %w: tensor<8x32x64xf32>, %r: tensor<8x2xi64>) {
  // expected-error @+1 {{weight must be [experts, out, in] = [8, out, 32] for input}}
  %0 = ernie.expert_matmul %x, %w, %r {transpose_weight} : tensor<8x2x16x32xf32>, tensor<8x32x64xf32>, tensor<8x2xi64> -> tensor<8x2x16x64xf32>
  return
}

// -----

func.func @expert_matmul_fill(%x: tensor<8x2x16x32xf32>, %w: tensor<8x32x64xf32>, %r: tensor<8x2xi64>) {
  // expected-error @+1 {{fill must be in (0, 1], got 1.5}}
  %0 = ernie.expert_matmul %x, %w, %r {fill = 1.5} : tensor<8x2x16x32xf32>, tensor<8x32x64xf32>, tensor<8x2xi64> -> tensor<8x2x16x64xf32>
  return
}

// -----

func.func @expert_matmul_types(%x: tensor<8x2x16x32xf32>, %w: tensor<8x32x64xbf16>, %r: tensor<8x2xi64>) {
  // expected-error @+1 {{weight must have the input's element type 'f32'}}
  %0 = ernie.expert_matmul %x, %w, %r : tensor<8x2x16x32xf32>, tensor<8x32x64xbf16>, tensor<8x2xi64> -> tensor<8x2x16x64xf32>
  return
}

// -----

func.func @expert_weight_grad_shape(%x: tensor<8x2x16x32xf32>, %dy: tensor<8x2x8x64xf32>, %r: tensor<8x2xi64>) {
  // expected-error @+1 {{grad must be [experts, groups, capacity] = [8, 2, 16] x out of 'f32' like the input}}
  %0 = ernie.expert_weight_grad %x, %dy, %r : tensor<8x2x16x32xf32>, tensor<8x2x8x64xf32>, tensor<8x2xi64> -> tensor<8x32x64xf32>
  return
}
