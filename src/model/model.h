// A loaded model: hyperparameters from the GGUF metadata and views of its weights (no copies; the
// file stays mapped). Loading validates every tensor the architecture needs: present, the expected
// shape, a type strata can compute with. One forward pass per architecture (arch_*.cpp) runs on it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "cpu/ops.h"
#include "cpu/numa.h"
#include "cpu/weights.h"
#include "model/gguf.h"
#include "model/kv_cache.h"

namespace strata {

enum class Arch { qwen3moe, qwen2moe, llama, deepseek2, gpt_oss, deepseek4, deepseek41 };

// How router logits z become expert choices and weights.
//  softmax:       choose by softmax(z), weigh by it (renormalised over the chosen if norm_topk)
//  sigmoid:       choose by sigmoid(z) (+ exp_probs_b), weigh by the unbiased sigmoid
//  softmax_topk:  choose by z, weigh by the softmax over the chosen k logits (gpt-oss, Mixtral)
//  sqrt_softplus: choose by sqrt(softplus(z)) (+ exp_probs_b), weigh by the unbiased score
//                 (deepseek4; its hash-routed layers take the experts from a token-id table)
enum class Gating { softmax, sigmoid, softmax_topk, sqrt_softplus };

// The gated activation of a SwiGLU FFN, act(gate) * up.
//  silu:       silu(g) * u
//  swiglu_oai: x = min(g, limit); x sigmoid(alpha x) (clamp(u, -limit, limit) + 1)  (gpt-oss)
//  silu_clamp: silu(min(g, limit)) * clamp(u, -limit, limit)  (deepseek4)
enum class GluKind { silu, swiglu_oai, silu_clamp };
struct GluParams {
  GluKind kind = GluKind::silu;
  float alpha = 1.0f, limit = 0.0f;
};

// deepseek41's Engram (fixtures README, deepseek41): on each Engram layer, before the block, every
// token adds hashed n-gram embeddings to its streams. Token ids are compressed by token_map; for
// order n = 2..max_ngram the last n compressed ids (pad_id before the sequence start) are hashed
// r = c[p] m[0] ^ c[p-1] m[1] ^ ... (wrapping 64-bit), and for each of the order's n_head heads the
// row is r mod prime + offset of blk.L.engram_embd (key_length values a row).
struct EngramParams {
  std::vector<int> layers;  // the Engram layers, ascending; slot i is layers[i]
  int n_head = 0, key_length = 0, max_ngram = 0;
  int pad_id = 0;                      // a compressed id
  std::vector<int32_t> token_map;      // [n_vocab]: token id -> compressed id
  std::vector<uint64_t> multipliers;   // [slot][max_ngram]
  std::vector<uint64_t> primes, offsets;  // [slot][rows_per_token()], order-major, then head
  int rows_per_token() const { return (max_ngram - 1) * n_head; }
  int slot(int il) const {
    for (size_t i = 0; i < layers.size(); ++i)
      if (layers[i] == il) return int(i);
    return -1;
  }
};

struct HParams {
  Arch arch = Arch::qwen3moe;
  std::string arch_name;
  int n_layer = 0;          // the main layers (block_count less the nextn layers)
  int n_nextn = 0;  // multi-token-prediction (nextn) layers in the file after the main ones
  int n_embd = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;  // per-head width of q and k
  int head_dim_v = 0;  // per-head width of v
  float eps = 1e-6f;
  cpu::RopeParams rope;

  // mixture of experts
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff = 0;        // dense FFN width (dense layers)
  int n_ff_exp = 0;    // routed expert width
  int n_ff_shexp = 0;  // shared expert width (all shared experts together)
  int n_layer_dense_lead = 0;  // deepseek2: leading dense layers
  Gating gating = Gating::softmax;
  bool norm_topk = false;       // renormalise the chosen experts' weights to sum 1
  float expert_weights_scale = 1.0f;
  int n_group = 0, n_group_used = 0;  // deepseek2 group-limited routing (0: off)
  GluParams expert_glu;                // the routed experts' activation

  // sliding-window attention: layer il sees only the last n_swa positions when swa_period is 0 or
  // il % swa_period < swa_period - 1 (llama.cpp's swa pattern; gpt-oss: period 2, the even
  // layers), every position otherwise. n_swa 0: no window anywhere.
  int n_swa = 0, swa_period = 0;
  int window(int il) const {
    return n_swa > 0 && (swa_period == 0 || il % swa_period < swa_period - 1) ? n_swa : 0;
  }

  // deepseek2 MLA
  int q_lora_rank = 0;   // 0: no q LoRA (attn_q directly)
  int kv_lora_rank = 0;
  int qk_nope = 0, qk_rope = 0, v_head = 0;
  float attn_scale = 0;  // softmax scale of q.k

  // deepseek4 (fixtures README): hyper-connection streams, compressed attention, output LoRA
  int hc_streams = 0, hc_sinkhorn_iters = 0;
  float hc_eps = 0;
  std::vector<int> compress_ratio;  // per layer: 0 (window only), 4 (+ indexer) or 128
  cpu::RopeParams rope_compressed;  // the rope of the compressed layers (base, YaRN, magnitude 1)
  int n_idx_head = 0, idx_head_dim = 0, idx_top_k = 0;  // lightning indexer
  int o_groups = 0, o_lora_rank = 0;
  int n_hash_layers = 0;              // layers il < n_hash_layers route by token id
  std::vector<float> clamp_exp, clamp_shexp;  // per layer SwiGLU limits
  const cpu::RopeParams& layer_rope(int il) const {
    return (arch == Arch::deepseek4 || arch == Arch::deepseek41) && compress_ratio[size_t(il)] > 0 ? rope_compressed
                                                                                                  : rope;
  }

  // deepseek41 (fixtures README): compressed attention shared across layers. Per layer, the layer
  // whose compressed rows it attends to (kv_source: the last layer at or before it with a
  // compressor, its own when it has one), whose top-k choice it uses (topk_source: the last with an
  // indexer query) and, for an index source, whose index keys it scores (key_source: the last with
  // indexer.attn_k, a KV source); -1 for window-only layers. Ratios are any r >= 1 (pooling r
  // tokens, no overlap; ratio 1 is a plain projection).
  std::vector<int> kv_source, topk_source, key_source;
  EngramParams engram;

  int token_bos = -1, token_eos = -1;
};

struct LayerWeights {
  Weight attn_norm, ffn_norm;  // F32 [n_embd]; gpt-oss names ffn_norm post_attention_norm
  // GQA attention
  Weight wq, wk, wv, wo;          // [n_embd] -> [n_head * hd], ...
  Weight bq, bk, bv, bo;          // biases (qwen2moe, gpt-oss), F32
  Weight attn_sinks;              // per-head sink logits (gpt-oss), F32 [n_head]
  Weight q_norm, k_norm;          // per-head RMSNorm (qwen3moe), F32 [head_dim]
  // MLA attention (deepseek2)
  Weight wq_a, q_a_norm, wq_b;    // q LoRA: [n_embd] -> q_lora -> [n_head * (nope + rope)]
  Weight wkv_a_mqa, kv_a_norm;    // [n_embd] -> [kv_lora + rope]
  Weight wk_b;                    // [n_head] x ([qk_nope] <- [kv_lora])... see arch_deepseek2.cpp
  Weight wv_b;
  // feed-forward
  Weight ffn_gate, ffn_up, ffn_down;                  // dense layers
  Weight router;                                      // ffn_gate_inp: [n_embd] -> [n_expert], F32
  Weight router_b;                                    // its bias (gpt-oss), F32 [n_expert]
  Weight exp_probs_b;                                 // selection bias (deepseek2), F32 [n_expert]
  Weight gate_exps, up_exps, down_exps;               // stacked [n_expert]
  Weight gate_exps_b, up_exps_b, down_exps_b;         // biases (gpt-oss), F32 [n_expert][F|n_embd]
  Weight gate_shexp, up_shexp, down_shexp, gate_inp_shexp;  // shared expert (+ its sigmoid gate)
  // deepseek4
  Weight wkv;                                   // attn_kv: [n_embd] -> one K = V head
  Weight wo_a, wo_b;                            // grouped output LoRA
  Weight hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  Weight comp_kv, comp_gate, comp_ape, comp_norm;  // attention compressor (compressed layers)
  Weight idx_q_b, idx_proj;                        // lightning indexer (ratio-4 layers)
  Weight idx_comp_kv, idx_comp_gate, idx_comp_ape, idx_comp_norm;
  Weight tid2eid;                                  // hash-routed layers: I32 [n_vocab][k]
  // deepseek41: the index keys' projection of a key owner, and the Engram of an Engram layer
  Weight idx_k, idx_k_norm;                        // [head_dim] -> [idx_head_dim], its RMSNorm
  Weight engram_embd;   // [rows][key_length]: the hashed n-gram table (the tier may keep it on disk)
  Weight engram_wkv;    // [rows_per_token * key_length] -> [(S + 1) * n_embd]: S keys, one value
  Weight engram_q, engram_k;  // F32 [S][n_embd]: the gate's per-stream weights
  bool is_moe() const { return bool(gate_exps); }
};

// A multi-token-prediction (nextn) layer, as DeepSeek-V3 trains it and GGUF stores it (blk.N.*
// with N = the main layer count): from the main model's last hidden row h_q (before the final
// norm) and the embedding of token t_{q+1}, one more block of the main layers' kind computes a
// row whose logits predict t_{q+2}:
//   x = eh_proj [enorm(embed(t_{q+1})) ; hnorm(h_q)],  x = block(x) at position q,
//   logits = head(head_norm(x)).
struct MtpWeights {
  int il = 0;  // its block index in the file (the first nextn layer)
  LayerWeights block;
  Weight eh_proj;                     // [2 n_embd] -> [n_embd]
  Weight enorm, hnorm, head_norm;     // F32 [n_embd]
  Weight embed, head;                 // its own embeddings and head, else the model's
};

class Model {
 public:
  Model();
  ~Model();
  // repack: weights read into RAM are rewritten into the layouts the start-up kernels read
  // fastest (cpu/repack.h: 16-row interleaving where the ISA has such a kernel); mapped files
  // stay as they are.
  // stream_experts (a mapped file): every weight but the routed experts' matrices (and deepseek41's
  // Engram tables) is copied into RAM (and repacked there); those stay in the file for the NVMe
  // tier to read (storage/expert_store.h, storage/row_store.h; the engine opens them).
  // stream_engram (with stream_experts): the Engram tables stay in the file too.
  static Result<std::unique_ptr<Model>> load(const std::string& path,
                                             MappedFile::Mode mode = MappedFile::Mode::mmap,
                                             bool repack = true, bool stream_experts = false, bool stream_engram = true);
  static Result<std::unique_ptr<Model>> load(GgufFile file, bool repack = true, bool stream_experts = false,
                                             bool stream_engram = true);

  const HParams& hparams() const { return hp_; }
  const GgufFile& file() const { return file_; }

  Weight tok_embd, output_norm, output;
  Weight output_hc_fn, output_hc_base, output_hc_scale;  // deepseek4: streams -> one row
  std::vector<LayerWeights> layers;
  // The first nextn layer, loaded when the file has one (speculative decoding's MTP drafter), else
  // null with the reason in mtp_error.
  std::unique_ptr<MtpWeights> mtp;
  std::string mtp_error;

  // What load's repacking did: bytes of weights interleaved and the time it took.
  uint64_t repacked_bytes = 0;
  double repack_seconds = 0;
  // stream_experts: bytes of the weights copied into RAM (everything but the routed experts).
  uint64_t resident_bytes = 0;
  // Loaded with stream_experts: the routed experts stay in the file (their Weights point into the
  // mapping, for an expert store to read), and whether they are to be interleaved where read (as
  // the resident weights are).
  bool experts_streamed = false;
  bool engram_streamed = false;  // deepseek41's Engram tables left in the file
  bool streamed_repack = false;

 private:
  GgufFile file_;
  HParams hp_;
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> resident_;  // stream_experts copies
};

// Binds the weights read into RAM by the NUMA layout's policy (cpu/numa.h): the routed experts'
// rows to their groups' nodes under shard, the rest interleaved (all on node N under node:N).
// Nothing on one node, on a stand-in topology, or for a mapped file or streamed experts (the page
// cache and the NVMe tier's slots are not placed); `skipped` then says why.
cpu::PlacementStats place_in_numa(const Model& m, const cpu::NumaLayout& l, std::string* skipped = nullptr);

// The hyperparameters of a GGUF's metadata alone (no tensor is read: works on header-only files).
Result<HParams> hparams_from_gguf(const GgufFile& f);
// Bytes the KV cache holds per position of context, all layers, with `type` entries for GQA
// caches (MLA's are float).
uint64_t kv_bytes_per_token(const HParams& hp, KvType type);
// The entries a GQA cache of `requested` entries gets: requested where the heads fit it (q8_0:
// dims that are multiples of 32), else f16.
KvType gqa_cache_type(const HParams& hp, KvType requested);

// The vector of an F32 weight (norms, biases).
inline const float* f32(const Weight& w) { return reinterpret_cast<const float*>(w.data); }

}  // namespace strata
