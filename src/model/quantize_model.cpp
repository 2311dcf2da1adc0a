// strata quantize: GGUF -> GGUF in another quant mix (quantize_model.h).
#include "model/quantize_model.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

#include "cpu/quant_traits.h"
#include "cpu/quantize.h"

namespace strata {

namespace {

struct MixInfo {
  QuantMix mix;
  std::string_view name;
  uint32_t ftype;  // llama_ftype, written as general.file_type
  GgmlType base;   // the type of an ordinary matrix
};

constexpr MixInfo kMixes[] = {
    {QuantMix::f32, "F32", 0, GgmlType::f32},          {QuantMix::f16, "F16", 1, GgmlType::f16},
    {QuantMix::q8_0, "Q8_0", 7, GgmlType::q8_0},       {QuantMix::q6_k, "Q6_K", 18, GgmlType::q6_k},
    {QuantMix::q4_k_m, "Q4_K_M", 15, GgmlType::q4_k},  {QuantMix::q4_0, "Q4_0", 2, GgmlType::q4_0},
    {QuantMix::mxfp4_moe, "MXFP4_MOE", 38, GgmlType::q8_0},
};

const MixInfo& info(QuantMix mix) {
  for (const MixInfo& m : kMixes) {
    if (m.mix == mix) return m;
  }
  STRATA_CHECK(false, "a QuantMix without a table entry");
  return kMixes[0];
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// The layer of "blk.N.<...>", or -1.
int layer_of(std::string_view name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  int il = 0;
  size_t i = 4;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) il = il * 10 + (name[i] - '0');
  return i > 4 && i < name.size() && name[i] == '.' ? il : -1;
}

// llama.cpp's use_more_bits(i_layer, n_layers): the layers Q4_K_M gives Q6_K.
bool use_more_bits(int il, int n_layer) {
  return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

int block_count(const GgufFile& in) {
  auto arch = in.get_string("general.architecture");
  if (!arch || !*arch) return 0;
  auto n = in.get_uint(**arch + ".block_count");
  return n && *n ? int(std::min<uint64_t>(**n, 1 << 20)) : 0;
}

// The storage type `mix` asks for, before the block-size fallback.
GgmlType wanted_type(const GgufFile& in, const GgufTensorInfo& t, QuantMix mix) {
  const std::string_view name = t.name;
  const bool matrix = t.n_dims >= 2 && ends_with(name, ".weight");
  // Norms, biases, routers and small tables stay as they are (llama-quantize keeps the router too).
  if (!matrix || contains(name, "ffn_gate_inp") || contains(name, "_norm") || t.ne[0] * t.ne[1] < 4096)
    return t.type;
  const MixInfo& m = info(mix);
  if (mix == QuantMix::f32 || mix == QuantMix::f16 || mix == QuantMix::q8_0 || mix == QuantMix::q6_k) return m.base;
  const bool head = name == "output.weight" || (name == "token_embd.weight" && !in.find_tensor("output.weight"));
  if (mix == QuantMix::mxfp4_moe) return contains(name, "_exps.") ? GgmlType::mxfp4 : GgmlType::q8_0;
  if (head) return GgmlType::q6_k;
  if (mix == QuantMix::q4_k_m && (contains(name, "attn_v.") || contains(name, "ffn_down"))) {
    const int il = layer_of(name);
    if (il >= 0 && use_more_bits(il, std::max(block_count(in), il + 1))) return GgmlType::q6_k;
  }
  return m.base;
}

}  // namespace

std::optional<QuantMix> quant_mix_from_name(std::string_view name) {
  for (const MixInfo& m : kMixes) {
    if (m.name.size() == name.size() &&
        std::equal(name.begin(), name.end(), m.name.begin(), [](char a, char b) {
          return std::toupper(static_cast<unsigned char>(a)) == b;
        }))
      return m.mix;
  }
  return std::nullopt;
}

std::string_view quant_mix_name(QuantMix mix) {
  return info(mix).name;
}

std::string_view quant_mix_names() {
  return "F32, F16, Q8_0, Q6_K, Q4_K_M, Q4_0, MXFP4_MOE";
}

GgmlType quantized_type(const GgufFile& in, const GgufTensorInfo& t, QuantMix mix) {
  const GgmlType want = wanted_type(in, t, mix);
  if (want == t.type) return want;
  for (GgmlType type : {want, GgmlType::q8_0, GgmlType::f16}) {
    if (t.ne[0] % ggml_traits(type).block_size == 0) return type;
  }
  return GgmlType::f32;
}

Status quantize_gguf(const GgufFile& in, const std::string& out_path, QuantMix mix,
                     const std::function<void(uint64_t done, uint64_t total)>& progress) {
  GgufWriter w;
  for (const GgufKv& kv : in.kvs()) w.set(kv.key, kv.value);
  w.set("general.file_type", GgufValue::make_u32(info(mix).ftype));
  w.set_alignment(in.alignment());
  std::vector<GgmlType> types;
  uint64_t total = 0;
  for (const GgufTensorInfo& t : in.tensors()) {
    const GgmlType type = quantized_type(in, t, mix);
    if (type != t.type) {
      if (!quant_traits(t.type).dequantize_row)
        return Error{strfmt("%s: tensor %s has type %s, which strata cannot decode to requantize", in.name().c_str(),
                            t.name.c_str(), std::string(ggml_type_name(t.type)).c_str())};
      STRATA_CHECK(can_quantize(type), "quantized_type() chose a type quantize_row() cannot write");
    }
    types.push_back(type);
    w.add_tensor(t.name, type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims));
    total += t.n_bytes;
  }

  // Tensors are converted whole, one at a time, as the writer asks for their bytes (in file order).
  size_t current = SIZE_MAX;
  std::vector<uint8_t> converted;
  uint64_t done = 0;
  auto fill = [&](size_t index, uint64_t offset, std::span<uint8_t> out) {
    const GgufTensorInfo& t = in.tensors()[index];
    const std::span<const uint8_t> src = in.tensor_data(t);
    if (types[index] == t.type) {
      std::memcpy(out.data(), src.data() + offset, out.size());
    } else {
      if (current != index) {
        current = index;
        const int64_t n = int64_t(t.ne[0]);
        const int64_t rows = int64_t(t.n_elements() / t.ne[0]);
        const uint64_t in_row = t.row_bytes(), out_row = ggml_row_bytes(types[index], t.ne[0]);
        converted.resize(size_t(out_row) * size_t(rows));
        const DequantizeRowFn dequantize = quant_traits(t.type).dequantize_row;
#pragma omp parallel
        {
          std::vector<float> row(static_cast<size_t>(n));
#pragma omp for schedule(static)
          for (int64_t r = 0; r < rows; ++r) {
            dequantize(src.data() + uint64_t(r) * in_row, row.data(), n);
            quantize_row(types[index], row.data(), converted.data() + uint64_t(r) * out_row, n);
          }
        }
      }
      std::memcpy(out.data(), converted.data() + offset, out.size());
    }
    if (offset + out.size() == w.tensors()[index].n_bytes) {
      done += t.n_bytes;
      if (progress) progress(done, total);
    }
  };
  return w.write_file(out_path, fill);
}

}  // namespace strata
