#include "engine/session.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>

#include "engine/engine.h"
#include "model/forward.h"

namespace strata {


Session::~Session() {
  if (engine_ != nullptr) engine_->session_closed(this);
  backend().release_cache(cache_);
}

Session::Session(const Model& model, int n_ctx, cpu::MatmulPath path, KvType kv)
    : model_(model), backend_(path) {
  init_cache(model, n_ctx, cache_, path == cpu::MatmulPath::exact ? KvType::f32 : kv);
}

Session::Session(const Engine& engine, int n_ctx, cpu::MatmulPath path, KvType kv)
    : Session(engine.model(), n_ctx, path, kv) {
  engine_ = &engine;
}

const Backend& Session::backend() const {
  if (engine_ != nullptr && engine_->backend() != nullptr && path() == cpu::MatmulPath::quantized)
    return *engine_->backend();
  return backend_;
}

Exec Session::exec() const {
  if (engine_ == nullptr) return Exec(backend());
  return Exec(backend(), engine_->experts(), engine_->routing_override(), engine_->engram());
}

// After a forward pass: a routed expert the NVMe tier could not read was computed as zeros, so
// the logits are not returned and no position advances.
Status Session::forward_error() const { return engine_ != nullptr ? engine_->take_error() : Status::success(); }

// After a forward pass that advanced `sessions`: the engine's tiers see the step.
void Session::step_done(std::span<Session* const> sessions) {
  if (sessions[0]->engine_ != nullptr) sessions[0]->engine_->end_step(sessions);
}

Status Session::check(std::span<const int32_t> tokens) const {
  const HParams& hp = model_.hparams();
  if (tokens.empty()) return Error{"eval: no tokens"};
  for (int32_t id : tokens) {
    if (id < 0 || id >= hp.n_vocab)
      return Error{strfmt("eval: token id %d is outside the vocabulary (0..%d)", id, hp.n_vocab - 1)};
  }
  const int64_t n = int64_t(tokens.size());
  if (n_past_ + n > cache_.n_ctx) {
    return Error{strfmt("eval: context full: %" PRId64 " tokens cached + %" PRId64 " new > context %d",
                        n_past_, n, cache_.n_ctx)};
  }
  return {};
}

Result<std::vector<float>> Session::eval(std::span<const int32_t> tokens, bool all_logits) {
  const HParams& hp = model_.hparams();
  if (Status s = check(tokens); !s) return s.error();
  const int64_t n = int64_t(tokens.size());
  std::vector<float> logits(size_t((all_logits ? n : 1) * hp.n_vocab));
  const SeqSpan seq{&cache_, n_past_, n};
  std::vector<float> hidden(keep_hidden_ ? size_t(n * hp.n_embd) : 0);
  forward(model_, exec(), std::span<const SeqSpan>(&seq, 1), tokens.data(), all_logits, logits.data(),
              keep_hidden_ ? hidden.data() : nullptr);
  STRATA_TRY(forward_error());
  if (keep_hidden_) keep_rows(hidden.data(), n);
  n_past_ += n;
  Session* self = this;
  step_done(std::span<Session* const>(&self, 1));
  return logits;
}

void Session::keep_rows(const float* rows, int64_t n) {
  // rows of forgotten positions (a rewind) go; a gap (a truncation below the kept rows) restarts
  const size_t E = size_t(model_.hparams().n_embd);
  const int64_t kept = int64_t(hidden_.size() / E);
  if (n_past_ < hidden_pos0_ || n_past_ > hidden_pos0_ + kept) {
    hidden_.clear();
    hidden_pos0_ = n_past_;
  }
  hidden_.resize(size_t(n_past_ - hidden_pos0_) * E);
  hidden_.insert(hidden_.end(), rows, rows + size_t(n) * E);
}

void Session::keep_hidden(bool on) {
  STRATA_CHECK(!on || (model_.hparams().arch != Arch::deepseek4 && model_.hparams().arch != Arch::deepseek41),
               "keep_hidden: deepseek4 and deepseek41 give no hidden rows");
  keep_hidden_ = on;
  hidden_.clear();
  hidden_pos0_ = n_past_;
}

const float* Session::hidden_row(int64_t pos) const {
  const int64_t E = model_.hparams().n_embd, rows = int64_t(hidden_.size()) / E;
  if (pos < hidden_pos0_ || pos >= hidden_pos0_ + rows || pos >= n_past_) return nullptr;
  return hidden_.data() + (pos - hidden_pos0_) * E;
}

void Session::release_hidden(int64_t pos) {
  const int64_t E = model_.hparams().n_embd, rows = int64_t(hidden_.size()) / E;
  const int64_t drop = std::clamp<int64_t>(pos - hidden_pos0_, 0, rows);
  hidden_.erase(hidden_.begin(), hidden_.begin() + drop * E);
  hidden_pos0_ += drop;
}

Result<std::vector<float>> Session::eval_batch(std::span<Session* const> sessions,
                                              std::span<const std::vector<int32_t>> tokens, bool all_logits) {
  STRATA_CHECK(sessions.size() == tokens.size());
  if (sessions.empty()) return Error{"eval_batch: no sequences"};
  const Model& m = sessions[0]->model_;
  const HParams& hp = m.hparams();
  std::vector<SeqSpan> seqs;
  std::vector<int32_t> all;
  for (size_t s = 0; s < sessions.size(); ++s) {
    Session& se = *sessions[s];
    STRATA_CHECK(&se.model_ == &m && se.engine_ == sessions[0]->engine_ &&
                     se.backend_.path() == sessions[0]->backend_.path(),
                 "eval_batch: sessions of different engines or paths");
    for (size_t o = 0; o < s; ++o) STRATA_CHECK(sessions[o] != &se, "eval_batch: a session twice");
    if (Status st = se.check(tokens[s]); !st) return st.error();
    const int64_t n = int64_t(tokens[s].size());
    seqs.push_back({&se.cache_, se.n_past_, n});
    all.insert(all.end(), tokens[s].begin(), tokens[s].end());
  }
  std::vector<float> logits((all_logits ? all.size() : sessions.size()) * size_t(hp.n_vocab));
  // the last layer's rows, where a session keeps them (an MTP drafter's)
  const bool hidden = std::any_of(sessions.begin(), sessions.end(), [](const Session* se) { return se->keep_hidden_; });
  std::vector<float> rows(hidden ? all.size() * size_t(hp.n_embd) : 0);
  forward(m, sessions[0]->exec(), seqs, all.data(), all_logits, logits.data(), hidden ? rows.data() : nullptr);
  STRATA_TRY(sessions[0]->forward_error());
  for (size_t s = 0, t = 0; s < sessions.size(); t += tokens[s].size(), ++s) {
    if (sessions[s]->keep_hidden_) sessions[s]->keep_rows(rows.data() + t * size_t(hp.n_embd), int64_t(tokens[s].size()));
    sessions[s]->n_past_ += int64_t(tokens[s].size());
  }
  step_done(sessions);
  return logits;
}

std::vector<std::vector<float>> Session::copy_rings() const {
  std::vector<std::vector<float>> rings;
  for (const KvCache::CompressedLayer& cl : cache_.compressed) {
    for (const KvCache::Compressor* c : {&cl.attn, &cl.index}) {
      rings.push_back(c->ring_a);
      rings.push_back(c->ring_s);
    }
  }
  return rings;
}

void Session::begin_speculation() {
  spec_pos_ = n_past_;
  spec_rings_ = copy_rings();
}

void Session::checkpoint() {
  if (cache_.compressed.empty()) return;
  checkpoint_pos_ = n_past_;
  checkpoint_rings_ = copy_rings();
}

int64_t Session::truncate(int64_t n) {
  STRATA_CHECK(n >= 0 && n <= n_past_);
  if (n == n_past_ || cache_.compressed.empty()) return n_past_ = n;
  // A block [b, b + r) is pooled from the ring when its last token is evaluated, from its own
  // tokens and (deepseek4's ratio 4, whose pools are twice as wide) the block before; resuming at
  // n needs the ring slots of the tokens from n's block (or the one before it) up to n, which a
  // later token p overwrote when p - slots reached them.
  bool exact = true;
  for (const KvCache::CompressedLayer& cl : cache_.compressed)
    for (const KvCache::Compressor* c : {&cl.attn, &cl.index}) {
      if (cl.ratio == 0 || c->slots == 0) continue;
      const int64_t needed_from = n / cl.ratio * cl.ratio - (c->pool_width > c->width ? cl.ratio : 0);
      if (needed_from + c->slots < n_past_) exact = false;
    }
  if (!exact) {
    if (checkpoint_pos_ < 0 || checkpoint_pos_ > n) return n_past_ = 0;
    n = checkpoint_pos_;
    size_t i = 0;
    for (KvCache::CompressedLayer& cl : cache_.compressed) {
      for (KvCache::Compressor* c : {&cl.attn, &cl.index}) {
        c->ring_a = checkpoint_rings_[i++];
        c->ring_s = checkpoint_rings_[i++];
      }
    }
  }
  if (checkpoint_pos_ > n) checkpoint_pos_ = -1;  // its positions are forgotten
  return n_past_ = n;
}

int Session::max_speculation() const {
  int most = cache_.n_ctx;
  for (const KvCache::CompressedLayer& cl : cache_.compressed)
    for (const KvCache::Compressor* c : {&cl.attn, &cl.index})
      if (cl.ratio > 0 && c->slots > 0) most = std::min(most, c->slots);
  return most;
}

void Session::rewind(int64_t n) {
  STRATA_CHECK(spec_pos_ >= 0 && n >= spec_pos_ && n <= n_past_, "rewind: outside the speculation");
  STRATA_CHECK(n_past_ - spec_pos_ <= max_speculation(), "rewind: more tokens than the rings hold");
  // a compressor's ring slot p mod slots was overwritten by the forgotten positions p >= n; the
  // copy holds what it had before (positions the kept tokens still pool). Block rows are indexed
  // by block and rewritten when a block's last token is evaluated again.
  size_t i = 0;
  for (KvCache::CompressedLayer& cl : cache_.compressed) {
    for (KvCache::Compressor* c : {&cl.attn, &cl.index}) {
      const std::vector<float>& a = spec_rings_[i++];
      const std::vector<float>& s = spec_rings_[i++];
      if (c->slots == 0) continue;
      const size_t w = size_t(c->pool_width);
      for (int64_t p = n; p < n_past_; ++p) {
        const size_t at = size_t(p % c->slots) * w;
        std::copy(a.begin() + long(at), a.begin() + long(at + w), c->ring_a.begin() + long(at));
        std::copy(s.begin() + long(at), s.begin() + long(at + w), c->ring_s.begin() + long(at));
      }
    }
  }
  if (checkpoint_pos_ > n) checkpoint_pos_ = -1;
  n_past_ = n;
}

int32_t argmax(std::span<const float> logits) {
  // the largest value with eight independent running maxima (the one-chain loop took 0.7 ms per
  // 152k-token vocabulary, a 1.5% of a decoded token), then its first index; NaN never wins
  float m[8];
  std::fill(m, m + 8, -INFINITY);
  const size_t n = logits.size(), n8 = n / 8 * 8;
  for (size_t i = 0; i < n8; i += 8)
    for (int j = 0; j < 8; ++j) m[j] = logits[i + size_t(j)] > m[j] ? logits[i + size_t(j)] : m[j];
  for (size_t i = n8; i < n; ++i) m[0] = logits[i] > m[0] ? logits[i] : m[0];
  const float mx = *std::max_element(m, m + 8);
  for (size_t i = 0; i < n; ++i)
    if (logits[i] == mx) return int32_t(i);
  return 0;  // empty, or nothing above -inf
}

}  // namespace strata
