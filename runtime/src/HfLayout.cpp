//===- HfLayout.cpp - ernie's states and Hugging Face's tensors ----------===//

#include "ernie/runtime/HfLayout.h"

#include "ernie/runtime/BoundedInput.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace ernie::runtime {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string &why) { throw std::runtime_error(why); }

// The families of ernie.models: model_type, ernie's decoder prefix, whether
// transformers ties the head when config.json does not say, the selection
// bias's tensor. Python's base_model_prefix must agree (test_hf_layout.py).
const HfFamily kFamilies[] = {
    {"llama", "llama", false, "", false},
    {"qwen2", "qwen2", false, "", false},
    {"qwen3", "qwen3", false, "", false},
    {"qwen3_moe", "qwen3_moe", false, "", false},
    {"ernie4_5", "model", true, "", false},
    {"ernie4_5_moe", "model", true, "moe_statics.e_score_correction_bias", true, {},
     {{".mlp.moe_statics.", ".mlp.gate.moe_statics."}}},
    {"mistral", "mistral", false, "", false},
    {"deepseek_v3", "model", false, "gate.e_score_correction_bias", false},
    {"mixtral", "mixtral", false, "", false,
     {{".mlp.gate.weight", ".block_sparse_moe.gate.weight"},
      {".mlp.experts.", ".block_sparse_moe.experts."},
      {".gate_proj.weight", ".w1.weight"},
      {".up_proj.weight", ".w3.weight"},
      {".down_proj.weight", ".w2.weight"}}},
};
const std::pair<const char *, const char *> kArchitectures[] = {
    {"LlamaForCausalLM", "llama"},         {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},         {"Qwen3MoeForCausalLM", "qwen3_moe"},
    {"Ernie4_5ForCausalLM", "ernie4_5"},   {"Ernie4_5_MoeForCausalLM", "ernie4_5_moe"},
    {"MistralForCausalLM", "mistral"},     {"MixtralForCausalLM", "mixtral"},
    {"DeepseekV3ForCausalLM", "deepseek_v3"},
};

const std::string kBiasSlot = ":e_score_correction_bias";
const std::string kHfBase = "model.";
const std::string kHead = "lm_head.weight";

bool startsWith(const std::string &s, const std::string &prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}
bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

/// A positive integer field of the config, or `fallback` when absent.
int64_t field(const json &config, const std::string &key, int64_t fallback = -1) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    if (fallback < 0)
      fail("config.json: no " + key);
    return fallback;
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 1)
    fail("config.json: " + key + " = " + briefJson(*it) + " is not a positive integer");
  return it->get<int64_t>();
}

bool tied(const json &config, const HfFamily &family) {
  auto it = config.find("tie_word_embeddings");
  if (it == config.end() || it->is_null())
    return family.tiedByDefault;
  if (!it->is_boolean())
    fail("config.json: tie_word_embeddings = " + briefJson(*it) + " is not true or false");
  return it->get<bool>();
}

/// q, k and v's widths (heads x head_dim), as transformers derives them.
std::vector<int64_t> qkvWidths(const json &config) {
  int64_t heads = field(config, "num_attention_heads");
  int64_t kv = field(config, "num_key_value_heads", heads);
  int64_t headDim = field(config, "head_dim", field(config, "hidden_size") / heads);
  return {heads * headDim, kv * headDim, kv * headDim};
}

/// The layer index of `rest` ("layers.<i>. ..."), or -1.
int64_t layerOf(const std::string &rest) {
  if (!startsWith(rest, "layers."))
    return -1;
  size_t end = rest.find('.', 7);
  std::string digits = rest.substr(7, end == std::string::npos ? end : end - 7);
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), ::isdigit))
    return -1;
  return std::stoll(digits);
}

/// Checks the embedding and the layer count against the config: a config
/// of another model is named, not written beside the wrong weights.
void checkAgainstConfig(const json &config, const NamedShapes &states,
                        const std::string &base, const std::string &what) {
  int64_t vocab = field(config, "vocab_size"), hidden = field(config, "hidden_size");
  int64_t layers = field(config, "num_hidden_layers");
  std::set<int64_t> seen;
  bool embedding = false;
  for (const auto &[name, shape] : states) {
    if (name == base + "embed_tokens.weight") {
      embedding = true;
      if (shape != std::vector<int64_t>{vocab, hidden})
        fail(what + " '" + name + "' is " + shapeText(shape) +
             "; config.json's vocab_size and hidden_size make it " +
             shapeText({vocab, hidden}));
    }
    if (startsWith(name, base) && name.find(':') == std::string::npos)
      if (int64_t layer = layerOf(name.substr(base.size())); layer >= 0) {
        if (layer >= layers)
          fail(what + " '" + name + "' is of layer " + std::to_string(layer) +
               "; config.json's num_hidden_layers is " + std::to_string(layers));
        seen.insert(layer);
      }
  }
  if (!embedding)
    fail(what + "s have no '" + base + "embed_tokens.weight'");
  if (static_cast<int64_t>(seen.size()) != layers)
    fail(what + "s hold " + std::to_string(seen.size()) +
         " layers; config.json's num_hidden_layers is " + std::to_string(layers));
}

/// The experts' stack of a Hugging Face name: ("<...>.experts", e,
/// "<proj>.weight") of "<...>.experts.<e>.<proj>.weight".
bool splitExpert(const std::string &name, std::string &stack, int64_t &expert,
                 std::string &proj) {
  size_t at = name.rfind(".experts.");
  if (at == std::string::npos)
    return false;
  size_t begin = at + 9, end = name.find('.', begin);
  if (end == std::string::npos || end == begin || end - begin > 9)
    return false;
  std::string digits = name.substr(begin, end - begin);
  if (!std::all_of(digits.begin(), digits.end(), ::isdigit))
    return false;
  stack = name.substr(0, at + 8);
  expert = std::stoll(digits);
  proj = name.substr(end + 1);
  return true;
}

/// `name` with each of `family`'s renames applied, ernie's spelling to
/// Hugging Face's (`toHf`) or back.
std::string renamed(const HfFamily &family, std::string name, bool toHf,
                    bool fused = false) {
  auto apply = [&](const std::string &from, const std::string &to) {
    if (size_t at = name.find(from); at != std::string::npos)
      name.replace(at, from.size(), to);
  };
  const auto &renames = fused ? family.fusedRenames : family.renames;
  if (toHf)
    for (const auto &[ours, theirs] : renames)
      apply(ours, theirs);
  else
    for (auto it = renames.rbegin(); it != renames.rend(); ++it)
      apply(it->second, it->first);
  return name;
}

const std::string kFusedGateUp = ".experts.gate_up_proj", kFusedDown = ".experts.down_proj";

std::vector<int64_t> swapped(std::vector<int64_t> shape) {
  std::swap(shape[shape.size() - 2], shape[shape.size() - 1]);
  return shape;
}

} // namespace

std::vector<std::string> hfFamilyNames() {
  std::vector<std::string> out;
  for (const HfFamily &f : kFamilies)
    out.push_back(f.modelType);
  std::sort(out.begin(), out.end());
  return out;
}

const HfFamily &hfFamilyOf(const json &config) {
  if (!config.is_object())
    fail("config.json: not a JSON object");
  std::string type = config.value("model_type", json()).is_string()
                         ? config["model_type"].get<std::string>()
                         : "";
  if (auto arch = config.find("architectures");
      arch != config.end() && arch->is_array())
    for (const json &a : *arch)
      for (const auto &[cls, t] : kArchitectures)
        if (type.empty() && a.is_string() && a.get<std::string>() == cls)
          type = t;
  for (const HfFamily &f : kFamilies)
    if (f.modelType == type)
      return f;
  std::string known;
  for (const std::string &n : hfFamilyNames())
    known += (known.empty() ? "" : ", ") + n;
  fail("config.json: model_type '" + type + "' (architectures " +
       briefJson(config.value("architectures", json::array())) +
       ") is not a family ernie has; it has " + known);
}

std::vector<HfTensor> hfTensorsOfStates(const json &config, const NamedShapes &states) {
  const HfFamily &family = hfFamilyOf(config);
  const std::string base = family.basePrefix + ".";
  bool isTied = tied(config, family);
  bool head = false;
  std::vector<HfTensor> out;
  auto whole = [&](const std::string &hf, const std::string &state,
                   const std::vector<int64_t> &shape, bool transposed) {
    out.push_back({hf, transposed ? swapped(shape) : shape, state,
                   std::vector<int64_t>(shape.size(), 0), transposed});
  };
  // Column blocks of a fused [in, sum(widths)] parameter (or bias).
  auto columns = [&](const std::string &state, const std::vector<int64_t> &shape,
                     const std::string &stem, const std::vector<std::string> &parts,
                     const std::vector<int64_t> &widths, const std::string &suffix) {
    int64_t total = 0;
    for (int64_t w : widths)
      total += w;
    if (shape.back() != total)
      fail("state '" + state + "' is " + shapeText(shape) + "; config.json makes its " +
           "last dimension " + std::to_string(total));
    int64_t column = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      std::vector<int64_t> block = shape, offsets(shape.size(), 0);
      block.back() = widths[i];
      offsets.back() = column;
      column += widths[i];
      bool matrix = shape.size() == 2;
      out.push_back({kHfBase + stem + parts[i] + suffix,
                     matrix ? swapped(block) : block, state, offsets, matrix});
    }
  };
  // The selection bias of each router; a checkpoint without the slot
  // (no aux-free balancing) has Hugging Face's zeros.
  std::set<std::string> biases;
  auto biasOf = [&](const std::string &gate, const std::vector<int64_t> &shape) {
    std::string stem = gate.substr(base.size(), gate.size() - base.size() - 11);
    std::vector<int64_t> hfShape = shape;
    if (family.biasMatrix)
      hfShape.insert(hfShape.begin(), 1);
    biases.insert(gate);
    return HfTensor{kHfBase + stem + family.biasTensor, hfShape, gate + kBiasSlot,
                    std::vector<int64_t>(shape.size(), 0), false};
  };
  std::vector<std::pair<std::string, int64_t>> gates;
  for (const auto &[name, shape] : states) {
    if (!family.biasTensor.empty() && endsWith(name, ".mlp.gate.weight") &&
        startsWith(name, base) && shape.size() == 2)
      gates.emplace_back(name, shape[1]);
    if (size_t colon = name.find(':'); colon != std::string::npos) {
      // The selection bias, a slot of `<layer>.mlp.gate.weight`.
      std::string owner = name.substr(0, colon);
      if (family.biasTensor.empty() || !endsWith(name, kBiasSlot) ||
          !startsWith(owner, base) || !endsWith(owner, ".mlp.gate.weight"))
        continue; // optimizer state, master weights, routing counters
      out.push_back(biasOf(owner, shape));
      continue;
    }
    if (startsWith(name, "optimizer."))
      continue;
    if (name == kHead) {
      if (isTied)
        fail("state '" + name + "': config.json ties the head to the embedding "
             "(tie_word_embeddings), but the checkpoint holds a head of its own");
      head = true;
      whole(kHead, name, shape, shape.size() == 2);
      continue;
    }
    if (!startsWith(name, base))
      fail("state '" + name + "' is not a parameter of a " + family.modelType +
           " model (whose parameters are under '" + base + "' and '" + kHead + "')");
    std::string rest = name.substr(base.size());
    if (endsWith(rest, ".qkv_proj.weight") || endsWith(rest, ".qkv_proj.bias")) {
      bool bias = endsWith(rest, ".bias");
      columns(name, shape, rest.substr(0, rest.size() - (bias ? 13 : 15)),
              {"q_proj", "k_proj", "v_proj"}, qkvWidths(config), bias ? ".bias" : ".weight");
    } else if (endsWith(rest, ".gate_up_proj.weight") && shape.size() == 2) {
      if (shape[1] % 2)
        fail("state '" + name + "' is " + shapeText(shape) + ": gate and up halves "
             "need an even width");
      columns(name, shape, rest.substr(0, rest.size() - 19), {"gate_proj", "up_proj"},
              {shape[1] / 2, shape[1] / 2}, ".weight");
    } else if (shape.size() == 3 && rest.find(".experts.") != std::string::npos) {
      // [E, in, out]: one [out, in] tensor per expert.
      size_t at = rest.rfind(".experts.");
      std::string stack = rest.substr(0, at + 9), proj = rest.substr(at + 9);
      for (int64_t e = 0; e < shape[0]; ++e)
        out.push_back({kHfBase + stack + std::to_string(e) + "." + proj,
                       {shape[2], shape[1]}, name, {e, 0, 0}, true});
    } else {
      whole(kHfBase + rest, name, shape,
            shape.size() == 2 && !endsWith(rest, "embed_tokens.weight"));
    }
  }
  for (const auto &[gate, experts] : gates)
    if (!biases.count(gate))
      out.push_back(biasOf(gate, {experts}));
  if (!isTied && !head)
    fail("states have no '" + kHead + "', but config.json does not tie the head "
         "to the embedding (tie_word_embeddings)");
  checkAgainstConfig(config, states, base, "state");
  for (HfTensor &t : out)
    t.name = renamed(family, t.name, true);
  return out;
}

std::pair<NamedShapes, std::vector<HfTensor>>
statesOfHfTensors(const json &config, const NamedShapes &tensors) {
  const HfFamily &family = hfFamilyOf(config);
  const std::string base = family.basePrefix + ".";
  bool isTied = tied(config, family);
  NamedShapes states;
  std::map<std::string, size_t> stateIndex;
  std::vector<HfTensor> out;
  // Per stack its experts' shape and the experts seen.
  std::map<std::string, std::pair<std::vector<int64_t>, std::set<int64_t>>> stacks;
  auto addState = [&](const std::string &state, const std::vector<int64_t> &shape) {
    if (stateIndex.emplace(state, states.size()).second)
      states.emplace_back(state, shape);
  };
  // transformers' own layout: its experts fused, its own names.
  bool fused = false;
  for (const auto &[hfName, shape] : tensors)
    fused |= shape.size() == 3 && (endsWith(hfName, kFusedGateUp) || endsWith(hfName, kFusedDown));
  for (const auto &[hfName, shape] : tensors) {
    if (endsWith(hfName, "rotary_emb.inv_freq") || (isTied && hfName == kHead))
      continue;
    const std::string name = renamed(family, hfName, false, fused);
    if (shape.size() == 3 && endsWith(name, kFusedGateUp) && startsWith(name, kHfBase)) {
      // [E, 2I, H]: rows [0, I) of each expert are its gate, [I, 2I) its up.
      if (shape[1] % 2)
        fail("tensor '" + hfName + "' is " + shapeText(shape) + ": gate and up halves "
             "need an even second dimension");
      std::string stack = base + name.substr(kHfBase.size(), name.size() - kHfBase.size() -
                                                                 kFusedGateUp.size()) + ".experts.";
      std::vector<int64_t> half = {shape[0], shape[1] / 2, shape[2]};
      for (auto [proj, row] : {std::pair{"gate_proj.weight", int64_t(0)},
                               std::pair{"up_proj.weight", shape[1] / 2}}) {
        addState(stack + proj, {shape[0], shape[2], shape[1] / 2});
        out.push_back({hfName, shape, stack + proj, {0, 0, 0}, true, {0, row, 0}, half});
      }
      continue;
    }
    if (shape.size() == 3 && endsWith(name, kFusedDown) && startsWith(name, kHfBase)) {
      std::string state = base + name.substr(kHfBase.size()) + ".weight"; // [E, I, H]
      addState(state, {shape[0], shape[2], shape[1]});
      out.push_back({hfName, shape, state, {0, 0, 0}, true});
      continue;
    }
    if (name == kHead) {
      std::vector<int64_t> s = shape.size() == 2 ? swapped(shape) : shape;
      addState(kHead, s);
      out.push_back({hfName, shape, kHead, std::vector<int64_t>(shape.size(), 0),
                     shape.size() == 2});
      continue;
    }
    if (!startsWith(name, kHfBase))
      fail("tensor '" + hfName + "' is not a weight of a " + family.modelType +
           " model (whose weights are under '" + kHfBase + "' and '" + kHead + "')");
    std::string rest = name.substr(kHfBase.size());
    std::string stack, proj;
    int64_t expert = 0;
    if (!family.biasTensor.empty() && endsWith(rest, ".mlp." + family.biasTensor)) {
      std::string stem = rest.substr(0, rest.size() - family.biasTensor.size());
      int64_t n = 1;
      for (int64_t d : shape)
        n *= d;
      std::string state = base + stem + "gate.weight" + kBiasSlot;
      addState(state, {n});
      out.push_back({hfName, shape, state, {0}, false});
    } else if (shape.size() == 2 && splitExpert(rest, stack, expert, proj)) {
      std::string state = base + stack + "." + proj;
      auto &[expertShape, seen] = stacks[state];
      if (seen.empty())
        expertShape = shape;
      if (shape != expertShape)
        fail("tensor '" + hfName + "' is " + shapeText(shape) + ", the other experts of '" +
             state + "' " + shapeText(expertShape));
      if (!seen.insert(expert).second)
        fail("tensor '" + hfName + "' appears twice");
      addState(state, {0, shape[1], shape[0]}); // the count once every expert is seen
      out.push_back({hfName, shape, state, {expert, 0, 0}, true});
    } else {
      bool transposed = shape.size() == 2 && !endsWith(rest, "embed_tokens.weight");
      addState(base + rest, transposed ? swapped(shape) : shape);
      out.push_back({hfName, shape, base + rest, std::vector<int64_t>(shape.size(), 0),
                     transposed});
    }
  }
  for (auto &[state, stackInfo] : stacks) {
    const std::set<int64_t> &seen = stackInfo.second;
    int64_t count = static_cast<int64_t>(seen.size());
    if (*seen.rbegin() != count - 1)
      fail("the experts of '" + state + "' are " + std::to_string(count) +
           " tensors, but one is numbered " + std::to_string(*seen.rbegin()) +
           ": a gap in the experts");
    states[stateIndex[state]].second[0] = count;
  }
  if (!isTied && !stateIndex.count(kHead))
    fail("no tensor '" + kHead + "', but config.json does not tie the head to the "
         "embedding (tie_word_embeddings)");
  checkAgainstConfig(config, states, base, "tensor");
  return {states, out};
}

} // namespace ernie::runtime
