// A one-layer Llama (Hugging Face architecture) and its loss, as ernie IR:
// token embedding, RMSNorm, fused QKV projection, rotary embedding,
// grouped-query causal attention (4 query heads, 2 key/value heads), SwiGLU
// MLP with a fused gate/up projection, final norm, LM head and cross-entropy.
// Parameters carry the names Paddle's Llama plan matches against.
//
//   ernie-opt examples/llama_block.mlir --ernie-simplify-pipeline
//
// hidden 64, head_dim 16, intermediate 128, vocabulary 256, batch 2 x seq 16.

func.func @forward(
    %ids: tensor<2x16xi64>, %labels: tensor<2x16xi64>,
    %embed: tensor<256x64xf32> {ernie.param = "llama.embed_tokens.weight"},
    %ln1: tensor<64xf32> {ernie.param = "llama.layers.0.input_layernorm.weight"},
    %wqkv: tensor<64x128xf32> {ernie.param = "llama.layers.0.self_attn.qkv_proj.weight"},
    %wo: tensor<64x64xf32> {ernie.param = "llama.layers.0.self_attn.o_proj.weight"},
    %ln2: tensor<64xf32> {ernie.param = "llama.layers.0.post_attention_layernorm.weight"},
    %wgu: tensor<64x256xf32> {ernie.param = "llama.layers.0.mlp.gate_up_proj.weight"},
    %wdown: tensor<128x64xf32> {ernie.param = "llama.layers.0.mlp.down_proj.weight"},
    %lnf: tensor<64xf32> {ernie.param = "llama.norm.weight"},
    %whead: tensor<64x256xf32> {ernie.param = "lm_head.weight"}) -> tensor<f32> {
  %h0 = ernie.embedding %ids, %embed : tensor<2x16xi64>, tensor<256x64xf32> -> tensor<2x16x64xf32>

  // Self-attention.
  %x = ernie.rms_norm %h0, %ln1, epsilon = 1.0e-6 : tensor<2x16x64xf32>, tensor<64xf32>
  %qkv = ernie.matmul %x, %wqkv : tensor<2x16x64xf32>, tensor<64x128xf32> -> tensor<2x16x128xf32>
  %q, %k, %v = ernie.split %qkv axis = 2, sizes = [64, 32, 32] : tensor<2x16x128xf32> -> tensor<2x16x64xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>
  %q4 = ernie.reshape %q : tensor<2x16x64xf32> -> tensor<2x16x4x16xf32>
  %k4 = ernie.reshape %k : tensor<2x16x32xf32> -> tensor<2x16x2x16xf32>
  %v4 = ernie.reshape %v : tensor<2x16x32xf32> -> tensor<2x16x2x16xf32>
  %pos = ernie.iota dim = 0 : tensor<16xi64>
  %qr = ernie.rope %q4, %pos, theta = 10000.0 : tensor<2x16x4x16xf32>, tensor<16xi64>
  %kr = ernie.rope %k4, %pos, theta = 10000.0 : tensor<2x16x2x16xf32>, tensor<16xi64>
  %att = ernie.attention %qr, %kr, %v4 {causal} : tensor<2x16x4x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x2x16xf32> -> tensor<2x16x4x16xf32>
  %att2 = ernie.reshape %att : tensor<2x16x4x16xf32> -> tensor<2x16x64xf32>
  %o = ernie.matmul %att2, %wo : tensor<2x16x64xf32>, tensor<64x64xf32> -> tensor<2x16x64xf32>
  %h1 = ernie.add %h0, %o : tensor<2x16x64xf32>

  // SwiGLU MLP.
  %y = ernie.rms_norm %h1, %ln2, epsilon = 1.0e-6 : tensor<2x16x64xf32>, tensor<64xf32>
  %gu = ernie.matmul %y, %wgu : tensor<2x16x64xf32>, tensor<64x256xf32> -> tensor<2x16x256xf32>
  %gate, %up = ernie.split %gu axis = 2, sizes = [128, 128] : tensor<2x16x256xf32> -> tensor<2x16x128xf32>, tensor<2x16x128xf32>
  %act = ernie.silu %gate : tensor<2x16x128xf32>
  %mix = ernie.mul %act, %up : tensor<2x16x128xf32>
  %down = ernie.matmul %mix, %wdown : tensor<2x16x128xf32>, tensor<128x64xf32> -> tensor<2x16x64xf32>
  %h2 = ernie.add %h1, %down : tensor<2x16x64xf32>

  // Head and loss.
  %z = ernie.rms_norm %h2, %lnf, epsilon = 1.0e-6 : tensor<2x16x64xf32>, tensor<64xf32>
  %logits = ernie.matmul %z, %whead : tensor<2x16x64xf32>, tensor<64x256xf32> -> tensor<2x16x256xf32>
  %loss = ernie.cross_entropy %logits, %labels : tensor<2x16x256xf32>, tensor<2x16xi64> -> tensor<f32>
  return %loss : tensor<f32>
}
