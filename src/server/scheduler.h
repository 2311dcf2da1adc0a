// Continuous batching: requests wait in a bounded queue, take one of max_sequences slots (a
// Session each), and every step evaluates all active slots in one forward pass
// (Session::eval_batch: each expert's weights read once for every sequence routed to it).
// Prompt cache: a slot keeps the tokens its session holds after its sequence ends; a new request
// takes the free slot holding the longest prefix of its prompt and evaluates only the rest.
// Chunked prefill: a prompt is evaluated prefill_chunk tokens per step, beside the others'
// decodes, so a long one does not stall their streams. A finished or cancelled sequence leaves
// between steps. With a drafter, a decoding sequence adds its drafts to its step and keeps what
// its own verification accepts.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace strata::server {

struct CompletionRequest {
  std::vector<TokenId> prompt;
  SamplerParams sampling;
  int max_tokens = 256;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool special_text = false;  // control tokens as their text (the reply parser reads them)
  int top_logprobs = -1;      // -1: no logprobs; 0..20: each token's logprob and this many alternatives
  // A forced tool call's arguments: the output is held to one JSON object (engine/json_constraint.h)
  // and ends when it closes, closed by force when the tokens run out; `suffix` follows it.
  bool json_object = false;
  std::string suffix;
};

// A generated token's log-probability (log-softmax of the model's logits, before sampling
// transforms) and the most likely alternatives, as OpenAI's logprobs report them.
struct TokenLogprob {
  std::string token;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};

// What the scheduler hands over: text that became final, and the logprobs of the tokens sampled
// since the last piece (when asked for).
struct JobPiece {
  std::string text;
  std::vector<TokenLogprob> logprobs;
};

struct CompletionSummary {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;      // prompt tokens reused from the slot's cache (not evaluated)
  std::string finish_reason;  // "stop", "length", "cancelled", "error"
  std::string error;          // for "error"
};

// One request in flight: the scheduler appends text and finally a summary; the HTTP side reads
// them (next) and may cancel (a client that went away).
class Job {
 public:
  explicit Job(CompletionRequest r) : request(std::move(r)) {}
  const CompletionRequest request;

  // Waits for a piece or the end. Returns false once everything was read and the job is done.
  bool next(JobPiece& piece);
  // Everything at once (non-streaming): waits for the end; the logprobs go to `logprobs` if given.
  std::string wait_all(std::vector<TokenLogprob>* logprobs = nullptr);
  CompletionSummary summary() const;
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // scheduler side
  void push(std::string_view text, std::vector<TokenLogprob> logprobs = {});
  void finish(CompletionSummary s);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobPiece> pieces_;
  bool done_ = false;
  CompletionSummary summary_;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  int max_sequences = 4;  // slots: sequences decoded together
  int max_queue = 16;     // requests waiting for a slot before new ones are refused
  int ctx = 4096;         // context of each slot
  KvType kv_type = KvType::f16;
  // Speculative decoding (docs/speculative.md): "none", "ngram" (prompt lookup) or "mtp" (the
  // model's multi-token-prediction layer; the model must have one); the number of drafts adapts
  // per sequence, up to max_draft.
  std::string drafter = "none";
  int max_draft = 8;
  bool adaptive_draft = true;  // false: draft max_draft whenever there is room (tests)
  bool cache_prompt = true;    // reuse the longest common prefix a free slot holds
  int prefill_chunk = 512;     // prompt tokens evaluated per step in all (0: a whole prompt at once)
};

struct SchedulerMetrics {
  int64_t requests_total = 0, requests_rejected = 0, requests_cancelled = 0;
  int64_t prompt_tokens_total = 0, completion_tokens_total = 0;
  int64_t cached_tokens_total = 0;  // prompt tokens reused from a slot's cache
  int64_t steps_total = 0;
  int64_t draft_tokens_total = 0, draft_accepted_total = 0;  // speculative decoding
  int active = 0, queued = 0;
  double tokens_per_second = 0;  // completion tokens over the last few seconds
  double busy_seconds = 0;        // time spent in forward passes
  Engine::TierStats tiers;        // the engine's tiers after the last step (read on the scheduler's thread)
};

class Scheduler {
 public:
  // Sequences of `engine`'s model, run on its tiers; the engine outlives the scheduler.
  Scheduler(const Engine& engine, const Tokenizer& tok, SchedulerOptions o);
  ~Scheduler();  // finishes every job (cancelled) and joins the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a job. Errors (nothing queued): an empty prompt, a prompt that leaves no room in a
  // slot's context ("context_length_exceeded"), a full queue ("queue full").
  Result<std::shared_ptr<Job>> submit(CompletionRequest r);
  // Cancels every job at the next step (running and queued). Only an atomic store: safe from a
  // signal handler, so that handlers waiting on jobs return and the HTTP server can stop.
  void cancel_all() { cancel_all_.store(true); }
  SchedulerMetrics metrics() const;
  const SchedulerOptions& options() const { return o_; }
  const Engine& engine() const { return engine_; }
  const Model& model() const { return engine_.model(); }

 private:
  struct Slot;
  void loop();

  const Engine& engine_;
  const Model& model_;
  const Tokenizer& tok_;
  const SchedulerOptions o_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::unique_ptr<Slot>> slots_;
  bool stop_ = false;
  std::atomic<bool> cancel_all_{false};
  SchedulerMetrics m_;
  std::deque<std::pair<double, int64_t>> recent_;  // (time, completion tokens so far) samples
  std::thread thread_;
};

}  // namespace strata::server
