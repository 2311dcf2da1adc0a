#include "model/model.h"

#include "model/backend.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "cpu/quant_traits.h"
#include "cpu/repack.h"

namespace strata {
namespace {

// Reads hyperparameters with errors that name the key.
class KeyReader {
 public:
  KeyReader(const GgufFile& f, std::string prefix) : f_(f), prefix_(std::move(prefix)) {}

  Status u(const char* key, int& out, bool required = true) {
    auto v = f_.get_uint(prefix_ + key);
    if (!v) return v.error();
    if (!v->has_value()) {
      if (required) return missing(key);
      return Status::success();
    }
    if (**v > uint64_t(INT32_MAX)) {
      return Error{strfmt("%s: metadata key '%s%s' is %" PRIu64 ", too large", f_.name().c_str(),
                          prefix_.c_str(), key, **v)};
    }
    out = int(**v);
    return Status::success();
  }
  Status f(const char* key, float& out, bool required = true) {
    auto v = f_.get_float(prefix_ + key);
    if (!v) return v.error();
    if (!v->has_value()) return required ? Status(missing(key)) : Status::success();
    out = float(**v);
    return Status::success();
  }
  Status b(const char* key, bool& out) {
    auto v = f_.get_bool(prefix_ + key);
    if (!v) return v.error();
    if (v->has_value()) out = **v;
    return Status::success();
  }

 private:
  Error missing(const char* key) const {
    return Error{strfmt("%s: required metadata key '%s%s' is missing", f_.name().c_str(),
                        prefix_.c_str(), key)};
  }
  const GgufFile& f_;
  std::string prefix_;
};

// Looks up tensors and checks shape and type; errors name the tensor.
class TensorGetter {
 public:
  // writable: the file's bytes where get() may rewrite matrices into the kernels' layouts
  // (cpu/repack.h), or null to leave every tensor as it is in the file.
  TensorGetter(const GgufFile& f, uint8_t* writable) : f_(f), writable_(writable) {}
  // Stream mode: every tensor but the routed experts' matrices is read from `fd` (the file) into
  // buffers kept in `owned` (and repacked there when `repack`); the experts' views stay in the
  // mapped file. (pread, not a copy from the mapping: page faults read a cold file at ~40 MB/s.)
  using Owned = std::vector<std::unique_ptr<uint8_t, void (*)(void*)>>;
  TensorGetter(const GgufFile& f, Owned* owned, bool repack, int fd, bool stream_engram)
      : f_(f), writable_(nullptr), owned_(owned), owned_repack_(repack), fd_(fd), stream_engram_(stream_engram) {}

  uint64_t repacked_bytes = 0;  // what get() interleaved, and how long it took
  double repack_seconds = 0;
  uint64_t resident_bytes = 0;  // copied (stream mode)

  // `ne` is the expected shape (row dimension first). Missing optional tensors give an empty Weight.
  Result<Weight> get(const std::string& name, std::vector<int64_t> ne, bool required = true,
                     bool table = false) {
    const GgufTensorInfo* t = f_.find_tensor(name);
    if (!t) {
      if (!required) return Weight{};
      return Error{strfmt("%s: tensor '%s' is missing", f_.name().c_str(), name.c_str())};
    }
    bool same = int(ne.size()) == t->n_dims;
    for (size_t d = 0; same && d < ne.size(); ++d) same = uint64_t(ne[d]) == t->ne[d];
    if (!same) {
      std::string want = "[";
      for (size_t d = 0; d < ne.size(); ++d) want += strfmt(d ? ", %" PRId64 : "%" PRId64, ne[d]);
      want += "]";
      return Error{strfmt("%s: tensor '%s' has shape %s, expected %s", f_.name().c_str(), name.c_str(),
                          t->shape_string().c_str(), want.c_str())};
    }
    if (table) {  // an integer table (deepseek4's token id -> experts), never computed with
      if (t->type != GgmlType::i32)
        return Error{strfmt("%s: tensor '%s' has type %s, expected i32", f_.name().c_str(), name.c_str(),
                            ggml_type_name(t->type).data())};
    } else {
      STRATA_TRY(check_weight_type(t->type, name));
    }
    Weight w;
    w.data = f_.tensor_data(*t).data();
    w.type = t->type;
    w.n_in = int64_t(t->ne[0]);
    w.n_out = t->n_dims >= 2 ? int64_t(t->ne[1]) : 1;
    w.n_mat = t->n_dims >= 3 ? int64_t(t->ne[2]) : 1;
    w.row_bytes = t->row_bytes();
    uint8_t* writable = writable_ ? writable_ + (w.data - f_.bytes_.data()) : nullptr;
    if (owned_ != nullptr) {
      // routed experts: the ExpertStore's; Engram tables: the row store's (engine/engram_tier.h)
      if (name.ends_with("_exps.weight") || (stream_engram_ && name.ends_with("engram_embd.weight"))) return w;
      auto [it, fresh] = copies_.try_emplace(w.data, nullptr);
      if (fresh) {  // once per tensor (tied embeddings are asked for twice)
        const size_t n = (t->n_bytes + 63) / 64 * 64;
        owned_->emplace_back(static_cast<uint8_t*>(std::aligned_alloc(64, n)), std::free);
        STRATA_CHECK(owned_->back() != nullptr, "out of memory copying the resident weights");
        const uint64_t at = uint64_t(w.data - f_.bytes_.data());
        for (uint64_t done = 0; done < t->n_bytes;) {
          const ssize_t got = ::pread(fd_, owned_->back().get() + done, t->n_bytes - done, off_t(at + done));
          if (got < 0 && errno == EINTR) continue;
          if (got <= 0) {
            return Error{strfmt("%s: reading tensor '%s' at offset %" PRIu64 ": %s", f_.name().c_str(), name.c_str(),
                                at + done, got < 0 ? std::strerror(errno) : "unexpected end of file")};
          }
          done += uint64_t(got);
        }
        it->second = owned_->back().get();
        resident_bytes += t->n_bytes;
      }
      w.data = it->second;
      if (owned_repack_) writable = it->second;
    }
    if (writable != nullptr && !table && cpu::can_interleave(w)) {
      if (interleaved_.insert(w.data).second) {  // once per tensor, however often it is asked for
        const auto t0 = std::chrono::steady_clock::now();
        cpu::interleave(w, writable);
        repacked_bytes += w.mat_bytes() * uint64_t(w.n_mat);
        repack_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      w.interleaved = true;
    }
    return w;
  }
  const GgufFile& file() const { return f_; }
  // A vector that must be F32 (norms, biases, routers).
  Result<Weight> get_f32(const std::string& name, std::vector<int64_t> ne, bool required = true) {
    auto w = get(name, std::move(ne), required);
    if (w.ok() && *w && w->type != GgmlType::f32) {
      return Error{strfmt("%s: tensor '%s' has type %s, expected f32", f_.name().c_str(),
                          name.c_str(), ggml_type_name(w->type).data())};
    }
    return w;
  }

 private:
  const GgufFile& f_;
  uint8_t* writable_;
  Owned* owned_ = nullptr;
  bool owned_repack_ = false;
  int fd_ = -1;
  bool stream_engram_ = false;
  std::unordered_map<const uint8_t*, uint8_t*> copies_;  // file bytes -> their copy
  std::unordered_set<const uint8_t*> interleaved_;
};

#define ASSIGN_OR_RETURN(lhs, expr) \
  do {                              \
    auto r_ = (expr);               \
    if (!r_.ok()) return r_.error(); \
    lhs = std::move(*r_);           \
  } while (0)

// The shared experts' FFN width (deepseek2, deepseek4): expert_shared_count experts of
// expert_feed_forward_length, as one FFN. A product past int is a hostile header.
Status read_shared_width(const GgufFile& f, KeyReader& k, HParams& hp) {
  int n_shared = 0;
  STRATA_TRY(k.u("expert_shared_count", n_shared));
  const int64_t width = int64_t(n_shared) * hp.n_ff_exp;
  if (width > INT32_MAX)
    return Error{strfmt("%s: expert_shared_count %d x expert_feed_forward_length %d is too large", f.name().c_str(),
                        n_shared, hp.n_ff_exp)};
  hp.n_ff_shexp = int(width);
  return Status::success();
}

// deepseek41: each layer's role in the shared compressed attention, from its tensors (HParams
// kv_source / topk_source / key_source). A layer that would read before any source is a broken file.
Status read_deepseek41_roles(const GgufFile& f, HParams& hp) {
  const int L = hp.n_layer;
  hp.kv_source.assign(size_t(L), -1);
  hp.topk_source.assign(size_t(L), -1);
  hp.key_source.assign(size_t(L), -1);
  int kv = -1, topk = -1, key = -1;
  for (int il = 0; il < L; ++il) {
    auto has = [&](const char* t) { return f.find_tensor(strfmt("blk.%d.%s", il, t)) != nullptr; };
    const bool comp = has("attn_compressor_kv.weight"), query = has("indexer.attn_q_b.weight"),
               owner = has("indexer.attn_k.weight");
    const int r = hp.compress_ratio[size_t(il)];
    if (r == 0) {
      if (comp || query || owner)
        return Error{strfmt("%s: blk.%d has compressed-attention tensors but deepseek41.attention.compress_ratios "
                            "makes it window-only (0)", f.name().c_str(), il)};
      continue;
    }
    if (owner && !comp)
      return Error{strfmt("%s: blk.%d.indexer.attn_k.weight needs the layer's own attn_compressor_kv.weight (index "
                          "keys come from its compressed rows)", f.name().c_str(), il)};
    if (comp) kv = il;
    if (owner) key = il;
    if (query) topk = il;
    if (kv < 0 || topk < 0 || key < 0)
      return Error{strfmt("%s: blk.%d (compress ratio %d) reads compressed attention before any layer provides %s",
                          f.name().c_str(), il, r,
                          kv < 0 ? "attn_compressor_kv.weight" : key < 0 ? "indexer.attn_k.weight"
                                                                          : "indexer.attn_q_b.weight")};
    hp.kv_source[size_t(il)] = kv;
    hp.topk_source[size_t(il)] = topk;
    if (query) hp.key_source[size_t(il)] = key;
  }
  return Status::success();
}

// deepseek41's Engram keys (HParams::engram), checked against each table's rows and the vocabulary.
Status read_engram(const GgufFile& f, HParams& hp) {
  EngramParams& e = hp.engram;
  const std::string a = "deepseek41.engram.";
  auto ids = f.get_uint_array(a + "layer_ids");
  if (!ids) return ids.error();
  if (!ids->has_value() || (*ids)->empty()) return Status::success();  // no Engram layer
  int prev = -1;
  for (uint64_t il : **ids) {
    if (il >= uint64_t(hp.n_layer) || int(il) <= prev)
      return Error{strfmt("%s: %slayer_ids must be ascending layers below %d (holds %llu)", f.name().c_str(),
                          a.c_str(), hp.n_layer, static_cast<unsigned long long>(il))};
    e.layers.push_back(prev = int(il));
  }
  KeyReader k(f, a);
  STRATA_TRY(k.u("head_count", e.n_head));
  STRATA_TRY(k.u("key_length", e.key_length));
  STRATA_TRY(k.u("max_ngram_size", e.max_ngram));
  STRATA_TRY(k.u("pad_id", e.pad_id));
  if (e.n_head < 1 || e.n_head > 64 || e.key_length < 1 || e.key_length > 65536 || e.max_ngram < 2 ||
      e.max_ngram > 16 || e.pad_id < 0)
    return Error{strfmt("%s: %shead_count %d, key_length %d, max_ngram_size %d or pad_id %d is out of range",
                        f.name().c_str(), a.c_str(), e.n_head, e.key_length, e.max_ngram, e.pad_id)};
  const size_t slots = e.layers.size(), per = size_t(e.rows_per_token());
  auto table = [&](const char* key, size_t n, std::vector<uint64_t>& out) -> Status {
    auto v = f.get_uint_array(a + key);
    if (!v) return v.error();
    if (!v->has_value() || (*v)->size() != n)
      return Error{strfmt("%s: %s%s must be an array of %zu integers (%zu Engram layers x %zu)", f.name().c_str(),
                          a.c_str(), key, n, slots, n / slots)};
    out = std::move(**v);
    return Status::success();
  };
  STRATA_TRY(table("multipliers", slots * size_t(e.max_ngram), e.multipliers));
  STRATA_TRY(table("primes", slots * per, e.primes));
  STRATA_TRY(table("offsets", slots * per, e.offsets));
  for (size_t s = 0; s < slots; ++s) {
    const std::string t = strfmt("blk.%d.engram_embd.weight", e.layers[s]);
    const GgufTensorInfo* ti = f.find_tensor(t);
    if (ti == nullptr || ti->n_dims != 2 || ti->ne[0] != uint64_t(e.key_length))
      return Error{strfmt("%s: tensor '%s' is missing or not [%d, rows]", f.name().c_str(), t.c_str(), e.key_length)};
    for (size_t c = 0; c < per; ++c) {
      const uint64_t prime = e.primes[s * per + c], off = e.offsets[s * per + c];
      if (prime == 0 || off > ti->ne[1] || prime > ti->ne[1] - off)
        return Error{strfmt("%s: %sprimes / offsets [layer %d, column %zu] = %llu / %llu do not fit the %llu rows of "
                            "%s", f.name().c_str(), a.c_str(), e.layers[s], c, static_cast<unsigned long long>(prime),
                            static_cast<unsigned long long>(off), static_cast<unsigned long long>(ti->ne[1]),
                            t.c_str())};
    }
  }
  auto map = f.get_uint_array(a + "token_map");
  if (!map) return map.error();
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  const uint64_t n_vocab = embd != nullptr && embd->n_dims == 2 ? embd->ne[1] : 0;
  if (!map->has_value() || (*map)->size() != n_vocab)
    return Error{strfmt("%s: %stoken_map must hold one compressed id per token (%llu), not %zu", f.name().c_str(),
                        a.c_str(), static_cast<unsigned long long>(n_vocab), map->has_value() ? (*map)->size() : 0)};
  for (uint64_t c : **map) {
    if (c > uint64_t(INT32_MAX))
      return Error{strfmt("%s: %stoken_map holds %llu", f.name().c_str(), a.c_str(), static_cast<unsigned long long>(c))};
    e.token_map.push_back(int32_t(c));
  }
  return Status::success();
}

Result<HParams> read_hparams(const GgufFile& f) {
  HParams hp;
  auto arch = f.require_string("general.architecture");
  if (!arch) return arch.error();
  hp.arch_name = *arch;
  if (*arch == "qwen3moe") hp.arch = Arch::qwen3moe;
  else if (*arch == "qwen2moe") hp.arch = Arch::qwen2moe;
  else if (*arch == "llama") hp.arch = Arch::llama;
  else if (*arch == "deepseek2") hp.arch = Arch::deepseek2;
  else if (*arch == "gpt-oss") hp.arch = Arch::gpt_oss;
  else if (*arch == "deepseek4") hp.arch = Arch::deepseek4;
  else if (*arch == "deepseek41") hp.arch = Arch::deepseek41;
  else
    return Error{strfmt("%s: architecture '%s' is not supported (strata runs qwen3moe, qwen2moe, "
                        "llama (Mixtral), deepseek2, deepseek4, deepseek41 and gpt-oss)", f.name().c_str(),
                        arch->c_str())};
  const bool ds4 = hp.arch == Arch::deepseek4 || hp.arch == Arch::deepseek41;

  KeyReader k(f, *arch + ".");
  STRATA_TRY(k.u("block_count", hp.n_layer));
  // multi-token-prediction (nextn) layers follow the main ones: not computed (yet), not loaded
  STRATA_TRY(k.u("nextn_predict_layers", hp.n_nextn, false));
  if (hp.n_nextn < 0 || hp.n_nextn >= hp.n_layer)
    return Error{strfmt("%s: %s.nextn_predict_layers %d leaves no layer of %d", f.name().c_str(), arch->c_str(),
                        hp.n_nextn, hp.n_layer)};
  hp.n_layer -= hp.n_nextn;
  STRATA_TRY(k.u("embedding_length", hp.n_embd));
  STRATA_TRY(k.u("context_length", hp.n_ctx_train));
  STRATA_TRY(k.u("attention.head_count", hp.n_head));
  hp.n_head_kv = hp.n_head;
  STRATA_TRY(k.u("attention.head_count_kv", hp.n_head_kv, false));
  STRATA_TRY(k.f("attention.layer_norm_rms_epsilon", hp.eps));
  hp.head_dim_k = hp.n_head ? hp.n_embd / hp.n_head : 0;
  STRATA_TRY(k.u("attention.key_length", hp.head_dim_k, false));
  hp.head_dim_v = hp.head_dim_k;
  STRATA_TRY(k.u("attention.value_length", hp.head_dim_v, false));
  STRATA_TRY(k.u("feed_forward_length", hp.n_ff, false));
  STRATA_TRY(k.u("expert_count", hp.n_expert, false));
  STRATA_TRY(k.u("expert_used_count", hp.n_expert_used, false));
  STRATA_TRY(k.u("expert_feed_forward_length", hp.n_ff_exp, false));

  hp.rope.freq_base = 10000.0f;
  STRATA_TRY(k.f("rope.freq_base", hp.rope.freq_base, false));
  hp.rope.n_rot = hp.head_dim_k;
  STRATA_TRY(k.u("rope.dimension_count", hp.rope.n_rot, false));
  hp.rope.kind = hp.arch == Arch::llama || hp.arch == Arch::deepseek2 || ds4
                     ? cpu::RopeKind::norm
                     : cpu::RopeKind::neox;
  auto scaling = f.get_string(*arch + ".rope.scaling.type");
  if (!scaling) return scaling.error();
  if (scaling->has_value() && **scaling == "yarn" && ds4) {
    // deepseek4, deepseek41: YaRN applies to the compressed layers only (their own rope, below)
    STRATA_TRY(k.f("rope.scaling.factor", hp.rope_compressed.factor));
    STRATA_TRY(k.u("rope.scaling.original_context_length", hp.rope_compressed.n_ctx_orig));
  } else if (scaling->has_value() && **scaling == "yarn") {
    STRATA_TRY(k.f("rope.scaling.factor", hp.rope.factor));
    STRATA_TRY(k.u("rope.scaling.original_context_length", hp.rope.n_ctx_orig));
    STRATA_TRY(k.f("rope.scaling.yarn_beta_fast", hp.rope.beta_fast, false));
    STRATA_TRY(k.f("rope.scaling.yarn_beta_slow", hp.rope.beta_slow, false));
    hp.rope.ext_factor = 1.0f;
  } else if (scaling->has_value() && **scaling != "none") {
    return Error{strfmt("%s: rope scaling '%s' is not supported", f.name().c_str(), (*scaling)->c_str())};
  }

  switch (hp.arch) {
    case Arch::qwen3moe:
      hp.norm_topk = true;  // llama.cpp: qwen3moe renormalises the top-k weights
      break;
    case Arch::qwen2moe:
      STRATA_TRY(k.u("expert_shared_feed_forward_length", hp.n_ff_shexp));
      break;
    case Arch::llama:
      hp.gating = Gating::softmax_topk;  // Mixtral: softmax, top-k, renormalised; the same weights
      if (hp.n_ff_exp == 0) hp.n_ff_exp = hp.n_ff;  // Mixtral's experts use feed_forward_length
      break;
    case Arch::gpt_oss:
      hp.gating = Gating::softmax_topk;
      // not in the file: llama.cpp's constants for gpt-oss
      hp.expert_glu = {.kind = GluKind::swiglu_oai, .alpha = 1.702f, .limit = 7.0f};
      STRATA_TRY(k.u("attention.sliding_window", hp.n_swa));
      hp.swa_period = 2;  // even layers slide, odd layers see everything
      break;
    case Arch::deepseek2: {
      int gating = 1;
      STRATA_TRY(k.u("leading_dense_block_count", hp.n_layer_dense_lead));
      STRATA_TRY(k.u("expert_gating_func", gating, false));
      if (gating != 1 && gating != 2)
        return Error{strfmt("%s: %s.expert_gating_func %d is not known (1 softmax, 2 sigmoid)",
                            f.name().c_str(), arch->c_str(), gating)};
      hp.gating = gating == 2 ? Gating::sigmoid : Gating::softmax;
      STRATA_TRY(k.b("expert_weights_norm", hp.norm_topk));
      STRATA_TRY(k.f("expert_weights_scale", hp.expert_weights_scale, false));
      STRATA_TRY(k.u("expert_group_count", hp.n_group, false));
      STRATA_TRY(k.u("expert_group_used_count", hp.n_group_used, false));
      STRATA_TRY(read_shared_width(f, k, hp));
      STRATA_TRY(k.u("attention.q_lora_rank", hp.q_lora_rank, false));
      STRATA_TRY(k.u("attention.kv_lora_rank", hp.kv_lora_rank));
      hp.qk_rope = hp.rope.n_rot;
      int k_mla = 0, v_mla = 0;
      STRATA_TRY(k.u("attention.key_length_mla", k_mla, false));
      STRATA_TRY(k.u("attention.value_length_mla", v_mla, false));
      if (k_mla == 0) k_mla = hp.head_dim_k;  // older files: key_length is the MLA width
      if (v_mla == 0) v_mla = hp.head_dim_v;
      hp.qk_nope = k_mla - hp.qk_rope;
      hp.v_head = v_mla;
      // softmax scale: YaRN's mscale enters squared (fixtures README, deepseek2); the rope
      // magnitude itself is kept at 1.
      // (yarn_log_multiplier is 0.1 * mscale_all_dim)
      float yarn_log_mul = 0.0f;
      STRATA_TRY(k.f("rope.scaling.yarn_log_multiplier", yarn_log_mul, false));
      const float mscale = hp.rope.factor > 1 ? 1.0f + yarn_log_mul * std::log(hp.rope.factor) : 1.0f;
      hp.attn_scale = mscale * mscale / std::sqrt(float(k_mla));
      if (hp.rope.ext_factor != 0) hp.rope.attn_factor = 1.0f / (1.0f + 0.1f * std::log(hp.rope.factor));
      break;
    }
    case Arch::deepseek4:
    case Arch::deepseek41: {
      int gating = 0;
      STRATA_TRY(k.u("expert_gating_func", gating));
      if (gating != 4)
        return Error{strfmt("%s: %s.expert_gating_func %d is not known (4: sqrt(softplus))", f.name().c_str(),
                            arch->c_str(), gating)};
      hp.gating = Gating::sqrt_softplus;
      hp.norm_topk = true;
      STRATA_TRY(k.b("expert_weights_norm", hp.norm_topk));
      STRATA_TRY(k.f("expert_weights_scale", hp.expert_weights_scale, false));
      STRATA_TRY(read_shared_width(f, k, hp));
      STRATA_TRY(k.u("attention.q_lora_rank", hp.q_lora_rank));
      STRATA_TRY(k.u("attention.sliding_window", hp.n_swa));
      STRATA_TRY(k.u("attention.indexer.head_count", hp.n_idx_head));
      STRATA_TRY(k.u("attention.indexer.key_length", hp.idx_head_dim));
      STRATA_TRY(k.u("attention.indexer.top_k", hp.idx_top_k));
      STRATA_TRY(k.u("attention.output_group_count", hp.o_groups));
      STRATA_TRY(k.u("attention.output_lora_rank", hp.o_lora_rank));
      STRATA_TRY(k.u("hyper_connection.count", hp.hc_streams));
      STRATA_TRY(k.u("hyper_connection.sinkhorn_iterations", hp.hc_sinkhorn_iters));
      STRATA_TRY(k.f("hyper_connection.epsilon", hp.hc_eps));
      STRATA_TRY(k.u("hash_layer_count", hp.n_hash_layers, false));
      hp.rope_compressed.kind = cpu::RopeKind::norm;
      hp.rope_compressed.n_rot = hp.rope.n_rot;
      STRATA_TRY(k.f("attention.compress_rope_freq_base", hp.rope_compressed.freq_base));
      if (hp.rope_compressed.factor > 1) {
        // fixtures README: beta_fast 32 / beta_slow 1 (the file's yarn_beta keys are not read),
        // magnitude 1 (attn_factor cancels YaRN's 1 + 0.1 ln factor)
        hp.rope_compressed.ext_factor = 1.0f;
        hp.rope_compressed.beta_fast = 32.0f;
        hp.rope_compressed.beta_slow = 1.0f;
        hp.rope_compressed.attn_factor = 1.0f / (1.0f + 0.1f * std::log(hp.rope_compressed.factor));
      }
      auto numbers = [&](const char* key, size_t n, auto& out) -> Status {
        auto v = f.get_number_array(*arch + "." + key);
        if (!v) return v.error();
        if (!v->has_value() || (*v)->size() < n || (*v)->size() > n + size_t(hp.n_nextn))
          return Error{strfmt("%s: %s.%s must be an array of %zu numbers (one per layer)", f.name().c_str(),
                              arch->c_str(), key, n + size_t(hp.n_nextn))};
        out.clear();
        for (size_t i = 0; i < n; ++i)  // the main layers' (nextn layers' entries follow)
          out.push_back(static_cast<typename std::decay_t<decltype(out)>::value_type>((**v)[i]));
        return Status::success();
      };
      if (hp.n_layer <= 0 || hp.n_layer > 4096)
        return Error{strfmt("%s: %s.block_count %d is out of range", f.name().c_str(), arch->c_str(), hp.n_layer)};
      STRATA_TRY(numbers("attention.compress_ratios", size_t(hp.n_layer), hp.compress_ratio));
      STRATA_TRY(numbers("swiglu_clamp_exp", size_t(hp.n_layer), hp.clamp_exp));
      STRATA_TRY(numbers("swiglu_clamp_shexp", size_t(hp.n_layer), hp.clamp_shexp));
      for (int r : hp.compress_ratio) {
        if (hp.arch == Arch::deepseek4 && r != 0 && r != 4 && r != 128)
          return Error{strfmt("%s: deepseek4 compress ratio %d is not supported (0, 4 or 128)", f.name().c_str(), r)};
        if (hp.arch == Arch::deepseek41 && (r < 0 || r > 4096))
          return Error{strfmt("%s: deepseek41.attention.compress_ratios holds %d (0: window only, or 1..4096)",
                              f.name().c_str(), r)};
      }
      if (hp.n_head_kv != 1 || hp.head_dim_k != hp.head_dim_v || hp.hc_streams < 1 || hp.hc_streams > 16 ||
          hp.o_groups <= 0 || hp.n_head % hp.o_groups != 0 || hp.o_lora_rank <= 0 || hp.o_lora_rank % 16 != 0 ||
          hp.n_hash_layers > hp.n_layer ||
          hp.idx_top_k <= 0 || hp.idx_head_dim < hp.rope.n_rot || hp.n_idx_head <= 0)
        return Error{strfmt("%s: inconsistent %s hyperparameters (kv heads %d, key %d / value %d, "
                            "%d streams, %d output groups of rank %d (a multiple of 16) for %d heads, %d hash layers, "
                            "indexer %d x %d top %d)",
                            f.name().c_str(), arch->c_str(), hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, hp.hc_streams,
                            hp.o_groups, hp.o_lora_rank, hp.n_head, hp.n_hash_layers, hp.n_idx_head, hp.idx_head_dim,
                            hp.idx_top_k)};
      if (hp.arch == Arch::deepseek41) {
        if (hp.n_hash_layers != 0)
          return Error{strfmt("%s: deepseek41.hash_layer_count is %d (DeepSeek-V4.1 has no hash-routed layers)",
                              f.name().c_str(), hp.n_hash_layers)};
        STRATA_TRY(read_deepseek41_roles(f, hp));
        STRATA_TRY(read_engram(f, hp));
      }
      break;
    }
  }
  if (hp.attn_scale == 0) hp.attn_scale = 1.0f / std::sqrt(float(hp.head_dim_k));

  // every layer has tensors: a count beyond the file's tensors is a hostile or broken header
  if (uint64_t(hp.n_layer) > f.tensors().size()) {
    return Error{strfmt("%s: %s.block_count is %d but the file has only %zu tensors", f.name().c_str(),
                        arch->c_str(), hp.n_layer, f.tensors().size())};
  }
  if (hp.n_layer <= 0 || hp.n_embd <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0 ||
      hp.n_head % hp.n_head_kv != 0) {
    return Error{strfmt("%s: inconsistent attention hyperparameters (layers %d, n_embd %d, heads %d, "
                        "kv heads %d)", f.name().c_str(), hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv)};
  }
  if (hp.n_expert > 0 && (hp.n_expert_used <= 0 || hp.n_expert_used > hp.n_expert)) {
    return Error{strfmt("%s: expert_used_count %d is not in 1..expert_count (%d)", f.name().c_str(),
                        hp.n_expert_used, hp.n_expert)};
  }
  if (hp.rope.n_rot <= 0 || hp.rope.n_rot % 2 != 0 || hp.rope.n_rot > hp.head_dim_k) {
    return Error{strfmt("%s: rope dimension %d is not an even number up to the head size %d",
                        f.name().c_str(), hp.rope.n_rot, hp.head_dim_k)};
  }
  if (hp.n_group > 0 && (hp.n_expert % hp.n_group != 0 || hp.n_group_used <= 0 ||
                         hp.n_group_used > hp.n_group)) {
    return Error{strfmt("%s: expert groups %d (used %d) do not divide %d experts", f.name().c_str(),
                        hp.n_group, hp.n_group_used, hp.n_expert)};
  }

  auto read_id = [&](const char* key, int& out) -> Status {
    auto v = f.get_uint(key);
    if (!v) return v.error();
    if (v->has_value()) out = int(**v);
    return Status::success();
  };
  STRATA_TRY(read_id("tokenizer.ggml.bos_token_id", hp.token_bos));
  STRATA_TRY(read_id("tokenizer.ggml.eos_token_id", hp.token_eos));
  return hp;
}

// deepseek41's compressed attention by the layer's roles (HParams::kv_source ...): a KV source's
// compressor (no position embedding; ratio 1 has no gate), an index source's indexer query, a key
// owner's index-key projection; and an Engram layer's table, projection and gate weights.
Status load_deepseek41_compressed(TensorGetter& g, const HParams& hp, int il, LayerWeights& l) {
  auto n = [&](const char* s) { return strfmt("blk.%d.%s", il, s); };
  const int64_t E = hp.n_embd, D = hp.head_dim_k, Q = hp.q_lora_rank, IH = hp.n_idx_head, ID = hp.idx_head_dim;
  const size_t i = size_t(il);
  if (hp.kv_source[i] == il) {
    ASSIGN_OR_RETURN(l.comp_kv, g.get(n("attn_compressor_kv.weight"), {E, D}));
    ASSIGN_OR_RETURN(l.comp_gate, g.get(n("attn_compressor_gate.weight"), {E, D}, hp.compress_ratio[i] > 1));
    ASSIGN_OR_RETURN(l.comp_norm, g.get_f32(n("attn_compressor_norm.weight"), {D}));
  }
  if (hp.topk_source[i] == il) {
    ASSIGN_OR_RETURN(l.idx_q_b, g.get(n("indexer.attn_q_b.weight"), {Q, IH * ID}));
    ASSIGN_OR_RETURN(l.idx_proj, g.get(n("indexer.proj.weight"), {E, IH}));
  }
  if (g.file().find_tensor(n("indexer.attn_k.weight")) != nullptr) {
    ASSIGN_OR_RETURN(l.idx_k, g.get(n("indexer.attn_k.weight"), {D, ID}));
    ASSIGN_OR_RETURN(l.idx_k_norm, g.get_f32(n("indexer.k_norm.weight"), {ID}));
  }
  return Status::success();
}

Status load_engram(TensorGetter& g, const HParams& hp, int il, LayerWeights& l) {
  const EngramParams& e = hp.engram;
  if (e.slot(il) < 0) return Status::success();
  auto n = [&](const char* s) { return strfmt("blk.%d.%s", il, s); };
  const int64_t E = hp.n_embd, S = hp.hc_streams;
  const GgufTensorInfo* t = g.file().find_tensor(n("engram_embd.weight"));  // its rows: read_engram checked
  ASSIGN_OR_RETURN(l.engram_embd, g.get(n("engram_embd.weight"), {e.key_length, int64_t(t->ne[1])}));
  ASSIGN_OR_RETURN(l.engram_wkv, g.get(n("engram_wkv.weight"), {int64_t(e.rows_per_token()) * e.key_length, (S + 1) * E}));
  ASSIGN_OR_RETURN(l.engram_q, g.get_f32(n("engram_q.weight"), {E, S}));
  ASSIGN_OR_RETURN(l.engram_k, g.get_f32(n("engram_k.weight"), {E, S}));
  return Status::success();
}

// deepseek4's attention sublayer, its compressor and indexer, and both hyper-connection mixers.
Status load_deepseek4_attention(TensorGetter& g, const HParams& hp, int il, LayerWeights& l) {
  auto n = [&](const char* s) { return strfmt("blk.%d.%s", il, s); };
  const int64_t E = hp.n_embd, H = hp.n_head, D = hp.head_dim_k, Q = hp.q_lora_rank, S = hp.hc_streams;
  const int64_t G = hp.o_groups, OL = hp.o_lora_rank, MIX = 2 * S + S * S;
  ASSIGN_OR_RETURN(l.wq_a, g.get(n("attn_q_a.weight"), {E, Q}));
  ASSIGN_OR_RETURN(l.q_a_norm, g.get_f32(n("attn_q_a_norm.weight"), {Q}));
  ASSIGN_OR_RETURN(l.wq_b, g.get(n("attn_q_b.weight"), {Q, H * D}));
  ASSIGN_OR_RETURN(l.wkv, g.get(n("attn_kv.weight"), {E, D}));
  ASSIGN_OR_RETURN(l.kv_a_norm, g.get_f32(n("attn_kv_a_norm.weight"), {D}));
  ASSIGN_OR_RETURN(l.attn_sinks, g.get_f32(n("attn_sinks.weight"), {H}));
  ASSIGN_OR_RETURN(l.wo_a, g.get(n("attn_output_a.weight"), {H * D / G, OL * G}));
  ASSIGN_OR_RETURN(l.wo_b, g.get(n("attn_output_b.weight"), {OL * G, E}));
  ASSIGN_OR_RETURN(l.hc_attn_fn, g.get(n("hc_attn_fn.weight"), {S * E, MIX}));
  ASSIGN_OR_RETURN(l.hc_attn_base, g.get_f32(n("hc_attn_base.weight"), {MIX}));
  ASSIGN_OR_RETURN(l.hc_attn_scale, g.get_f32(n("hc_attn_scale.weight"), {3}));
  ASSIGN_OR_RETURN(l.hc_ffn_fn, g.get(n("hc_ffn_fn.weight"), {S * E, MIX}));
  ASSIGN_OR_RETURN(l.hc_ffn_base, g.get_f32(n("hc_ffn_base.weight"), {MIX}));
  ASSIGN_OR_RETURN(l.hc_ffn_scale, g.get_f32(n("hc_ffn_scale.weight"), {3}));
  const int r = hp.compress_ratio[size_t(il)];
  if (r == 0) return Status::success();
  if (hp.arch == Arch::deepseek41) return load_deepseek41_compressed(g, hp, il, l);
  const int64_t W = r == 4 ? 2 * D : D;  // ratio 4 pools overlapping pairs of blocks
  ASSIGN_OR_RETURN(l.comp_kv, g.get(n("attn_compressor_kv.weight"), {E, W}));
  ASSIGN_OR_RETURN(l.comp_gate, g.get(n("attn_compressor_gate.weight"), {E, W}));
  ASSIGN_OR_RETURN(l.comp_ape, g.get(n("attn_compressor_ape.weight"), {W, r}));
  ASSIGN_OR_RETURN(l.comp_norm, g.get_f32(n("attn_compressor_norm.weight"), {D}));
  if (r != 4) return Status::success();
  const int64_t IH = hp.n_idx_head, ID = hp.idx_head_dim;
  ASSIGN_OR_RETURN(l.idx_q_b, g.get(n("indexer.attn_q_b.weight"), {Q, IH * ID}));
  ASSIGN_OR_RETURN(l.idx_proj, g.get(n("indexer.proj.weight"), {E, IH}));
  ASSIGN_OR_RETURN(l.idx_comp_kv, g.get(n("indexer_compressor_kv.weight"), {E, 2 * ID}));
  ASSIGN_OR_RETURN(l.idx_comp_gate, g.get(n("indexer_compressor_gate.weight"), {E, 2 * ID}));
  ASSIGN_OR_RETURN(l.idx_comp_ape, g.get(n("indexer_compressor_ape.weight"), {2 * ID, 4}));
  ASSIGN_OR_RETURN(l.idx_comp_norm, g.get_f32(n("indexer_compressor_norm.weight"), {ID}));
  return Status::success();
}

// The tensors of block il (a main layer, or a nextn layer's block), validated against hp.
Status load_layer(TensorGetter& g, const HParams& hp, int il, LayerWeights& l) {
  const int64_t E = hp.n_embd, H = hp.n_head, HKV = hp.n_head_kv, DK = hp.head_dim_k, DV = hp.head_dim_v;
  const int64_t X = hp.n_expert;
  auto n = [&](const char* s) { return strfmt("blk.%d.%s", il, s); };
  ASSIGN_OR_RETURN(l.attn_norm, g.get_f32(n("attn_norm.weight"), {E}));
  const bool oss = hp.arch == Arch::gpt_oss;  // gpt-oss: biases and sinks are required
  const char* ffn_norm = oss ? "post_attention_norm.weight" : "ffn_norm.weight";
  ASSIGN_OR_RETURN(l.ffn_norm, g.get_f32(n(ffn_norm), {E}));

  if (hp.arch == Arch::deepseek4 || hp.arch == Arch::deepseek41) {
    STRATA_TRY(load_deepseek4_attention(g, hp, il, l));
    STRATA_TRY(load_engram(g, hp, il, l));
  } else if (hp.arch == Arch::deepseek2) {
    const int64_t QK = hp.qk_nope + hp.qk_rope, R = hp.kv_lora_rank;
    if (hp.q_lora_rank > 0) {
      const int64_t Q = hp.q_lora_rank;
      ASSIGN_OR_RETURN(l.wq_a, g.get(n("attn_q_a.weight"), {E, Q}));
      ASSIGN_OR_RETURN(l.q_a_norm, g.get_f32(n("attn_q_a_norm.weight"), {Q}));
      ASSIGN_OR_RETURN(l.wq_b, g.get(n("attn_q_b.weight"), {Q, H * QK}));
    } else {
      ASSIGN_OR_RETURN(l.wq, g.get(n("attn_q.weight"), {E, H * QK}));
    }
    ASSIGN_OR_RETURN(l.wkv_a_mqa, g.get(n("attn_kv_a_mqa.weight"), {E, R + hp.qk_rope}));
    ASSIGN_OR_RETURN(l.kv_a_norm, g.get_f32(n("attn_kv_a_norm.weight"), {R}));
    ASSIGN_OR_RETURN(l.wk_b, g.get(n("attn_k_b.weight"), {hp.qk_nope, R, H}));
    ASSIGN_OR_RETURN(l.wv_b, g.get(n("attn_v_b.weight"), {R, hp.v_head, H}));
    ASSIGN_OR_RETURN(l.wo, g.get(n("attn_output.weight"), {H * hp.v_head, E}));
  } else {
    ASSIGN_OR_RETURN(l.wq, g.get(n("attn_q.weight"), {E, H * DK}));
    ASSIGN_OR_RETURN(l.wk, g.get(n("attn_k.weight"), {E, HKV * DK}));
    ASSIGN_OR_RETURN(l.wv, g.get(n("attn_v.weight"), {E, HKV * DV}));
    ASSIGN_OR_RETURN(l.wo, g.get(n("attn_output.weight"), {H * DV, E}));
    ASSIGN_OR_RETURN(l.bq, g.get_f32(n("attn_q.bias"), {H * DK}, oss));
    ASSIGN_OR_RETURN(l.bk, g.get_f32(n("attn_k.bias"), {HKV * DK}, oss));
    ASSIGN_OR_RETURN(l.bv, g.get_f32(n("attn_v.bias"), {HKV * DV}, oss));
    ASSIGN_OR_RETURN(l.bo, g.get_f32(n("attn_output.bias"), {E}, oss));
    ASSIGN_OR_RETURN(l.attn_sinks, g.get_f32(n("attn_sinks.weight"), {H}, oss));
    const bool qk_norm = hp.arch == Arch::qwen3moe;
    ASSIGN_OR_RETURN(l.q_norm, g.get_f32(n("attn_q_norm.weight"), {DK}, qk_norm));
    ASSIGN_OR_RETURN(l.k_norm, g.get_f32(n("attn_k_norm.weight"), {DK}, qk_norm));
  }

  const bool dense = X == 0 || il < hp.n_layer_dense_lead;
  if (dense) {
    const int64_t F = hp.n_ff;
    ASSIGN_OR_RETURN(l.ffn_gate, g.get(n("ffn_gate.weight"), {E, F}));
    ASSIGN_OR_RETURN(l.ffn_up, g.get(n("ffn_up.weight"), {E, F}));
    ASSIGN_OR_RETURN(l.ffn_down, g.get(n("ffn_down.weight"), {F, E}));
    return Status::success();
  }
  const int64_t FE = hp.n_ff_exp;
  ASSIGN_OR_RETURN(l.router, g.get_f32(n("ffn_gate_inp.weight"), {E, X}));
  ASSIGN_OR_RETURN(l.gate_exps, g.get(n("ffn_gate_exps.weight"), {E, FE, X}));
  ASSIGN_OR_RETURN(l.up_exps, g.get(n("ffn_up_exps.weight"), {E, FE, X}));
  ASSIGN_OR_RETURN(l.down_exps, g.get(n("ffn_down_exps.weight"), {FE, E, X}));
  ASSIGN_OR_RETURN(l.router_b, g.get_f32(n("ffn_gate_inp.bias"), {X}, oss));
  ASSIGN_OR_RETURN(l.gate_exps_b, g.get_f32(n("ffn_gate_exps.bias"), {FE, X}, oss));
  ASSIGN_OR_RETURN(l.up_exps_b, g.get_f32(n("ffn_up_exps.bias"), {FE, X}, oss));
  ASSIGN_OR_RETURN(l.down_exps_b, g.get_f32(n("ffn_down_exps.bias"), {E, X}, oss));
  if (hp.arch == Arch::deepseek2) {
    ASSIGN_OR_RETURN(l.exp_probs_b, g.get_f32(n("exp_probs_b.bias"), {X}, hp.gating == Gating::sigmoid));
  }
  if (hp.arch == Arch::deepseek4 || hp.arch == Arch::deepseek41) {
    const bool hash = il < hp.n_hash_layers;
    ASSIGN_OR_RETURN(l.exp_probs_b, g.get_f32(n("exp_probs_b.bias"), {X}, !hash));
    if (hash) {
      ASSIGN_OR_RETURN(l.tid2eid, g.get(n("ffn_gate_tid2eid.weight"), {hp.n_expert_used, hp.n_vocab}, true, true));
      const int32_t* table = reinterpret_cast<const int32_t*>(l.tid2eid.data);
      for (int64_t i = 0; i < int64_t(hp.n_expert_used) * hp.n_vocab; ++i)
        if (table[i] < 0 || table[i] >= hp.n_expert)
          return Error{strfmt("%s: blk.%d.ffn_gate_tid2eid.weight holds expert %d (the model has %d)",
                              g.file().name().c_str(), il, table[i], hp.n_expert)};
    }
  }
  if (hp.n_ff_shexp > 0) {
    const int64_t FS = hp.n_ff_shexp;
    ASSIGN_OR_RETURN(l.gate_shexp, g.get(n("ffn_gate_shexp.weight"), {E, FS}));
    ASSIGN_OR_RETURN(l.up_shexp, g.get(n("ffn_up_shexp.weight"), {E, FS}));
    ASSIGN_OR_RETURN(l.down_shexp, g.get(n("ffn_down_shexp.weight"), {FS, E}));
    ASSIGN_OR_RETURN(l.gate_inp_shexp, g.get_f32(n("ffn_gate_inp_shexp.weight"), {E}, false));
  }
  return Status::success();
}

// The first nextn layer of a file that has them (Model::mtp); a file whose nextn layer strata
// cannot use still loads, with the reason in mtp_error.
void load_mtp(TensorGetter& g, Model& m) {
  const HParams& hp = m.hparams();
  if (hp.n_nextn == 0) {
    m.mtp_error = "the model has no multi-token-prediction (nextn) layer";
    return;
  }
  if (hp.arch == Arch::deepseek4 || hp.arch == Arch::deepseek41) {
    m.mtp_error = "multi-token prediction is not built for " + hp.arch_name + " (its nextn layer is not loaded)";
    return;
  }
  auto mtp = std::make_unique<MtpWeights>();
  mtp->il = hp.n_layer;
  const int64_t E = hp.n_embd, V = hp.n_vocab;
  auto n = [&](const char* s) { return strfmt("blk.%d.nextn.%s", mtp->il, s); };
  auto load = [&]() -> Status {
    STRATA_TRY(load_layer(g, hp, mtp->il, mtp->block));
    ASSIGN_OR_RETURN(mtp->eh_proj, g.get(n("eh_proj.weight"), {2 * E, E}));
    ASSIGN_OR_RETURN(mtp->enorm, g.get_f32(n("enorm.weight"), {E}));
    ASSIGN_OR_RETURN(mtp->hnorm, g.get_f32(n("hnorm.weight"), {E}));
    ASSIGN_OR_RETURN(mtp->head_norm, g.get_f32(n("shared_head_norm.weight"), {E}));
    ASSIGN_OR_RETURN(mtp->embed, g.get(n("embed_tokens.weight"), {E, V}, false));
    ASSIGN_OR_RETURN(mtp->head, g.get(n("shared_head_head.weight"), {E, V}, false));
    return Status::success();
  };
  if (Status s = load(); !s) {
    m.mtp_error = "its multi-token-prediction layer cannot be used: " + s.error().message;
    return;
  }
  m.mtp = std::move(mtp);
}

}  // namespace

Result<HParams> hparams_from_gguf(const GgufFile& f) { return read_hparams(f); }

KvType gqa_cache_type(const HParams& hp, KvType requested) {
  return cpu::kv_type_fits(requested, hp.head_dim_k, hp.head_dim_v) ? requested : KvType::f16;
}

uint64_t kv_bytes_per_token(const HParams& hp, KvType type) {
  // as the KV cache stores them: MLA keeps the latent row and the rope key (float); GQA k and v
  if (hp.arch == Arch::deepseek2) return uint64_t(hp.kv_lora_rank + hp.qk_rope) * sizeof(float) * uint64_t(hp.n_layer);
  if (hp.arch == Arch::deepseek4) {
    // float rows: the raw K = V row of every layer (all positions are kept), plus a compressed row
    // per `ratio` positions (and an index key per 4) in the compressed layers
    double floats = 0;
    for (int il = 0; il < hp.n_layer; ++il) {
      const int r = hp.compress_ratio[size_t(il)];
      floats += hp.head_dim_k;
      if (r > 0) floats += double(hp.head_dim_k) / r + (r == 4 ? double(hp.idx_head_dim) / r : 0.0);
    }
    return uint64_t(std::ceil(floats * sizeof(float)));
  }
  if (hp.arch == Arch::deepseek41) {
    // float rows: the raw K = V row of every layer, a compressed row per `ratio` positions of each
    // KV source and an index key per `ratio` positions of each key owner; one compressed id
    double floats = 1;
    for (int il = 0; il < hp.n_layer; ++il) {
      const int r = hp.compress_ratio[size_t(il)];
      floats += hp.head_dim_k;
      if (r > 0 && hp.kv_source[size_t(il)] == il) floats += double(hp.head_dim_k) / r;
      if (r > 0 && std::find(hp.key_source.begin(), hp.key_source.end(), il) != hp.key_source.end())
        floats += double(hp.idx_head_dim) / r;
    }
    return uint64_t(std::ceil(floats * sizeof(float)));
  }
  const KvType t = gqa_cache_type(hp, type);
  const uint64_t per_head = cpu::kv_key_block_bytes(t, hp.head_dim_k) / uint64_t(cpu::kKvKeyBlock) +
                            cpu::kv_value_row_bytes(t, hp.head_dim_v);
  return uint64_t(hp.n_head_kv) * per_head * uint64_t(hp.n_layer);
}

Model::Model() = default;
Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const std::string& path, MappedFile::Mode mode, bool repack,
                                           bool stream_experts, bool stream_engram) {
  auto f = GgufFile::open(path, stream_experts ? MappedFile::Mode::mmap : mode);
  if (!f) return f.error();
  return load(std::move(*f), repack, stream_experts, stream_engram);
}

Result<std::unique_ptr<Model>> Model::load(GgufFile file, bool repack, bool stream_experts, bool stream_engram) {
  auto m = std::make_unique<Model>();
  m->file_ = std::move(file);
  const GgufFile& f = m->file_;
  auto hp_r = read_hparams(f);
  if (!hp_r) return hp_r.error();
  HParams& hp = m->hp_;
  hp = std::move(*hp_r);

  int fd = -1;
  if (stream_experts) {
    fd = ::open(f.name().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Error{strfmt("%s: cannot open: %s", f.name().c_str(), std::strerror(errno))};
  }
  struct CloseFd {
    int fd;
    ~CloseFd() {
      if (fd >= 0) ::close(fd);
    }
  } close_fd{fd};
  TensorGetter g = stream_experts ? TensorGetter(f, &m->resident_, repack, fd, stream_engram)
                                  : TensorGetter(f, repack ? f.mutable_bytes() : nullptr);
  m->streamed_repack = stream_experts && repack;
  m->experts_streamed = stream_experts;
  m->engram_streamed = stream_experts && stream_engram && !hp.engram.layers.empty();
  const int64_t E = hp.n_embd;
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd || embd->n_dims != 2)
    return Error{strfmt("%s: tensor 'token_embd.weight' is missing or not 2D", f.name().c_str())};
  hp.n_vocab = int(embd->ne[1]);
  const int64_t V = hp.n_vocab;
  ASSIGN_OR_RETURN(m->tok_embd, g.get("token_embd.weight", {E, V}));
  ASSIGN_OR_RETURN(m->output_norm, g.get_f32("output_norm.weight", {E}));
  ASSIGN_OR_RETURN(m->output, g.get("output.weight", {E, V}, false));
  if (!m->output) m->output = m->tok_embd;  // tied embeddings
  if (hp.arch == Arch::deepseek4) {
    const int64_t S = hp.hc_streams;
    ASSIGN_OR_RETURN(m->output_hc_fn, g.get("output_hc_fn.weight", {S * E, S}));
    ASSIGN_OR_RETURN(m->output_hc_base, g.get_f32("output_hc_base.weight", {S}));
    ASSIGN_OR_RETURN(m->output_hc_scale, g.get_f32("output_hc_scale.weight", {1}));
  }

  m->layers.resize(size_t(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) STRATA_TRY(load_layer(g, hp, il, m->layers[size_t(il)]));
  load_mtp(g, *m);
  m->repacked_bytes = g.repacked_bytes;
  m->repack_seconds = g.repack_seconds;
  m->resident_bytes = g.resident_bytes;
  return m;
}

cpu::PlacementStats place_in_numa(const Model& m, const cpu::NumaLayout& l, std::string* skipped) {
  cpu::PlacementStats s;
  auto skip = [&](const char* why) {
    if (skipped != nullptr) *skipped = why;
    return s;
  };
  if (l.topology().n_nodes() == 1 && l.options().policy != cpu::NumaPolicy::node)
    return skip("one NUMA node: nothing to place");
  if (!l.topology().is_this_system()) return skip("a stand-in topology: nothing is bound");
  if (m.file().load_mode() != MappedFile::Mode::ram || m.experts_streamed)
    return skip("weights not read into RAM (mapped file or streamed experts): the page cache decides where they are");
  // the routed experts by their rows (under shard), then every byte between them spread (so no
  // page moves twice)
  const std::span<const uint8_t> all = m.file().bytes_;
  std::vector<const Weight*> experts;
  auto add = [&](const LayerWeights& lw) {
    for (const Weight* w : {&lw.gate_exps, &lw.up_exps, &lw.down_exps})
      if (*w) experts.push_back(w);
  };
  for (const LayerWeights& lw : m.layers) add(lw);
  if (m.mtp != nullptr) add(m.mtp->block);
  std::sort(experts.begin(), experts.end(), [](const Weight* a, const Weight* b) { return a->data < b->data; });
  // each bound range can become a mapping of its own: shard binds one per expert matrix and node,
  // which for DeepSeek-V3 on 2 nodes is ~90k, past Linux's default vm.max_map_count (65530).
  // Unless 8192 mappings stay free for the rest of the process (thread stacks, large allocations),
  // the experts are interleaved instead, and the note says what to raise.
  if (l.sharded()) {
    int64_t ranges = 0;
    for (const Weight* w : experts) ranges += w->n_mat * l.n_groups();
    const int64_t headroom = cpu::mapping_headroom();
    if (headroom >= 0 && ranges > headroom - 8192) {
      s.note = strfmt("shard needs ~%lld memory mappings for the experts' rows and vm.max_map_count leaves %lld: "
                      "experts interleaved instead (sysctl -w vm.max_map_count=%lld lets shard bind them)",
                      static_cast<long long>(ranges), static_cast<long long>(headroom),
                      static_cast<long long>(ranges + 65536));
      cpu::bind_spread(l, all.data(), all.size(), s);
      return s;
    }
  }
  const uint8_t* at = all.data();
  for (const Weight* w : experts) {
    if (w->data > at) cpu::bind_spread(l, at, size_t(w->data - at), s);
    cpu::bind_expert_rows(l, *w, s);
    at = std::max(at, w->data + w->mat_bytes() * size_t(w->n_mat));
  }
  if (all.data() + all.size() > at) cpu::bind_spread(l, at, size_t(all.data() + all.size() - at), s);
  return s;
}

}  // namespace strata
