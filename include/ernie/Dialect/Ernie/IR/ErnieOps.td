//===- ErnieOps.td - ernie operations ---------------------*- tablegen -*-===//
//
// Every op of the ernie dialect: elementwise math, creation, linear algebra,
// reductions, normalisation, shape manipulation and the transformer-level ops
// (rope, attention, cross_entropy).
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_DIALECT_ERNIE_IR_ERNIEOPS_TD
#define ERNIE_DIALECT_ERNIE_IR_ERNIEOPS_TD

include "ernie/Dialect/Ernie/IR/ErnieBase.td"
include "ernie/Dialect/Ernie/IR/ErnieAttrs.td"
include "ernie/Dialect/Ernie/IR/ErnieInterfaces.td"
include "ernie/Dialect/Ernie/IR/ErnieTypes.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

// Every ernie op is pure and reports its cost.
class Ernie_PureOp<string mnemonic, list<Trait> traits = []>
    : Ernie_Op<mnemonic, !listconcat([Pure, Ernie_CostOpInterface], traits)>;

// An op whose result types follow from its operands and attributes. Its shape
// rules live in inferReturnTypes alone; the verifier runs them too, so a
// broken rule is reported once, with its own message, before the generic
// "inferred type(s) ... are incompatible" check.
class Ernie_InferredOp<string mnemonic, list<Trait> traits = []>
    : Ernie_PureOp<mnemonic, !listconcat([InferTypeOpAdaptor], traits)> {
  let hasVerifier = 1;
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::verify() {
      return ::mlir::ernie::detail::verifyInferredShapeRules(*this);
    }
  }];
}

//===----------------------------------------------------------------------===//
// Elementwise unary ops.
//===----------------------------------------------------------------------===//

class Ernie_UnaryOp<string mnemonic, Type type, string math,
                    list<Trait> traits = []>
    : Ernie_PureOp<mnemonic, !listconcat(
          [Elementwise, SameOperandsAndResultType, Ernie_ShardingRuleOpInterface,
           DeclareOpInterfaceMethods<Ernie_GradientOpInterface>], traits)> {
  let summary = "elementwise " # math;
  let description = [{
    Computes `}] # math # [{` for every element of the operand.

    ```mlir
    %y = ernie.}] # mnemonic # [{ %x : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins type:$operand);
  let results = (outs type:$result);
  let assemblyFormat = "$operand attr-dict `:` type($result)";
}

def Ernie_NegOp : Ernie_UnaryOp<"neg", Ernie_NumericTensor, "-x"> {
  let hasFolder = 1;
}
def Ernie_ExpOp : Ernie_UnaryOp<"exp", Ernie_FloatTensor, "e^x">;
def Ernie_LogOp : Ernie_UnaryOp<"log", Ernie_FloatTensor, "ln(x)">;
def Ernie_SqrtOp : Ernie_UnaryOp<"sqrt", Ernie_FloatTensor, "sqrt(x)">;
def Ernie_RsqrtOp : Ernie_UnaryOp<"rsqrt", Ernie_FloatTensor, "1 / sqrt(x)">;
def Ernie_TanhOp : Ernie_UnaryOp<"tanh", Ernie_FloatTensor, "tanh(x)">;
def Ernie_SigmoidOp
    : Ernie_UnaryOp<"sigmoid", Ernie_FloatTensor, "1 / (1 + e^-x)">;
def Ernie_SiluOp : Ernie_UnaryOp<"silu", Ernie_FloatTensor, "x * sigmoid(x)">;
def Ernie_ReluOp : Ernie_UnaryOp<"relu", Ernie_NumericTensor, "max(x, 0)">;
def Ernie_AbsOp : Ernie_UnaryOp<"abs", Ernie_NumericTensor, "|x|">;
def Ernie_ReciprocalOp
    : Ernie_UnaryOp<"reciprocal", Ernie_FloatTensor, "1 / x">;
def Ernie_ErfOp : Ernie_UnaryOp<"erf", Ernie_FloatTensor, "erf(x)">;

def Ernie_StopGradientOp : Ernie_PureOp<"stop_gradient",
    [Elementwise, SameOperandsAndResultType, Ernie_ShardingRuleOpInterface, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "the value, with no gradient flowing back through it";
  let description = [{
    The identity in the forward pass; autodiff treats its result as a
    constant (Paddle's `stop_gradient`, PyTorch's `detach`).

    ```mlir
    %c = ernie.stop_gradient %x : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$operand);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = "$operand attr-dict `:` type($result)";
}

def Ernie_GeluOp : Ernie_PureOp<"gelu",
    [Elementwise, SameOperandsAndResultType, Ernie_ShardingRuleOpInterface, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "elementwise GELU";
  let description = [{
    `x * Φ(x)` with the exact Gaussian CDF, or, with `approximate`, the tanh
    form `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))` (Paddle's
    `approximate=True`, PyTorch's `approximate="tanh"`).

    ```mlir
    %y = ernie.gelu %x {approximate} : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$operand, UnitAttr:$approximate);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = "$operand attr-dict `:` type($result)";
}

def Ernie_CastOp : Ernie_PureOp<"cast",
    [Elementwise, SameOperandsAndResultShape, Ernie_ShardingRuleOpInterface, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "elementwise element-type conversion";
  let description = [{
    Converts every element to the result's element type: floats round to
    nearest even (for the fp8 types saturating to the largest finite value,
    infinities included, and NaN becoming the canonical NaN 0x7F: NVIDIA's
    `__NV_SATFINITE` conversions, which the CPU and CUDA runtimes both
    follow; elsewhere NaN stays NaN), float to integer truncates toward
    zero, integer to i1 is `x != 0`.

    ```mlir
    %y = ernie.cast %x : tensor<4x8xf32> -> tensor<4x8xbf16>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$operand);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = "$operand attr-dict `:` type($operand) `->` type($result)";
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Elementwise binary ops.
//===----------------------------------------------------------------------===//

class Ernie_BinaryOp<string mnemonic, Type type, string math,
                     list<Trait> traits = []>
    : Ernie_PureOp<mnemonic, !listconcat(
          [Elementwise, SameOperandsAndResultType, Ernie_ShardingRuleOpInterface,
           DeclareOpInterfaceMethods<Ernie_GradientOpInterface>], traits)> {
  let summary = "elementwise " # math;
  let description = [{
    Computes `}] # math # [{` elementwise. The operands have one shape:
    broadcasting is explicit (`ernie.broadcast`).

    ```mlir
    %z = ernie.}] # mnemonic # [{ %x, %y : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins type:$lhs, type:$rhs);
  let results = (outs type:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
  let hasFolder = 1;
}

def Ernie_AddOp : Ernie_BinaryOp<"add", Ernie_NumericTensor, "lhs + rhs",
                                 [Commutative]>;
def Ernie_SubOp : Ernie_BinaryOp<"sub", Ernie_NumericTensor, "lhs - rhs">;
def Ernie_MulOp : Ernie_BinaryOp<"mul", Ernie_NumericTensor, "lhs * rhs",
                                 [Commutative]>;
def Ernie_DivOp : Ernie_BinaryOp<"div", Ernie_NumericTensor, "lhs / rhs">;
def Ernie_MaximumOp : Ernie_BinaryOp<"maximum", Ernie_NumericTensor,
                                     "max(lhs, rhs)", [Commutative]>;
def Ernie_MinimumOp : Ernie_BinaryOp<"minimum", Ernie_NumericTensor,
                                     "min(lhs, rhs)", [Commutative]>;
def Ernie_PowOp : Ernie_BinaryOp<"pow", Ernie_FloatTensor, "lhs ^ rhs">;

def Ernie_CompareOp : Ernie_InferredOp<"compare",
    [Elementwise, SameTypeOperands, Ernie_ShardingRuleOpInterface]> {
  let summary = "elementwise comparison";
  let description = [{
    Compares the operands elementwise with `direction` and yields booleans.
    Float comparisons are ordered: any comparison with NaN is false except
    `ne`.

    ```mlir
    %m = ernie.compare lt, %x, %y : tensor<4xf32>
    ```
  }];
  let arguments = (ins Ernie_CompareDirection:$direction,
                       Ernie_Tensor:$lhs, Ernie_Tensor:$rhs);
  let results = (outs Ernie_BoolTensor:$result);
  let assemblyFormat = "$direction `,` $lhs `,` $rhs attr-dict `:` type($lhs)";
}

def Ernie_SelectOp : Ernie_PureOp<"select",
    [Elementwise, AllTypesMatch<["on_true", "on_false", "result"]>,
     AllShapesMatch<["cond", "result"]>, Ernie_ShardingRuleOpInterface, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "elementwise choice";
  let description = [{
    `cond ? on_true : on_false` for every element.

    ```mlir
    %z = ernie.select %m, %x, %y : tensor<4xi1>, tensor<4xf32>
    ```
  }];
  let arguments = (ins Ernie_BoolTensor:$cond, Ernie_Tensor:$on_true,
                       Ernie_Tensor:$on_false);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $cond `,` $on_true `,` $on_false attr-dict `:` type($cond) `,` type($result)
  }];
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Creation ops.
//===----------------------------------------------------------------------===//

def Ernie_ConstantOp : Ernie_PureOp<"constant",
    [ConstantLike, AllTypesMatch<["value", "result"]>, DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>]> {
  let summary = "a tensor of known values";
  let description = [{
    ```mlir
    %c = ernie.constant dense<[1.0, 2.0]> : tensor<2xf32>
    ```
  }];
  let arguments = (ins ElementsAttr:$value);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = "attr-dict $value";
  let hasFolder = 1;
}

def Ernie_FullOp : Ernie_PureOp<"full", [ConstantLike, Ernie_ShardingRuleOpInterface]> {
  let summary = "a tensor filled with one value";
  let description = [{
    Every element equals `value`, whose type is the result's element type.
    The literal is written without its type; it is rounded to the element
    type (nearest even) when parsed.

    ```mlir
    %z = ernie.full 0.0 : tensor<4x8xbf16>
    %i = ernie.full -100 : tensor<8xi64>
    ```
  }];
  let arguments = (ins TypedAttrInterface:$value);
  let results = (outs Ernie_Tensor:$result);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let hasFolder = 1;
  let builders = [
    OpBuilder<(ins "::mlir::RankedTensorType":$type, "double":$value)>
  ];
}

def Ernie_IotaOp : Ernie_PureOp<"iota", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>]> {
  let summary = "0, 1, 2, ... along one dimension";
  let description = [{
    Element `[i0, ..., in]` equals `i_dimension` (converted to the element
    type), whatever the other indices.

    ```mlir
    %pos = ernie.iota dim = 1 : tensor<2x16xi64>
    ```
  }];
  let arguments = (ins ConfinedAttr<I64Attr, [IntNonNegative]>:$dimension);
  let results = (outs Ernie_NumericTensor:$result);
  let assemblyFormat = "`dim` `=` $dimension attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Linear algebra and reductions.
//===----------------------------------------------------------------------===//

def Ernie_MatmulOp : Ernie_InferredOp<"matmul",
    [DeclareOpInterfaceMethods<Ernie_CostOpInterface, ["getFlops"]>, DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "batched matrix product";
  let description = [{
    `lhs[..., m, k] x rhs[..., k, n] -> [..., m, n]`, where `transpose_a`
    reads `lhs` as `[..., k, m]` and `transpose_b` reads `rhs` as
    `[..., n, k]`. The batch dimensions of both operands are equal, or `rhs`
    has rank 2 and is applied to every batch of `lhs` (a weight applied to
    `[batch, seq, hidden]` activations).

    ```mlir
    %y = ernie.matmul %x, %w {transpose_b} : tensor<2x16x64xf32>, tensor<128x64xf32> -> tensor<2x16x128xf32>
    ```
  }];
  let arguments = (ins Ernie_NumericTensor:$lhs, Ernie_NumericTensor:$rhs,
                       UnitAttr:$transpose_a, UnitAttr:$transpose_b);
  let results = (outs Ernie_NumericTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
}

def Ernie_MatmulAccumulateOp : Ernie_InferredOp<"matmul_accumulate",
    [DeclareOpInterfaceMethods<Ernie_CostOpInterface, ["getFlops"]>,
     DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>]> {
  let summary = "a matrix product added to an accumulator (GEMM with beta = 1)";
  let description = [{
    `acc + lhs x rhs`, the product under `matmul`'s rules (`transpose_a`,
    `transpose_b`, batches, a rank-2 `rhs` applied to every batch) and
    accumulated in the accumulator's type, which is the operands' or, for
    bf16 or f16 operands, f32: the product is never rounded to the narrow
    type. The result has the accumulator's type; a kernel may write it
    over the accumulator. What the pipeline schedule makes of a weight
    gradient's GEMM and the micro-batch sum it feeds (Megatron's gradient
    accumulation fusion: the weight-gradient GEMM adds into the f32 main
    gradient). Made after autodiff: it has no gradient.

    ```mlir
    %g = ernie.matmul_accumulate %x, %dy, %acc {transpose_a} : tensor<32x16xbf16>, tensor<32x24xbf16>, tensor<16x24xf32> -> tensor<16x24xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$lhs, Ernie_FloatTensor:$rhs,
                       Ernie_FloatTensor:$acc,
                       UnitAttr:$transpose_a, UnitAttr:$transpose_b);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` $acc attr-dict `:` type($lhs) `,` type($rhs) `,`
    type($acc) `->` type($result)
  }];
}

def Ernie_ScaledMatmulOp : Ernie_PureOp<"scaled_matmul",
    [DeclareOpInterfaceMethods<Ernie_CostOpInterface, ["getFlops"]>,
     DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>]> {
  let summary = "matrix product of fp8 codes, dequantised and accumulated in f32";
  let description = [{
    `matmul` of two fp8 operands (e4m3fn or e5m2, either mix) given with
    the dequantisation multipliers of their quantisation (`scale_inv`, the
    convention of Transformer Engine and `ernie.fp8.quantize`): the product
    of the dequantised values `lhs * lhs_scale_inv` and `rhs *
    rhs_scale_inv`, accumulated in f32, written as f32 or bf16. Per-tensor
    scales are scalars. What `--ernie-fp8-lowering` makes of a linear
    layer's GEMMs; the CUDA backend's form is cuBLASLt's FP8 GEMM.

    ```mlir
    %y = ernie.scaled_matmul %a, %b, %sa, %sb {transpose_b} : tensor<16x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<f32>, tensor<f32> -> tensor<16x32xf32>
    ```
  }];
  let arguments = (ins Ernie_TensorOf<[F8E4M3FN, F8E5M2]>:$lhs,
                       Ernie_TensorOf<[F8E4M3FN, F8E5M2]>:$rhs,
                       Ernie_TensorOf<[F32]>:$lhs_scale_inv,
                       Ernie_TensorOf<[F32]>:$rhs_scale_inv,
                       UnitAttr:$transpose_a, UnitAttr:$transpose_b);
  let results = (outs Ernie_TensorOf<[F32, BF16]>:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` $lhs_scale_inv `,` $rhs_scale_inv attr-dict `:`
    type($lhs) `,` type($rhs) `,` type($lhs_scale_inv) `,`
    type($rhs_scale_inv) `->` type($result)
  }];
  let hasVerifier = 1;
}

class Ernie_ReduceOp<string mnemonic, Type type, string math>
    : Ernie_InferredOp<mnemonic, [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = math # " over the given axes";
  let description = [{
    Reduces the `axes` (sorted, distinct) with }] # math # [{. With
    `keepdim` the reduced dimensions stay as size 1, otherwise they are
    dropped.

    ```mlir
    %s = ernie.}] # mnemonic # [{ %x axes = [1] keepdim : tensor<4x8xf32> -> tensor<4x1xf32>
    ```
  }];
  let arguments = (ins type:$input, DenseI64ArrayAttr:$axes,
                       UnitAttr:$keepdim);
  let results = (outs type:$result);
  let assemblyFormat = [{
    $input `axes` `=` $axes (`keepdim` $keepdim^)? attr-dict `:`
    type($input) `->` type($result)
  }];
  let hasFolder = 1;
}

def Ernie_ReduceSumOp : Ernie_ReduceOp<"reduce_sum", Ernie_NumericTensor, "the sum">;
def Ernie_ReduceMeanOp : Ernie_ReduceOp<"reduce_mean", Ernie_FloatTensor, "the mean">;
def Ernie_ReduceMaxOp : Ernie_ReduceOp<"reduce_max", Ernie_NumericTensor, "the maximum">;

class Ernie_SoftmaxOpBase<string mnemonic, string math>
    : Ernie_PureOp<mnemonic, [SameOperandsAndResultType, DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = math # " along one axis";
  let description = [{
    Numerically stable }] # math # [{ along `axis`.

    ```mlir
    %p = ernie.}] # mnemonic # [{ %logits, axis = 1 : tensor<4x32xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$input,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$axis);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = "$input `,` `axis` `=` $axis attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Ernie_SoftmaxOp : Ernie_SoftmaxOpBase<"softmax", "softmax">;
def Ernie_LogSoftmaxOp : Ernie_SoftmaxOpBase<"log_softmax", "log-softmax">;

//===----------------------------------------------------------------------===//
// Normalisation.
//===----------------------------------------------------------------------===//

def Ernie_RmsNormOp : Ernie_PureOp<"rms_norm",
    [AllTypesMatch<["input", "result"]>, DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "root-mean-square normalisation over the last dimension";
  let description = [{
    `x / sqrt(mean(x^2, -1) + epsilon) * weight`, with `weight` of shape
    `[d]` for an input `[..., d]`. The weight may have another float type
    than the input (fp32 weights under bf16 activations).

    ```mlir
    %y = ernie.rms_norm %x, %w, epsilon = 1.000000e-06 : tensor<2x16x64xbf16>, tensor<64xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$input, Ernie_FloatTensor:$weight,
                       DefaultValuedAttr<F64Attr, "1.0e-6">:$epsilon);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight `,` `epsilon` `=` $epsilon attr-dict `:`
    type($input) `,` type($weight)
  }];
  let hasVerifier = 1;
}

def Ernie_LayerNormOp : Ernie_PureOp<"layer_norm",
    [AllTypesMatch<["input", "result"]>, AllTypesMatch<["weight", "bias"]>,
     DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "layer normalisation over the last dimension";
  let description = [{
    `(x - mean) / sqrt(var + epsilon) * weight + bias` over the last dimension
    (biased variance), with `weight` and `bias` of shape `[d]`.

    ```mlir
    %y = ernie.layer_norm %x, %w, %b, epsilon = 1.000000e-05 : tensor<2x16x64xf32>, tensor<64xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$input, Ernie_FloatTensor:$weight,
                       Ernie_FloatTensor:$bias,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$epsilon);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight `,` $bias `,` `epsilon` `=` $epsilon attr-dict `:`
    type($input) `,` type($weight)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Shape ops.
//===----------------------------------------------------------------------===//

def Ernie_ReshapeOp : Ernie_PureOp<"reshape", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "the same elements in another shape";
  let description = [{
    Row-major reinterpretation of the elements; the element count is kept.

    ```mlir
    %y = ernie.reshape %x : tensor<2x16x64xf32> -> tensor<2x16x4x16xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Ernie_TransposeOp : Ernie_InferredOp<"transpose", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "permute dimensions";
  let description = [{
    Result dimension `i` is input dimension `perm[i]`.

    ```mlir
    %y = ernie.transpose %x, perm = [0, 2, 1, 3] : tensor<2x16x4x8xf32> -> tensor<2x4x16x8xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, DenseI64ArrayAttr:$perm);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `,` `perm` `=` $perm attr-dict `:` type($input) `->` type($result)
  }];
  let hasFolder = 1;
}

def Ernie_BroadcastOp : Ernie_PureOp<"broadcast", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "expand a tensor to a larger shape";
  let description = [{
    Operand dimension `i` becomes result dimension `dims[i]` (strictly
    increasing); its size equals that result dimension or is 1 (expanded).
    Result dimensions not named in `dims` are new.

    ```mlir
    %y = ernie.broadcast %b, dims = [2] : tensor<64xf32> -> tensor<2x16x64xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, DenseI64ArrayAttr:$dims);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `,` `dims` `=` $dims attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Ernie_SliceOp : Ernie_InferredOp<"slice", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "a strided box of a tensor";
  let description = [{
    Per dimension `[start:limit:step]`, `0 <= start <= limit <= size`,
    `step >= 1`; the result has `ceil((limit - start) / step)` elements there.

    ```mlir
    %y = ernie.slice %x [0:2, 4:16:2] : tensor<4x16xf32> -> tensor<2x6xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, DenseI64ArrayAttr:$start,
                       DenseI64ArrayAttr:$limit, DenseI64ArrayAttr:$step);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input custom<SliceRanges>($start, $limit, $step) attr-dict `:`
    type($input) `->` type($result)
  }];
  let hasFolder = 1;
}

def Ernie_PadOp : Ernie_InferredOp<"pad",
    [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "surround (and interleave) a tensor with zeros";
  let description = [{
    Per dimension, `low` zeros before, `high` zeros after and `interior`
    zeros between consecutive elements (all non-negative). The result
    dimension is `low + size + (size - 1) * interior + high`. The transpose
    of a strided `slice`: its gradient.

    ```mlir
    %y = ernie.pad %x low = [0, 1], high = [0, 2], interior = [0, 1] : tensor<2x3xf32> -> tensor<2x8xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, DenseI64ArrayAttr:$low,
                       DenseI64ArrayAttr:$high, DenseI64ArrayAttr:$interior);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `low` `=` $low `,` `high` `=` $high `,` `interior` `=` $interior
    attr-dict `:` type($input) `->` type($result)
  }];
}

def Ernie_ConcatOp : Ernie_InferredOp<"concat", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "join tensors along one axis";
  let description = [{
    The inputs have one element type and rank and agree on every dimension
    but `axis`.

    ```mlir
    %y = ernie.concat %a, %b axis = 1 : tensor<2x3xf32>, tensor<2x5xf32> -> tensor<2x8xf32>
    ```
  }];
  let arguments = (ins Variadic<Ernie_Tensor>:$inputs,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$axis);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $inputs `axis` `=` $axis attr-dict `:` type($inputs) `->` type($result)
  }];
  let hasFolder = 1;
}

def Ernie_SplitOp : Ernie_InferredOp<"split", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "cut a tensor into pieces along one axis";
  let description = [{
    One result per entry of `sizes`, which add up to the size of `axis`.

    ```mlir
    %q, %k, %v = ernie.split %qkv axis = 2, sizes = [64, 16, 16] : tensor<2x8x96xf32> -> tensor<2x8x64xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$axis,
                       DenseI64ArrayAttr:$sizes);
  let results = (outs Variadic<Ernie_Tensor>:$results);
  let assemblyFormat = [{
    $input `axis` `=` $axis `,` `sizes` `=` $sizes attr-dict `:`
    type($input) `->` type($results)
  }];
}

def Ernie_GatherOp : Ernie_InferredOp<"gather", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "take entries along one axis by index";
  let description = [{
    `result[a..., i..., b...] = input[a..., indices[i...], b...]` where `a` are
    the dimensions before `axis` (numpy's `take`, Paddle's `gather`). The
    result shape is `input[:axis] + indices + input[axis+1:]`. Indices out of
    range are an error at run time.

    ```mlir
    %y = ernie.gather %x[%idx] axis = 0 : tensor<10x4xf32>, tensor<3xi64> -> tensor<3x4xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, Ernie_IndexTensor:$indices,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$axis);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `[` $indices `]` `axis` `=` $axis attr-dict `:`
    type($input) `,` type($indices) `->` type($result)
  }];
}

def Ernie_IndexAddOp : Ernie_InferredOp<"index_add",
    [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "add slices into a tensor at indices along one axis";
  let description = [{
    `result = base`, then `result[a..., indices[i...], b...] +=
    updates[a..., i..., b...]` for every `i` (repeated indices accumulate).
    `updates` has the shape `gather` would produce. Paddle's `index_add`;
    the gradient of `gather` and `embedding`.

    ```mlir
    %t = ernie.index_add %zeros, %ids, %rows axis = 0 : tensor<100x8xf32>, tensor<2x3xi64>, tensor<2x3x8xf32> -> tensor<100x8xf32>
    ```
  }];
  let arguments = (ins Ernie_NumericTensor:$base, Ernie_IndexTensor:$indices,
                       Ernie_NumericTensor:$updates,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$axis);
  let results = (outs Ernie_NumericTensor:$result);
  let assemblyFormat = [{
    $base `,` $indices `,` $updates `axis` `=` $axis attr-dict `:`
    type($base) `,` type($indices) `,` type($updates) `->` type($result)
  }];
}

def Ernie_EmbeddingOp : Ernie_InferredOp<"embedding", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "look up rows of a table";
  let description = [{
    `result[i..., :] = weight[indices[i...], :]` for a table `[vocab, hidden]`.
    Rows equal to `padding_idx`, when given, receive no gradient (Paddle's
    `padding_idx`).

    ```mlir
    %h = ernie.embedding %ids, %table : tensor<2x16xi64>, tensor<1000x64xf32> -> tensor<2x16x64xf32>
    ```
  }];
  let arguments = (ins Ernie_IndexTensor:$indices, Ernie_FloatTensor:$weight,
                       OptionalAttr<I64Attr>:$padding_idx);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $indices `,` $weight attr-dict `:` type($indices) `,` type($weight) `->`
    type($result)
  }];
}

def Ernie_TopkOp : Ernie_InferredOp<"topk", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "the k largest (or smallest) entries along one axis";
  let description = [{
    Values sorted (descending when `largest`, the default), with their i64
    indices; ties keep the lower index first.

    ```mlir
    %v, %i = ernie.topk %scores, k = 2, axis = 1 : tensor<16x8xf32> -> tensor<16x2xf32>, tensor<16x2xi64>
    ```
  }];
  let arguments = (ins Ernie_NumericTensor:$input,
                       ConfinedAttr<I64Attr, [IntPositive]>:$k,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$axis,
                       DefaultValuedAttr<BoolAttr, "true">:$largest);
  let results = (outs Ernie_NumericTensor:$values,
                      Ernie_I64Tensor:$indices);
  let assemblyFormat = [{
    $input `,` `k` `=` $k `,` `axis` `=` $axis attr-dict `:`
    type($input) `->` type($values) `,` type($indices)
  }];
}

//===----------------------------------------------------------------------===//
// Mixture of experts: routing with a capacity, dispatch and combine.
//
// Tokens come in groups, `[groups, tokens, ...]`; each group has its own
// capacity of `capacity` slots per expert, and the expert buffers are
// `[experts, groups, capacity, hidden]`. Groups are independent, so
// sharding the group dimension (one group per data-parallel rank, Paddle's
// per-rank capacity) splits the work without changing what is dropped, and
// moving the buffers' sharding from groups to experts is the all-to-all of
// expert parallelism.
//===----------------------------------------------------------------------===//

def Ernie_MoeRouteOp : Ernie_InferredOp<"moe_route", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>]> {
  let summary = "capacity slots of top-k expert choices";
  let description = [{
    `experts` `[groups, tokens, k]` holds each token's chosen experts in
    `[0, num_experts)`. The result gives each choice its slot in its
    expert's buffer of the same group: choices are taken choice rank first
    (every token's first choice, then every second choice, as GShard does),
    tokens in order, and a choice gets the number of earlier choices of its
    expert in its group. A slot of `capacity` or more is dropped: -1.

    ```mlir
    %slots = ernie.moe_route %experts {num_experts = 8, capacity = 4} : tensor<2x16x2xi64> -> tensor<2x16x2xi64>
    ```
  }];
  let arguments = (ins Ernie_IndexTensor:$experts,
                       ConfinedAttr<I64Attr, [IntPositive]>:$num_experts,
                       ConfinedAttr<I64Attr, [IntPositive]>:$capacity);
  let results = (outs Ernie_I64Tensor:$slots);
  let assemblyFormat = [{
    $experts attr-dict `:` type($experts) `->` type($slots)
  }];
}

def Ernie_MoeDispatchOp : Ernie_InferredOp<"moe_dispatch", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "scatter tokens into their experts' capacity buffers";
  let description = [{
    Starting from zeros, `result[experts[g, t, j], g, slots[g, t, j], :] +=
    weights[g, t, j] * input[g, t, :]` for every kept choice (slot >= 0;
    `moe_route`'s slots are distinct, so each slot holds one token or
    zeros). `input` is `[groups, tokens, hidden]`, `experts`, `slots` and
    `weights` `[groups, tokens, k]`, the result `[num_experts, groups,
    capacity, hidden]`. Plain dispatch passes weights of one; the weighted
    form is `moe_combine`'s gradient.

    ```mlir
    %buf = ernie.moe_dispatch %x, %experts, %slots, %ones {num_experts = 8, capacity = 4} : tensor<2x16x32xf32>, tensor<2x16x2xi64>, tensor<2x16x2xi64>, tensor<2x16x2xf32> -> tensor<8x2x4x32xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$input, Ernie_IndexTensor:$experts,
                       Ernie_IndexTensor:$slots, Ernie_FloatTensor:$weights,
                       ConfinedAttr<I64Attr, [IntPositive]>:$num_experts,
                       ConfinedAttr<I64Attr, [IntPositive]>:$capacity);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $experts `,` $slots `,` $weights attr-dict `:` type($input) `,`
    type($experts) `,` type($slots) `,` type($weights) `->` type($result)
  }];
}

def Ernie_MoeCombineOp : Ernie_InferredOp<"moe_combine", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "the weighted sum of each token's expert outputs";
  let description = [{
    `result[g, t, :] = sum_j weights[g, t, j] * input[experts[g, t, j], g,
    slots[g, t, j], :]` over the kept choices (a dropped choice adds
    nothing). `input` is `[experts, groups, capacity, hidden]`; `experts`,
    `slots` and `weights` `[groups, tokens, k]`; the result `[groups,
    tokens, hidden]`. The transpose of `moe_dispatch`.

    ```mlir
    %y = ernie.moe_combine %out, %experts, %slots, %w : tensor<8x2x4x32xf32>, tensor<2x16x2xi64>, tensor<2x16x2xi64>, tensor<2x16x2xf32> -> tensor<2x16x32xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$input, Ernie_IndexTensor:$experts,
                       Ernie_IndexTensor:$slots, Ernie_FloatTensor:$weights);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $experts `,` $slots `,` $weights attr-dict `:` type($input) `,`
    type($experts) `,` type($slots) `,` type($weights) `->` type($result)
  }];
}

def Ernie_MoeWeightsGradOp : Ernie_InferredOp<"moe_weights_grad", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>]> {
  let summary = "the gradient of dispatch's or combine's weights";
  let description = [{
    `result[g, t, j] = sum_h tokens[g, t, h] * buffers[experts[g, t, j], g,
    slots[g, t, j], h]` for kept choices, zero for dropped ones: the
    gradient of `moe_combine`'s weights (tokens = the result's gradient,
    buffers = its input) and of `moe_dispatch`'s (tokens = its input,
    buffers = the result's gradient).

    ```mlir
    %dw = ernie.moe_weights_grad %dy, %out, %experts, %slots : tensor<2x16x32xf32>, tensor<8x2x4x32xf32>, tensor<2x16x2xi64>, tensor<2x16x2xi64> -> tensor<2x16x2xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$tokens, Ernie_FloatTensor:$buffers,
                       Ernie_IndexTensor:$experts, Ernie_IndexTensor:$slots);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $tokens `,` $buffers `,` $experts `,` $slots attr-dict `:` type($tokens)
    `,` type($buffers) `,` type($experts) `,` type($slots) `->` type($result)
  }];
}

def Ernie_ExpertMatmulOp : Ernie_InferredOp<"expert_matmul",
    [DeclareOpInterfaceMethods<Ernie_CostOpInterface, ["getFlops", "getBytesAccessed"]>, DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "each expert's GEMM over the slots routing filled (grouped GEMM)";
  let description = [{
    `result[e, g, r, :] = input[e, g, r, :] x weight[e]` for the rows `r <
    rows[e, g]` that routing filled, zeros for the rest: `input` is the
    dispatched buffers `[experts, groups, capacity, in]`, `weight` `[experts,
    in, out]` (`[experts, out, in]` with `transpose_weight`), `rows`
    `[experts, groups]` the slots in use (`moe_route` fills each expert's
    slots of a group from 0), the result `[experts, groups, capacity, out]`.
    A kernel computes only the filled rows, so a dropless layer's empty
    slots (E / k times the rows routing uses) cost nothing but their
    zeros. `fill` is the fraction of the slots routing fills on average
    (k x tokens over experts x capacity), the cost model's FLOP count;
    the kernels read `rows`.

    ```mlir
    %y = ernie.expert_matmul %buf, %w, %rows {fill = 2.500000e-01 : f64} : tensor<8x2x16x32xf32>, tensor<8x32x64xf32>, tensor<8x2xi64> -> tensor<8x2x16x64xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$input, Ernie_FloatTensor:$weight,
                       Ernie_IndexTensor:$rows, UnitAttr:$transpose_weight,
                       DefaultValuedAttr<F64Attr, "1.0">:$fill);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight `,` $rows attr-dict `:` type($input) `,` type($weight)
    `,` type($rows) `->` type($result)
  }];
}

def Ernie_ExpertWeightGradOp : Ernie_InferredOp<"expert_weight_grad",
    [DeclareOpInterfaceMethods<Ernie_CostOpInterface, ["getFlops", "getBytesAccessed"]>, DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>]> {
  let summary = "the expert weights' gradient of `expert_matmul`";
  let description = [{
    `result[e] = sum_g sum_{r < rows[e, g]} input[e, g, r, :]^T x
    grad[e, g, r, :]`: `input` `[experts, groups, capacity, in]`, `grad`
    `[experts, groups, capacity, out]`, `rows` `[experts, groups]`, the
    result `[experts, in, out]`. Only the filled rows are read. `fill` as
    `expert_matmul`'s.

    ```mlir
    %dw = ernie.expert_weight_grad %buf, %dy, %rows {fill = 2.500000e-01 : f64} : tensor<8x2x16x32xf32>, tensor<8x2x16x64xf32>, tensor<8x2xi64> -> tensor<8x32x64xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$input, Ernie_FloatTensor:$grad,
                       Ernie_IndexTensor:$rows,
                       DefaultValuedAttr<F64Attr, "1.0">:$fill);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $grad `,` $rows attr-dict `:` type($input) `,` type($grad) `,`
    type($rows) `->` type($result)
  }];
}

//===----------------------------------------------------------------------===//
// Transformer ops.
//===----------------------------------------------------------------------===//

def Ernie_RopeOp : Ernie_PureOp<"rope",
    [AllTypesMatch<["input", "result"]>, DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "rotary position embedding";
  let description = [{
    Rotates `input` `[batch, seq, heads, head_dim]` (head_dim even) by the
    angles `position * theta^(-2i / head_dim)`. Pairs are `(i, i + head_dim/2)`
    (the "rotate half" form of GPT-NeoX and Hugging Face Llama), or
    `(2i, 2i + 1)` with `interleaved` (the original RoFormer form).
    `positions` is `[seq]` or `[batch, seq]`, integer.

    ```mlir
    %q2 = ernie.rope %q, %pos, theta = 1.000000e+04 : tensor<2x16x4x32xf32>, tensor<16xi64>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$input, Ernie_IndexTensor:$positions,
                       DefaultValuedAttr<F64Attr, "10000.0">:$theta,
                       UnitAttr:$interleaved);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $positions `,` `theta` `=` $theta attr-dict `:`
    type($input) `,` type($positions)
  }];
  let hasVerifier = 1;
}

def Ernie_AttentionOp : Ernie_InferredOp<"attention",
    [DeclareOpInterfaceMethods<Ernie_CostOpInterface, ["getFlops"]>, DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "scaled dot-product attention with grouped-query heads";
  let description = [{
    `softmax(q k^T * scale [+ causal mask]) v` per head, on the layout
    `[batch, seq, heads, head_dim]`. `query` has `hq` heads, `key` and
    `value` have `hkv` heads with `hq % hkv == 0`: query head `h` attends
    with key/value head `h / (hq / hkv)` (grouped-query attention; `hkv == 1`
    is multi-query). `scale` defaults to `1/sqrt(head_dim)`. With `causal`,
    query `i` sees keys `0..i` (query and key sequences are equally long);
    with a `window` too (sliding-window attention, Mistral's
    `sliding_window`), only the last `window` of them, `i - window + 1..i`.

    ```mlir
    %o = ernie.attention %q, %k, %v {causal} : tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32> -> tensor<2x16x8x32xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$query, Ernie_FloatTensor:$key,
                       Ernie_FloatTensor:$value, UnitAttr:$causal,
                       OptionalAttr<F64Attr>:$scale,
                       OptionalAttr<I64Attr>:$window);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $query `,` $key `,` $value attr-dict `:` type($query) `,` type($key) `,`
    type($value) `->` type($result)
  }];
}

def Ernie_AttentionGradOp : Ernie_InferredOp<"attention_grad",
    [DeclareOpInterfaceMethods<Ernie_CostOpInterface, ["getFlops"]>,
     DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>]> {
  let summary = "the gradients of attention's query, key and value";
  let description = [{
    Given `attention`'s operands and attributes and the gradient `dout` of
    its result, the gradients of `query`, `key` and `value` (each of its
    operand's type). Kernels recompute the probabilities, as flash
    attention does, so nothing of the forward is saved but its inputs.

    ```mlir
    %dq, %dk, %dv = ernie.attention_grad %q, %k, %v, %dout {causal} : tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x8x32xf32> -> tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$query, Ernie_FloatTensor:$key,
                       Ernie_FloatTensor:$value, Ernie_FloatTensor:$dout,
                       UnitAttr:$causal, OptionalAttr<F64Attr>:$scale,
                       OptionalAttr<I64Attr>:$window);
  let results = (outs Ernie_FloatTensor:$dquery, Ernie_FloatTensor:$dkey,
                      Ernie_FloatTensor:$dvalue);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $dout attr-dict `:` type($query) `,`
    type($key) `,` type($value) `,` type($dout) `->` type($dquery) `,`
    type($dkey) `,` type($dvalue)
  }];
}

def Ernie_CrossEntropyGradOp : Ernie_InferredOp<"cross_entropy_grad",
    [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>]> {
  let summary = "the gradient of cross_entropy with respect to its logits";
  let description = [{
    `(softmax(logits) - one_hot(labels)) * dloss`, with ignored tokens
    zero and, for `reduction = mean`, divided by the count of tokens not
    ignored. `dloss` has `cross_entropy`'s result type for the same
    attributes.

    ```mlir
    %dl = ernie.cross_entropy_grad %logits, %labels, %dloss : tensor<2x16x100xf32>, tensor<2x16xi64>, tensor<f32> -> tensor<2x16x100xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$logits, Ernie_IndexTensor:$labels,
                       Ernie_FloatTensor:$dloss,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       DefaultValuedAttr<Ernie_LossReductionAttr,
                                         "::mlir::ernie::LossReduction::mean">:$reduction);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $labels `,` $dloss attr-dict `:` type($logits) `,`
    type($labels) `,` type($dloss) `->` type($result)
  }];
}

def Ernie_CrossEntropyAndGradOp : Ernie_InferredOp<"cross_entropy_and_grad"> {
  let summary = "cross_entropy and its gradient over the same logits, in one pass";
  let description = [{
    `cross_entropy(logits, labels)` and `cross_entropy_grad(logits, labels,
    dloss)` with the same attributes, bit for bit, reading the logits once
    and computing each exponential once (the two ops each compute all of
    them). `--ernie-fuse` forms it where a partitioned step computes both;
    it has no sharding rule or gradient, as it exists only after partition.

    ```mlir
    %loss, %dl = ernie.cross_entropy_and_grad %logits, %labels, %dloss : tensor<2x16x100xf32>, tensor<2x16xi64>, tensor<f32> -> tensor<f32>, tensor<2x16x100xf32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$logits, Ernie_IndexTensor:$labels,
                       Ernie_FloatTensor:$dloss,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       DefaultValuedAttr<Ernie_LossReductionAttr,
                                         "::mlir::ernie::LossReduction::mean">:$reduction);
  let results = (outs Ernie_FloatTensor:$loss, Ernie_FloatTensor:$dlogits);
  let assemblyFormat = [{
    $logits `,` $labels `,` $dloss attr-dict `:` type($logits) `,`
    type($labels) `,` type($dloss) `->` type($loss) `,` type($dlogits)
  }];
}

def Ernie_CrossEntropyOp : Ernie_InferredOp<"cross_entropy", [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface, ["getShardingRule"]>, DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "softmax cross-entropy against integer labels";
  let description = [{
    Per token `logsumexp(logits[t, :]) - logits[t, label[t]]` over the last
    (vocabulary) dimension. Tokens whose label equals `ignore_index` (default
    -100) contribute nothing. `reduction = mean` (the default) averages over
    the tokens not ignored, `sum` adds them, `none` returns one loss per
    token with the labels' shape.

    ```mlir
    %loss = ernie.cross_entropy %logits, %labels : tensor<2x16x1000xf32>, tensor<2x16xi64> -> tensor<f32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$logits, Ernie_IndexTensor:$labels,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       DefaultValuedAttr<Ernie_LossReductionAttr,
                                         "::mlir::ernie::LossReduction::mean">:$reduction);
  let results = (outs Ernie_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $labels attr-dict `:` type($logits) `,` type($labels) `->`
    type($result)
  }];
}

//===----------------------------------------------------------------------===//
// Optimizer updates: each optimizer's math in one op. The learning rate and
// step are inputs (scalar tensors), so a schedule needs no recompilation.
//===----------------------------------------------------------------------===//

class Ernie_OptimizerOp<string mnemonic, list<Trait> traits = []>
    : Ernie_PureOp<mnemonic, !listconcat(
          [DeclareOpInterfaceMethods<Ernie_ShardingRuleOpInterface,
                                     ["getShardingRule"]>], traits)> {
  let hasVerifier = 1;
}

def Ernie_SgdUpdateOp : Ernie_OptimizerOp<"sgd_update",
    [AllTypesMatch<["param", "grad", "new_param"]>,
     AllTypesMatch<["momentum_buffer", "new_momentum_buffer"]>]> {
  let summary = "one SGD step with momentum and weight decay";
  let description = [{
    `g' = grad + weight_decay * param`; `buf' = momentum * buf + g'`;
    `param' = param - lr * (nesterov ? g' + momentum * buf' : buf')`
    (PyTorch's and Paddle's `SGD`/`Momentum`; with `momentum = 0`,
    `buf' = g'`). Computed in the buffer's (f32) precision; the buffer has
    the parameter's shape.

    ```mlir
    %p2, %b2 = ernie.sgd_update %p, %g, %buf, %lr {momentum = 9.000000e-01 : f64} : tensor<64x64xf32>, tensor<64x64xf32>, tensor<f32>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$param, Ernie_FloatTensor:$grad,
                       Ernie_FloatTensor:$momentum_buffer,
                       Ernie_FloatTensor:$lr,
                       DefaultValuedAttr<F64Attr, "0.0">:$momentum,
                       DefaultValuedAttr<F64Attr, "0.0">:$weight_decay,
                       UnitAttr:$nesterov);
  let results = (outs Ernie_FloatTensor:$new_param,
                      Ernie_FloatTensor:$new_momentum_buffer);
  let assemblyFormat = [{
    $param `,` $grad `,` $momentum_buffer `,` $lr attr-dict `:`
    type($param) `,` type($momentum_buffer) `,` type($lr)
  }];
}

def Ernie_AdamWUpdateOp : Ernie_OptimizerOp<"adamw_update",
    [AllTypesMatch<["param", "grad", "new_param"]>,
     AllTypesMatch<["moment1", "moment2", "new_moment1", "new_moment2"]>]> {
  let summary = "one AdamW step with bias correction and decoupled decay";
  let description = [{
    With `t = step` (1 for the first update):
    `m' = b1 m + (1 - b1) g`, `v' = b2 v + (1 - b2) g^2`,
    `m^ = m' / (1 - b1^t)`, `v^ = v' / (1 - b2^t)`,
    `param' = param - lr * (m^ / (sqrt(v^) + epsilon) + weight_decay * param)`
    (Loshchilov & Hutter; PyTorch's `AdamW`, Paddle's `AdamW`). Moments are
    kept in their own (f32) precision.

    ```mlir
    %p2, %m2, %v2 = ernie.adamw_update %p, %g, %m, %v, %lr, %t {weight_decay = 1.000000e-02 : f64} : tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<i64>
    ```
  }];
  let arguments = (ins Ernie_FloatTensor:$param, Ernie_FloatTensor:$grad,
                       Ernie_FloatTensor:$moment1, Ernie_FloatTensor:$moment2,
                       Ernie_FloatTensor:$lr, Ernie_IndexTensor:$step,
                       DefaultValuedAttr<F64Attr, "0.9">:$beta1,
                       DefaultValuedAttr<F64Attr, "0.999">:$beta2,
                       DefaultValuedAttr<F64Attr, "1.0e-8">:$epsilon,
                       DefaultValuedAttr<F64Attr, "0.01">:$weight_decay);
  let results = (outs Ernie_FloatTensor:$new_param,
                      Ernie_FloatTensor:$new_moment1,
                      Ernie_FloatTensor:$new_moment2);
  let assemblyFormat = [{
    $param `,` $grad `,` $moment1 `,` $moment2 `,` $lr `,` $step attr-dict `:`
    type($param) `,` type($moment1) `,` type($lr) `,` type($step)
  }];
}

//===----------------------------------------------------------------------===//
// Meshes and sharding annotations.
//===----------------------------------------------------------------------===//

// The mesh's rank count, computed without overflow, is at most kMaxRanks.
def Ernie_MeshRankBound : NativeOpTrait<"MeshRankBound"> {
  let cppNamespace = "::mlir::ernie";
}

def Ernie_MeshOp : Ernie_Op<"mesh", [Symbol, HasParent<"::mlir::ModuleOp">,
                                     Ernie_MeshRankBound]> {
  let summary = "a named N-D device mesh";
  let description = [{
    A logical grid of ranks with named axes, row-major: the last axis varies
    fastest. Shardings name a mesh and its axes, never ranks, so a program's
    size does not depend on the number of ranks.

    ```mlir
    ernie.mesh @mesh(dp = 2, mp = 4)
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrArrayAttr:$axis_names,
                       DenseI64ArrayAttr:$axis_sizes);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The size of axis `name`, or std::nullopt when the mesh has none.
    std::optional<int64_t> getAxisSize(::llvm::StringRef name);
    /// Ranks in the mesh: the product of the axis sizes.
    int64_t getNumRanks();
    /// The most ranks a mesh may have; the runtime checks the same bound
    /// (kMaxRanks in runtime/include/ernie/runtime/Mesh.h) at load.
    static constexpr int64_t kMaxRanks = int64_t(1) << 20;
  }];
}

def Ernie_ShardingConstraintOp : Ernie_Op<"sharding_constraint",
    [Pure, SameOperandsAndResultType,
     DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "the user's placement for a value inside a function";
  let description = [{
    Asks propagation to give the value this sharding. Between conflicting
    constraints the lower `priority` wins (0 is the strongest, as in Shardy);
    a constraint propagation cannot honour for every use gets a reshard
    rather than being dropped.

    ```mlir
    %y = ernie.sharding_constraint %x <@mesh, [{dp}, {} ]> : tensor<8x16xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, Ernie_ShardingAttr:$sharding,
                       DefaultValuedAttr<ConfinedAttr<I64Attr, [IntNonNegative]>, "0">:$priority);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input $sharding attr-dict `:` type($result)
  }];
}

def Ernie_ReshardOp : Ernie_Op<"reshard",
    [Pure, SameOperandsAndResultType,
     DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "move a value to another sharding";
  let description = [{
    The value is the same; its layout changes to `sharding`. Partition lowers
    every reshard to the cheapest sequence of collectives and local slices.

    ```mlir
    %y = ernie.reshard %x <@mesh, [{}, {mp} ]> : tensor<8x16xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, Ernie_ShardingAttr:$sharding);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = "$input $sharding attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Collectives: what partition lowers reshards to. They name mesh axes, never
// ranks: the group of a rank is every rank that differs from it only along
// the named axes, ordered by those axes' coordinates (major to minor).
//
// Every rank runs the same program, so a rewrite of a collective happens on
// all of them alike: collectives are Pure, and CSE merges two that reduce
// the same value (one all-reduce, not one per use). Two are not: a started
// transfer stays paired with its wait, and an all-gather's result is group
// size times its input — keeping it for a later use (the backward) costs
// that memory, so a later use gathers again, as Megatron's sequence
// parallelism does.
//===----------------------------------------------------------------------===//

class Ernie_CollectiveOp<string mnemonic, list<Trait> traits = []>
    : Ernie_Op<mnemonic, !listconcat(
          [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
           DeclareOpInterfaceMethods<Ernie_CostOpInterface,
                                     ["getBytesAccessed"]>], traits)> {
  let hasVerifier = 1;
  code commonExtraClassDeclaration = [{
    /// The ranks in one group: the product of the named axes' sizes.
    int64_t getGroupSize(MeshOp mesh);
  }];
  let extraClassDeclaration = commonExtraClassDeclaration;
}

def Ernie_AllReduceOp : Ernie_CollectiveOp<"all_reduce",
    [Pure, SameOperandsAndResultType]> {
  let summary = "reduce over a group; every member gets the result";
  let description = [{
    ```mlir
    %y = ernie.all_reduce %x over @mesh[mp] sum : tensor<8x16xf32>
    ```

    Canonicalization: the partial sum of a reduction computed in f32 and
    rounded to a narrow float is summed across ranks in f32 and rounded
    once after (`all_reduce(cast(reduce_sum(x)))` becomes
    `cast(all_reduce(reduce_sum(x)))`), as Megatron and PyTorch keep
    losses and norm statistics in f32.
  }];
  let hasCanonicalizer = 1;
  let arguments = (ins Ernie_Tensor:$input, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$axes, Ernie_ReduceKindAttr:$kind);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `over` custom<MeshAxes>($mesh, $axes) custom<ReduceKindKeyword>($kind)
    attr-dict `:` type($result)
  }];
}

def Ernie_AllGatherOp : Ernie_CollectiveOp<"all_gather"> {
  let summary = "concatenate the group's pieces along one dimension";
  let description = [{
    ```mlir
    %y = ernie.all_gather %x over @mesh[mp] dim = 1 : tensor<8x4xf32> -> tensor<8x16xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$axes,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$dim);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `over` custom<MeshAxes>($mesh, $axes) `dim` `=` $dim attr-dict `:`
    type($input) `->` type($result)
  }];
}

def Ernie_ReduceScatterOp : Ernie_CollectiveOp<"reduce_scatter", [Pure]> {
  let summary = "reduce over a group, each member keeping its piece";
  let description = [{
    Member `i` keeps piece `i` along `dim` of the reduced tensor.

    ```mlir
    %y = ernie.reduce_scatter %x over @mesh[mp] dim = 0 sum : tensor<8x16xf32> -> tensor<2x16xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$axes,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$dim,
                       Ernie_ReduceKindAttr:$kind);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `over` custom<MeshAxes>($mesh, $axes) `dim` `=` $dim
    custom<ReduceKindKeyword>($kind) attr-dict `:` type($input) `->` type($result)
  }];
}

def Ernie_AllToAllOp : Ernie_CollectiveOp<"all_to_all", [Pure]> {
  let summary = "exchange pieces: split one dimension, concatenate another";
  let description = [{
    Each member cuts its tensor into group-size pieces along `split_dim`,
    sends piece `j` to member `j`, and concatenates what it receives along
    `concat_dim` in member order.

    ```mlir
    %y = ernie.all_to_all %x over @mesh[mp] split_dim = 1, concat_dim = 0 : tensor<2x16xf32> -> tensor<8x4xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$axes,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$split_dim,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$concat_dim);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `over` custom<MeshAxes>($mesh, $axes) `split_dim` `=` $split_dim `,`
    `concat_dim` `=` $concat_dim attr-dict `:` type($input) `->` type($result)
  }];
}

def Ernie_ShardSliceOp : Ernie_CollectiveOp<"shard_slice", [Pure]> {
  let summary = "keep this rank's piece of a replicated dimension";
  let description = [{
    No communication: member `i` of an `n`-member group keeps piece
    `(i + shift) mod n` along `dim` (piece `i` unless `shift` says otherwise:
    a decomposed collective matmul walks the pieces with it).

    ```mlir
    %y = ernie.shard_slice %x over @mesh[dp] dim = 0 : tensor<8x16xf32> -> tensor<4x16xf32>
    %z = ernie.shard_slice %x over @mesh[dp] dim = 0 shift = 1 : tensor<8x16xf32> -> tensor<4x16xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$axes,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$dim,
                       DefaultValuedAttr<I64Attr, "0">:$shift);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `over` custom<MeshAxes>($mesh, $axes) `dim` `=` $dim
    (`shift` `=` $shift^)? attr-dict `:` type($input) `->` type($result)
  }];
  // Every piece of a splat is the same splat. Canonicalization moves the
  // slice before elementwise ops and broadcasts whose every use is the same
  // slice (they then compute 1/n of the elements), and turns the slice of
  // an all-reduce over the same axes into a reduce-scatter (1/2 the bytes).
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Ernie_ShardInsertOp : Ernie_CollectiveOp<"shard_insert",
    [Pure, AllTypesMatch<["dest", "result"]>]> {
  let summary = "write this rank's piece into a tensor";
  let description = [{
    No communication; the inverse of `shard_slice`: `dest` with piece
    `(i + shift) mod n` along `dim` replaced by `piece`, for member `i` of an
    `n`-member group. How a decomposed collective matmul assembles the
    pieces it computed one ring step at a time.

    ```mlir
    %y = ernie.shard_insert %p into %acc over @mesh[mp] dim = 1 shift = -1 : tensor<2x4x8xf32> -> tensor<2x16x8xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$piece, Ernie_Tensor:$dest,
                       FlatSymbolRefAttr:$mesh, StrArrayAttr:$axes,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$dim,
                       DefaultValuedAttr<I64Attr, "0">:$shift);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $piece `into` $dest `over` custom<MeshAxes>($mesh, $axes) `dim` `=` $dim
    (`shift` `=` $shift^)? attr-dict `:` type($piece) `->` type($result)
  }];
}

def Ernie_CollectivePermuteStartOp
    : Ernie_CollectiveOp<"collective_permute_start", [
        TypesMatchWith<"the result is a future of the input's type", "input",
                       "result",
                       "::mlir::ernie::FutureType::get($_self.getContext(), "
                       "::llvm::cast<::mlir::RankedTensorType>($_self))">]> {
  let summary = "start sending a tensor `shift` members along the group";
  let description = [{
    Member `i` of an `n`-member group sends `input` to member
    `(i + shift) mod n` and receives from member `(i - shift) mod n`. The
    transfer runs asynchronously: the result is a future that exactly one
    `ernie.wait` later in the block turns into the received tensor, and
    `input` stays untouched until then. One step of a ring.

    ```mlir
    %f = ernie.collective_permute_start %x over @mesh[mp] shift = 1 : tensor<2x4x8xf32>
    %y = ernie.wait %f : tensor<2x4x8xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$axes, I64Attr:$shift);
  let results = (outs Ernie_FutureType:$result);
  let assemblyFormat = [{
    $input `over` custom<MeshAxes>($mesh, $axes) `shift` `=` $shift attr-dict
    `:` type($input)
  }];
}

def Ernie_AllReduceStartOp : Ernie_CollectiveOp<"all_reduce_start",
    [DeclareOpInterfaceMethods<InferTypeOpInterface>]> {
  let summary = "start one all-reduce of a bucket of tensors";
  let description = [{
    Reduces every input over the group as one message (a bucket: one
    collective's latency for all of them) on the communication thread, so
    the computation after it overlaps the transfer. Each result is a future
    that exactly one `ernie.wait` later in the block turns into the reduced
    tensor; the inputs stay untouched until the first wait. With
    `accumulate = f32` narrow floats (bf16, f16) are reduced in f32 and
    rounded once (Megatron's f32 main gradients); otherwise in their own
    type. What `--ernie-bucket-gradients` makes of data-parallel gradient
    all-reduces.

    ```mlir
    %f:2 = ernie.all_reduce_start %a, %b over @mesh[dp] sum : tensor<64xf32>, tensor<8x8xf32>
    %ra = ernie.wait %f#0 : tensor<64xf32>
    ```
  }];
  let arguments = (ins Variadic<Ernie_Tensor>:$inputs, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$axes, Ernie_ReduceKindAttr:$kind,
                       OptionalAttr<TypeAttr>:$accumulate);
  let results = (outs Variadic<Ernie_FutureType>:$results);
  let assemblyFormat = [{
    $inputs `over` custom<MeshAxes>($mesh, $axes) custom<ReduceKindKeyword>($kind)
    attr-dict `:` type($inputs)
  }];
  let builders = [
    OpBuilder<(ins "::mlir::ValueRange":$inputs, "::mlir::StringRef":$mesh,
                   "::mlir::ArrayAttr":$axes, "ReduceKind":$kind,
                   "::mlir::Type":$accumulate)>
  ];
}

def Ernie_ReduceScatterStartOp : Ernie_CollectiveOp<"reduce_scatter_start"> {
  let summary = "start one reduce-scatter of a bucket of tensors";
  let description = [{
    `ernie.reduce_scatter` of every input along `dim`, as one message on
    the communication thread: each member packs its inputs' pieces by
    destination (piece `j` of every input, then piece `j + 1`), so one
    reduce-scatter of the message leaves each member its own piece of
    every input, summed in group order as the blocking op sums it. Each
    result is a future of that piece which exactly one `ernie.wait` later
    in the block turns into a tensor; the inputs stay untouched until the
    first wait. `accumulate = f32` reduces narrow floats in f32 and rounds
    once. What `--ernie-bucket-gradients` makes of ZeRO-2/3's gradient
    reduce-scatters.

    ```mlir
    %f:2 = ernie.reduce_scatter_start %a, %b over @mesh[dp] dim = 0 sum : tensor<64xf32>, tensor<8x8xf32> -> tensor<32xf32>, tensor<4x8xf32>
    %ra = ernie.wait %f#0 : tensor<32xf32>
    ```
  }];
  let arguments = (ins Variadic<Ernie_Tensor>:$inputs, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$axes,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$dim,
                       Ernie_ReduceKindAttr:$kind,
                       OptionalAttr<TypeAttr>:$accumulate);
  let results = (outs Variadic<Ernie_FutureType>:$results);
  let assemblyFormat = [{
    $inputs `over` custom<MeshAxes>($mesh, $axes) `dim` `=` $dim
    custom<ReduceKindKeyword>($kind) attr-dict `:` type($inputs) `->`
    custom<FutureTypes>(type($results))
  }];
}

def Ernie_AllGatherStartOp : Ernie_CollectiveOp<"all_gather_start"> {
  let summary = "start one all-gather of a bucket of tensors";
  let description = [{
    `ernie.all_gather` of every input along `dim`, as one message on the
    communication thread: each member sends its inputs back to back, and
    each result is a future of one input's gathered tensor. Exactly one
    `ernie.wait` later in the block turns a future into its tensor; the
    inputs stay untouched until the first wait. What
    `--ernie-bucket-gradients` makes of ZeRO's parameter gathers after the
    optimizer step.

    ```mlir
    %f:2 = ernie.all_gather_start %a, %b over @mesh[dp] dim = 0 : tensor<32xf32>, tensor<4x8xf32> -> tensor<64xf32>, tensor<8x8xf32>
    %a2 = ernie.wait %f#0 : tensor<64xf32>
    ```
  }];
  let arguments = (ins Variadic<Ernie_Tensor>:$inputs, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$axes,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$dim);
  let results = (outs Variadic<Ernie_FutureType>:$results);
  let assemblyFormat = [{
    $inputs `over` custom<MeshAxes>($mesh, $axes) `dim` `=` $dim attr-dict
    `:` type($inputs) `->` custom<FutureTypes>(type($results))
  }];
}

def Ernie_WaitOp : Ernie_Op<"wait", [
    TypesMatchWith<"the future holds the result's type", "result", "future",
                   "::mlir::ernie::FutureType::get($_self.getContext(), "
                   "::llvm::cast<::mlir::RankedTensorType>($_self))">]> {
  let summary = "the tensor an asynchronous collective produced";
  let description = [{
    Blocks until the collective that returned `future` has finished, and
    yields its tensor.

    ```mlir
    %y = ernie.wait %f : tensor<2x4x8xf32>
    ```
  }];
  let arguments = (ins Ernie_FutureType:$future);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = "$future attr-dict `:` type($result)";
}

def Ernie_PartialInitOp : Ernie_CollectiveOp<"partial_init",
    [Pure, SameOperandsAndResultType]> {
  let summary = "turn a replicated value into a pending reduction";
  let description = [{
    No communication. For `sum` the first member of each group keeps the
    value and the others hold zeros, so the group's sum is the value; for
    `avg`, `max` and `min` every member keeps it.

    ```mlir
    %y = ernie.partial_init %x over @mesh[mp] sum : tensor<8x16xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$axes, Ernie_ReduceKindAttr:$kind);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `over` custom<MeshAxes>($mesh, $axes) custom<ReduceKindKeyword>($kind)
    attr-dict `:` type($result)
  }];
}

def Ernie_AxisIndexOp : Ernie_CollectiveOp<"axis_index", [Pure]> {
  let summary = "this rank's coordinate along mesh axes";
  let description = [{
    The rank's linear index within its group over `axes` (row-major over the
    named axes), as a scalar tensor. What a rank-dependent local computation
    (a vocab-parallel lookup's row offset) starts from.

    ```mlir
    %i = ernie.axis_index over @mesh[mp] : tensor<i64>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$mesh, StrArrayAttr:$axes);
  let results = (outs TensorOf<[I64]>:$result);
  let assemblyFormat = [{
    `over` custom<MeshAxes>($mesh, $axes) attr-dict `:` type($result)
  }];
}

//===----------------------------------------------------------------------===//
// Pipeline parallelism
//===----------------------------------------------------------------------===//

def Ernie_SplitPointOp : Ernie_PureOp<"split_point",
    [Elementwise, SameOperandsAndResultType, Ernie_ShardingRuleOpInterface,
     DeclareOpInterfaceMethods<Ernie_GradientOpInterface>]> {
  let summary = "a pipeline stage boundary";
  let description = [{
    The identity. `--ernie-pipeline-split` places what is computed from the
    result in the next (virtual) stage and then removes the marker: an op's
    stage is the number of markers on its way from the program's inputs.

    ```mlir
    %h1 = ernie.split_point %h : tensor<4x16x64xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$operand);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = "$operand attr-dict `:` type($result)";
}

def Ernie_SendOp : Ernie_Op<"send"> {
  let summary = "send a value to another pipeline stage";
  let description = [{
    Sends this rank's `input` to the rank that runs virtual stage `peer`
    (the same coordinates on every mesh axis but the stage axis). Transfers
    on one `channel` are told apart by micro-batch, and a send never waits
    for its receiver. `--ernie-pipeline-schedule` writes sends and
    receives; they live in stage functions.

    ```mlir
    ernie.send %h to stage 1 channel 0 : tensor<2x16x64xf32>
    ```
  }];
  let arguments = (ins Ernie_Tensor:$input, I64Attr:$peer, I64Attr:$channel);
  let assemblyFormat = [{
    $input `to` `stage` $peer `channel` $channel attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
}

def Ernie_RecvOp : Ernie_Op<"recv"> {
  let summary = "receive a value from another pipeline stage";
  let description = [{
    The value virtual stage `peer` sends on `channel` for the current
    micro-batch; blocks until it arrives.

    ```mlir
    %h = ernie.recv from stage 0 channel 0 : tensor<2x16x64xf32>
    ```
  }];
  let arguments = (ins I64Attr:$peer, I64Attr:$channel);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    `from` `stage` $peer `channel` $channel attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

class Ernie_StageCollectiveOp<string mnemonic>
    : Ernie_Op<mnemonic, [SameOperandsAndResultType, Elementwise,
                          Ernie_ShardingRuleOpInterface]> {
  let arguments = (ins Ernie_Tensor:$input, DenseI64ArrayAttr:$stages,
                       I64Attr:$channel);
  let results = (outs Ernie_Tensor:$result);
  let assemblyFormat = [{
    $input `over` `stages` $stages `channel` $channel attr-dict `:`
    type($result)
  }];
  let hasVerifier = 1;
}

def Ernie_StageAllReduceOp : Ernie_StageCollectiveOp<"stage_all_reduce"> {
  let summary = "sum a shared parameter's replicas over pipeline stages";
  let description = [{
    The sum, in stage order, of `input` on the ranks of the listed pipeline
    stages (stage-axis coordinates, sorted) that share this rank's other
    coordinates; every member gets the same bits. The group of a shared
    parameter: `--ernie-shared-weight-dedup` derives `stages` from where the
    parameter is used, so every rank computes the same groups in the same
    order.

    ```mlir
    %g = ernie.stage_all_reduce %dw over stages [0, 3] channel 7 : tensor<64x256xf32>
    ```
  }];
}

def Ernie_StageBroadcastOp : Ernie_StageCollectiveOp<"stage_broadcast"> {
  let summary = "the first listed pipeline stage's value, on every member";
  let description = [{
    How a shared parameter's replicas start equal.

    ```mlir
    %w = ernie.stage_broadcast %w0 over stages [0, 3] channel 8 : tensor<256x64xf32>
    ```
  }];
}

//===----------------------------------------------------------------------===//
// Fusion
//===----------------------------------------------------------------------===//

def Ernie_FusedOp : Ernie_Op<"fused", [Pure, IsolatedFromAbove,
    DeclareOpInterfaceMethods<Ernie_CostOpInterface, ["getFlops"]>]> {
  let summary = "elementwise ops the runtime runs as one loop";
  let description = [{
    A group of elementwise ops, the broadcasts of its inputs and the
    reductions that end it (`--ernie-fuse`). The body is ordinary ernie ops
    on whole tensors; every value it computes has the region's iteration
    shape (the shape of its widest value), except the results of
    `reduce_sum`, `reduce_mean` and `reduce_max`, which only `ernie.yield`
    reads. A broadcast reads a block argument. The runtime walks the
    iteration shape once, a chunk at a time: each input is read once, each
    result written once, and no intermediate reaches memory. Values inside
    compute in f32 (f64 for f64 regions) whatever their element type and
    round only where they are yielded; reductions accumulate in that type.

    ```mlir
    %y = ernie.fused (%x, %w) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32> {
    ^bb0(%a: tensor<4x8xf32>, %b: tensor<8xf32>):
      %wb = ernie.broadcast %b, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
      %s = ernie.silu %a : tensor<4x8xf32>
      %m = ernie.mul %s, %wb : tensor<4x8xf32>
      ernie.yield %m : tensor<4x8xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<Ernie_Tensor>:$inputs);
  let results = (outs Variadic<Ernie_Tensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `(` $inputs `)` attr-dict `:` functional-type($inputs, $results) $body
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The shape every non-reduced value of the body has.
    ::llvm::ArrayRef<int64_t> getIterationShape();
  }];
}

def Ernie_YieldOp : Ernie_Op<"yield", [Pure, Terminator,
                                       HasParent<"FusedOp">]> {
  let summary = "the values a fused region writes to memory";
  let arguments = (ins Variadic<Ernie_Tensor>:$values);
  let assemblyFormat = "$values attr-dict `:` type($values)";
}

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIEOPS_TD
