#include "model/model_info.h"

#include <algorithm>
#include <cinttypes>
#include <unordered_map>

namespace strata {

std::string_view tensor_role_name(TensorRole role) {
  switch (role) {
    case TensorRole::embedding: return "embeddings";
    case TensorRole::attention: return "attention";
    case TensorRole::router: return "routers";
    case TensorRole::dense_ffn: return "dense FFN";
    case TensorRole::shared_expert: return "shared experts";
    case TensorRole::routed_expert: return "routed experts";
    case TensorRole::norm: return "norms";
    case TensorRole::output: return "output";
    case TensorRole::engram: return "Engram tables";
    case TensorRole::other: return "other";
  }
  return "?";
}

int tensor_layer(std::string_view name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  int layer = 0;
  size_t k = 4;
  if (k >= name.size() || name[k] < '0' || name[k] > '9') return -1;
  for (; k < name.size() && name[k] >= '0' && name[k] <= '9'; ++k) {
    layer = layer * 10 + (name[k] - '0');
    if (layer > 1000000) return -1;
  }
  return (k < name.size() && name[k] == '.') ? layer : -1;
}

TensorRole classify_tensor(std::string_view name) {
  auto has = [&](std::string_view s) { return name.find(s) != std::string_view::npos; };
  std::string_view local = name;  // the part after "blk.N."
  if (tensor_layer(name) >= 0) local = name.substr(name.find('.', 4) + 1);

  if (local.rfind("nextn.", 0) == 0) return TensorRole::other;
  if (has("norm")) return TensorRole::norm;
  if (local.rfind("token_embd", 0) == 0) return TensorRole::embedding;
  if (local.rfind("engram_embd", 0) == 0) return TensorRole::engram;
  if (local == "output.weight" || local == "output.bias") return TensorRole::output;
  if (has("_exps")) return TensorRole::routed_expert;
  if (has("_shexp")) return TensorRole::shared_expert;
  if (local.rfind("ffn_gate_inp", 0) == 0 || local.rfind("exp_probs_b", 0) == 0 ||
      local.rfind("ffn_gate_tid2eid", 0) == 0 || local.rfind("ffn_exp_probs_b", 0) == 0)
    return TensorRole::router;
  if (local.rfind("ffn_", 0) == 0) return TensorRole::dense_ffn;
  if (local.rfind("attn_", 0) == 0 || local.rfind("indexer", 0) == 0) return TensorRole::attention;
  return TensorRole::other;
}

namespace {

std::string layer_pattern(std::string_view name) {
  int layer = tensor_layer(name);
  if (layer < 0) return std::string(name);
  return "blk.*." + std::string(name.substr(name.find('.', 4) + 1));
}

uint64_t params_of(const GgufTensorInfo& t) { return t.n_elements(); }

}  // namespace

Result<ModelSummary> summarize_model(const GgufFile& f) {
  ModelSummary s;
  auto arch = f.require_string("general.architecture");
  if (!arch) return arch.error();
  s.arch = *arch;
  auto name = f.get_string("general.name");
  if (!name) return name.error();
  s.name = name->value_or("");
  auto n_layer = f.get_uint(s.arch + ".block_count");
  if (!n_layer) return n_layer.error();
  auto n_nextn = f.get_uint(s.arch + ".nextn_predict_layers");
  if (!n_nextn) return n_nextn.error();
  s.n_nextn_layers = n_nextn->value_or(0);
  s.n_layer = n_layer->value_or(0);
  if (s.n_nextn_layers > s.n_layer) {
    return Error{strfmt("%s: %s.nextn_predict_layers (%" PRIu64 ") exceeds block_count (%" PRIu64 ")",
                        f.name().c_str(), s.arch.c_str(), s.n_nextn_layers, s.n_layer)};
  }
  if (const GgufValue* tokens = f.find("tokenizer.ggml.tokens"); tokens && tokens->type == GgufType::array)
    s.n_vocab = tokens->elems.size();
  auto used = f.get_uint(s.arch + ".expert_used_count");
  if (!used) return used.error();
  s.n_expert_used = used->value_or(0);

  const uint64_t first_nextn = s.n_layer - s.n_nextn_layers;
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  const bool tied_output = f.find_tensor("output.weight") == nullptr;

  std::unordered_map<std::string, size_t> pattern_index;
  std::map<int, uint64_t> expert_bytes_by_layer;  // bytes of all experts of a layer
  std::map<int, uint64_t> expert_params_by_layer;  // parameters of all experts of a layer
  std::map<int, uint64_t> n_expert_by_layer;
  uint64_t active = 0, active_params = 0;

  for (const GgufTensorInfo& t : f.tensors()) {
    const TensorRole role = classify_tensor(t.name);
    const int layer = tensor_layer(t.name);
    RoleTotals& r = s.roles[static_cast<int>(role)];
    ++r.n_tensors;
    r.n_params += params_of(t);
    r.n_bytes += t.n_bytes;
    r.bytes_by_type[t.type] += t.n_bytes;
    s.n_params += params_of(t);
    s.n_bytes += t.n_bytes;

    std::string pat = layer_pattern(t.name);
    auto [it, inserted] = pattern_index.try_emplace(pat, s.patterns.size());
    if (inserted) s.patterns.push_back({pat, role, 0, 0, {}, t.shape_string()});
    TensorPattern& p = s.patterns[it->second];
    ++p.n_tensors;
    p.n_bytes += t.n_bytes;
    ++p.count_by_type[t.type];
    if (p.shape != t.shape_string()) p.shape = "(varies)";

    const bool in_nextn = layer >= 0 && uint64_t(layer) >= first_nextn;
    if (in_nextn) continue;
    if (role == TensorRole::routed_expert) {
      // stacked experts: the last dimension counts them
      const uint64_t n_exp = t.ne[t.n_dims - 1];
      if (t.n_dims < 2 || n_exp == 0) {
        return Error{strfmt("%s: tensor '%s' looks like stacked experts but has shape %s",
                            f.name().c_str(), t.name.c_str(), t.shape_string().c_str())};
      }
      auto [ne_it, first] = n_expert_by_layer.try_emplace(layer, n_exp);
      if (!first && ne_it->second != n_exp) {
        return Error{strfmt("%s: tensor '%s' stacks %" PRIu64 " experts but layer %d has %" PRIu64,
                            f.name().c_str(), t.name.c_str(), n_exp, layer, ne_it->second)};
      }
      expert_bytes_by_layer[layer] += t.n_bytes;
      expert_params_by_layer[layer] += params_of(t);
    } else if (role == TensorRole::engram) {
      // rows by hashed n-grams: (max_ngram_size - 1) x head_count rows per token
      auto heads = f.get_uint(s.arch + ".engram.head_count");
      auto orders = f.get_uint(s.arch + ".engram.max_ngram_size");
      if (!heads) return heads.error();
      if (!orders) return orders.error();
      const uint64_t rows = heads->value_or(0) * (orders->value_or(1) > 0 ? orders->value_or(1) - 1 : 0);
      s.engram_bytes_total += t.n_bytes;
      s.engram_rows_per_token += rows;
      s.engram_bytes_per_token += rows * t.row_bytes();
      active += rows * t.row_bytes();
      active_params += rows * t.ne[0];
    } else if ((&t == embd && !tied_output) || t.name.find("ffn_gate_tid2eid") != std::string::npos) {
      active += t.row_bytes();  // tables looked up by token id: one row per token
      active_params += t.ne[0];
    } else {
      active += t.n_bytes;
      if (t.n_dims >= 2) active_params += params_of(t);  // matrices: vectors (norms, biases) add no matmul work
    }
  }

  if (!expert_bytes_by_layer.empty()) {
    s.n_moe_layers = expert_bytes_by_layer.size();
    s.n_expert = n_expert_by_layer.begin()->second;
    if (s.n_expert_used == 0) {
      return Error{strfmt("%s: the model has routed experts but no %s.expert_used_count",
                          f.name().c_str(), s.arch.c_str())};
    }
    s.expert_bytes_min = UINT64_MAX;
    for (const auto& [layer, bytes] : expert_bytes_by_layer) {
      const uint64_t n_exp = n_expert_by_layer[layer];
      if (s.n_expert_used > n_exp) {
        return Error{strfmt("%s: %s.expert_used_count %" PRIu64 " exceeds the %" PRIu64
                            " experts of layer %d",
                            f.name().c_str(), s.arch.c_str(), s.n_expert_used, n_exp, layer)};
      }
      const uint64_t per_expert = bytes / n_exp;
      s.expert_bytes_min = std::min(s.expert_bytes_min, per_expert);
      s.expert_bytes_max = std::max(s.expert_bytes_max, per_expert);
      s.expert_bytes_total += bytes;
      active += per_expert * s.n_expert_used;
      active_params += expert_params_by_layer[layer] / n_exp * s.n_expert_used;
      s.active_routed_params_per_token += expert_params_by_layer[layer] / n_exp * s.n_expert_used;
    }
  }
  s.active_bytes_per_token = active;
  s.active_params_per_token = active_params;
  return s;
}

}  // namespace strata
