// A cluster propagation or partition cannot use: an error naming the file
// (and the field), a non-zero exit.
// RUN: not ernie-opt %s "--ernie-sharding-propagation=cluster=%S/Inputs/no-such-cluster.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not ernie-opt %s "--ernie-auto-parallel-pipeline=cluster=%S/Inputs/cost-bad-peak.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=PEAK
// RUN: not ernie-opt %s "--ernie-spmd-partition=cluster=%S/Inputs/cost-small.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=RANKS
// RUN: not ernie-opt %s "--ernie-sharding-propagation=cluster=%S/Inputs/cost-small.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=RANKS

// MISSING: error: {{.*}}no-such-cluster.json: No such file or directory
// PEAK: error: {{.*}}cost-bad-peak.json: device: peak_flops.bf16: expected a positive number
// RANKS: {{.*}}.mlir:[[@LINE+1]]:1: error: the mesh has 4 ranks but the cluster 'two devices' only 2 devices
ernie.mesh @mesh(dp = 4)
func.func @f(%x: tensor<8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>}) -> tensor<8xf32> {
  return %x : tensor<8xf32>
}
