// RUN: ernie-opt %s --split-input-file --ernie-sharding-propagation --verify-diagnostics

ernie.mesh @a(x = 2)
ernie.mesh @b(y = 2)
func.func @two_meshes(%p: tensor<4xf32> {ernie.sharding = #ernie.sharding<@a, [{x}]>}) -> tensor<4xf32> {
  // expected-error @+1 {{sharding names mesh @b but this module is partitioned over @a; one mesh per module is supported}}
  %0 = ernie.sharding_constraint %p <@b, [{y}]> : tensor<4xf32>
  return %0 : tensor<4xf32>
}
