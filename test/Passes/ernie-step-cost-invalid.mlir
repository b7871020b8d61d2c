// Bad cluster descriptions and programs the cost model cannot place: an
// error naming the file and the field, a non-zero exit.
// RUN: not ernie-opt %s --ernie-step-cost -o /dev/null 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: not ernie-opt %s "--ernie-step-cost=cluster=%S/Inputs/no-such-cluster.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not ernie-opt %s "--ernie-step-cost=cluster=%S/Inputs/cost-bad-peak.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=PEAK
// RUN: not ernie-opt %s "--ernie-step-cost=cluster=%S/Inputs/cost-unknown-field.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not ernie-opt %s "--ernie-step-cost=cluster=%S/Inputs/cost-no-network.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=NETWORK
// RUN: not ernie-opt %s "--ernie-step-cost=cluster=%S/Inputs/cost-missing-device.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=DEVICE
// RUN: not ernie-opt %s "--ernie-step-cost=cluster=%S/Inputs/cost-small.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=RANKS
// RUN: not ernie-opt %s "--ernie-step-cost=cluster=%S/Inputs/cost-device.json" -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOTCLUSTER

// NONE: error: --ernie-step-cost needs cluster=<file>
// MISSING: error: {{.*}}no-such-cluster.json: No such file or directory
// PEAK: error: {{.*}}cost-bad-peak.json: device: peak_flops.bf16: expected a positive number
// UNKNOWN: error: {{.*}}cost-unknown-field.json: devices_per_nod: unknown field (expected name, source, device,
// NETWORK: error: {{.*}}cost-no-network.json: inter_node: expected a JSON object
// DEVICE: error: {{.*}}cost-missing-device.json: device: {{.*}}no-such-device.json: No such file or directory
// RANKS: error: the program has 4 ranks but the cluster 'two devices' only 2 devices
// NOTCLUSTER: error: {{.*}}cost-device.json: {{[a-z_]+}}: unknown field (expected name, source, device,
ernie.mesh @mesh(dp = 4)
func.func @train_step(%y: tensor<8xf32>) -> tensor<8xf32> {
  %r = ernie.all_reduce %y over @mesh[dp] sum : tensor<8xf32>
  return %r : tensor<8xf32>
}
