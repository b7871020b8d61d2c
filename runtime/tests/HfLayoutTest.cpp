//===- HfLayoutTest.cpp - ernie's states and Hugging Face's tensors -------===//
//
// The rules of HfLayout.h on small hand-written cases. The Python tests
// check the same table against transformers' own folders.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/HfLayout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

using namespace ernie::runtime;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

json llama(json changes = json::object()) {
  json config = {{"model_type", "llama"},      {"vocab_size", 10},
                 {"hidden_size", 8},           {"num_hidden_layers", 1},
                 {"num_attention_heads", 2},   {"num_key_value_heads", 1},
                 {"tie_word_embeddings", false}};
  config.update(changes);
  return config;
}

std::string errorOf(const std::function<void()> &work) {
  try {
    work();
  } catch (const std::runtime_error &e) {
    return e.what();
  }
  return "";
}

const HfTensor &named(const std::vector<HfTensor> &tensors, const std::string &name) {
  for (const HfTensor &t : tensors)
    if (t.name == name)
      return t;
  throw std::runtime_error("no tensor " + name);
}

TEST(HfLayout, LinearsAreTransposedAndTheDecoderIsModel) {
  NamedShapes states = {{"llama.embed_tokens.weight", {10, 8}},
                        {"llama.layers.0.self_attn.o_proj.weight", {8, 8}},
                        {"llama.layers.0.input_layernorm.weight", {8}},
                        {"lm_head.weight", {8, 10}},
                        {"lm_head.weight:moment1", {8, 10}},
                        {"optimizer.step", {}}};
  std::vector<HfTensor> out = hfTensorsOfStates(llama(), states);
  ASSERT_EQ(out.size(), 4u); // the moment and the step have no tensor
  EXPECT_FALSE(named(out, "model.embed_tokens.weight").transposed);
  const HfTensor &head = named(out, "lm_head.weight");
  EXPECT_TRUE(head.transposed);
  EXPECT_EQ(head.shape, (std::vector<int64_t>{10, 8}));
  EXPECT_EQ(named(out, "model.layers.0.input_layernorm.weight").state,
            "llama.layers.0.input_layernorm.weight");
}

TEST(HfLayout, FusedProjectionsAreColumnBlocksOfTheConfigsWidths) {
  // q 2 heads x 4, k and v 1 head x 4: columns [0, 8), [8, 12), [12, 16).
  NamedShapes states = {{"llama.embed_tokens.weight", {10, 8}},
                        {"llama.layers.0.self_attn.qkv_proj.weight", {8, 16}},
                        {"llama.layers.0.mlp.gate_up_proj.weight", {8, 12}},
                        {"lm_head.weight", {8, 10}}};
  std::vector<HfTensor> out = hfTensorsOfStates(llama(), states);
  const HfTensor &k = named(out, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k.offsets, (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(k.shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(named(out, "model.layers.0.mlp.up_proj.weight").offsets,
            (std::vector<int64_t>{0, 6}));
  EXPECT_THAT(errorOf([&] { hfTensorsOfStates(llama({{"num_key_value_heads", 2}}), states); }),
              HasSubstr("'llama.layers.0.self_attn.qkv_proj.weight' is [8, 16]; config.json "
                        "makes its last dimension 24"));
}

TEST(HfLayout, StackedExpertsAreOneTensorEachAndBackWithoutGaps) {
  json config = {{"model_type", "ernie4_5_moe"}, {"vocab_size", 10}, {"hidden_size", 8},
                 {"num_hidden_layers", 1}, {"num_attention_heads", 2}};
  NamedShapes states = {{"model.embed_tokens.weight", {10, 8}},
                        {"model.layers.0.mlp.gate.weight", {8, 3}},
                        {"model.layers.0.mlp.experts.down_proj.weight", {3, 5, 8}}};
  std::vector<HfTensor> out = hfTensorsOfStates(config, states); // tied by default
  const HfTensor &e2 = named(out, "model.layers.0.mlp.experts.2.down_proj.weight");
  EXPECT_EQ(e2.offsets, (std::vector<int64_t>{2, 0, 0}));
  EXPECT_EQ(e2.shape, (std::vector<int64_t>{8, 5}));
  // The router's selection bias, absent from the states: [1, E] zeros.
  const HfTensor &bias = named(out, "model.layers.0.mlp.moe_statics.e_score_correction_bias");
  EXPECT_EQ(bias.shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(bias.state, "model.layers.0.mlp.gate.weight:e_score_correction_bias");

  NamedShapes tensors;
  for (const HfTensor &t : out)
    tensors.emplace_back(t.name, t.shape);
  auto [back, placed] = statesOfHfTensors(config, tensors);
  NamedShapes want = states;
  want.emplace_back("model.layers.0.mlp.gate.weight:e_score_correction_bias",
                    std::vector<int64_t>{3});
  EXPECT_THAT(back, ::testing::UnorderedElementsAreArray(want));
  EXPECT_EQ(placed.size(), out.size());

  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [](const auto &t) { return t.first.find(".experts.1.") !=
                                                          std::string::npos; }),
                tensors.end());
  EXPECT_THAT(errorOf([&] { statesOfHfTensors(config, tensors); }),
              HasSubstr("a gap in the experts"));
}

TEST(HfLayout, ConfigsOfAnotherModelAreNamed) {
  NamedShapes states = {{"llama.embed_tokens.weight", {10, 8}}, {"lm_head.weight", {8, 10}},
                        {"llama.layers.0.input_layernorm.weight", {8}}};
  EXPECT_THAT(errorOf([&] { hfTensorsOfStates(llama({{"vocab_size", 12}}), states); }),
              HasSubstr("vocab_size and hidden_size make it [12, 8]"));
  EXPECT_THAT(errorOf([&] { hfTensorsOfStates(llama({{"num_hidden_layers", 2}}), states); }),
              HasSubstr("hold 1 layers; config.json's num_hidden_layers is 2"));
  EXPECT_THAT(errorOf([&] { hfTensorsOfStates(llama({{"tie_word_embeddings", true}}), states); }),
              HasSubstr("ties the head"));
  EXPECT_THAT(errorOf([&] { hfTensorsOfStates(llama({{"model_type", "qwen2"}}), states); }),
              HasSubstr("'llama.embed_tokens.weight' is not a parameter of a qwen2 model"));
  EXPECT_THAT(errorOf([&] { hfTensorsOfStates(llama({{"model_type", "bert"}}), states); }),
              HasSubstr("model_type 'bert'"));
  EXPECT_THAT(errorOf([&] { hfTensorsOfStates(llama({{"hidden_size", "8"}}), states); }),
              HasSubstr("hidden_size = \"8\" is not a positive integer"));
}

TEST(HfLayout, TheFamilyComesFromArchitecturesWithoutAModelType) {
  json config = llama();
  config.erase("model_type");
  config["architectures"] = {"Qwen3ForCausalLM"};
  EXPECT_EQ(hfFamilyOf(config).basePrefix, "qwen3");
}

} // namespace
