// Synthetic GGUF models with the exact tensor names, shapes, types and metadata keys of real MoE
// releases (what llama.cpp's converter and llama-quantize write), filled with seeded random
// weights. They let the engine, the tiering and the benchmarks run at the real scale (tens of GB,
// the real expert byte ranges) without downloading a model.
//
// A shape is one row of a data table (synth_shapes.cpp); a quant mix is one of llama-quantize's
// file types. build_synth_plan() turns (shape, mix, options) into a GgufWriter holding the header
// plus a description of every tensor's values; SynthPlan::fill() then produces any byte range of
// any tensor on demand, so a 60 GB file streams through GgufWriter::write_file in 64 MB chunks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "model/gguf.h"

namespace strata {

// Architectures as GGUF names them (general.architecture).
enum class SynthArch { qwen3moe, deepseek2, gpt_oss, llama, deepseek4, deepseek41 };
// "qwen3moe", "deepseek2", "gpt-oss", "llama", "deepseek4", "deepseek41"
std::string_view synth_arch_name(SynthArch arch);

// deepseek2.expert_gating_func, values as in llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE.
enum class SynthGating : uint32_t { softmax = 1, sigmoid = 2 };

// Hyperparameters of one real model. Fields an architecture does not use stay 0.
struct SynthShape {
  std::string_view name;         // --shape
  std::string_view description;  // for --list and general.name
  SynthArch arch = SynthArch::qwen3moe;
  uint32_t n_layer = 0;
  uint32_t n_embd = 0;
  uint32_t n_vocab = 0;  // of the generated vocabulary; --vocab replaces it by the file's
  uint32_t n_ctx_train = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;  // deepseek2: not used (MLA is written as one shared KV head)
  uint32_t head_dim = 0;   // key and value length per head (not deepseek2)
  uint32_t n_ff = 0;       // feed_forward_length: deepseek2's leading dense layers; the value the
                           // converter writes elsewhere (qwen3moe: the dense FFN of the family)
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;
  uint32_t n_ff_exp = 0;         // FFN width of one routed expert
  uint32_t n_expert_shared = 0;  // deepseek2: shared experts, stored as one FFN of
                                 // n_ff_exp * n_expert_shared
  uint32_t n_layer_dense = 0;    // deepseek2: leading layers with a dense FFN instead of experts
  uint32_t n_expert_group = 0;   // deepseek2: routing groups (written when > 0)
  uint32_t n_expert_group_used = 0;
  SynthGating gating = SynthGating::softmax;  // deepseek2
  float expert_weights_scale = 0;             // deepseek2
  bool expert_weights_norm = false;           // deepseek2
  // Multi-head latent attention (deepseek2). q_lora_rank 0: queries come from attn_q directly
  // (V2-Lite) instead of the attn_q_a / attn_q_b pair.
  uint32_t q_lora_rank = 0;
  uint32_t kv_lora_rank = 0;
  uint32_t qk_nope = 0;
  uint32_t qk_rope = 0;
  uint32_t v_head = 0;
  uint32_t n_rot = 0;  // rope.dimension_count where the converter writes it (llama)
  float rope_base = 0;
  float eps = 0;
  // YaRN context extension, written when yarn_factor > 0.
  float yarn_factor = 0;
  uint32_t yarn_orig_ctx = 0;
  float yarn_log_mul = 0;                    // deepseek2: 0.1 * mscale_all_dim
  uint32_t n_swa = 0;                        // gpt-oss: sliding window of the even layers;
                                             // deepseek4: of every layer
  // deepseek4 (fixtures README): the first n_window_layers layers attend to their window only,
  // the rest alternate compress ratio 4 (with the lightning indexer) and 128; the first
  // n_hash_layers route by token id. The head size is head_dim, n_rot its roped tail.
  uint32_t n_window_layers = 0;
  uint32_t n_hash_layers = 0;
  uint32_t hc_streams = 0;
  uint32_t o_groups = 0, o_lora_rank = 0;
  uint32_t n_idx_head = 0, idx_head_dim = 0, idx_top_k = 0;
  float compress_rope_base = 0;
  float swiglu_limit = 0;
  // deepseek41 (fixtures README): after the window-only layers, the compressed layers cycle
  // through a ratio-2 source (compressor, indexer, index keys), a ratio-2 reader and a ratio-1
  // source; no hash layers. Engram on layers engram_layers (-1: none; layers cut by --layers are
  // dropped), orders 2..engram_max_ngram of engram_heads heads each, rows of engram_dim values,
  // about engram_rows rows a table (each head's buckets a distinct prime).
  int32_t engram_layers[2] = {-1, -1};
  uint32_t engram_heads = 0, engram_dim = 0, engram_max_ngram = 0;
  uint64_t engram_rows = 0;
  std::string_view tokenizer_pre = "gpt-2";  // tokenizer.ggml.pre of the generated vocabulary
};

// The shape table, in --list order.
std::span<const SynthShape> synth_shapes();
const SynthShape* find_synth_shape(std::string_view name);

// Quantization mixes, each as llama-quantize makes it from a float model (synth.cpp,
// synth_tensor_type, states the rules).
enum class SynthQuant { q8_0, q4_k_m, mxfp4_moe };
// "q8_0", "q4_k" / "q4_k_m", "mxfp4" / "mxfp4_moe", any case.
std::optional<SynthQuant> synth_quant_from_name(std::string_view name);
std::string_view synth_quant_name(SynthQuant quant);  // "Q8_0", "Q4_K_M", "MXFP4_MOE"

// The type llama-quantize gives tensor `name` of shape `ne` (row first) when making `quant` for
// a model of `shape`. Tensors it never quantizes (1D, norms, routers, biases) are F32.
GgmlType synth_tensor_type(const SynthShape& shape, SynthQuant quant, std::string_view name,
                           const std::vector<uint64_t>& ne);

// The first kSynthSharedChannels channels of every token embedding carry a common offset (the
// "massive activation" channels of real models) and each router reads them with a per-expert
// weight; that is what makes expert popularity uneven. See synth.cpp.
constexpr uint32_t kSynthSharedChannels = 32;

// How a tensor's values are drawn. Quantized weights are written block by block with valid,
// randomly drawn scales and quants; nothing is quantized from floats.
enum class SynthFill : uint8_t {
  weight,     // zero mean, standard deviation `std`
  embedding,  // weight, plus a mean of `std` on the shared channels of every row
  norm,       // 1 + N(0, std)
  bias,       // N(0, std) (biases, attention sinks, exp_probs_b)
  router,     // N(0, std), except on the shared channels: expert_bias / kSynthSharedChannels
  table,      // I32 [k][n_vocab] (deepseek4's token id -> experts): k distinct experts per token
};

struct SynthTensorFill {
  SynthFill kind = SynthFill::weight;
  float std = 0;
  // router: the logit offset each expert gets from the shared channels of a normalized hidden
  // state (about 1 there); [n_expert]
  std::vector<float> expert_bias;
  uint32_t n_expert = 0;  // table: experts to choose from
};

struct SynthOptions {
  uint64_t seed = 1;
  std::string vocab_path;  // a GGUF whose tokenizer.* keys are copied; empty: generated
  // Multi-token-prediction (nextn) layers after the main ones, as DeepSeek-V3 and GLM-4.5 ship
  // them: a block of the main layers' kind plus nextn.{eh_proj, enorm, hnorm, shared_head_norm};
  // block_count counts them and nextn_predict_layers says how many. Not for deepseek4.
  uint32_t mtp_layers = 0;
  uint64_t engram_rows = 0;  // deepseek41: rows of each Engram table (0: the shape's)
};

// A synthetic model ready to be written: the header and how to draw every tensor's bytes.
struct SynthPlan {
  GgufWriter writer;
  std::vector<SynthTensorFill> fills;  // parallel to writer.tensors()
  uint64_t seed = 0;
  uint32_t n_vocab = 0;

  // Writes bytes [offset, offset + out.size()) of tensor `index` (a GgufWriter::FillFn). The
  // bytes depend only on (seed, index, position): never on how the range is cut into calls or on
  // the number of OpenMP threads that fill it.
  void fill(size_t index, uint64_t offset, std::span<uint8_t> out) const;
  // Whole-file helpers.
  Status write_file(const std::string& path,
                    const GgufWriter::ProgressFn& progress = nullptr) const;
  std::vector<uint8_t> write_memory() const;
};

// The model's metadata in file order: general.*, the architecture's keys, tokenizer.*, then the
// quantization keys. Fails only on a bad vocabulary file.
Result<std::vector<GgufKv>> synth_metadata(const SynthShape& shape, SynthQuant quant,
                                           const SynthOptions& options);

// Builds the plan (synth_metadata and the tensors); fails only on a bad vocabulary file.
Result<SynthPlan> build_synth_plan(const SynthShape& shape, SynthQuant quant,
                                   const SynthOptions& options);

// The tokenizer.* metadata of the generated byte-level BPE vocabulary of `n_vocab` tokens
// (synth_vocab.cpp): GPT-2's 256 byte symbols and first 767 merges, <|endoftext|> (bos = eos),
// then unused filler tokens "[PAD<id>]" up to n_vocab, as the converter pads a vocabulary.
std::vector<GgufKv> synth_generated_vocab(uint32_t n_vocab, std::string_view pre);

}  // namespace strata
