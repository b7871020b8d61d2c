//===- SpmdCases.h - one valid inferSpmd call per ernie op ------*- C++ -*-===//
//
// The sweep test runs each; the fuzzer mutates them. Types and attributes
// are MLIR text, dims_mappings are over the mesh [x = 2, y = 4]. An op with
// a sharding rule that is missing here fails InferSpmdSweep.EveryOpHasACase.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_TEST_UNIT_SPMDCASES_H
#define ERNIE_TEST_UNIT_SPMDCASES_H

#include <cstdint>
#include <vector>

namespace ernie_test {

struct SpmdCase {
  const char *op;
  std::vector<const char *> types;
  std::vector<std::vector<int64_t>> mappings;
  const char *attrs;
};

inline const std::vector<SpmdCase> &spmdCases() {
  static const char *m = "tensor<8x16xf32>";
  static const std::vector<SpmdCase> cases = {
      {"ernie.abs", {m}, {{0, 1}}, "{}"},
      {"ernie.neg", {m}, {{0, 1}}, "{}"},
      {"ernie.exp", {m}, {{0, 1}}, "{}"},
      {"ernie.log", {m}, {{0, 1}}, "{}"},
      {"ernie.sqrt", {m}, {{0, 1}}, "{}"},
      {"ernie.rsqrt", {m}, {{0, 1}}, "{}"},
      {"ernie.tanh", {m}, {{0, 1}}, "{}"},
      {"ernie.sigmoid", {m}, {{0, 1}}, "{}"},
      {"ernie.silu", {m}, {{0, 1}}, "{}"},
      {"ernie.relu", {m}, {{0, 1}}, "{}"},
      {"ernie.reciprocal", {m}, {{0, 1}}, "{}"},
      {"ernie.erf", {m}, {{0, 1}}, "{}"},
      {"ernie.stop_gradient", {m}, {{0, 1}}, "{}"},
      {"ernie.split_point", {m}, {{0, 1}}, "{}"},
      {"ernie.gelu", {m}, {{0, 1}}, "{approximate = true}"},
      {"ernie.add", {m, m}, {{0, -1}, {-1, 1}}, "{}"},
      {"ernie.sub", {m, m}, {{0, -1}, {-1, 1}}, "{}"},
      {"ernie.mul", {m, m}, {{0, -1}, {-1, 1}}, "{}"},
      {"ernie.div", {m, m}, {{0, -1}, {-1, 1}}, "{}"},
      {"ernie.maximum", {m, m}, {{0, -1}, {-1, 1}}, "{}"},
      {"ernie.minimum", {m, m}, {{0, -1}, {-1, 1}}, "{}"},
      {"ernie.pow",
       {"tensor<8x16xf32>", "tensor<16xf32>"},
       {{0, -1}, {1}},
       "{}"},
      {"ernie.compare", {m, m}, {{0, -1}, {-1, 1}}, "{direction = \"lt\"}"},
      {"ernie.select",
       {"tensor<8x16xi1>", m, m},
       {{0, -1}, {-1, 1}, {-1, -1}},
       "{}"},
      {"ernie.cast", {m}, {{0, 1}}, "{dtype = \"bf16\"}"},
      {"ernie.constant", {}, {}, "{value = dense<1.0> : tensor<4x8xf32>}"},
      {"ernie.full", {}, {}, "{shape = [4, 8], dtype = \"f32\", value = 0.5}"},
      {"ernie.iota",
       {},
       {},
       "{shape = [4, 8], dtype = \"i64\", dimension = 1}"},
      {"ernie.matmul",
       {"tensor<8x16xf32>", "tensor<32x16xf32>"},
       {{0, 1}, {-1, 1}},
       "{trans_y = true}"},
      {"ernie.scaled_matmul",
       {"tensor<16x64xf8E4M3FN>", "tensor<32x64xf8E4M3FN>", "tensor<f32>",
        "tensor<f32>"},
       {{0, -1}, {1, -1}, {}, {}},
       "{transpose_b, shape = [16, 32], dtype = \"f32\"}"},
      {"ernie.reduce_sum", {m}, {{0, 1}}, "{axis = -1, keepdim = true}"},
      {"ernie.reduce_mean", {m}, {{0, 1}}, "{axis = [-1]}"},
      {"ernie.reduce_max", {m}, {{0, 1}}, "{axes = array<i64: 0, 1>}"},
      {"ernie.softmax", {m}, {{0, 1}}, "{axis = -1}"},
      {"ernie.log_softmax", {m}, {{0, 1}}, "{axis = 0}"},
      {"ernie.rms_norm",
       {m, "tensor<16xf32>"},
       {{0, 1}, {-1}},
       "{epsilon = 1.0e-6}"},
      {"ernie.layer_norm",
       {m, "tensor<16xf32>", "tensor<16xf32>"},
       {{0, 1}, {-1}, {-1}},
       "{epsilon = 1.0e-5, begin_norm_axis = 1}"},
      {"ernie.reshape", {m}, {{0, 1}}, "{shape = [0, 4, -1]}"},
      {"ernie.transpose", {m}, {{0, 1}}, "{perm = [-1, 0]}"},
      {"ernie.broadcast", {"tensor<16xf32>"}, {{1}}, "{shape = [8, 16]}"},
      {"ernie.slice",
       {m},
       {{0, 1}},
       "{start = [0, 0], limit = [8, 8], step = [1, 1]}"},
      {"ernie.pad",
       {m},
       {{0, 1}},
       "{low = [0, 1], high = [0, 1], interior = [0, 0]}"},
      {"ernie.concat",
       {m, "tensor<8x8xf32>"},
       {{0, 1}, {-1, -1}},
       "{axis = -1}"},
      {"ernie.split", {m}, {{0, 1}}, "{num_or_sections = 2, axis = 0}"},
      {"ernie.gather", {m, "tensor<3xi64>"}, {{0, 1}, {-1}}, "{axis = 0}"},
      {"ernie.index_add",
       {m, "tensor<3xi64>", "tensor<3x16xf32>"},
       {{-1, 1}, {-1}, {-1, 1}},
       "{axis = 0}"},
      {"ernie.embedding",
       {"tensor<4x8xi64>", "tensor<32x16xf32>"},
       {{0, -1}, {1, -1}},
       "{padding_idx = 0}"},
      {"ernie.topk", {m}, {{0, 1}}, "{k = 2, axis = -1, largest = false}"},
      {"ernie.rope",
       {"tensor<2x8x4x16xf32>", "tensor<8xi64>"},
       {{0, -1, 1, -1}, {-1}},
       "{theta = 10000.0}"},
      {"ernie.attention",
       {"tensor<2x8x4x16xf32>", "tensor<2x8x2x16xf32>", "tensor<2x8x2x16xf32>"},
       {{0, -1, 1, -1}, {0, -1, 1, -1}, {0, -1, 1, -1}},
       "{causal}"},
      {"ernie.attention_grad",
       {"tensor<2x8x4x16xf32>", "tensor<2x8x2x16xf32>", "tensor<2x8x2x16xf32>",
        "tensor<2x8x4x16xf32>"},
       {{0, -1, 1, -1}, {0, -1, 1, -1}, {0, -1, 1, -1}, {0, -1, 1, -1}},
       "{causal}"},
      {"ernie.cross_entropy",
       {"tensor<8x32xf32>", "tensor<8xi64>"},
       {{0, 1}, {0}},
       "{reduction = \"none\", axis = -1}"},
      {"ernie.cross_entropy_grad",
       {"tensor<8x32xf32>", "tensor<8xi64>", "tensor<f32>"},
       {{0, 1}, {0}, {}},
       "{reduction = \"sum\", ignore_index = -100}"},
      {"ernie.sgd_update",
       {m, m, m, "tensor<f32>"},
       {{0, 1}, {0, 1}, {0, 1}, {}},
       "{momentum = 0.9}"},
      {"ernie.adamw_update",
       {m, m, m, m, "tensor<f32>", "tensor<i64>"},
       {{0, 1}, {0, 1}, {0, 1}, {0, 1}, {}, {}},
       "{beta1 = 0.9, weight_decay = 0}"},
      {"ernie.stage_all_reduce",
       {m},
       {{0, 1}},
       "{stages = [0, 1], channel = 0}"},
      {"ernie.stage_broadcast",
       {m},
       {{0, 1}},
       "{stages = [0, 1], channel = 0}"},
      // Ops without a rule: inferSpmd refuses them cleanly.
      {"ernie.all_reduce", {m}, {{0, 1}}, "{}"},
      {"ernie.reshard", {m}, {{0, 1}}, "{}"},
  };
  return cases;
}

} // namespace ernie_test

#endif // ERNIE_TEST_UNIT_SPMDCASES_H
