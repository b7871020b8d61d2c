// RUN: ernie-opt %s --split-input-file "--ernie-bucket-gradients=bucket-bytes=1024" | FileCheck %s
// RUN: ernie-opt %s --split-input-file "--ernie-bucket-gradients=bucket-bytes=1024 accumulate=native" | FileCheck %s --check-prefix=NATIVE
// RUN: not ernie-opt %s --split-input-file "--ernie-bucket-gradients=accumulate=f16" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: ernie-opt %s --split-input-file "--ernie-bucket-gradients=bucket-bytes=2048" | FileCheck %s --check-prefix=ZERO3

// Three gradients of 1 KiB, 512 B and 512 B, ready in the order c, a, b:
// c fills a bucket of its own, started right after it is computed; a and b
// share the next, started after b. The loss's all-reduce (not a gradient
// result, and read by an add) and the max are left alone. Every wait is at
// the return.
ernie.mesh @mesh(dp = 2)
// CHECK-LABEL: func.func @grads
// CHECK: %[[C:.+]] = ernie.exp %arg2
// CHECK-NEXT: %[[F0:.+]] = ernie.all_reduce_start %[[C]] over @mesh[dp] sum : tensor<256xf32>
// CHECK: %[[A:.+]] = ernie.neg %arg0
// CHECK: %[[B:.+]] = ernie.tanh %arg1
// CHECK-NEXT: %[[F1:.+]]:2 = ernie.all_reduce_start %[[A]], %[[B]] over @mesh[dp] sum : tensor<128xf32>, tensor<128xf32>
// CHECK: ernie.all_reduce %{{.+}} over @mesh[dp] sum : tensor<f32>
// CHECK: ernie.all_reduce %{{.+}} over @mesh[dp] max : tensor<128xf32>
// CHECK-DAG: %[[WC:.+]] = ernie.wait %[[F0]] : tensor<256xf32>
// CHECK-DAG: %[[WA:.+]] = ernie.wait %[[F1]]#0 : tensor<128xf32>
// CHECK-DAG: %[[WB:.+]] = ernie.wait %[[F1]]#1 : tensor<128xf32>
// CHECK: return %{{.+}}, %[[WA]], %[[WB]], %[[WC]], %{{.+}}
func.func @grads(%x: tensor<128xf32>, %y: tensor<128xf32>, %z: tensor<256xf32>, %l: tensor<f32>)
    -> (tensor<f32>, tensor<128xf32> {ernie.grad_of = "a"}, tensor<128xf32> {ernie.grad_of = "b"},
        tensor<256xf32> {ernie.grad_of = "c"}, tensor<128xf32> {ernie.grad_of = "m"}) {
  %c = ernie.exp %z : tensor<256xf32>
  %a = ernie.neg %x : tensor<128xf32>
  %b = ernie.tanh %y : tensor<128xf32>
  %loss = ernie.all_reduce %l over @mesh[dp] sum : tensor<f32>
  %twice = ernie.add %loss, %loss : tensor<f32>
  %m = ernie.all_reduce %a over @mesh[dp] max : tensor<128xf32>
  %ra = ernie.all_reduce %a over @mesh[dp] sum : tensor<128xf32>
  %rb = ernie.all_reduce %b over @mesh[dp] sum : tensor<128xf32>
  %rc = ernie.all_reduce %c over @mesh[dp] sum : tensor<256xf32>
  return %twice, %ra, %rb, %rc, %m : tensor<f32>, tensor<128xf32>, tensor<128xf32>, tensor<256xf32>, tensor<128xf32>
}

// -----

// A returned all-reduce that is not a gradient (the loss) stays blocking.
ernie.mesh @mesh(dp = 2)
// CHECK-LABEL: func.func @loss_only
// CHECK-NOT: all_reduce_start
// CHECK: ernie.all_reduce
func.func @loss_only(%l: tensor<f32>) -> (tensor<f32> {ernie.loss}) {
  %r = ernie.all_reduce %l over @mesh[dp] avg : tensor<f32>
  return %r : tensor<f32>
}

// -----

// bf16 gradients are reduced in f32 unless asked otherwise; buckets never
// mix element types or axes.
ernie.mesh @mesh(dp = 2, mp = 2)
// CHECK-LABEL: func.func @types
// CHECK-DAG: ernie.all_reduce_start %arg0 over @mesh[dp] sum {accumulate = f32} : tensor<8xbf16>
// CHECK-DAG: ernie.all_reduce_start %arg1 over @mesh[dp] sum : tensor<8xf32>
// CHECK-DAG: ernie.all_reduce_start %arg2 over @mesh[dp, mp] sum : tensor<8xf32>
// CHECK: return
// NATIVE-LABEL: func.func @types
// NATIVE: ernie.all_reduce_start %arg0 over @mesh[dp] sum : tensor<8xbf16>
func.func @types(%a: tensor<8xbf16>, %b: tensor<8xf32>, %c: tensor<8xf32>)
    -> (tensor<8xbf16> {ernie.grad_of = "a"}, tensor<8xf32> {ernie.grad_of = "b"}, tensor<8xf32> {ernie.grad_of = "c"}) {
  %ra = ernie.all_reduce %a over @mesh[dp] sum : tensor<8xbf16>
  %rb = ernie.all_reduce %b over @mesh[dp] sum : tensor<8xf32>
  %rc = ernie.all_reduce %c over @mesh[dp, mp] sum : tensor<8xf32>
  return %ra, %rb, %rc : tensor<8xbf16>, tensor<8xf32>, tensor<8xf32>
}

// BAD: --ernie-bucket-gradients: accumulate must be 'f32' or 'native', not 'f16'

// -----

// ZeRO-3: each parameter shard (an argument) gathered where it is used.
// Buckets of 2 KiB (two gathered tensors) in program order: {w1, w2} and
// {w3, w1 again}; the
// first starts where w1 is needed, the second where the first's first
// gathered tensor is needed (a prefetch: it moves while w1 and w2 are used),
// and each gather becomes a wait in its place. A gather of a computed value
// is left alone.
ernie.mesh @mesh(dp = 2)
// ZERO3-LABEL: func.func @zero3
// ZERO3-NEXT: %[[F1:.+]]:2 = ernie.all_gather_start %arg1, %arg2 over @mesh[dp] dim = 0 : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<16x16xf32>, tensor<16x16xf32>
// ZERO3-NEXT: %[[F2:.+]]:2 = ernie.all_gather_start %arg3, %arg1 over @mesh[dp] dim = 0 : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<16x16xf32>, tensor<16x16xf32>
// ZERO3-NEXT: %[[W1:.+]] = ernie.wait %[[F1]]#0 : tensor<16x16xf32>
// ZERO3-NEXT: %[[H1:.+]] = ernie.matmul %arg0, %[[W1]]
// ZERO3-NEXT: %[[W2:.+]] = ernie.wait %[[F1]]#1
// ZERO3-NEXT: %[[H2:.+]] = ernie.matmul %[[H1]], %[[W2]]
// ZERO3-NEXT: %[[W3:.+]] = ernie.wait %[[F2]]#0
// ZERO3-NEXT: %[[H3:.+]] = ernie.matmul %[[H2]], %[[W3]]
// ZERO3-NEXT: %[[W1B:.+]] = ernie.wait %[[F2]]#1
// ZERO3-NEXT: %[[H4:.+]] = ernie.matmul %[[H3]], %[[W1B]]
// ZERO3-NEXT: ernie.all_gather %[[H4]] over @mesh[dp] dim = 0
func.func @zero3(%x: tensor<4x16xf32>, %w1: tensor<8x16xf32>, %w2: tensor<8x16xf32>, %w3: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %g1 = ernie.all_gather %w1 over @mesh[dp] dim = 0 : tensor<8x16xf32> -> tensor<16x16xf32>
  %h1 = ernie.matmul %x, %g1 : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
  %g2 = ernie.all_gather %w2 over @mesh[dp] dim = 0 : tensor<8x16xf32> -> tensor<16x16xf32>
  %h2 = ernie.matmul %h1, %g2 : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
  %g3 = ernie.all_gather %w3 over @mesh[dp] dim = 0 : tensor<8x16xf32> -> tensor<16x16xf32>
  %h3 = ernie.matmul %h2, %g3 : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
  %g4 = ernie.all_gather %w1 over @mesh[dp] dim = 0 : tensor<8x16xf32> -> tensor<16x16xf32>
  %h4 = ernie.matmul %h3, %g4 : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
  %y = ernie.all_gather %h4 over @mesh[dp] dim = 0 : tensor<4x16xf32> -> tensor<8x16xf32>
  %z = ernie.neg %y : tensor<8x16xf32>
  return %z : tensor<8x16xf32>
}
