#include "server/scheduler.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <optional>

#include "cpu/kernels.h"
#include "engine/json_constraint.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "engine/text_stream.h"

namespace strata::server {

bool Job::next(JobPiece& piece) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !pieces_.empty() || done_; });
  if (pieces_.empty()) return false;
  piece = std::move(pieces_.front());
  pieces_.pop_front();
  return true;
}

std::string Job::wait_all(std::vector<TokenLogprob>* logprobs) {
  std::string all;
  JobPiece piece;
  while (next(piece)) {
    all += piece.text;
    if (logprobs) logprobs->insert(logprobs->end(), piece.logprobs.begin(), piece.logprobs.end());
  }
  return all;
}

CompletionSummary Job::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  return summary_;
}

void Job::push(std::string_view text, std::vector<TokenLogprob> logprobs) {
  if (text.empty() && logprobs.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pieces_.push_back({std::string(text), std::move(logprobs)});
  }
  cv_.notify_all();
}

void Job::finish(CompletionSummary s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    summary_ = std::move(s);
    done_ = true;
  }
  cv_.notify_all();
}

struct Scheduler::Slot {
  std::unique_ptr<Session> session;  // allocated at first use, reused
  std::shared_ptr<Job> job;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStream> stream;
  // The tokens the session holds (positions 0 .. n_past - 1). Kept after the job ends: the
  // prompt cache of the next job that takes this slot.
  std::vector<TokenId> history;
  std::vector<TokenId> prefill;  // prompt tokens not evaluated yet (chunked prefill)
  std::vector<TokenId> step;     // tokens of the next forward pass: a prompt chunk, or the pending token then drafts
  bool prompting = false;        // this step evaluates prompt tokens (no drafts beside it)
  int generated = 0;
  int cached = 0;                // prompt tokens reused from history
  std::vector<TokenLogprob> logprobs;  // of the tokens sampled since the last push
  std::optional<JsonPrefix> json;      // json_object requests: the object so far
  std::vector<float> masked;           // a logits row with the invalid tokens at -inf
  std::unique_ptr<Drafter> drafter;  // per job (null: none)
  std::unique_ptr<DraftController> control;
};

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Tokens `held` and `prompt` share from the start, leaving at least the prompt's last token to
// evaluate (its logits give the first sampled token).
size_t common_prefix(const std::vector<TokenId>& held, const std::vector<TokenId>& prompt) {
  size_t n = 0;
  while (n < held.size() && n + 1 < prompt.size() && held[n] == prompt[n]) ++n;
  return n;
}

// The log-softmax of `logits` at `token`, and the `top` most likely tokens with theirs.
TokenLogprob logprob_of(std::span<const float> logits, TokenId token, int top, const Tokenizer& tok, bool special) {
  float mx = -INFINITY;
  for (float l : logits) mx = std::max(mx, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l - mx));
  const float lse = mx + float(std::log(sum));
  TokenLogprob out{tok.token_to_piece(token, special), logits[size_t(token)] - lse, {}};
  if (top > 0) {
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    const size_t k = std::min(size_t(top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + long(k), ids.end(), [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    });
    for (size_t j = 0; j < k; ++j) out.top.emplace_back(tok.token_to_piece(ids[j], special), logits[size_t(ids[j])] - lse);
  }
  return out;
}
}  // namespace

Scheduler::Scheduler(const Engine& engine, const Tokenizer& tok, SchedulerOptions o)
    : engine_(engine), model_(engine.model()), tok_(tok), o_(o) {
  const Model& model = model_;
  STRATA_CHECK(o_.max_sequences >= 1 && o_.max_queue >= 0 && o_.ctx >= 2);
  STRATA_CHECK(o_.drafter == "none" || o_.drafter == "ngram" || (o_.drafter == "mtp" && model.mtp != nullptr),
               "the server drafts with none, ngram, or mtp where the model has an MTP layer");
  for (int i = 0; i < o_.max_sequences; ++i) slots_.push_back(std::make_unique<Slot>());
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& job : queue_) job->finish({0, 0, 0, "cancelled", "the server is shutting down"});
}

Result<std::shared_ptr<Job>> Scheduler::submit(CompletionRequest r) {
  if (r.prompt.empty()) return Error{"the prompt is empty"};
  if (int64_t(r.prompt.size()) + 1 > o_.ctx) {
    std::lock_guard<std::mutex> lock(mu_);
    ++m_.requests_rejected;
    return Error{strfmt("context_length_exceeded: the prompt has %zu tokens; the context of a sequence is %d",
                        r.prompt.size(), o_.ctx)};
  }
  auto job = std::make_shared<Job>(std::move(r));
  {
    std::lock_guard<std::mutex> lock(mu_);
    int free = 0;
    for (const auto& s : slots_) free += s->job == nullptr;
    if (int(queue_.size()) >= o_.max_queue + free) {
      ++m_.requests_rejected;
      return Error{strfmt("queue full: %d sequences running and %zu requests waiting", o_.max_sequences, queue_.size())};
    }
    queue_.push_back(job);
    ++m_.requests_total;
  }
  cv_.notify_all();
  return job;
}

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerMetrics m = m_;
  m.queued = int(queue_.size());
  m.active = 0;
  for (const auto& s : slots_) m.active += s->job != nullptr;
  if (recent_.size() >= 2) {
    const double dt = recent_.back().first - recent_.front().first;
    if (dt > 0) m.tokens_per_second = double(recent_.back().second - recent_.front().second) / dt;
  }
  return m;
}

void Scheduler::loop() {
  std::vector<Session*> sessions;
  std::vector<std::vector<int32_t>> steps;
  std::vector<Slot*> running;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto has_work = [&] {
        for (const auto& s : slots_)
          if (s->job) return true;
        return !queue_.empty();
      };
      cv_.wait(lock, [&] { return stop_ || has_work(); });
      if (stop_) break;
      if (cancel_all_.load()) {  // shutting down: nothing new starts
        for (auto& job : queue_) job->cancel();
      }
      // sequences join between steps, each in the free slot that holds the longest prefix of its
      // prompt (the first free one when none holds any)
      while (!queue_.empty()) {
        Slot* best = nullptr;
        size_t best_n = 0;
        for (auto& s : slots_) {
          if (s->job) continue;
          const size_t n = o_.cache_prompt ? common_prefix(s->history, queue_.front()->request.prompt) : 0;
          if (!best || n > best_n) best = s.get(), best_n = n;
        }
        if (!best) break;
        best->job = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    // set up newly admitted slots; drop cancelled ones
    running.clear();
    for (auto& sp : slots_) {
      Slot& s = *sp;
      if (!s.job) continue;
      if (cancel_all_.load()) s.job->cancel();
      if (s.job->cancelled()) {
        std::shared_ptr<Job> job;
        {
          // the slot is free (metrics see it) before the job says it is done
          std::lock_guard<std::mutex> lock(mu_);
          ++m_.requests_cancelled;
          job = std::move(s.job);
        }
        s.sampler.reset();
        s.stream.reset();
        s.prefill.clear();
        job->finish({int(job->request.prompt.size()), s.generated, s.cached, "cancelled", ""});
        continue;
      }
      if (!s.sampler) {
        const CompletionRequest& r = s.job->request;
        if (!s.session) s.session = std::make_unique<Session>(engine_, o_.ctx, cpu::MatmulPath::quantized, o_.kv_type);
        // the prompt cache: keep what the session holds of this prompt. Not with the MTP drafter,
        // whose own cache is made from the target's hidden rows as the prompt is evaluated.
        size_t reuse = o_.cache_prompt && o_.drafter != "mtp" ? common_prefix(s.history, r.prompt) : 0;
        reuse = size_t(s.session->truncate(int64_t(std::min(reuse, size_t(s.session->n_past())))));
        s.history.resize(reuse);
        s.prefill.assign(r.prompt.begin() + long(reuse), r.prompt.end());
        s.cached = int(reuse);
        s.sampler = std::make_unique<Sampler>(r.sampling);
        s.stream = std::make_unique<TextStream>(r.stop);
        s.step.clear();
        s.generated = 0;
        s.logprobs.clear();
        s.drafter.reset();
        s.control.reset();
        s.json.reset();
        if (r.json_object) s.json.emplace();
        if (o_.drafter != "none" && o_.max_draft > 0 && !r.json_object) {
          // before the prompt: the MTP drafter has the session keep its hidden rows from there
          auto d = make_drafter(o_.drafter, s.session.get());
          STRATA_CHECK(d.ok(), "the drafter was checked when the scheduler was made");
          s.drafter = std::move(*d);
          // the MTP drafter's layer runs per sequence: a step's drafts at most what its rings
          // rewind (deepseek4 has none)
          s.control = std::make_unique<DraftController>(std::min(o_.max_draft, s.session->max_speculation() - 1),
                                                        o_.adaptive_draft);
        }
        std::lock_guard<std::mutex> lock(mu_);
        m_.prompt_tokens_total += int64_t(r.prompt.size());
        m_.cached_tokens_total += s.cached;
      }
      running.push_back(&s);
    }
    if (running.empty()) continue;

    // Chunked prefill: the prompts' tokens of one step are prefill_chunk at most in all, handed
    // out in slot order; a slot whose prompt gets none this step sits it out.
    int chunk_left = o_.prefill_chunk > 0 ? o_.prefill_chunk : INT32_MAX;
    for (size_t j = 0; j < running.size();) {
      Slot& s = *running[j];
      s.prompting = !s.prefill.empty();
      if (s.prompting) {
        const size_t n = std::min(s.prefill.size(), size_t(std::max(chunk_left, 0)));
        if (n == 0) {
          running.erase(running.begin() + long(j));
          continue;
        }
        s.step.assign(s.prefill.begin(), s.prefill.begin() + long(n));
        s.prefill.erase(s.prefill.begin(), s.prefill.begin() + long(n));
        chunk_left -= int(n);
      }
      ++j;
    }

    // Drafts join a step only when every sequence in it is decoding (a prompt would make every
    // row's logits a prompt's worth), and only up to cpu::kBatchInvariantTokens tokens in all, so
    // each sequence's rows are computed as in plain decoding and greedy output is unchanged.
    // A step time is measured from here: drafting (the MTP drafter runs a layer) and the pass.
    // Every decoding step's time goes to each sequence's controller, plain ones too (its yardstick).
    const double t_step = now_s();
    const bool decoding = std::all_of(running.begin(), running.end(), [](const Slot* s) { return !s->prompting; });
    // a constrained sequence samples from its masked row, which the verification path does not
    const bool constrained = std::any_of(running.begin(), running.end(), [](const Slot* s) { return s->json.has_value(); });
    bool drafting = false;
    if (o_.drafter != "none" && decoding && !constrained) {
      int budget = int(cpu::kBatchInvariantTokens) - int(running.size());
      const size_t first = size_t(m_.steps_total) % running.size();  // who drafts first rotates
      for (size_t j = 0; j < running.size() && budget > 0; ++j) {
        Slot& s = *running[(first + j) % running.size()];
        if (!s.control) continue;
        const CompletionRequest& r = s.job->request;
        const int room = int(std::min<int64_t>({o_.ctx - s.session->n_past() - 1, int64_t(r.max_tokens - s.generated - 1),
                                                int64_t(budget)}));
        const int k = s.control->choose(room);
        if (k <= 0) continue;
        s.history.push_back(s.step[0]);  // the drafter sees the pending token last
        std::vector<TokenId> drafts = s.drafter->draft(s.history, k);
        s.history.pop_back();
        if (drafts.size() > size_t(k)) drafts.resize(size_t(k));
        s.step.insert(s.step.end(), drafts.begin(), drafts.end());
        budget -= int(drafts.size());
        drafting = drafting || !drafts.empty();
      }
    }
    sessions.clear();
    steps.clear();
    std::vector<int64_t> pos0;
    for (Slot* s : running) {
      sessions.push_back(s->session.get());
      steps.push_back(s->step);
      pos0.push_back(s->session->n_past());
      if (s->step.size() > 1 && drafting) s->session->begin_speculation();
    }
    const double t0 = now_s();
    auto logits = Session::eval_batch(sessions, steps, drafting);
    const double t1 = now_s();
    {
      // counted before any job of the step finishes, so its waiter sees the step in the metrics
      std::lock_guard<std::mutex> lock(mu_);
      ++m_.steps_total;
      m_.busy_seconds += t1 - t0;
    }
    const size_t V = size_t(model_.hparams().n_vocab);
    size_t row = 0;  // the slot's first row of logits
    for (size_t i = 0; i < running.size(); ++i) {
      Slot& s = *running[i];
      const CompletionRequest& r = s.job->request;
      std::string finish;
      std::string error;
      // Takes a sampled token as output (sampled from `from`), `n_past` the position count plain
      // decoding would have after evaluating its predecessor; true when the sequence ends with it.
      auto emit = [&](TokenId t, std::span<const float> from, int64_t n_past) {
        if (!r.ignore_eos && tok_.is_eog(t)) {
          finish = "stop";
          return true;
        }
        ++s.generated;
        {
          std::lock_guard<std::mutex> lock(mu_);  // counted before the job can finish
          ++m_.completion_tokens_total;
        }
        if (r.top_logprobs >= 0) s.logprobs.push_back(logprob_of(from, t, r.top_logprobs, tok_, r.special_text));
        const std::string piece = tok_.token_to_piece(t, r.special_text);
        const std::string_view text = s.stream->push(piece);
        // with logprobs a piece per token (a stream's chunk each, as OpenAI sends them), else per text
        if (!text.empty() || !s.logprobs.empty()) s.job->push(text, std::exchange(s.logprobs, {}));
        if (s.json) {
          STRATA_CHECK(s.json->push(piece), "the token was chosen to keep the JSON valid");
          if (s.json->complete()) finish = "stop";
        }
        if (s.stream->stopped()) finish = "stop";
        else if (s.generated >= r.max_tokens || n_past + 1 >= o_.ctx) finish = "length";
        return !finish.empty();
      };
      const int n_draft = s.prompting ? 0 : int(s.step.size()) - 1;
      if (!logits) {
        finish = "error";
        error = logits.error().message;
        // no session advanced, but a failed pass may have left state behind: start afresh
        s.session->reset();
        s.history.clear();
      } else if (!drafting) {
        s.history.insert(s.history.end(), s.step.begin(), s.step.end());
        if (s.prefill.empty()) {  // else more of the prompt in later steps
          if (s.prompting) s.session->checkpoint();  // where the next turn's prompt may resume
          const std::span<const float> last(logits->data() + i * V, V);
          std::span<const float> from = last;
          if (s.json) {  // only tokens that keep the object valid; none: it is closed below
            s.masked.assign(last.begin(), last.end());
            if (constrain_to_json(s.masked, *s.json, tok_, r.special_text)) from = s.masked;
            else finish = "stop";
          }
          if (finish.empty()) {
            const TokenId next = s.sampler->sample(from, s.history);
            if (decoding && s.control) s.control->record(0, 0, t1 - t_step);
            if (!emit(next, last, s.session->n_past())) s.step.assign(1, next);
          }
        }
      } else {
        // row j follows the pending token and drafts 0 .. j-1: verify in order, keep what agrees
        s.history.push_back(s.step[0]);
        auto row_at = [&](int j) { return std::span<const float>(logits->data() + (row + size_t(j)) * V, V); };
        int accepted = 0;
        TokenId next = 0;
        bool rejected = false;
        for (; accepted < n_draft; ++accepted) {
          bool ok = false;
          next = s.sampler->verify(row_at(accepted), s.history, s.step[size_t(1 + accepted)], ok);
          if (!ok) {
            rejected = true;
            break;
          }
          s.history.push_back(next);
        }
        if (!rejected) next = s.sampler->sample(row_at(n_draft), s.history);
        if (s.control) s.control->record(n_draft, accepted, t1 - t_step);
        if (n_draft > 0) {
          s.session->rewind(pos0[i] + 1 + accepted);
          std::lock_guard<std::mutex> lock(mu_);
          m_.draft_tokens_total += n_draft;
          m_.draft_accepted_total += accepted;
        }
        bool ended = false;
        for (int j = 0; j < accepted && !ended; ++j) ended = emit(s.step[size_t(1 + j)], row_at(j), pos0[i] + 1 + j);
        if (!ended && !emit(next, row_at(accepted), pos0[i] + 1 + accepted)) s.step.assign(1, next);
      }
      row += drafting ? steps[i].size() : 1;
      if (!finish.empty()) {
        std::string tail(s.stream->flush());
        if (s.json && finish != "error") tail += s.json->closing() + r.suffix;  // a forced call ends whole
        s.job->push(tail, std::exchange(s.logprobs, {}));
        std::shared_ptr<Job> job;
        {
          std::lock_guard<std::mutex> lock(mu_);
          job = std::move(s.job);
        }
        s.sampler.reset();
        s.stream.reset();
        s.prefill.clear();
        job->finish({int(job->request.prompt.size()), s.generated, s.cached, finish, error});
      }
    }
    const Engine::TierStats tiers = engine_.tier_stats();  // on this thread: the tiers are not thread-safe
    std::lock_guard<std::mutex> lock(mu_);
    m_.tiers = tiers;
    recent_.emplace_back(t1, m_.completion_tokens_total);
    while (recent_.size() > 2 && t1 - recent_.front().first > 10.0) recent_.pop_front();
  }
  // shutting down: finish what is still running
  for (auto& s : slots_) {
    if (s->job) s->job->finish({int(s->job->request.prompt.size()), s->generated, s->cached, "cancelled", "the server is shutting down"});
    s->job.reset();
  }
}

}  // namespace strata::server
