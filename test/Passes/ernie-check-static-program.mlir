// RUN: ernie-opt %s --split-input-file --ernie-check-static-program --verify-diagnostics | FileCheck %s

// A well-formed program passes through unchanged.
// CHECK-LABEL: func.func @ok
// CHECK: ernie.matmul
// CHECK: call @callee
func.func @ok(%x: tensor<2x4xf32>, %w: tensor<4x8xf32>, %lr: f32) -> tensor<2x8xf32> {
  %0 = ernie.matmul %x, %w : tensor<2x4xf32>, tensor<4x8xf32> -> tensor<2x8xf32>
  %1 = func.call @callee(%0) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return %1 : tensor<2x8xf32>
}
func.func private @callee(tensor<2x8xf32>) -> tensor<2x8xf32>

// -----

// expected-error @+1 {{block argument #0 has type 'tensor<?x4xf32>'; ernie programs need statically shaped ernie tensors or scalars}}
func.func @dynamic(%x: tensor<?x4xf32>) {
  return
}

// -----

func.func @foreign(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'arith.addf' op is not part of an ernie program}}
  %0 = arith.addf %x, %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @vector_result() {
  // expected-error @+1 {{result #0 has type 'vector<4xf32>'; ernie programs need statically shaped ernie tensors or scalars}}
  %0 = arith.constant dense<0.0> : vector<4xf32>
  return
}

// -----

// expected-error @+1 {{parameter 'w' names arguments #0 and #1; tie shared weights with 'ernie.tied' instead}}
func.func @duplicate_param(%a: tensor<4xf32> {ernie.param = "w"}, %b: tensor<4xf32> {ernie.param = "w"}) {
  return
}

// -----

// Tied parameters keep their own names.
// CHECK-LABEL: func.func @tied
func.func @tied(%a: tensor<4xf32> {ernie.param = "embed.weight", ernie.tied = "embed"},
                %b: tensor<4xf32> {ernie.param = "lm_head.weight", ernie.tied = "embed"}) {
  return
}

// -----

// expected-error @+1 {{block argument #0 has type 'tensor<4xi8>'; ernie programs need statically shaped ernie tensors or scalars}}
func.func @narrow_integers(%x: tensor<4xi8>) {
  return
}

// -----

// expected-error @+1 {{block argument #0 has type 'index'; ernie programs need statically shaped ernie tensors or scalars}}
func.func @index_scalar(%x: index) {
  return
}

// -----

// expected-error @+1 {{signature type 'tensor<?xf32>' is not a statically shaped ernie tensor or scalar}}
func.func private @dynamic_declaration(tensor<?xf32>) -> tensor<4xf32>

// -----

// expected-error @+1 {{block argument #0 has type 'tensor<4xindex>'; ernie programs need statically shaped ernie tensors or scalars}}
func.func @index_tensor(%x: tensor<4xindex>) {
  return
}

// -----

// expected-error @+1 {{block argument #0 has type 'tensor<2xcomplex<f32>>'; ernie programs need statically shaped ernie tensors or scalars}}
func.func @complex_tensor(%x: tensor<2xcomplex<f32>>) {
  return
}
