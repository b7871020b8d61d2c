// What the program writer refuses although each op verifies: a pipeline
// split point never cut, a zero-size signature, an ill-formed pipeline.
// RUN: ernie-translate --ernie-to-program %s --split-input-file --verify-diagnostics -o /dev/null

func.func @forward(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %a = ernie.relu %x : tensor<4x8xf32>
  // expected-error @+1 {{a pipeline split point is left in the program: run --ernie-pipeline-split, autodiff and --ernie-pipeline-schedule before export}}
  %s = ernie.split_point %a : tensor<4x8xf32>
  %b = ernie.exp %s : tensor<4x8xf32>
  return %b : tensor<4x8xf32>
}

// -----

// No ernie op sees the value, so only the writer can say it.
// expected-error @+1 {{argument #0 ('tensor<0x8xf32>') has a zero-size dimension: ernie tensors have no zero-size dimensions}}
func.func @empty(%x: tensor<0x8xf32>) -> tensor<0x8xf32> {
  return %x : tensor<0x8xf32>
}

// -----

// expected-error @+1 {{'ernie.pipeline' key 'virtual_stages' is missing}}
module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64}} {
  func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{'ernie.pipeline_schedule' must be an array of strings, one per pipeline rank}}
module attributes {ernie.pipeline = {axis = "pp", micro_batches = 1 : i64, schedule = "1F1B", stages = 1 : i64, virtual_stages = 1 : i64}, ernie.pipeline_schedule = [1]} {
  func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{the pipeline needs one schedule per stage}}
module attributes {ernie.pipeline = {axis = "pp", micro_batches = 1 : i64, schedule = "1F1B", stages = 1 : i64, virtual_stages = 1 : i64}} {
  func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// Found by ernie-fuzz-mlir: a splat of 2^34 elements was expanded into
// 64 GiB of bytes (std::bad_alloc); a FlatBuffer holds 2 GiB.
func.func @huge_constant() -> tensor<8x2147483648xf32> {
  // expected-error @+1 {{constants of more than 1073741824 bytes in all do not fit in a program file (this one is 17179869184 x 4 bytes)}}
  %0 = ernie.constant dense<1.0> : tensor<8x2147483648xf32>
  return %0 : tensor<8x2147483648xf32>
}
