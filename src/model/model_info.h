// What a GGUF model is made of, for `strata info` and for planning: tensors grouped by role,
// bytes per routed expert, and the bytes one decode step must read.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "model/gguf.h"

namespace strata {

enum class TensorRole {
  embedding,      // token_embd
  attention,      // attn_*, indexer/compressor of compressed attention
  router,         // ffn_gate_inp, exp_probs_b, hash-routing tables
  dense_ffn,      // ffn_{gate,up,down} of dense layers
  shared_expert,  // *_shexp
  routed_expert,  // *_exps: stacked [.., n_expert]
  norm,           // every *norm*
  output,         // output (lm head)
  engram,         // deepseek41's Engram tables (engram_embd): rows looked up by hashed n-grams
  other,          // hyper-connections, MTP (nextn) layers, anything unrecognised
};
constexpr int kTensorRoleCount = 10;
std::string_view tensor_role_name(TensorRole role);

// Role of a tensor by its GGUF name (llama.cpp's naming).
TensorRole classify_tensor(std::string_view name);
// Layer index of "blk.N.*", or -1.
int tensor_layer(std::string_view name);

struct RoleTotals {
  uint64_t n_tensors = 0;
  uint64_t n_params = 0;
  uint64_t n_bytes = 0;
  std::map<GgmlType, uint64_t> bytes_by_type;
};

// Tensors that differ only in their layer number, aggregated ("blk.*.ffn_up_exps.weight").
struct TensorPattern {
  std::string pattern;
  TensorRole role = TensorRole::other;
  uint64_t n_tensors = 0;
  uint64_t n_bytes = 0;
  std::map<GgmlType, uint64_t> count_by_type;
  std::string shape;  // of the first tensor; "(varies)" when they differ
};

struct ModelSummary {
  std::string arch;  // general.architecture
  std::string name;  // general.name, may be empty
  uint64_t n_layer = 0;
  uint64_t n_vocab = 0;
  uint64_t n_params = 0;
  uint64_t n_bytes = 0;  // all tensor data

  std::array<RoleTotals, kTensorRoleCount> roles{};
  std::vector<TensorPattern> patterns;  // in order of first appearance

  // Mixture of experts (zero when the model has no routed experts).
  uint64_t n_expert = 0;
  uint64_t n_expert_used = 0;
  uint64_t n_moe_layers = 0;
  uint64_t expert_bytes_min = 0, expert_bytes_max = 0;  // bytes of one routed expert, over layers
  uint64_t expert_bytes_total = 0;                      // all routed experts of all layers
  // deepseek41's Engram tables: their bytes, and the rows (and bytes) one token reads of them
  uint64_t engram_bytes_total = 0;
  uint64_t engram_rows_per_token = 0, engram_bytes_per_token = 0;

  // Bytes one decode step reads: one embedding row, all non-expert weights, and n_expert_used
  // experts per MoE layer (and its Engram rows). MTP (nextn) layers are excluded: strata does not run them in decode.
  uint64_t active_bytes_per_token = 0;
  // Weight-matrix elements of that step (each one multiply-add per token: 2 ops per token in a
  // prefill's GEMM); the embedding row counts its n_embd elements.
  uint64_t active_params_per_token = 0;
  // The routed experts' part of it (n_expert_used experts per MoE layer).
  uint64_t active_routed_params_per_token = 0;
  uint64_t n_nextn_layers = 0;
};

Result<ModelSummary> summarize_model(const GgufFile& f);

}  // namespace strata
