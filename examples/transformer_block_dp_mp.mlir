// A Llama-style transformer block with a hybrid plan on 4 ranks: the batch
// split over dp, attention heads and MLP columns over mp (Megatron's
// column- then row-parallel matmuls). Only the inputs and weights are
// annotated; the compiler decides every other placement.
//
//   ernie-opt examples/transformer_block_dp_mp.mlir --ernie-auto-parallel-pipeline
//
ernie.mesh @mesh(dp = 2, mp = 2)

func.func @block(%x: tensor<4x16x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}, {}]>},
    %ln1: tensor<64xf32>, %ln2: tensor<64xf32>,
    %wq: tensor<64x64xf32> {ernie.param = "q", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
    %wk: tensor<64x32xf32> {ernie.param = "k", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
    %wv: tensor<64x32xf32> {ernie.param = "v", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
    %wo: tensor<64x64xf32> {ernie.param = "o", ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>},
    %wg: tensor<64x128xf32> {ernie.param = "gate", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
    %wu: tensor<64x128xf32> {ernie.param = "up", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
    %wd: tensor<128x64xf32> {ernie.param = "down", ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> tensor<4x16x64xf32> {
  %n1 = ernie.rms_norm %x, %ln1, epsilon = 1.0e-6 : tensor<4x16x64xf32>, tensor<64xf32>
  %q = ernie.matmul %n1, %wq : tensor<4x16x64xf32>, tensor<64x64xf32> -> tensor<4x16x64xf32>
  %k = ernie.matmul %n1, %wk : tensor<4x16x64xf32>, tensor<64x32xf32> -> tensor<4x16x32xf32>
  %v = ernie.matmul %n1, %wv : tensor<4x16x64xf32>, tensor<64x32xf32> -> tensor<4x16x32xf32>
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
  %n2 = ernie.rms_norm %h, %ln2, epsilon = 1.0e-6 : tensor<4x16x64xf32>, tensor<64xf32>
  %g = ernie.matmul %n2, %wg : tensor<4x16x64xf32>, tensor<64x128xf32> -> tensor<4x16x128xf32>
  %u = ernie.matmul %n2, %wu : tensor<4x16x64xf32>, tensor<64x128xf32> -> tensor<4x16x128xf32>
  %a = ernie.silu %g : tensor<4x16x128xf32>
  %m = ernie.mul %a, %u : tensor<4x16x128xf32>
  %d = ernie.matmul %m, %wd : tensor<4x16x128xf32>, tensor<128x64xf32> -> tensor<4x16x64xf32>
  %y = ernie.add %h, %d : tensor<4x16x64xf32>
  return %y : tensor<4x16x64xf32>
}
