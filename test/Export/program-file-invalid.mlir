// RUN: ernie-translate --ernie-to-program %s --split-input-file --verify-diagnostics -o /dev/null

// expected-error @+1 {{cannot plan memory for a value of type 'tensor<?xf32>'}}
func.func @dynamic(%x: tensor<?xf32>) -> tensor<?xf32> {
  return %x : tensor<?xf32>
}

// -----

ernie.mesh @a(x = 2)
// expected-error @+1 {{a program file holds one mesh; this module declares several}}
ernie.mesh @b(y = 2)

// -----

// expected-error @+1 {{the module has no public function to export}}
module {
  func.func private @hidden(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
}

// -----

func.func private @external(tensor<2xf32>) -> tensor<2xf32>
func.func @calls_external(%x: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @+1 {{calls must be inlined before export}}
  %y = func.call @external(%x) : (tensor<2xf32>) -> tensor<2xf32>
  return %y : tensor<2xf32>
}
