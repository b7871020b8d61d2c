// RUN: ernie-opt %s --split-input-file --verify-diagnostics

func.func @not_elementwise(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %y = ernie.fused (%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    // expected-error @+1 {{cannot be part of a fused region}}
    %m = ernie.matmul %a, %a : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    ernie.yield %m : tensor<4x4xf32>
  }
  return %y : tensor<4x4xf32>
}

// -----

func.func @mixed(%x: tensor<4xf32>) -> tensor<4xf64> {
  %y = ernie.fused (%x) : (tensor<4xf32>) -> tensor<4xf64> {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{mixes f64 with narrower floats}}
    %c = ernie.cast %a : tensor<4xf32> -> tensor<4xf64>
    ernie.yield %c : tensor<4xf64>
  }
  return %y : tensor<4xf64>
}

// -----

func.func @computed_broadcast(%x: tensor<8xf32>) -> tensor<4x8xf32> {
  %y = ernie.fused (%x) : (tensor<8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<8xf32>):
    // A computed value off the iteration shape is what a broadcast of it
    // would need: the region computes only at its iteration shape.
    // expected-error @+1 {{does not have the fused region's iteration shape [4, 8]}}
    %e = ernie.exp %a : tensor<8xf32>
    %b = ernie.broadcast %e, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
    ernie.yield %b : tensor<4x8xf32>
  }
  return %y : tensor<4x8xf32>
}

// -----

func.func @read_reduction(%x: tensor<4x8xf32>) -> tensor<4xf32> {
  %y = ernie.fused (%x) : (tensor<4x8xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4x8xf32>):
    // expected-error @+1 {{ends a fused region: only its yield may read a reduction}}
    %s = ernie.reduce_sum %a axes = [1] : tensor<4x8xf32> -> tensor<4xf32>
    %e = ernie.exp %s : tensor<4xf32>
    ernie.yield %e : tensor<4xf32>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @unbroadcast_input(%x: tensor<4x8xf32>, %v: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>) {
  // expected-error @+1 {{input #1 is read without a broadcast but does not have the iteration shape}}
  %y:2 = ernie.fused (%x, %v) : (tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8xf32>):
    %e = ernie.exp %a : tensor<4x8xf32>
    ernie.yield %e, %b : tensor<4x8xf32>, tensor<8xf32>
  }
  return %y#0, %y#1 : tensor<4x8xf32>, tensor<8xf32>
}

// -----

func.func @yield_types(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{the body must yield values of the results' types}}
  %y = ernie.fused (%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %c = ernie.cast %a : tensor<4xf32> -> tensor<4xbf16>
    ernie.yield %c : tensor<4xbf16>
  }
  return %y : tensor<4xf32>
}

// -----

func.func @integers(%x: tensor<4xi64>) -> tensor<4xi64> {
  %y = ernie.fused (%x) : (tensor<4xi64>) -> tensor<4xi64> {
  ^bb0(%a: tensor<4xi64>):
    // expected-error @+1 {{computes on integers}}
    %n = ernie.neg %a : tensor<4xi64>
    ernie.yield %n : tensor<4xi64>
  }
  return %y : tensor<4xi64>
}
