// Perplexity and divergence from a reference (perplexity.h).
//
// Base file (kl_base), little-endian: "STRATAKL", u32 version 1, u32 n_vocab, u32 n_ctx,
// u32 n_chunks, the chunks' tokens (int32, n_chunks * n_ctx, BOS already in place), then per chunk
// the log-probabilities (float32, n_vocab each) of its scored positions, n_ctx / 2 .. n_ctx - 2.
#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/session.h"

namespace strata {

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'K', 'L'};
constexpr uint32_t kVersion = 1;

// log-softmax of one row of logits, in double for the sums; false when a logit is not finite.
bool log_softmax(const float* logits, int64_t n, std::vector<float>& out) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(logits[i])) return false;
    max = std::max(max, logits[i]);
  }
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i] - max));
  const float lse = max + float(std::log(sum));
  out.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = logits[i] - lse;
  return true;
}

int64_t argmax(const std::vector<float>& v) {
  return std::max_element(v.begin(), v.end()) - v.begin();
}

// The reference file, read or written chunk by chunk.
class BaseFile {
 public:
  static Result<std::unique_ptr<BaseFile>> open_or_create(const std::string& path, uint32_t n_vocab, uint32_t n_ctx,
                                                          uint32_t n_chunks, std::span<const int32_t> tokens) {
    auto f = std::unique_ptr<BaseFile>(new BaseFile);
    f->path_ = path;
    f->n_vocab_ = n_vocab;
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      f->in_.open(path, std::ios::binary);
      if (!f->in_) return Error{strfmt("--kl-base %s: cannot open", path.c_str())};
      char magic[8];
      uint32_t head[4];
      f->in_.read(magic, 8);
      f->in_.read(reinterpret_cast<char*>(head), sizeof head);
      if (!f->in_ || std::memcmp(magic, kMagic, 8) != 0 || head[0] != kVersion)
        return Error{strfmt("--kl-base %s: not a strata base log-prob file (version %u)", path.c_str(), kVersion)};
      if (head[1] != n_vocab)
        return Error{strfmt("--kl-base %s: written for a vocabulary of %u tokens, this model has %u", path.c_str(),
                            head[1], n_vocab)};
      if (head[2] != n_ctx)
        return Error{strfmt("--kl-base %s: written with --ctx %u, this run uses %u", path.c_str(), head[2], n_ctx)};
      if (head[3] != n_chunks)
        return Error{strfmt("--kl-base %s: holds %u chunks, this run scores %u (same text and --chunks?)",
                            path.c_str(), head[3], n_chunks)};
      std::vector<int32_t> stored(tokens.size());
      f->in_.read(reinterpret_cast<char*>(stored.data()), std::streamsize(stored.size() * sizeof(int32_t)));
      if (!f->in_ || !std::equal(stored.begin(), stored.end(), tokens.begin()))
        return Error{strfmt("--kl-base %s: written for other tokens (another text or tokenizer)", path.c_str())};
      const uint64_t want = 8 + sizeof head + tokens.size() * sizeof(int32_t) +
                            uint64_t(n_chunks) * uint64_t(n_ctx - 1 - n_ctx / 2) * n_vocab * sizeof(float);
      if (std::filesystem::file_size(path, ec) != want)
        return Error{strfmt("--kl-base %s: %ju bytes, expected %ju (truncated?)", path.c_str(),
                            uintmax_t(std::filesystem::file_size(path, ec)), uintmax_t(want))};
      return f;
    }
    f->writing_ = true;
    f->tmp_ = path + ".tmp";
    f->out_.open(f->tmp_, std::ios::binary | std::ios::trunc);
    if (!f->out_) return Error{strfmt("--kl-base %s: cannot create", f->tmp_.c_str())};
    const uint32_t head[4] = {kVersion, n_vocab, n_ctx, n_chunks};
    f->out_.write(kMagic, 8);
    f->out_.write(reinterpret_cast<const char*>(head), sizeof head);
    f->out_.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * sizeof(int32_t)));
    return f;
  }
  ~BaseFile() {
    if (writing_ && !done_) {
      out_.close();
      std::error_code ec;
      std::filesystem::remove(tmp_, ec);
    }
  }
  bool writing() const { return writing_; }
  Status read_row(std::vector<float>& row) {
    row.resize(n_vocab_);
    in_.read(reinterpret_cast<char*>(row.data()), std::streamsize(row.size() * sizeof(float)));
    if (!in_) return Error{strfmt("--kl-base %s: read failed", path_.c_str())};
    return {};
  }
  Status write_row(const std::vector<float>& row) {
    out_.write(reinterpret_cast<const char*>(row.data()), std::streamsize(row.size() * sizeof(float)));
    if (!out_) return Error{strfmt("--kl-base %s: write failed (disk full?)", tmp_.c_str())};
    return {};
  }
  Status finish() {
    if (!writing_) return {};
    out_.close();
    if (!out_) return Error{strfmt("--kl-base %s: write failed", tmp_.c_str())};
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) return Error{strfmt("--kl-base: cannot rename %s to %s (%s)", tmp_.c_str(), path_.c_str(),
                                ec.message().c_str())};
    done_ = true;
    return {};
  }

 private:
  std::string path_, tmp_;
  uint32_t n_vocab_ = 0;
  bool writing_ = false, done_ = false;
  std::ifstream in_;
  std::ofstream out_;
};

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
  return v[k];
}

}  // namespace

Result<PerplexityResult> perplexity(const Engine& engine, std::span<const int32_t> tokens,
                                    const PerplexityOptions& o, const PerplexityProgress& progress) {
  const Model& m = engine.model();
  const int64_t V = m.hparams().n_vocab;
  const int n_ctx = o.n_ctx;
  if (n_ctx < 8) return Error{strfmt("--ctx %d: chunks need at least 8 tokens", n_ctx)};
  if (m.hparams().n_ctx_train > 0 && n_ctx > m.hparams().n_ctx_train)
    return Error{strfmt("--ctx %d is above the model's training context %d", n_ctx, m.hparams().n_ctx_train)};
  int n_chunks = int(std::min<int64_t>(int64_t(tokens.size()) / n_ctx, INT32_MAX));
  if (o.max_chunks > 0) n_chunks = std::min(n_chunks, o.max_chunks);
  if (n_chunks == 0)
    return Error{strfmt("the text has %zu tokens, fewer than one chunk of --ctx %d", tokens.size(), n_ctx)};
  if (o.kl_exact && !o.kl_base.empty()) return Error{"--kl-exact and --kl-base name two references; choose one"};

  std::vector<int32_t> chunks(tokens.begin(), tokens.begin() + int64_t(n_chunks) * n_ctx);
  for (const int32_t t : chunks) {
    if (t < 0 || t >= V) return Error{strfmt("token id %d is outside the vocabulary (%jd)", t, intmax_t(V))};
  }
  if (o.bos >= 0) {
    for (int c = 0; c < n_chunks; ++c) chunks[size_t(c) * size_t(n_ctx)] = o.bos;
  }

  std::unique_ptr<BaseFile> base;
  if (!o.kl_base.empty()) {
    auto b = BaseFile::open_or_create(o.kl_base, uint32_t(V), uint32_t(n_ctx), uint32_t(n_chunks), chunks);
    if (!b) return b.error();
    base = std::move(*b);
  }
  const bool compare = o.kl_exact || (base && !base->writing());

  Session test(engine, n_ctx, o.path, engine.config().kv_type);
  std::unique_ptr<Session> exact;
  if (o.kl_exact) exact = std::make_unique<Session>(engine, n_ctx, cpu::MatmulPath::exact);

  const int first = n_ctx / 2;
  double nll = 0, nll2 = 0, nll_ref = 0;
  int64_t count = 0, agree = 0;
  double dp2 = 0;
  std::vector<double> kls;
  std::vector<float> lp, lp_ref;
  for (int c = 0; c < n_chunks; ++c) {
    const std::span<const int32_t> chunk(chunks.data() + size_t(c) * size_t(n_ctx), size_t(n_ctx));
    test.reset();
    auto logits = test.eval(chunk, /*all_logits=*/true);
    if (!logits) return logits.error();
    std::vector<float> ref_logits;
    if (exact) {
      exact->reset();
      auto l = exact->eval(chunk, true);
      if (!l) return l.error();
      ref_logits = std::move(*l);
    }
    for (int j = first; j < n_ctx - 1; ++j) {
      if (!log_softmax(logits->data() + int64_t(j) * V, V, lp))
        return Error{strfmt("the model computed a non-finite logit in chunk %d at position %d", c + 1, j)};
      const int32_t next = chunk[size_t(j) + 1];
      const double x = -double(lp[size_t(next)]);
      nll += x;
      nll2 += x * x;
      ++count;
      if (base && base->writing()) {
        STRATA_TRY(base->write_row(lp));
        continue;
      }
      if (!compare) continue;
      if (exact) {
        if (!log_softmax(ref_logits.data() + int64_t(j) * V, V, lp_ref))
          return Error{strfmt("the exact path computed a non-finite logit in chunk %d at position %d", c + 1, j)};
      } else {
        STRATA_TRY(base->read_row(lp_ref));
      }
      double kl = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double p = std::exp(double(lp_ref[size_t(v)]));
        kl += p * (double(lp_ref[size_t(v)]) - double(lp[size_t(v)]));
      }
      kls.push_back(std::max(kl, 0.0));
      agree += argmax(lp) == argmax(lp_ref);
      nll_ref -= double(lp_ref[size_t(next)]);
      const double dp = std::exp(double(lp[size_t(next)])) - std::exp(double(lp_ref[size_t(next)]));
      dp2 += dp * dp;
    }
    if (progress) progress(c + 1, n_chunks, std::exp(nll / double(count)));
  }
  if (base) STRATA_TRY(base->finish());

  PerplexityResult r;
  r.n_chunks = n_chunks;
  r.n_scored = count;
  const double mean = nll / double(count);
  r.ppl = std::exp(mean);
  const double var = nll2 / double(count) - mean * mean;
  r.ppl_err = count > 1 && var > 0 ? r.ppl * std::sqrt(var / double(count - 1)) : 0;
  r.wrote_base = base && base->writing();
  if (compare) {
    KlStats k;
    const double n = double(kls.size());
    double s = 0, s2 = 0;
    for (const double v : kls) {
      s += v;
      s2 += v * v;
    }
    k.mean = s / n;
    const double kvar = s2 / n - k.mean * k.mean;
    k.mean_err = n > 1 && kvar > 0 ? std::sqrt(kvar / (n - 1)) : 0;
    k.max = *std::max_element(kls.begin(), kls.end());
    k.median = percentile(kls, 0.5);
    k.p90 = percentile(kls, 0.9);
    k.p99 = percentile(kls, 0.99);
    k.top1 = double(agree) / n;
    k.rms_dp = std::sqrt(dp2 / n);
    k.ppl_ref = std::exp(nll_ref / n);
    r.kl = k;
  }
  return r;
}

}  // namespace strata
