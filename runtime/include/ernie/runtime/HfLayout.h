//===- HfLayout.h - ernie's states and Hugging Face's tensors ---*- C++ -*-===//
//
// ernie's models use Hugging Face's module names, so a state and the tensor
// of a Hugging Face folder differ only by rules that hold for every family:
//
//   - the decoder's prefix: ernie's `<base>.` (the family's
//     base_model_prefix: `llama.`, `qwen2.`, ... ERNIE's `model.`) is
//     Hugging Face's `model.`; `lm_head.weight` keeps its name;
//   - Linears are ernie's [in, out], Hugging Face's [out, in]: every
//     matrix but the embedding is transposed;
//   - experts are stacked, `...experts.gate_proj.weight` [E, in, out],
//     where Hugging Face has one `...experts.<e>.gate_proj.weight` each;
//   - PaddleNLP's fused `qkv_proj` and `gate_up_proj` are column blocks of
//     Hugging Face's q/k/v and gate/up (widths from the config);
//   - a tied head has no tensor of its own;
//   - a family may spell some names otherwise (Mixtral's experts are
//     `block_sparse_moe.experts.<e>.w1/w3/w2`): a table of renames;
//   - the aux-free selection bias, a slot of the router's weight
//     (`...mlp.gate.weight:e_score_correction_bias` [E]), is the family's
//     tensor (ERNIE 4.5: `...mlp.moe_statics.e_score_correction_bias`
//     [1, E]); other slots (optimizer state, master weights) have none.
//
// The one mapping ernie-ckpt's export-hf and import-hf and the Python
// models' from_pretrained, save_pretrained and rank-by-rank loading use.
// Errors are std::runtime_error naming the state or tensor and the config
// field that disagrees.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_HFLAYOUT_H
#define ERNIE_RUNTIME_HFLAYOUT_H

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ernie::runtime {

/// A tensor's name and shape.
using NamedShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

/// One tensor of a Hugging Face folder and where it lies in an ernie state.
struct HfTensor {
  std::string name;            // Hugging Face's
  std::vector<int64_t> shape;  // Hugging Face's
  std::string state;           // ernie's
  /// Where the block starts in the state; offsets past the tensor's rank
  /// pick one entry of the leading dimensions (an expert of a stack).
  std::vector<int64_t> offsets;
  /// The tensor holds the block with its last two dimensions swapped.
  bool transposed = false;
  /// Where the block lies in the tensor and its shape there, when the
  /// tensor holds several (transformers' fused experts: gate and up rows
  /// of one `experts.gate_up_proj`); empty: the whole tensor.
  std::vector<int64_t> sourceOffsets = {}, sourceShape = {};
};

/// A family's naming, by config.json's model_type.
struct HfFamily {
  std::string modelType;
  std::string basePrefix; // ernie's name of the decoder
  bool tiedByDefault = false;
  /// The selection bias's tensor after `model.layers.<i>.mlp.`, empty
  /// when the family has none; `biasMatrix`: stored as [1, E].
  std::string biasTensor;
  bool biasMatrix = false;
  /// Substrings Hugging Face spells otherwise, (ernie's, theirs), applied
  /// in order (Mixtral's `block_sparse_moe.experts.<e>.w1`).
  std::vector<std::pair<std::string, std::string>> renames = {};
  /// The renames of transformers' own layout (`save_original_format=False`:
  /// the names it computes with, experts fused into
  /// `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I]).
  std::vector<std::pair<std::string, std::string>> fusedRenames = {};
};

/// The family config.json `config` describes (by model_type, else by
/// architectures, as transformers picks); throws listing the known ones.
const HfFamily &hfFamilyOf(const nlohmann::json &config);
/// Every family's model_type, sorted.
std::vector<std::string> hfFamilyNames();

/// The Hugging Face tensors of ernie states `states` (a checkpoint's or a
/// program's, global shapes), grouped by state in the states' order. Slots
/// other than the selection bias and `optimizer.*` are skipped; a router
/// of a family with selection biases has one even where the states lack
/// it (its state then absent: zeros, as transformers starts it); a state
/// that is no parameter of the family, a fused width or a head that
/// disagrees with `config` throws naming it.
std::vector<HfTensor> hfTensorsOfStates(const nlohmann::json &config,
                                        const NamedShapes &states);

/// The ernie states (global shapes, in order of first appearance) that
/// Hugging Face tensors `tensors` fill, and where each tensor goes; a
/// folder in transformers' fused layout (experts as `experts.gate_up_proj`
/// and `experts.down_proj`) is read by its own renames.
/// Rotary caches and a tied head's copy are skipped; a tensor that is no
/// weight of the family, a stack of experts with a gap or experts of
/// different shapes throws naming it.
std::pair<NamedShapes, std::vector<HfTensor>>
statesOfHfTensors(const nlohmann::json &config, const NamedShapes &tensors);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_HFLAYOUT_H
