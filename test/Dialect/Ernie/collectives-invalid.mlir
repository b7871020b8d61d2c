// RUN: ernie-opt %s --split-input-file --verify-diagnostics

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @gather_size(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{result dimension 1 must be 64, got 32}}
  %0 = ernie.all_gather %x over @mesh[mp] dim = 1 : tensor<8x16xf32> -> tensor<8x32xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @scatter_uneven(%x: tensor<6x16xf32>) {
  // expected-error @+1 {{dimension 0 of size 6 does not divide over 4 ranks}}
  %0 = ernie.reduce_scatter %x over @mesh[mp] dim = 0 sum : tensor<6x16xf32> -> tensor<1x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @unknown_axis(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{mesh @mesh has no axis 'tp'}}
  %0 = ernie.all_reduce %x over @mesh[tp] sum : tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @axis_twice(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{axis 'mp' is named twice}}
  %0 = ernie.all_reduce %x over @mesh[mp, mp] sum : tensor<8x16xf32>
  return
}

// -----

func.func @no_mesh(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{names mesh @nowhere, which is not defined}}
  %0 = ernie.all_reduce %x over @nowhere[mp] sum : tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @dim_range(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{dim 2 is out of range for rank 2}}
  %0 = ernie.shard_slice %x over @mesh[mp] dim = 2 : tensor<8x16xf32> -> tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @all_to_all_shape(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{result must be 'tensor<32x4xf32>', got 'tensor<8x16xf32>'}}
  %0 = ernie.all_to_all %x over @mesh[mp] split_dim = 1, concat_dim = 0 : tensor<8x16xf32> -> tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @bad_kind(%x: tensor<8xf32>) {
  // expected-error @+1 {{unknown reduce kind 'prod' (expected sum, avg, max or min)}}
  %0 = ernie.all_reduce %x over @mesh[dp] prod : tensor<8xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @no_axes(%x: tensor<8xf32>) {
  // expected-error @+1 {{needs at least one mesh axis}}
  %0 = ernie.all_reduce %x over @mesh[] sum : tensor<8xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @insert_shape(%x: tensor<8x16xf32>, %p: tensor<8x8xf32>) {
  // expected-error @+1 {{result dimension 1 must be 32, got 16}}
  %0 = ernie.shard_insert %p into %x over @mesh[mp] dim = 1 : tensor<8x8xf32> -> tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @start_without_wait(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{result must be waited for exactly once, found 0 uses}}
  %f = ernie.collective_permute_start %x over @mesh[mp] shift = 1 : tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @waited_twice(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{result must be waited for exactly once, found 2 uses}}
  %f = ernie.collective_permute_start %x over @mesh[mp] shift = 1 : tensor<8x16xf32>
  %0 = ernie.wait %f : tensor<8x16xf32>
  %1 = ernie.wait %f : tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @wait_type(%x: tensor<8x16xf32>) {
  // expected-note @+1 {{prior use here}}
  %f = ernie.collective_permute_start %x over @mesh[mp] shift = 1 : tensor<8x16xf32>
  // expected-error @+1 {{use of value '%f' expects different type than prior uses}}
  %0 = ernie.wait %f : tensor<8x8xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @permute_axis(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{mesh @mesh has no axis 'tp'}}
  %f = ernie.collective_permute_start %x over @mesh[tp] shift = 1 : tensor<8x16xf32>
  %0 = ernie.wait %f : tensor<8x16xf32>
  return
}

// -----

func.func @send_negative_peer(%x: tensor<2xf32>) {
  // expected-error @+1 {{peer stage must be non-negative, got -1}}
  ernie.send %x to stage -1 channel 0 : tensor<2xf32>
  return
}

// -----

func.func @recv_negative_peer() -> tensor<2xf32> {
  // expected-error @+1 {{peer stage must be non-negative, got -2}}
  %0 = ernie.recv from stage -2 channel 0 : tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

func.func @send_negative_channel(%x: tensor<2xf32>) {
  // expected-error @+1 {{channel must be non-negative, got -3}}
  ernie.send %x to stage 1 channel -3 : tensor<2xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @bucket_waited_twice(%a: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  // expected-error @+1 {{result must be waited for exactly once, found 2 uses}}
  %f = ernie.all_reduce_start %a over @mesh[dp] sum : tensor<4xf32>
  %x = ernie.wait %f : tensor<4xf32>
  %y = ernie.wait %f : tensor<4xf32>
  return %x, %y : tensor<4xf32>, tensor<4xf32>
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @bucket_accumulates_in_f64(%a: tensor<4xbf16>) -> tensor<4xbf16> {
  // expected-error @+1 {{accumulates in f32 or in the inputs' own types, not 'f64'}}
  %f = ernie.all_reduce_start %a over @mesh[dp] sum {accumulate = f64} : tensor<4xbf16>
  %x = ernie.wait %f : tensor<4xbf16>
  return %x : tensor<4xbf16>
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @bucket_bad_axis(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{mesh @mesh has no axis 'mp'}}
  %f = ernie.all_reduce_start %a over @mesh[mp] sum : tensor<4xf32>
  %x = ernie.wait %f : tensor<4xf32>
  return %x : tensor<4xf32>
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @scatter_bucket_wrong_piece(%a: tensor<4x6xf32>) -> tensor<4x2xf32> {
  // expected-error @+1 {{result dimension 1 must be 3, got 2}}
  %f = ernie.reduce_scatter_start %a over @mesh[dp] dim = 1 sum : tensor<4x6xf32> -> tensor<4x2xf32>
  %x = ernie.wait %f : tensor<4x2xf32>
  return %x : tensor<4x2xf32>
}

// -----

ernie.mesh @mesh(dp = 4)
func.func @scatter_bucket_uneven(%a: tensor<8xf32>, %b: tensor<6xf32>) -> (tensor<2xf32>, tensor<1xf32>) {
  // expected-error @+1 {{dimension 0 of size 6 does not divide over 4 ranks}}
  %f:2 = ernie.reduce_scatter_start %a, %b over @mesh[dp] dim = 0 sum : tensor<8xf32>, tensor<6xf32> -> tensor<2xf32>, tensor<1xf32>
  %x = ernie.wait %f#0 : tensor<2xf32>
  %y = ernie.wait %f#1 : tensor<1xf32>
  return %x, %y : tensor<2xf32>, tensor<1xf32>
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @scatter_bucket_accumulates_in_f16(%a: tensor<4xbf16>) -> tensor<2xbf16> {
  // expected-error @+1 {{accumulates in f32 or in the inputs' own types, not 'f16'}}
  %f = ernie.reduce_scatter_start %a over @mesh[dp] dim = 0 sum {accumulate = f16} : tensor<4xbf16> -> tensor<2xbf16>
  %x = ernie.wait %f : tensor<2xbf16>
  return %x : tensor<2xbf16>
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @gather_bucket_dim_out_of_range(%a: tensor<4xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{dim 1 is out of range for rank 1}}
  %f = ernie.all_gather_start %a over @mesh[dp] dim = 1 : tensor<4xf32> -> tensor<8xf32>
  %x = ernie.wait %f : tensor<8xf32>
  return %x : tensor<8xf32>
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @gather_bucket_not_waited(%a: tensor<4xf32>, %b: tensor<2xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{result must be waited for exactly once, found 0 uses}}
  %f:2 = ernie.all_gather_start %a, %b over @mesh[dp] dim = 0 : tensor<4xf32>, tensor<2xf32> -> tensor<8xf32>, tensor<4xf32>
  %x = ernie.wait %f#0 : tensor<8xf32>
  return %x : tensor<8xf32>
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @gather_bucket_too_few_futures(%a: tensor<4xf32>, %b: tensor<2xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{needs one future per input, got 1 for 2}}
  %f = ernie.all_gather_start %a, %b over @mesh[dp] dim = 0 : tensor<4xf32>, tensor<2xf32> -> tensor<8xf32>
  %x = ernie.wait %f : tensor<8xf32>
  return %x : tensor<8xf32>
}
