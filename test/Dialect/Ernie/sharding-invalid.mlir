// Every rule of meshes and shardings, broken once.
// RUN: ernie-opt %s --split-input-file --verify-diagnostics

// expected-error @+1 {{axis 'dp' is declared twice}}
ernie.mesh @mesh(dp = 2, dp = 4)

// -----

// expected-error @+1 {{axis 'mp' has size 0; sizes must be positive}}
ernie.mesh @mesh(dp = 2, mp = 0)

// -----

func.func @mesh_inside_function() {
  // expected-error @+1 {{expects parent op 'builtin.module'}}
  ernie.mesh @mesh(dp = 2)
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @unknown_axis(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{result: mesh @mesh has no axis 'tp'}}
  %0 = ernie.sharding_constraint %x <@mesh, [{tp}, {}]> : tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @axis_twice(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{mesh axis 'dp' is used twice in one sharding}}
  %0 = ernie.sharding_constraint %x <@mesh, [{dp}, {dp}]> : tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @axis_twice_partial(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{mesh axis 'mp' is used twice in one sharding}}
  %0 = ernie.reshard %x <@mesh, [{mp}, {}], partial = {mp = sum}> : tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4) {ernie.even_splits}
func.func @not_divisible(%x: tensor<6x16xf32>) {
  // expected-error @+1 {{result: dimension 0 of size 6 does not divide over mesh axes {dp, mp} of 8 ranks, and mesh @mesh asks for even splits}}
  %0 = ernie.reshard %x <@mesh, [{dp, mp}, {}]> : tensor<6x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @rank_mismatch(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{result: sharding has 1 dimensions but the value has rank 2}}
  %0 = ernie.reshard %x <@mesh, [{dp}]> : tensor<8x16xf32>
  return
}

// -----

func.func @unknown_mesh(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{result: sharding names mesh @nowhere, which is not defined}}
  %0 = ernie.reshard %x <@nowhere, [{dp}, {}]> : tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2)
func.func @bad_reduce_kind(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{unknown reduce kind 'prod' (expected sum, avg, max or min)}}
  %0 = ernie.reshard %x <@mesh, [{}, {}], partial = {dp = prod}> : tensor<8x16xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4) {ernie.even_splits}
// expected-error @+1 {{argument #0: dimension 1 of size 6 does not divide over mesh axes {mp} of 4 ranks, and mesh @mesh asks for even splits}}
func.func @arg_not_divisible(%x: tensor<8x6xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>}) {
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
// expected-error @+1 {{result #0: mesh @mesh has no axis 'pp'}}
func.func @result_unknown_axis(%x: tensor<8x8xf32>) -> (tensor<8x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{pp}, {}]>}) {
  return %x : tensor<8x8xf32>
}

// -----

// expected-error @+1 {{'ernie.sharding' on an argument must be an #ernie.sharding}}
func.func @arg_not_sharding(%x: tensor<8x8xf32> {ernie.sharding = 1 : i64}) {
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)
func.func @op_shardings_count(%x: tensor<8x8xf32>) {
  // expected-error @+1 {{'ernie.shardings' must list one sharding per result (1)}}
  %0 = ernie.neg %x {ernie.shardings = []} : tensor<8x8xf32>
  return
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4) {ernie.even_splits}
func.func @op_sharding_divisible(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{result #0: dimension 1 of size 6 does not divide over mesh axes {mp} of 4 ranks, and mesh @mesh asks for even splits}}
  %0 = ernie.neg %x {ernie.shardings = [#ernie.sharding<@mesh, [{}, {mp}]>]} : tensor<8x6xf32>
  return
}

// -----

func.func @unknown_op_attr(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{unknown ernie op attribute 'ernie.sharding'}}
  %0 = ernie.neg %x {ernie.sharding = 1} : tensor<8x6xf32>
  return
}

// -----

// expected-error @+1 {{'ernie.even_splits' is a unit attribute on an ernie.mesh}}
func.func @even_splits_elsewhere() attributes {ernie.even_splits} {
  return
}

// -----

// A mesh's rank count is bounded (MeshOp::kMaxRanks, as the runtime's).
// expected-error @+1 {{'ernie.mesh' op has more than 1048576 ranks (the product of its axis sizes)}}
ernie.mesh @too_many(dp = 4294967296)

// -----

// Two axes of 2^32: the product wraps to 0 in 64 bits, caught on the way.
// expected-error @+1 {{'ernie.mesh' op has more than 1048576 ranks}}
ernie.mesh @wraps(a = 4294967296, b = 4294967296)

// -----

// The bound itself is fine.
ernie.mesh @largest(dp = 1024, mp = 1024)
// expected-error @+1 {{'ernie.mesh' op has more than 1048576 ranks}}
ernie.mesh @one_more(dp = 1024, mp = 1024, pp = 2)

// -----

// expected-error @+1 {{axis names must be non-empty}}
ernie.mesh @empty_name("" = 2)

// -----

// expected-error @+1 {{metric 'grad_norm' (result #0) must be a scalar float tensor}}
func.func @metric_not_scalar(%x: tensor<4xf32>) -> (tensor<4xf32> {ernie.metric = "grad_norm"}) {
  return %x : tensor<4xf32>
}

// -----

// expected-error @+1 {{'ernie.metric' on result #0 must name the metric}}
func.func @metric_unnamed(%x: tensor<f32>) -> (tensor<f32> {ernie.metric = ""}) {
  return %x : tensor<f32>
}
