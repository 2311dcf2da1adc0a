// strata quantize: a GGUF rewritten with its weights in another storage format, tensor by tensor,
// with llama-quantize's choice of type per tensor for the common mixes (no importance matrix):
//   Q8_0        every matrix Q8_0
//   Q6_K        every matrix Q6_K
//   Q4_K_M      Q4_K; attn_v and ffn_down(_exps) Q6_K on the layers llama.cpp's use_more_bits picks
//               (the first and last eighth and every third between); the output head Q6_K
//   Q4_0        Q4_0; the output head Q6_K
//   MXFP4_MOE   routed experts (ffn_*_exps) MXFP4, every other matrix Q8_0
//   F16, F32    every matrix in that float type
// Kept as they are in every mix: 1-D tensors (norms, biases), the router (ffn_gate_inp) and other
// small tables. A matrix whose rows are not whole blocks of the chosen type falls back to Q8_0,
// then F16. The input may hold any type strata can decode; quantizing a quantized file compounds
// the error (the command says so).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/error.h"
#include "cpu/ggml_type.h"
#include "model/gguf.h"

namespace strata {

enum class QuantMix { f32, f16, q8_0, q6_k, q4_k_m, q4_0, mxfp4_moe };

std::optional<QuantMix> quant_mix_from_name(std::string_view name);  // "Q4_K_M", "q8_0", ... any case
std::string_view quant_mix_name(QuantMix mix);                       // "Q4_K_M"
std::string_view quant_mix_names();                                  // for messages and --help

// The storage type of tensor `t` of `in` under `mix`.
GgmlType quantized_type(const GgufFile& in, const GgufTensorInfo& t, QuantMix mix);

// Writes `in` to `out_path` with each tensor converted to quantized_type(); metadata is copied with
// general.file_type set to the mix's llama_ftype. progress(done, total) counts tensor bytes read.
Status quantize_gguf(const GgufFile& in, const std::string& out_path, QuantMix mix,
                     const std::function<void(uint64_t done, uint64_t total)>& progress = nullptr);

}  // namespace strata
