// Synthetic models: from a shape and a quant mix to a GGUF header and per-tensor fill rules.
// Metadata keys, tensor names, shapes and order follow what llama.cpp writes (its converter, then
// llama-quantize), checked against the fixtures in ../shared/fixtures/models by
// tests/test_synth.cpp.
#include "model/synth.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "model/synth_random.h"

namespace strata {

std::string_view synth_arch_name(SynthArch arch) {
  switch (arch) {
    case SynthArch::qwen3moe:
      return "qwen3moe";
    case SynthArch::deepseek2:
      return "deepseek2";
    case SynthArch::gpt_oss:
      return "gpt-oss";
    case SynthArch::llama:
      return "llama";
    case SynthArch::deepseek4:
      return "deepseek4";
    case SynthArch::deepseek41:
      return "deepseek41";
  }
  return "?";
}

std::optional<SynthQuant> synth_quant_from_name(std::string_view name) {
  std::string n(name);
  for (char& c : n) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (n == "q8_0") return SynthQuant::q8_0;
  if (n == "q4_k" || n == "q4_k_m") return SynthQuant::q4_k_m;
  if (n == "mxfp4" || n == "mxfp4_moe") return SynthQuant::mxfp4_moe;
  return std::nullopt;
}

std::string_view synth_quant_name(SynthQuant quant) {
  switch (quant) {
    case SynthQuant::q8_0:
      return "Q8_0";
    case SynthQuant::q4_k_m:
      return "Q4_K_M";
    case SynthQuant::mxfp4_moe:
      return "MXFP4_MOE";
  }
  return "?";
}

namespace {

// general.file_type (llama_ftype) of each mix.
uint32_t file_type(SynthQuant quant) {
  switch (quant) {
    case SynthQuant::q8_0:
      return 7;
    case SynthQuant::q4_k_m:
      return 15;
    case SynthQuant::mxfp4_moe:
      return 38;
  }
  return 0;
}

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}
bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// llama-quantize's use_more_bits(): the first and last eighth of the layers and every third
// layer in between get more bits.
bool use_more_bits(int layer, int n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

int layer_of(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  return std::atoi(std::string(name.substr(4)).c_str());
}

}  // namespace

// The rules of llama-quantize (llama_tensor_get_type and the `quantize` filter of
// llama_model_quantize_impl, mainline 2025-26), reduced to the tensors and mixes synth writes:
//  - never quantized, kept F32: tensors not named *weight (biases, exp_probs_b), 1D tensors
//    (norms, sinks), *_norm.weight, ffn_gate_inp.weight (routers);
//  - Q8_0: everything else Q8_0;
//  - MXFP4_MOE: output Q8_0, 3D tensors (the stacked experts, and deepseek2's per-head attn_k_b /
//    attn_v_b) MXFP4, the rest Q8_0;
//  - Q4_K_M: Q4_K, except output Q6_K; attn_v Q6_K in the use_more_bits layers; every ffn_down
//    (dense, _exps, _shexp) Q6_K in the use_more_bits layers; models of exactly 8 experts
//    (Mixtral) get attn_k and attn_v Q8_0 and attn_output Q5_K;
//  - a row length that is not a multiple of the type's block falls back: output to Q8_0,
//    Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0 (deepseek2's attn_k_b rows of qk_nope, V2-Lite's
//    expert rows of 1408, every row of gpt-oss's n_embd 2880).
// Layers are counted per tensor name as llama-quantize does for MoE models (the layer number in
// the name, out of block_count); attn_v's counter equals the layer since there is one per layer.
GgmlType synth_tensor_type(const SynthShape& shape, SynthQuant quant, std::string_view name,
                           const std::vector<uint64_t>& ne) {
  if (contains(name, "ffn_gate_tid2eid.weight")) return GgmlType::i32;  // deepseek4's table
  // deepseek41's Engram: the gate's per-stream weights stay F32, the tables Q8_0 in every mix
  // (as the fixture and ik_llama.cpp's quantizations keep them)
  if (contains(name, "engram_q.weight") || contains(name, "engram_k.weight")) return GgmlType::f32;
  if (contains(name, "engram_embd.weight")) return GgmlType::q8_0;
  const bool quantized = ends_with(name, "weight") && ne.size() >= 2 &&
                         !contains(name, "_norm.weight") && !contains(name, "ffn_gate_inp.weight");
  if (!quantized) return GgmlType::f32;
  const uint64_t row = ne[0];
  const bool is_output = name == "output.weight";
  const bool eight_experts = shape.n_expert == 8;
  const int layer = layer_of(name);
  const int n_layer = int(shape.n_layer);

  GgmlType type = GgmlType::q8_0;
  switch (quant) {
    case SynthQuant::q8_0:
      type = GgmlType::q8_0;
      break;
    case SynthQuant::mxfp4_moe:
      type = !is_output && ne.size() >= 3 && ne[2] > 1 ? GgmlType::mxfp4 : GgmlType::q8_0;
      break;
    case SynthQuant::q4_k_m:
      if (is_output) {
        type = row % 256 != 0 ? GgmlType::q8_0 : GgmlType::q6_k;
      } else if (contains(name, "attn_v.weight")) {
        type = eight_experts                   ? GgmlType::q8_0
               : use_more_bits(layer, n_layer) ? GgmlType::q6_k
                                               : GgmlType::q4_k;
      } else if (contains(name, "attn_k.weight")) {
        type = eight_experts ? GgmlType::q8_0 : GgmlType::q4_k;
      } else if (contains(name, "ffn_down")) {
        type = use_more_bits(layer, n_layer) ? GgmlType::q6_k : GgmlType::q4_k;
      } else if (contains(name, "attn_output.weight")) {
        type = eight_experts ? GgmlType::q5_k : GgmlType::q4_k;
      } else {
        type = GgmlType::q4_k;
      }
      break;
  }
  if (row % ggml_traits(type).block_size != 0) {
    switch (type) {
      case GgmlType::q4_k:
        type = GgmlType::q5_0;
        break;
      case GgmlType::q5_k:
        type = GgmlType::q5_1;
        break;
      case GgmlType::q6_k:
        type = GgmlType::q8_0;
        break;
      default:
        break;
    }
  }
  STRATA_CHECK(row % ggml_traits(type).block_size == 0,
               "rows must be whole blocks after the fallback (llama-quantize would use F16)");
  return type;
}

namespace {

// Expert popularity. Expert e's router row gets a logit offset -kRouterSkew * ln(1 + 8 r / n)
// from the shared channels, r being e's rank in a random per-layer order: popularity then falls
// like a power of the rank (Zipf-like), and the rank is scaled to 8 experts so that models with
// many experts are not dominated by one. With the unit-variance rest of the logits, random
// hidden states give top-2 of 8 a most popular expert at 1.8x and a least popular at 0.6x the
// mean share (top-4 of 8: 1.4x, 0.75x; top-8 of 128: 2.6x, 0.4x): a persistent skew, such as
// a long run sees.
//
// Measured through strata's forward pass (exact path) on 400 tokens of C++ source, with a
// qwen3moe of 8 layers, n_embd 1024, 8 experts top-2: per layer the most used expert had 1.8x
// and the least used 0.5x the mean share (1.5x and 0.6x without the offsets: a short text
// repeats tokens); 31.4% of a token's experts were also chosen by the previous token
// against 29.6% if tokens chose independently with that popularity. The Mixtral-8x7B trace
// (../shared/traces, 218 tokens of one HumanEval problem) has 1.5x, 0.6x, and 38% against 27%.
// So the skew is matched and the token-to-token correlation is not: it comes from attention
// carrying context, which random attention weights do only weakly, and nothing here strengthens
// it (per-token-class router preferences were tried and raised it to 36.6% against 33.6% only).
constexpr float kRouterSkew = 0.4f;

std::vector<float> router_expert_bias(uint64_t seed, int layer, uint32_t n_expert) {
  std::vector<uint32_t> rank(n_expert);
  std::iota(rank.begin(), rank.end(), 0u);
  synth_random::Rng rng(seed, 0x726f75746572ull /* "router" */, uint64_t(layer));
  for (uint32_t i = n_expert - 1; i > 0; --i) {
    std::swap(rank[i], rank[rng.next() % (i + 1)]);
  }
  std::vector<float> bias(n_expert);
  for (uint32_t e = 0; e < n_expert; ++e) {
    bias[e] = -kRouterSkew * std::log(1.0f + 8.0f * float(rank[e]) / float(n_expert));
  }
  const float mean = std::accumulate(bias.begin(), bias.end(), 0.0f) / float(n_expert);
  for (float& b : bias) b -= mean;  // no net shift: sigmoid gating sees centred logits
  return bias;
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;  // row dimension first
  SynthTensorFill fill;
};

// Collects a model's tensors with their value rules, then adds them to the writer in the order
// llama-quantize writes them (by layer, then by name; non-layer tensors first).
class PlanBuilder {
 public:
  PlanBuilder(const SynthShape& shape, SynthQuant quant, uint64_t seed, uint32_t n_vocab)
      : s_(shape), quant_(quant), seed_(seed), n_vocab_(n_vocab) {}

  // A projection with `fan_in` inputs: values of std 1/sqrt(fan_in) keep activations O(1).
  // Projections that write into the residual stream (attn_output, ffn_down*) are scaled down a
  // further 1/sqrt(2 n_layer), as GPT-2 initializes them, so the stream stays O(1) through all
  // layers and the token embedding's shared channels stay visible to the last router.
  void weight(const std::string& name, std::vector<uint64_t> ne, uint64_t fan_in,
              bool residual = false) {
    float std = 1.0f / std::sqrt(float(fan_in));
    if (residual) std /= std::sqrt(2.0f * float(s_.n_layer));
    add(name, std::move(ne), SynthFill::weight, std);
  }
  void norm(const std::string& name, uint64_t n) { add(name, {n}, SynthFill::norm, 0.1f); }
  // deepseek41: the rows of layer l's Engram table (SynthEngramLayout)
  void set_engram_rows(std::vector<uint64_t> rows) { engram_rows_ = std::move(rows); }
  uint64_t engram_rows(int l) const { return engram_rows_[size_t(l)]; }
  void norm2d(const std::string& name, std::vector<uint64_t> ne) { add(name, std::move(ne), SynthFill::norm, 0.1f); }
  // A table of unit-std rows (deepseek41's Engram)
  void embedding_table(const std::string& name, std::vector<uint64_t> ne) {
    add(name, std::move(ne), SynthFill::weight, 1.0f);
  }

  void bias(const std::string& name, std::vector<uint64_t> ne, float std = 0.02f) {
    add(name, std::move(ne), SynthFill::bias, std);
  }
  // Rows of unit std: the embedding is the residual stream's start.
  void embedding() { add("token_embd.weight", {s_.n_embd, n_vocab_}, SynthFill::embedding, 1.0f); }
  void router(int layer) {
    add(blk(layer, "ffn_gate_inp.weight"), {s_.n_embd, s_.n_expert}, SynthFill::router,
        1.0f / std::sqrt(float(s_.n_embd)), router_expert_bias(seed_, layer, s_.n_expert));
  }
  // The routed experts, stacked: gate and up [n_embd, n_ff_exp, n_expert], down
  // [n_ff_exp, n_embd, n_expert].
  void experts(int layer) {
    const uint64_t e = s_.n_expert, f = s_.n_ff_exp, d = s_.n_embd;
    weight(blk(layer, "ffn_gate_exps.weight"), {d, f, e}, d);
    weight(blk(layer, "ffn_up_exps.weight"), {d, f, e}, d);
    weight(blk(layer, "ffn_down_exps.weight"), {f, d, e}, f, true);
  }
  // deepseek4's token id -> experts table of a hash-routed layer: I32 [k, n_vocab].
  void table(int layer) {
    specs_.push_back({blk(layer, "ffn_gate_tid2eid.weight"),
                      {s_.n_expert_used, n_vocab_},
                      {SynthFill::table, 1.0f, {}, s_.n_expert}});
  }
  // A dense SwiGLU FFN of width `n_ff` whose tensor names end in `suffix` ("" or "_shexp").
  void dense_ffn(int layer, uint64_t n_ff, const std::string& suffix) {
    const uint64_t d = s_.n_embd;
    weight(blk(layer, "ffn_gate" + suffix + ".weight"), {d, n_ff}, d);
    weight(blk(layer, "ffn_up" + suffix + ".weight"), {d, n_ff}, d);
    weight(blk(layer, "ffn_down" + suffix + ".weight"), {n_ff, d}, n_ff, true);
  }

  static std::string blk(int layer, const std::string& what) {
    return "blk." + std::to_string(layer) + "." + what;
  }

  void finish(SynthPlan& plan) {
    std::stable_sort(specs_.begin(), specs_.end(), [](const TensorSpec& a, const TensorSpec& b) {
      const int la = layer_of(a.name), lb = layer_of(b.name);
      return la != lb ? la < lb : a.name < b.name;
    });
    for (TensorSpec& t : specs_) {
      plan.writer.add_tensor(t.name, synth_tensor_type(s_, quant_, t.name, t.ne), t.ne);
      plan.fills.push_back(std::move(t.fill));
    }
  }

 private:
  void add(std::string name, std::vector<uint64_t> ne, SynthFill kind, float std,
           std::vector<float> expert_bias = {}) {
    specs_.push_back({std::move(name), std::move(ne), {kind, std, std::move(expert_bias)}});
  }

  const SynthShape& s_;
  SynthQuant quant_;
  uint64_t seed_;
  uint32_t n_vocab_;
  std::vector<TensorSpec> specs_;
  std::vector<uint64_t> engram_rows_;  // [layer]
};

// ---- per-architecture tensors (names and ne as llama.cpp's llama-model.cpp creates them) ----

// Attention with separate q / k / v / o projections (qwen3moe, gpt-oss, llama).
void add_gqa_attention(PlanBuilder& b, const SynthShape& s, int l, bool biases) {
  const uint64_t d = s.n_embd, q = uint64_t(s.n_head) * s.head_dim,
                 kv = uint64_t(s.n_head_kv) * s.head_dim;
  b.weight(b.blk(l, "attn_q.weight"), {d, q}, d);
  b.weight(b.blk(l, "attn_k.weight"), {d, kv}, d);
  b.weight(b.blk(l, "attn_v.weight"), {d, kv}, d);
  b.weight(b.blk(l, "attn_output.weight"), {q, d}, q, true);
  if (biases) {
    b.bias(b.blk(l, "attn_q.bias"), {q});
    b.bias(b.blk(l, "attn_k.bias"), {kv});
    b.bias(b.blk(l, "attn_v.bias"), {kv});
    b.bias(b.blk(l, "attn_output.bias"), {d});
  }
}

void add_qwen3moe_layer(PlanBuilder& b, const SynthShape& s, int l) {
  b.norm(b.blk(l, "attn_norm.weight"), s.n_embd);
  add_gqa_attention(b, s, l, false);
  b.norm(b.blk(l, "attn_q_norm.weight"), s.head_dim);  // per-head RMSNorm of q and k
  b.norm(b.blk(l, "attn_k_norm.weight"), s.head_dim);
  b.norm(b.blk(l, "ffn_norm.weight"), s.n_embd);
  b.router(l);
  b.experts(l);
}

void add_llama_layer(PlanBuilder& b, const SynthShape& s, int l) {
  b.norm(b.blk(l, "attn_norm.weight"), s.n_embd);
  add_gqa_attention(b, s, l, false);
  b.norm(b.blk(l, "ffn_norm.weight"), s.n_embd);
  b.router(l);
  b.experts(l);
}

void add_gpt_oss_layer(PlanBuilder& b, const SynthShape& s, int l) {
  const uint64_t d = s.n_embd, e = s.n_expert, f = s.n_ff_exp;
  b.norm(b.blk(l, "attn_norm.weight"), d);
  add_gqa_attention(b, s, l, true);
  b.bias(b.blk(l, "attn_sinks.weight"), {s.n_head}, 1.0f);  // per-head sink logits
  b.norm(b.blk(l, "post_attention_norm.weight"), d);        // the FFN's input norm
  b.router(l);
  b.bias(b.blk(l, "ffn_gate_inp.bias"), {e});
  b.experts(l);
  b.bias(b.blk(l, "ffn_gate_exps.bias"), {f, e});
  b.bias(b.blk(l, "ffn_up_exps.bias"), {f, e});
  b.bias(b.blk(l, "ffn_down_exps.bias"), {d, e});
}

// Multi-head latent attention with kv_b stored split per head, as the current converter writes
// it: attn_k_b [qk_nope, kv_lora, n_head] (absorbed into the query), attn_v_b
// [kv_lora, v_head, n_head].
void add_deepseek2_layer(PlanBuilder& b, const SynthShape& s, int l) {
  const uint64_t d = s.n_embd, h = s.n_head, qk = uint64_t(s.qk_nope) + s.qk_rope;
  b.norm(b.blk(l, "attn_norm.weight"), d);
  if (s.q_lora_rank > 0) {
    b.weight(b.blk(l, "attn_q_a.weight"), {d, s.q_lora_rank}, d);
    b.norm(b.blk(l, "attn_q_a_norm.weight"), s.q_lora_rank);
    b.weight(b.blk(l, "attn_q_b.weight"), {s.q_lora_rank, h * qk}, s.q_lora_rank);
  } else {
    b.weight(b.blk(l, "attn_q.weight"), {d, h * qk}, d);
  }
  b.weight(b.blk(l, "attn_kv_a_mqa.weight"), {d, uint64_t(s.kv_lora_rank) + s.qk_rope}, d);
  b.norm(b.blk(l, "attn_kv_a_norm.weight"), s.kv_lora_rank);
  b.weight(b.blk(l, "attn_k_b.weight"), {s.qk_nope, s.kv_lora_rank, h}, s.kv_lora_rank);
  b.weight(b.blk(l, "attn_v_b.weight"), {s.kv_lora_rank, s.v_head, h}, s.kv_lora_rank);
  b.weight(b.blk(l, "attn_output.weight"), {h * s.v_head, d}, h * s.v_head, true);
  b.norm(b.blk(l, "ffn_norm.weight"), d);
  if (uint32_t(l) < s.n_layer_dense) {
    b.dense_ffn(l, s.n_ff, "");
    return;
  }
  b.router(l);
  if (s.gating == SynthGating::sigmoid) {
    b.bias(b.blk(l, "exp_probs_b.bias"), {s.n_expert});  // selection-only bias of V3
  }
  b.experts(l);
  if (s.n_expert_shared > 0) {
    b.dense_ffn(l, uint64_t(s.n_ff_exp) * s.n_expert_shared, "_shexp");
  }
}

// The compress ratio of deepseek4's layer l: window-only layers first, then 4 and 128 alternately.
uint32_t deepseek4_ratio(const SynthShape& s, int l) {
  if (uint32_t(l) < s.n_window_layers) return 0;
  return (uint32_t(l) - s.n_window_layers) % 2 == 0 ? 4 : 128;
}

// deepseek41's compressed-attention role of layer l (SynthShape): 0 window only, else the ratio,
// and whether the layer is a source (compressor, indexer query and index keys) or reads the last
// source's rows and choice.
struct Deepseek41Role {
  uint32_t ratio = 0;
  bool source = false;
};
Deepseek41Role deepseek41_role(const SynthShape& s, int l) {
  if (uint32_t(l) < s.n_window_layers) return {};
  switch ((uint32_t(l) - s.n_window_layers) % 3) {
    case 0:
      return {2, true};
    case 1:
      return {2, false};
    default:
      return {1, true};
  }
}
bool is_engram_layer(const SynthShape& s, int l) {
  return l < int(s.n_layer) && (s.engram_layers[0] == l || s.engram_layers[1] == l);
}

bool is_prime(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

// deepseek41's Engram hash layout (HParams::engram): as DeepSeek's engram.py builds it, each head's
// bucket count is a distinct prime (increasing from rows / columns, so a table holds about `rows`
// rows), offsets are cumulative, multipliers odd and below 2^63 / compressed vocabulary / 2 (no
// product overflows). Token ids are compressed 16 -> 13 (ids whose text normalises alike share one
// in the real tokenizer; here every few neighbours do).
struct SynthEngramLayout {
  std::vector<uint32_t> layers;
  std::vector<uint64_t> multipliers, primes, offsets;
  std::vector<uint64_t> table_rows;  // [layer] (0: no Engram)
  std::vector<uint32_t> token_map;
  uint32_t pad_id = 0;
};
SynthEngramLayout synth_engram_layout(const SynthShape& s, uint64_t rows, uint32_t n_vocab, uint64_t seed) {
  SynthEngramLayout e;
  e.table_rows.assign(s.n_layer, 0);
  if (s.arch != SynthArch::deepseek41) return e;
  for (int32_t l : s.engram_layers)
    if (l >= 0 && uint32_t(l) < s.n_layer) e.layers.push_back(uint32_t(l));
  std::sort(e.layers.begin(), e.layers.end());
  for (uint32_t i = 0; i < n_vocab; ++i) e.token_map.push_back(uint32_t(uint64_t(i) * 13 / 16));
  const uint64_t compressed = e.token_map.back() + 1ull;
  e.pad_id = uint32_t(std::min<uint64_t>(2, compressed - 1));  // a compressed id, as the fixture's
  const uint64_t half_bound = std::max<uint64_t>(1, uint64_t(INT64_MAX) / compressed / 2);
  const uint64_t cols = uint64_t(s.engram_max_ngram - 1) * s.engram_heads;
  uint64_t prime = std::max<uint64_t>(2, (rows == 0 ? s.engram_rows : rows) / cols);
  synth_random::Rng rng(seed, 0x656e6772616dull /* "engram" */, 0);
  for (uint32_t l : e.layers) {
    for (uint32_t k = 0; k < s.engram_max_ngram; ++k) e.multipliers.push_back(2 * (rng.next() % half_bound) + 1);
    uint64_t offset = 0;
    for (uint64_t c = 0; c < cols; ++c) {
      do ++prime;
      while (!is_prime(prime));
      e.primes.push_back(prime);
      e.offsets.push_back(offset);
      offset += prime;
    }
    e.table_rows[l] = offset;
  }
  return e;
}

GgufValue u64_array(const std::vector<uint64_t>& v) {
  std::vector<GgufValue> elems;
  for (uint64_t x : v) elems.push_back(GgufValue::make_u64(x));
  return GgufValue::make_array(GgufType::u64, std::move(elems));
}
GgufValue u32_array(const std::vector<uint32_t>& v) {
  std::vector<GgufValue> elems;
  for (uint32_t x : v) elems.push_back(GgufValue::make_u32(x));
  return GgufValue::make_array(GgufType::u32, std::move(elems));
}

// deepseek4 (fixtures README): hyper-connection mixers, the single K = V head with its q LoRA,
// the compressor (and for ratio 4 the lightning indexer), the grouped output LoRA; experts routed
// by a token-id table (hash layers) or by score + exp_probs_b; one shared expert.
void add_deepseek4_layer(PlanBuilder& b, const SynthShape& s, int l) {
  const uint64_t d = s.n_embd, h = s.n_head, hd = s.head_dim, q = s.q_lora_rank;
  const uint64_t S = s.hc_streams, mix = 2 * S + S * S, g = s.o_groups, ol = s.o_lora_rank;
  for (const char* part : {"attn", "ffn"}) {
    const std::string p = std::string("hc_") + part;
    b.weight(b.blk(l, p + "_fn.weight"), {S * d, mix}, S * d);
    b.bias(b.blk(l, p + "_base.weight"), {mix});
    b.norm(b.blk(l, p + "_scale.weight"), 3);
  }
  b.norm(b.blk(l, "attn_norm.weight"), d);
  b.weight(b.blk(l, "attn_q_a.weight"), {d, q}, d);
  b.norm(b.blk(l, "attn_q_a_norm.weight"), q);
  b.weight(b.blk(l, "attn_q_b.weight"), {q, h * hd}, q);
  b.weight(b.blk(l, "attn_kv.weight"), {d, hd}, d);
  b.norm(b.blk(l, "attn_kv_a_norm.weight"), hd);
  b.bias(b.blk(l, "attn_sinks.weight"), {h});
  b.weight(b.blk(l, "attn_output_a.weight"), {h * hd / g, ol * g}, h * hd / g);
  b.weight(b.blk(l, "attn_output_b.weight"), {ol * g, d}, ol * g, true);
  if (s.arch == SynthArch::deepseek41) {
    const Deepseek41Role role = deepseek41_role(s, l);
    if (role.source) {
      const uint64_t ih = s.n_idx_head, id = s.idx_head_dim;
      b.weight(b.blk(l, "attn_compressor_kv.weight"), {d, hd}, d);
      if (role.ratio > 1) b.weight(b.blk(l, "attn_compressor_gate.weight"), {d, hd}, d);
      b.norm(b.blk(l, "attn_compressor_norm.weight"), hd);
      b.weight(b.blk(l, "indexer.attn_q_b.weight"), {q, ih * id}, q);
      b.weight(b.blk(l, "indexer.proj.weight"), {d, ih}, d);
      b.weight(b.blk(l, "indexer.attn_k.weight"), {hd, id}, hd);
      b.norm(b.blk(l, "indexer.k_norm.weight"), id);
    }
    if (is_engram_layer(s, l)) {
      const uint64_t kw = uint64_t(s.engram_max_ngram - 1) * s.engram_heads * s.engram_dim;
      b.embedding_table(b.blk(l, "engram_embd.weight"), {s.engram_dim, b.engram_rows(l)});
      b.weight(b.blk(l, "engram_wkv.weight"), {kw, (S + 1) * d}, kw);
      b.norm2d(b.blk(l, "engram_q.weight"), {d, S});
      b.norm2d(b.blk(l, "engram_k.weight"), {d, S});
    }
  }
  const uint32_t r = s.arch == SynthArch::deepseek4 ? deepseek4_ratio(s, l) : 0;
  if (r > 0) {
    const uint64_t w = r == 4 ? 2 * hd : hd;  // ratio 4 pools overlapping pairs of blocks
    b.weight(b.blk(l, "attn_compressor_kv.weight"), {d, w}, d);
    b.weight(b.blk(l, "attn_compressor_gate.weight"), {d, w}, d);
    b.weight(b.blk(l, "attn_compressor_ape.weight"), {w, r}, w);
    b.norm(b.blk(l, "attn_compressor_norm.weight"), hd);
  }
  if (r == 4) {
    const uint64_t ih = s.n_idx_head, id = s.idx_head_dim;
    b.weight(b.blk(l, "indexer.attn_q_b.weight"), {q, ih * id}, q);
    b.weight(b.blk(l, "indexer.proj.weight"), {d, ih}, d);
    b.weight(b.blk(l, "indexer_compressor_kv.weight"), {d, 2 * id}, d);
    b.weight(b.blk(l, "indexer_compressor_gate.weight"), {d, 2 * id}, d);
    b.weight(b.blk(l, "indexer_compressor_ape.weight"), {2 * id, 4}, 2 * id);
    b.norm(b.blk(l, "indexer_compressor_norm.weight"), id);
  }
  b.norm(b.blk(l, "ffn_norm.weight"), d);
  b.router(l);
  if (uint32_t(l) < s.n_hash_layers) {
    b.table(l);
  } else {
    b.bias(b.blk(l, "exp_probs_b.bias"), {s.n_expert});
  }
  b.experts(l);
  b.dense_ffn(l, uint64_t(s.n_ff_exp) * s.n_expert_shared, "_shexp");
}

// ---- metadata (keys, order and types as in the fixtures llama.cpp wrote) ----

class KeyWriter {
 public:
  KeyWriter(std::vector<GgufKv>& kvs, std::string_view arch)
      : kvs_(kvs), prefix_(std::string(arch) + ".") {}
  void u32(std::string_view key, uint32_t v) { put(key, GgufValue::make_u32(v)); }
  void f32(std::string_view key, float v) { put(key, GgufValue::make_f32(v)); }
  void boolean(std::string_view key, bool v) { put(key, GgufValue::make_bool(v)); }
  void value(std::string_view key, GgufValue v) { put(key, std::move(v)); }
  void str(std::string_view key, std::string_view v) {
    put(key, GgufValue::make_string(std::string(v)));
  }
  void common(const SynthShape& s) {
    u32("context_length", s.n_ctx_train);
    u32("embedding_length", s.n_embd);
    u32("block_count", s.n_layer);
    u32("feed_forward_length", s.n_ff);
    u32("attention.head_count", s.n_head);
  }
  void yarn(const SynthShape& s) {
    str("rope.scaling.type", "yarn");
    f32("rope.scaling.factor", s.yarn_factor);
    u32("rope.scaling.original_context_length", s.yarn_orig_ctx);
    f32("rope.scaling.yarn_beta_fast", 32.0f);
    f32("rope.scaling.yarn_beta_slow", 1.0f);
  }

 private:
  void put(std::string_view key, GgufValue v) {
    kvs_.push_back({prefix_ + std::string(key), std::move(v)});
  }
  std::vector<GgufKv>& kvs_;
  std::string prefix_;
};

// deepseek4's keys in the order llama.cpp's converter writes them (the fixture files).
void add_deepseek4_keys(KeyWriter& k, const SynthShape& s, const SynthEngramLayout* engram) {
  k.u32("context_length", s.n_ctx_train);
  k.u32("embedding_length", s.n_embd);
  if (s.arch == SynthArch::deepseek4) k.u32("embedding_length_out", s.hc_streams * s.n_embd);
  k.u32("block_count", s.n_layer);
  k.u32("attention.head_count", s.n_head);
  k.u32("attention.head_count_kv", 1);
  k.u32("attention.key_length", s.head_dim);
  k.u32("attention.value_length", s.head_dim);
  k.u32("rope.dimension_count", s.n_rot);
  k.f32("rope.freq_base", s.rope_base);
  k.f32("attention.layer_norm_rms_epsilon", s.eps);
  k.yarn(s);
  k.u32("expert_count", s.n_expert);
  k.u32("expert_used_count", s.n_expert_used);
  k.u32("expert_feed_forward_length", s.n_ff_exp);
  k.u32("expert_shared_count", s.n_expert_shared);
  k.f32("expert_weights_scale", s.expert_weights_scale);
  k.boolean("expert_weights_norm", s.expert_weights_norm);
  k.u32("expert_gating_func", 4);  // sqrt(softplus)
  k.u32("attention.q_lora_rank", s.q_lora_rank);
  k.u32("attention.sliding_window", s.n_swa);
  const std::vector<float> limits(s.n_layer, s.swiglu_limit);
  k.value("swiglu_clamp_exp", GgufValue::make_f32_array(limits));
  k.value("swiglu_clamp_shexp", GgufValue::make_f32_array(limits));
  k.u32("attention.indexer.head_count", s.n_idx_head);
  k.u32("attention.indexer.key_length", s.idx_head_dim);
  k.u32("attention.indexer.top_k", s.idx_top_k);
  k.u32("attention.output_group_count", s.o_groups);
  k.u32("attention.output_lora_rank", s.o_lora_rank);
  std::vector<int32_t> ratios;
  for (int l = 0; l < int(s.n_layer); ++l)
    ratios.push_back(int32_t(s.arch == SynthArch::deepseek4 ? deepseek4_ratio(s, l) : deepseek41_role(s, l).ratio));
  k.value("attention.compress_ratios", GgufValue::make_i32_array(ratios));
  k.f32("attention.compress_rope_freq_base", s.compress_rope_base);
  k.u32("hyper_connection.count", s.hc_streams);
  k.u32("hyper_connection.sinkhorn_iterations", 20);
  k.f32("hyper_connection.epsilon", 1e-6f);
  k.u32("hash_layer_count", s.n_hash_layers);
  if (engram == nullptr || engram->layers.empty()) return;
  // deepseek41's Engram, in ik_llama.cpp's keys (the fixture's order)
  k.value("engram.layer_ids", u32_array(engram->layers));
  k.u32("engram.head_count", s.engram_heads);
  k.u32("engram.key_length", s.engram_dim);
  k.u32("engram.max_ngram_size", s.engram_max_ngram);
  k.value("engram.multipliers", u64_array(engram->multipliers));
  k.value("engram.primes", u64_array(engram->primes));
  k.value("engram.offsets", u64_array(engram->offsets));
  k.value("engram.token_map", GgufValue::make_i32_array(std::vector<int32_t>(engram->token_map.begin(), engram->token_map.end())));
  k.u32("engram.pad_id", engram->pad_id);
}

void add_arch_keys(std::vector<GgufKv>& kvs, const SynthShape& s, uint32_t n_vocab,
                   const SynthEngramLayout* engram) {
  KeyWriter k(kvs, synth_arch_name(s.arch));
  if (s.arch == SynthArch::deepseek4 || s.arch == SynthArch::deepseek41) return add_deepseek4_keys(k, s, engram);
  k.common(s);
  switch (s.arch) {
    case SynthArch::qwen3moe:
      k.u32("attention.head_count_kv", s.n_head_kv);
      k.f32("rope.freq_base", s.rope_base);
      k.f32("attention.layer_norm_rms_epsilon", s.eps);
      k.u32("expert_used_count", s.n_expert_used);
      k.u32("attention.key_length", s.head_dim);
      k.u32("attention.value_length", s.head_dim);
      k.u32("expert_count", s.n_expert);
      k.u32("expert_feed_forward_length", s.n_ff_exp);
      break;
    case SynthArch::llama:
      k.u32("attention.head_count_kv", s.n_head_kv);
      k.f32("rope.freq_base", s.rope_base);
      k.f32("attention.layer_norm_rms_epsilon", s.eps);
      k.u32("expert_count", s.n_expert);
      k.u32("expert_used_count", s.n_expert_used);
      k.u32("vocab_size", n_vocab);
      k.u32("rope.dimension_count", s.n_rot);
      break;
    case SynthArch::gpt_oss:
      k.u32("attention.head_count_kv", s.n_head_kv);
      k.yarn(s);
      k.f32("rope.freq_base", s.rope_base);
      k.f32("attention.layer_norm_rms_epsilon", s.eps);
      k.u32("expert_count", s.n_expert);
      k.u32("expert_used_count", s.n_expert_used);
      k.u32("attention.key_length", s.head_dim);
      k.u32("attention.value_length", s.head_dim);
      k.u32("attention.sliding_window", s.n_swa);
      k.u32("expert_feed_forward_length", s.n_ff_exp);
      break;
    case SynthArch::deepseek2:
      // MLA is written as multi-query attention over the compressed cache: one KV head whose
      // key is [kv_lora | rope] and whose value is the kv_lora latent; the *_mla lengths are
      // the per-head sizes after decompression.
      k.u32("attention.head_count_kv", 1);
      k.f32("rope.freq_base", s.rope_base);
      k.f32("attention.layer_norm_rms_epsilon", s.eps);
      k.u32("expert_count", s.n_expert);
      k.u32("expert_used_count", s.n_expert_used);
      if (s.n_expert_group > 0) {
        k.u32("expert_group_count", s.n_expert_group);
        k.u32("expert_group_used_count", s.n_expert_group_used);
      }
      k.u32("expert_gating_func", uint32_t(s.gating));
      k.u32("leading_dense_block_count", s.n_layer_dense);
      k.u32("vocab_size", n_vocab);
      if (s.q_lora_rank > 0) k.u32("attention.q_lora_rank", s.q_lora_rank);
      k.u32("attention.kv_lora_rank", s.kv_lora_rank);
      k.u32("attention.key_length", s.kv_lora_rank + s.qk_rope);
      k.u32("attention.value_length", s.kv_lora_rank);
      k.u32("attention.key_length_mla", s.qk_nope + s.qk_rope);
      k.u32("attention.value_length_mla", s.v_head);
      k.u32("expert_feed_forward_length", s.n_ff_exp);
      k.u32("expert_shared_count", s.n_expert_shared);
      k.f32("expert_weights_scale", s.expert_weights_scale);
      k.boolean("expert_weights_norm", s.expert_weights_norm);
      k.u32("rope.dimension_count", s.qk_rope);
      k.yarn(s);
      k.f32("rope.scaling.yarn_log_multiplier", s.yarn_log_mul);
      break;
    case SynthArch::deepseek4:
    case SynthArch::deepseek41:
      break;  // add_deepseek4_keys
  }
}

// tokenizer.* keys of a vocabulary GGUF, in file order.
Result<std::vector<GgufKv>> read_vocab(const std::string& path) {
  auto f = GgufFile::open(path);
  if (!f) return Error{"--vocab: " + f.error().message};
  const GgufValue* tokens = f->find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != GgufType::array || tokens->elem_type != GgufType::string ||
      tokens->elems.empty() || tokens->elems.size() > UINT32_MAX) {
    return Error{strfmt("--vocab %s: no tokenizer.ggml.tokens array of strings", path.c_str())};
  }
  std::vector<GgufKv> out;
  for (const GgufKv& kv : f->kvs()) {
    if (kv.key.rfind("tokenizer.", 0) == 0) out.push_back(kv);
  }
  return out;
}

uint32_t token_count(const std::vector<GgufKv>& vocab) {
  for (const GgufKv& kv : vocab) {
    if (kv.key == "tokenizer.ggml.tokens") return uint32_t(kv.value.elems.size());
  }
  STRATA_CHECK(false, "a vocabulary without tokenizer.ggml.tokens");
  return 0;
}

}  // namespace

Result<std::vector<GgufKv>> synth_metadata(const SynthShape& shape, SynthQuant quant,
                                           const SynthOptions& options) {
  std::vector<GgufKv> vocab;
  if (!options.vocab_path.empty()) {
    auto v = read_vocab(options.vocab_path);
    if (!v) return v.error();
    vocab = std::move(*v);
  } else {
    vocab = synth_generated_vocab(shape.n_vocab, shape.tokenizer_pre);
  }

  std::vector<GgufKv> kvs;
  auto put = [&](std::string key, GgufValue v) { kvs.push_back({std::move(key), std::move(v)}); };
  put("general.architecture", GgufValue::make_string(std::string(synth_arch_name(shape.arch))));
  put("general.name", GgufValue::make_string("synthetic " + std::string(shape.description)));
  put("general.description",
      GgufValue::make_string(strfmt("strata synth --shape %s --quant %s --seed %llu: random "
                                    "weights of the real shape; not a trained model",
                                    std::string(shape.name).c_str(),
                                    std::string(synth_quant_name(quant)).c_str(),
                                    static_cast<unsigned long long>(options.seed))));
  SynthShape with_mtp = shape;  // block_count counts the nextn layers
  with_mtp.n_layer += options.mtp_layers;
  const SynthEngramLayout engram = synth_engram_layout(shape, options.engram_rows, token_count(vocab), options.seed);
  add_arch_keys(kvs, with_mtp, token_count(vocab), &engram);
  if (options.mtp_layers > 0)
    put(std::string(synth_arch_name(shape.arch)) + ".nextn_predict_layers", GgufValue::make_u32(options.mtp_layers));
  for (GgufKv& kv : vocab) kvs.push_back(std::move(kv));
  put("general.quantization_version", GgufValue::make_u32(2));
  put("general.file_type", GgufValue::make_u32(file_type(quant)));
  return kvs;
}

Result<SynthPlan> build_synth_plan(const SynthShape& shape, SynthQuant quant,
                                   const SynthOptions& options) {
  if (options.mtp_layers > 0 && (shape.arch == SynthArch::deepseek4 || shape.arch == SynthArch::deepseek41))
    return Error{"multi-token-prediction layers are not built for " + std::string(synth_arch_name(shape.arch))};
  auto kvs = synth_metadata(shape, quant, options);
  if (!kvs) return kvs.error();
  SynthPlan plan;
  plan.seed = options.seed;
  plan.n_vocab = token_count(*kvs);
  for (GgufKv& kv : *kvs) plan.writer.set(std::move(kv.key), std::move(kv.value));

  PlanBuilder b(shape, quant, options.seed, plan.n_vocab);
  b.set_engram_rows(synth_engram_layout(shape, options.engram_rows, plan.n_vocab, options.seed).table_rows);
  b.embedding();
  b.norm("output_norm.weight", shape.n_embd);
  b.weight("output.weight", {shape.n_embd, plan.n_vocab}, shape.n_embd);
  if (shape.arch == SynthArch::deepseek4) {  // the streams' weights into the head
    const uint64_t S = shape.hc_streams;
    b.weight("output_hc_fn.weight", {S * shape.n_embd, S}, S * shape.n_embd);
    b.bias("output_hc_base.weight", {S});
    b.norm("output_hc_scale.weight", 1);
  }
  for (int l = 0; l < int(shape.n_layer + options.mtp_layers); ++l) {
    if (l >= int(shape.n_layer)) {  // a nextn layer: its input projection and norms, then the block
      const uint64_t d = shape.n_embd;
      b.weight(b.blk(l, "nextn.eh_proj.weight"), {2 * d, d}, 2 * d);
      b.norm(b.blk(l, "nextn.enorm.weight"), d);
      b.norm(b.blk(l, "nextn.hnorm.weight"), d);
      b.norm(b.blk(l, "nextn.shared_head_norm.weight"), d);
    }
    switch (shape.arch) {
      case SynthArch::qwen3moe:
        add_qwen3moe_layer(b, shape, l);
        break;
      case SynthArch::deepseek2:
        add_deepseek2_layer(b, shape, l);
        break;
      case SynthArch::gpt_oss:
        add_gpt_oss_layer(b, shape, l);
        break;
      case SynthArch::llama:
        add_llama_layer(b, shape, l);
        break;
      case SynthArch::deepseek4:
      case SynthArch::deepseek41:
        add_deepseek4_layer(b, shape, l);
        break;
    }
  }
  b.finish(plan);
  return plan;
}

}  // namespace strata
