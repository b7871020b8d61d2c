// RUN: ernie-opt %s --split-input-file --ernie-spmd-partition --verify-diagnostics

ernie.mesh @mesh(dp = 2)
func.func @unpropagated(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{result #0 has no sharding; run --ernie-sharding-propagation first}}
  %0 = ernie.exp %x : tensor<8xf32>
  return %0 : tensor<8xf32>
}
