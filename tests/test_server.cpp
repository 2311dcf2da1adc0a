// The OpenAI-compatible server over real HTTP on loopback (src/server): an in-process server on a
// free port with the bundled model, driven by httplib's client. Plain and streamed completions,
// concurrent requests sharing steps, every kind of bad request, a client that disconnects mid-stream,
// more requests than slots, the API key. Every request loop is bounded.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/http_server.h"
#include "storage/expert_store.h"
#include "test_support.h"

namespace strata::server {
namespace {

using nlohmann::json;

struct TestServer {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tok;
  ModelSummary summary;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;

  // `cache_slots` > 0: the routed experts stay in the file, streamed through an expert store of
  // that many slots (the NVMe tier); 0: everything in RAM.
  explicit TestServer(SchedulerOptions so = {}, HttpOptions ho = {}, int64_t cache_slots = 0) {
    const std::string path = (test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf").string();
    auto m = Model::load(path, MappedFile::Mode::mmap, true, /*stream_experts=*/cache_slots > 0);
    EXPECT_TRUE(m);
    engine = std::make_unique<Engine>(std::move(*m));
    const Model* model = &engine->model();
    if (cache_slots > 0) {
      ExpertStoreOptions o;
      o.queue_depth = 3;
      o.prefetch_depth = 1;
      o.cache_bytes = uint64_t(1) << 30;  // first a store with room to spare, for the slot size
      auto probe = ExpertStore::open(expert_layout(*model), path, o);
      EXPECT_TRUE(probe);
      o.cache_bytes = uint64_t(std::max((*probe)->min_slots(), cache_slots)) * (*probe)->slot_bytes();
      probe->reset();
      auto store = ExpertStore::open(expert_layout(*model), path, o);
      EXPECT_TRUE(store);
      engine->set_expert_store(std::move(*store));
    }
    auto t = Tokenizer::from_gguf(model->file());
    EXPECT_TRUE(t);
    tok = std::make_unique<Tokenizer>(std::move(*t));
    summary = *summarize_model(model->file());
    if (so.ctx == 4096) so.ctx = 256;
    scheduler = std::make_unique<Scheduler>(*engine, *tok, so);
    ho.port = 0;
    http = std::make_unique<HttpServer>(*scheduler, *tok, ChatTemplate::builtin(ChatFormat::chatml), "tiny", summary, ho);
    auto p = http->bind();
    EXPECT_TRUE(p);
    port = *p;
    thread = std::thread([this] { http->run(); });
  }
  ~TestServer() {
    http->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
};

json chat_body(int max_tokens, bool stream = false) {
  return {{"model", "tiny"},
          {"messages", json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello there"}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"stream", stream}};
}

TEST(Server, ChatCompletionPlain) {
  TestServer s;
  auto c = s.client();
  auto r = c.Post("/v1/chat/completions", chat_body(12).dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tiny");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  const std::string reason = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(reason == "length" || reason == "stop") << reason;
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 3);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 12);
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(),
            j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
  // greedy is deterministic: the same request gives the same text
  auto r2 = c.Post("/v1/chat/completions", chat_body(12).dump(), "application/json");
  ASSERT_TRUE(r2);
  EXPECT_EQ(json::parse(r2->body)["choices"][0]["message"]["content"], j["choices"][0]["message"]["content"]);
}

// Reads a server-sent-event stream into its data payloads.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

TEST(Server, StreamedChatEqualsPlain) {
  TestServer s;
  auto c = s.client();
  auto plain = c.Post("/v1/chat/completions", chat_body(10).dump(), "application/json");
  ASSERT_TRUE(plain);
  json body = chat_body(10, true);
  body["stream_options"] = {{"include_usage", true}};
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  const auto events = sse_events(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, finish;
  bool usage = false;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (e.contains("usage")) {
      usage = true;
      EXPECT_EQ(e["usage"]["completion_tokens"], json::parse(plain->body)["usage"]["completion_tokens"]);
      continue;
    }
    const json& ch = e["choices"][0];
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_TRUE(usage);
  EXPECT_FALSE(finish.empty());
  EXPECT_EQ(text, json::parse(plain->body)["choices"][0]["message"]["content"].get<std::string>());
}

TEST(Server, TextCompletionModelsHealthMetrics) {
  TestServer s;
  auto c = s.client();
  auto r = c.Post("/v1/completions", json{{"prompt", "The quick brown fox"}, {"max_tokens", 5}, {"seed", 3}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(j["choices"][0]["text"].is_string());
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "tiny");
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  EXPECT_NE(met->body.find("strata_completion_tokens_total"), std::string::npos);
  EXPECT_NE(met->body.find("strata_expert_cache_hit_ratio{tier=\"ram\"} 1"), std::string::npos);
  EXPECT_NE(met->body.find("strata_queue_length 0"), std::string::npos);
}

TEST(Server, BadRequestsGetOpenAIErrors) {
  TestServer s(SchedulerOptions{}, HttpOptions{.max_body = 64 << 10});
  auto c = s.client();
  struct Case {
    std::string body;
    int status;
    const char* param;
  };
  const std::string long_prompt(20000, 'x');
  const Case cases[] = {
      {"{not json", 400, ""},
      {"[1,2]", 400, ""},
      {json{{"messages", "hi"}}.dump(), 400, "messages"},
      {json{{"messages", json::array()}}.dump(), 400, "messages"},
      {json{{"messages", json::array({{{"role", 3}, {"content", "x"}}})}}.dump(), 400, "messages[0].role"},
      {json{{"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}}.dump(), 400, "messages[0].role"},
      {json{{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}.dump(), 400, "messages[0].content"},
      {[] { json b = chat_body(4); b["max_tokens"] = "ten"; return b.dump(); }(), 400, "max_tokens"},
      {[] { json b = chat_body(4); b["max_tokens"] = 0; return b.dump(); }(), 400, "max_tokens"},
      {[] { json b = chat_body(4); b["temperature"] = 7; return b.dump(); }(), 400, "temperature"},
      {[] { json b = chat_body(4); b["top_p"] = "x"; return b.dump(); }(), 400, "top_p"},
      {[] { json b = chat_body(4); b["stop"] = json::array({1}); return b.dump(); }(), 400, "stop"},
      {[] { json b = chat_body(4); b["stream"] = "yes"; return b.dump(); }(), 400, "stream"},
      {[] { json b = chat_body(4); b["n"] = 2; return b.dump(); }(), 400, "n"},
      // longer than a sequence's context (256 tokens here)
      {[&] { json b = chat_body(4); b["messages"][1]["content"] = std::string(3000, 'a') + " b c d e f g h i j k l m n o p"; return b.dump(); }(), 400, "messages"},
      // larger than the body limit
      {json{{"prompt", std::string(100000, 'y')}}.dump(), 413, ""},
  };
  for (const Case& k : cases) {
    auto r = c.Post("/v1/chat/completions", k.body, "application/json");
    ASSERT_TRUE(r) << k.body.substr(0, 80);
    EXPECT_EQ(r->status, k.status) << k.body.substr(0, 80) << " -> " << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->body;
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    if (k.param[0]) {
      EXPECT_EQ(j["error"]["param"], k.param) << r->body;
    }
  }
  auto r = c.Post("/v1/completions", json{{"prompt", 12}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  auto nf = c.Get("/v1/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  // the server is still up and serving
  auto ok = c.Post("/v1/chat/completions", chat_body(3).dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(Server, ConcurrentRequestsShareSteps) {
  TestServer s(SchedulerOptions{.max_sequences = 4});
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      auto c = s.client();
      json b = chat_body(24);
      b["messages"][1]["content"] = "Question number " + std::to_string(i);
      auto r = c.Post("/v1/chat/completions", b.dump(), "application/json");
      if (r && r->status == 200) ++ok;
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 4);
  const SchedulerMetrics m = s.scheduler->metrics();
  EXPECT_EQ(m.requests_total, 4);
  EXPECT_EQ(m.active, 0);
  // shared steps: fewer forward passes than tokens generated
  EXPECT_LT(m.steps_total, m.completion_tokens_total) << m.steps_total << " steps for " << m.completion_tokens_total << " tokens";
}

// Speculative decoding in the server (--draft ngram): with greedy sampling, one sequence's text is
// the same with drafts as without (drafted steps stay within the batch-invariant size, so every
// row is computed as in plain decoding), the drafts are counted, and several sequences drafting
// in shared steps all finish.
TEST(Server, NgramDraftsKeepGreedyOutput) {
  const std::string text = "one two three four five six. one two three four five six. one two three";
  bool adaptive = false;  // k = max_draft whenever there is room: every guess is tried
  auto run = [&](const char* drafter, int slots, int n_jobs, SchedulerMetrics* metrics) {
    TestServer s(SchedulerOptions{.max_sequences = slots, .ctx = 256, .drafter = drafter, .adaptive_draft = adaptive});
    std::vector<std::shared_ptr<Job>> jobs;
    for (int i = 0; i < n_jobs; ++i) {
      CompletionRequest r;
      r.prompt = s.tok->tokenize(text + std::string(size_t(i), '.'), true, false);
      r.max_tokens = 40;
      r.sampling.temperature = 0;
      r.ignore_eos = true;
      auto job = s.scheduler->submit(r);
      EXPECT_TRUE(job.ok());
      if (job) jobs.push_back(*job);
    }
    std::vector<std::string> out;
    for (auto& j : jobs) {
      out.push_back(j->wait_all());
      EXPECT_EQ(j->summary().finish_reason, "length");
      EXPECT_EQ(j->summary().completion_tokens, 40);
    }
    *metrics = s.scheduler->metrics();
    return out;
  };
  SchedulerMetrics plain_m, draft_m, many_m;
  const auto plain = run("none", 1, 1, &plain_m);
  const auto drafted = run("ngram", 1, 1, &draft_m);
  ASSERT_EQ(plain.size(), 1u);
  ASSERT_EQ(drafted.size(), 1u);
  EXPECT_EQ(drafted[0], plain[0]);
  EXPECT_EQ(plain_m.draft_tokens_total, 0);
  EXPECT_GT(draft_m.draft_tokens_total, 0) << "the prompt repeats: the n-gram drafter has guesses";
  EXPECT_LE(draft_m.draft_accepted_total, draft_m.draft_tokens_total);
  std::printf("  ngram drafts: %lld drafted, %lld accepted; %lld steps for 40 tokens (plain %lld)\n",
              (long long)draft_m.draft_tokens_total, (long long)draft_m.draft_accepted_total,
              (long long)draft_m.steps_total, (long long)plain_m.steps_total);
  const auto many = run("ngram", 3, 3, &many_m);
  EXPECT_EQ(many.size(), 3u);
  EXPECT_EQ(many_m.completion_tokens_total, 120);
  // the server's default: adaptive k, which needs plain steps' times as its yardstick first
  SchedulerMetrics adaptive_m;
  adaptive = true;
  EXPECT_EQ(run("ngram", 1, 1, &adaptive_m), plain);
  EXPECT_GT(adaptive_m.draft_tokens_total, 0) << "the adaptive controller never drafted";
}

// MTP drafts in the server: a synthetic model with a nextn layer, the scheduler alone. The
// batched steps keep each sequence's hidden rows for its drafter; greedy output is the same with
// drafts as without, for one sequence and for two sharing steps. The prompts are fed 8 tokens a
// step, so that every step stays within cpu::kBatchInvariantTokens and each row is computed as
// alone whatever the batching: two 9-token prompts taken in one step (18 rows: the tile kernels,
// whose sums run in another order) or in two, as the submissions' timing falls, could otherwise
// make the runs differ without any draft.
TEST(Server, MtpDraftsKeepGreedyOutput) {
  std::vector<uint8_t> bytes;
  auto loaded = test::synth_q8_model("tiny", bytes, 1);
  ASSERT_NE(loaded, nullptr);
  const Engine engine(std::move(loaded));
  const Model* model = &engine.model();
  ASSERT_NE(model->mtp, nullptr) << model->mtp_error;
  auto tok = Tokenizer::from_gguf(model->file());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  auto run = [&](const char* drafter, int n_jobs, SchedulerMetrics* metrics) {
    Scheduler sched(engine, *tok, SchedulerOptions{.max_sequences = n_jobs, .ctx = 128, .drafter = drafter,
                                                   .adaptive_draft = false, .prefill_chunk = 8});
    std::vector<std::shared_ptr<Job>> jobs;
    for (int i = 0; i < n_jobs; ++i) {
      CompletionRequest r;
      r.prompt = test::random_ids(9, 100 + uint32_t(i), model->hparams().n_vocab);
      r.max_tokens = 24;
      r.ignore_eos = true;
      auto job = sched.submit(r);
      EXPECT_TRUE(job.ok());
      if (job) jobs.push_back(*job);
    }
    std::vector<std::string> out;
    for (auto& j : jobs) {
      out.push_back(j->wait_all());
      EXPECT_EQ(j->summary().completion_tokens, 24);
    }
    *metrics = sched.metrics();
    return out;
  };
  SchedulerMetrics plain_m, mtp_m, two_plain_m, two_mtp_m;
  EXPECT_EQ(run("mtp", 1, &mtp_m), run("none", 1, &plain_m));
  EXPECT_GT(mtp_m.draft_tokens_total, 0);
  EXPECT_LE(mtp_m.draft_accepted_total, mtp_m.draft_tokens_total);
  EXPECT_EQ(run("mtp", 2, &two_mtp_m), run("none", 2, &two_plain_m));
  EXPECT_GT(two_mtp_m.draft_tokens_total, 0);
  std::printf("  mtp drafts: one sequence %lld drafted, %lld accepted; two: %lld, %lld\n",
              (long long)mtp_m.draft_tokens_total, (long long)mtp_m.draft_accepted_total,
              (long long)two_mtp_m.draft_tokens_total, (long long)two_mtp_m.draft_accepted_total);
}

// The scheduler alone on the bundled model: one greedy job's text, summary and the logprobs of
// its tokens (top 5).
struct JobResult {
  std::string text;
  CompletionSummary summary;
  std::vector<TokenLogprob> logprobs;
};
JobResult run_job(Scheduler& sched, const std::vector<TokenId>& prompt, int max_tokens) {
  CompletionRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.top_logprobs = 5;
  auto job = sched.submit(r);
  EXPECT_TRUE(job.ok());
  if (!job) return {};
  JobResult out;
  out.text = (*job)->wait_all(&out.logprobs);
  out.summary = (*job)->summary();
  return out;
}

// Two runs of the same request agree: the same greedy tokens, their logprobs within 0.03 (a cached
// or chunked prompt is evaluated in other batch shapes, through the several-token kernels instead
// of the one-token ones, which round the Q8 activations differently: up to 0.015 measured on the
// bundled Q4_K_M model). That random-weight model has near ties: where the second run picks
// another token, it must be one of the first run's best within twice the tolerance of its choice
// (on an AVX-512 EPYC the chunked prompt's fourth token: 7e-5 apart there, 0.014 in the whole
// prompt's run); the comparison ends there, as the continuations differ.
void expect_same_tokens(const JobResult& a, const JobResult& b) {
  constexpr double kTolerance = 0.03;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_NEAR(a.logprobs[i].logprob, b.logprobs[i].logprob, kTolerance) << "token " << i;
    if (a.logprobs[i].token == b.logprobs[i].token) continue;
    const auto& top = a.logprobs[i].top;
    const auto it = std::find_if(top.begin(), top.end(), [&](const auto& t) { return t.first == b.logprobs[i].token; });
    ASSERT_NE(it, top.end()) << "token " << i << ": '" << b.logprobs[i].token << "' is not among the first run's best";
    EXPECT_LT(double(a.logprobs[i].logprob) - double(it->second), 2 * kTolerance)
        << "token " << i << ": '" << a.logprobs[i].token << "' against '" << b.logprobs[i].token << "' is no tie";
    return;
  }
}

// The prompt cache: a second turn that extends the first reuses what the slot holds (the first
// prompt and the reply but its last token), evaluates only the rest, and answers as a server
// without the cache does; a request that shares nothing reuses nothing.
TEST(Server, PromptCacheReusesTheLongestPrefix) {
  TestServer cached(SchedulerOptions{.max_sequences = 2});
  TestServer fresh(SchedulerOptions{.max_sequences = 2, .cache_prompt = false});
  const std::vector<TokenId> turn1 = cached.tok->tokenize("The history of the bird in the sky is long", true, false);
  const JobResult a = run_job(*cached.scheduler, turn1, 6);
  EXPECT_EQ(a.summary.cached_tokens, 0);
  std::vector<TokenId> turn2 = turn1;
  const std::vector<TokenId> reply = cached.tok->tokenize(a.text, false, false);
  turn2.insert(turn2.end(), reply.begin(), reply.end());
  const std::vector<TokenId> more = cached.tok->tokenize(" and then the next question comes", false, false);
  turn2.insert(turn2.end(), more.begin(), more.end());
  const JobResult b = run_job(*cached.scheduler, turn2, 6);
  EXPECT_GE(b.summary.cached_tokens, int(turn1.size())) << "the first prompt is a prefix of the second";
  EXPECT_LT(b.summary.cached_tokens, int(turn2.size()));
  EXPECT_EQ(b.summary.prompt_tokens, int(turn2.size()));
  expect_same_tokens(b, run_job(*fresh.scheduler, turn2, 6));
  // the same prompt again: all but its last token from the cache
  const JobResult c = run_job(*cached.scheduler, turn2, 6);
  EXPECT_EQ(c.summary.cached_tokens, int(turn2.size()) - 1);
  expect_same_tokens(c, b);
  // a prompt that shares nothing with what the slots hold
  const JobResult d = run_job(*cached.scheduler, cached.tok->tokenize("Zebra", false, false), 3);
  EXPECT_EQ(d.summary.cached_tokens, 0);
  EXPECT_EQ(fresh.scheduler->metrics().cached_tokens_total, 0);
  EXPECT_EQ(cached.scheduler->metrics().cached_tokens_total, b.summary.cached_tokens + c.summary.cached_tokens);
}

// The prompt cache over HTTP: usage.prompt_tokens_details.cached_tokens.
TEST(Server, CachedTokensInTheUsage) {
  TestServer s(SchedulerOptions{.max_sequences = 1});
  auto c = s.client();
  auto r1 = c.Post("/v1/chat/completions", chat_body(4).dump(), "application/json");
  ASSERT_TRUE(r1);
  EXPECT_EQ(json::parse(r1->body)["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << r1->body;
  auto r2 = c.Post("/v1/chat/completions", chat_body(4).dump(), "application/json");
  ASSERT_TRUE(r2);
  const json u = json::parse(r2->body)["usage"];
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"].get<int>(), u["prompt_tokens"].get<int>() - 1) << r2->body;
}

// Chunked prefill: a prompt evaluated a few tokens per step gives the same tokens as one
// evaluated at once, takes a step per chunk, and another sequence keeps decoding beside it.
TEST(Server, ChunkedPrefillAnswersAsAWholePrompt) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += i % 3 ? " bird" : " sky";
  TestServer whole(SchedulerOptions{.max_sequences = 2, .prefill_chunk = 0});
  TestServer chunked(SchedulerOptions{.max_sequences = 2, .prefill_chunk = 8});
  const std::vector<TokenId> prompt = whole.tok->tokenize(text, true, false);
  ASSERT_GT(prompt.size(), 32u);
  const JobResult a = run_job(*whole.scheduler, prompt, 5);
  const int64_t steps0 = chunked.scheduler->metrics().steps_total;
  const JobResult b = run_job(*chunked.scheduler, prompt, 5);
  expect_same_tokens(a, b);
  const int64_t chunks = int64_t((prompt.size() + 7) / 8);
  EXPECT_EQ(chunked.scheduler->metrics().steps_total - steps0, chunks + 4) << "a step per chunk, then 4 decodes";
  // a long decode, then a long prompt joins: both finish, the decode's tokens unchanged
  CompletionRequest longer;
  longer.prompt = whole.tok->tokenize("Once", true, false);
  longer.max_tokens = 30;
  longer.sampling.temperature = 0;
  longer.ignore_eos = true;
  const std::string alone = (*whole.scheduler->submit(longer))->wait_all();
  auto j1 = chunked.scheduler->submit(longer);
  ASSERT_TRUE(j1.ok());
  JobPiece first;
  ASSERT_TRUE((*j1)->next(first));  // decoding
  const JobResult beside = run_job(*chunked.scheduler, prompt, 2);
  EXPECT_EQ(beside.logprobs.size(), 2u);
  EXPECT_EQ(first.text + (*j1)->wait_all(), alone);
}

// Logprobs: one entry per generated token, the chosen token's log-probability and the top ones
// in order; greedy picks the first of them.
TEST(Server, LogprobsOfEveryToken) {
  TestServer s;
  auto c = s.client();
  json body = chat_body(6);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(int(content.size()), j["usage"]["completion_tokens"].get<int>());
  std::string text;
  for (const json& t : content) {
    text += t["token"].get<std::string>();
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_EQ(t["top_logprobs"][0]["token"], t["token"]);
    EXPECT_NEAR(t["top_logprobs"][0]["logprob"].get<double>(), t["logprob"].get<double>(), 1e-6);
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_GE(t["top_logprobs"][1]["logprob"].get<double>(), t["top_logprobs"][2]["logprob"].get<double>());
    EXPECT_EQ(t["bytes"].size(), t["token"].get<std::string>().size());
  }
  EXPECT_EQ(text, j["choices"][0]["message"]["content"]);
  // streamed: the same entries, spread over the chunks
  body["stream"] = true;
  auto st = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(st);
  json streamed = json::array();
  for (const std::string& e : sse_events(st->body)) {
    if (e == "[DONE]") continue;
    const json ev = json::parse(e);
    if (!ev["choices"].empty() && ev["choices"][0].contains("logprobs") && !ev["choices"][0]["logprobs"].is_null())
      for (const json& t : ev["choices"][0]["logprobs"]["content"]) streamed.push_back(t);
  }
  ASSERT_EQ(streamed.size(), content.size());
  for (size_t i = 0; i < content.size(); ++i) EXPECT_EQ(streamed[i]["token"], content[i]["token"]);
  // the legacy endpoint: parallel arrays
  auto t = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", 2}}.dump(),
                  "application/json");
  ASSERT_TRUE(t);
  const json lp = json::parse(t->body)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), 3u);
  EXPECT_EQ(lp["token_logprobs"].size(), 3u);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  auto bad = c.Post("/v1/chat/completions", [&] { json b = chat_body(2); b["top_logprobs"] = 30; b["logprobs"] = true; return b.dump(); }(),
                    "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
}

TEST(Server, DisconnectMidStreamFreesTheSlot) {
  TestServer s(SchedulerOptions{.max_sequences = 1, .max_queue = 0});
  {
    auto c = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = chat_body(200, true).dump();
    req.set_header("Content-Type", "application/json");
    int chunks = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };  // hang up
    httplib::Response res;
    httplib::Error err;
    c.send(req, res, err);
    EXPECT_GE(chunks, 3);
  }
  // the slot comes back: a new request is served (bounded wait)
  bool served = false;
  for (int attempt = 0; attempt < 100 && !served; ++attempt) {
    auto c = s.client();
    auto r = c.Post("/v1/chat/completions", chat_body(2).dump(), "application/json");
    ASSERT_TRUE(r);
    served = r->status == 200;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(served);
  EXPECT_EQ(s.scheduler->metrics().requests_cancelled, 1);
}

TEST(Server, MoreRequestsThanSlotsQueueThenRefuse) {
  TestServer s(SchedulerOptions{.max_sequences = 1, .max_queue = 1});
  std::vector<std::thread> clients;
  std::atomic<int> ok{0}, busy{0};
  for (int i = 0; i < 5; ++i) {
    clients.emplace_back([&] {
      auto c = s.client();
      auto r = c.Post("/v1/chat/completions", chat_body(40).dump(), "application/json");
      if (!r) return;
      if (r->status == 200) ++ok;
      if (r->status == 429) {
        ++busy;
        EXPECT_NE(r->body.find("queue_full"), std::string::npos);
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok + busy, 5);
  EXPECT_GE(ok.load(), 2);  // one running, one queued at least
  EXPECT_GE(busy.load(), 1);
  EXPECT_EQ(s.scheduler->metrics().active, 0);
}

// A prompt that leaves no room in a slot's context: a 400 with OpenAI's code, nothing queued, and
// the server still answers.
TEST(Server, PromptLongerThanTheContext) {
  TestServer s(SchedulerOptions{.ctx = 32});
  auto c = s.client();
  json body = chat_body(4);
  body["messages"][1]["content"] = std::string(400, 'a') + " the end";
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("context_length_exceeded"), std::string::npos) << r->body;
  EXPECT_EQ(s.scheduler->metrics().queued, 0);
  auto ok = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST(Server, ApiKey) {
  TestServer s(SchedulerOptions{}, HttpOptions{.api_key = "sekret"});
  auto c = s.client();
  auto r = c.Post("/v1/chat/completions", chat_body(2).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  httplib::Headers wrong = {{"Authorization", "Bearer sekreT"}};
  r = c.Post("/v1/chat/completions", wrong, chat_body(2).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  httplib::Headers right = {{"Authorization", "Bearer sekret"}};
  r = c.Post("/v1/chat/completions", right, chat_body(2).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  auto h = c.Get("/health");  // health needs no key
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "abcd"));
  EXPECT_FALSE(constant_time_equal("", "a"));
}


// HttpServer::handle_bytes (what fuzz/fuzz_http_connection.cpp drives): a connection's raw bytes
// through the same parser and routes as a socket, keep-alive requests answered in order; a
// header cut short gets a 400, not a crash.
TEST(Server, RawBytesThroughTheSameRoutes) {
  TestServer s(SchedulerOptions{}, HttpOptions{.api_key = "k"});
  const std::string body = json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump();
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                           "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  const std::string out = s.http->handle_bytes("GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post +
                                               "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(out.rfind("HTTP/1.1 200", 0), 0u) << out;
  size_t n_ok = 0;
  for (size_t p = 0; (p = out.find("HTTP/1.1 200", p)) != std::string::npos; ++p) ++n_ok;
  EXPECT_EQ(n_ok, 2u) << out;  // health, the completion; models without the key: 401
  EXPECT_NE(out.find("\"text_completion\""), std::string::npos) << out;
  EXPECT_NE(out.find("HTTP/1.1 401"), std::string::npos) << out;
  const std::string cut = s.http->handle_bytes("POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n{");
  EXPECT_TRUE(cut.empty() || cut.rfind("HTTP/1.1 4", 0) == 0) << cut;
}

// ---- bounded soak ----------------------------------------------------------------------------

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

// Resident set size of this process, bytes.
int64_t rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return -1;
}

int64_t open_fds() {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// What a soak client did with one request, and what came back.
enum class Outcome { ok, streamed_ok, hung_up, gave_up, half_request, queue_full, too_long, bad };

// One well-formed non-streamed completion body, or why not.
std::string check_plain(const std::string& body, bool chat) {
  json j;
  try {
    j = json::parse(body);
  } catch (const std::exception& e) {
    return std::string("not JSON: ") + e.what();
  }
  if (j.value("object", "") != (chat ? "chat.completion" : "text_completion")) return "wrong object";
  if (!j.contains("choices") || j["choices"].size() != 1) return "no choice";
  const json& ch = j["choices"][0];
  const json& text = chat ? ch["message"]["content"] : ch["text"];
  if (!text.is_string()) return "no text";
  const std::string reason = ch.value("finish_reason", "");
  if (reason != "stop" && reason != "length") return "finish_reason '" + reason + "'";
  const json& u = j["usage"];
  // a sampled reply may stop at its first token (a stop token is not counted): 0 tokens then
  if (!u.contains("completion_tokens") || u["completion_tokens"].get<int>() < (reason == "stop" ? 0 : 1) ||
      u["total_tokens"].get<int>() != u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>())
    return "bad usage";
  return "";
}

// A complete event stream: JSON chunks, one finish reason, then [DONE].
std::string check_stream(const std::string& body) {
  const auto events = sse_events(body);
  if (events.empty() || events.back() != "[DONE]") return "no [DONE]";
  int finishes = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json e;
    try {
      e = json::parse(events[i]);
    } catch (const std::exception& ex) {
      return std::string("chunk not JSON: ") + ex.what();
    }
    if (e.contains("error")) return "error chunk";
    for (const json& ch : e["choices"])
      if (!ch["finish_reason"].is_null()) ++finishes;
  }
  return finishes == 1 ? "" : "finish reasons: " + std::to_string(finishes);
}

// An error answer of the kind expected under load: 429 queue_full or 400 context_length_exceeded.
Outcome classify_error(int status, const std::string& body) {
  if (status == 429 && body.find("queue_full") != std::string::npos) return Outcome::queue_full;
  if (status == 400 && body.find("context_length_exceeded") != std::string::npos) return Outcome::too_long;
  return Outcome::bad;
}

// N clients on loopback against a server streaming its experts through a small cache: random
// prompt lengths (some longer than the context), plain and streamed requests, clients that hang
// up mid-stream, give up before a plain answer, or send half a request and close. At the end:
// every response well formed or an expected 400 (a 429 is retried after a pause, as the error
// asks), no sequence active or queued, every cache slot free or resident (no pin or read left), as
// many open descriptors as at the start, and RSS no higher than after the warm-up plus a margin. STRATA_SOAK_REQUESTS / STRATA_SOAK_CLIENTS make
// it longer (docs/reliability.md).
TEST(Server, SoakConcurrentClientsWithCancellations) {
  const int n_requests = env_int("STRATA_SOAK_REQUESTS", 120);
  const int n_clients = env_int("STRATA_SOAK_CLIENTS", 6);
  TestServer s(SchedulerOptions{.max_sequences = 3, .max_queue = 3, .ctx = 256}, HttpOptions{}, /*cache_slots=*/1);
  ASSERT_TRUE(s.engine->expert_store());
  const ExpertStore& store = *s.engine->expert_store();
  {  // warm-up: the first requests allocate the slots' sessions and the allocator's arenas
    auto c = s.client();
    for (int i = 0; i < 3; ++i) ASSERT_EQ(c.Post("/v1/chat/completions", chat_body(8, i == 1).dump(), "application/json")->status, 200);
  }
  const int64_t fds0 = open_fds(), rss0 = rss_bytes();

  std::atomic<int> next{0}, retries{0};
  std::mutex mu;
  std::map<Outcome, int> counts;
  std::vector<std::string> failures;
  auto client = [&](int id) {
    std::mt19937 rng(uint32_t(1000 + id));
    for (int n = next++; n < n_requests; n = next++) {
      const int kind = int(rng() % 6);
      const bool chat = rng() % 2 == 0;
      const int words = rng() % 10 == 0 ? 400 : 1 + int(rng() % 60);  // one in ten longer than the context
      std::string text;
      for (int w = 0; w < words; ++w) {
        if (w) text += ' ';
        text += w % 3 ? "bird" : "sky";
      }
      json body = chat ? json{{"messages", json::array({{{"role", "user"}, {"content", text}}})}} : json{{"prompt", text}};
      body["max_tokens"] = 1 + int(rng() % 24);
      body["temperature"] = (rng() % 2) ? 0.0 : 0.8;
      body["seed"] = n;
      const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
      Outcome out = Outcome::bad;
      std::string why;
      // a 429 says "retry later": the client backs off and sends the same request again, for up
      // to 60 s (sanitizer builds run the model many times slower)
      const auto give_up_at = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      for (bool first = true; first || (out == Outcome::queue_full && std::chrono::steady_clock::now() < give_up_at);
           first = false) {
        if (!first) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10 + rng() % 40));
          ++retries;
        }
        why.clear();
        out = Outcome::bad;
        if (kind == 5) {  // half a request, then the connection closes
          const std::string half = "POST " + std::string(path) + " HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"pro";
          const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_port = htons(uint16_t(s.port));
          a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
              ::send(fd, half.data(), half.size(), MSG_NOSIGNAL) == ssize_t(half.size()))
            out = Outcome::half_request;
          else
            why = "cannot connect";
          if (fd >= 0) ::close(fd);
        } else if (kind >= 2) {  // streamed: read to the end (2, 3) or hang up after a few chunks (4)
          body["stream"] = true;
          httplib::Client c("127.0.0.1", s.port);
          c.set_read_timeout(60, 0);
          httplib::Request req;
          req.method = "POST";
          req.path = path;
          req.body = body.dump();
          req.set_header("Content-Type", "application/json");
          std::string got;
          const int hang_up_after = kind == 4 ? 1 + int(rng() % 4) : -1;
          int chunks = 0;
          bool hung_up = false;
          req.content_receiver = [&](const char* d, size_t len, uint64_t, uint64_t) {
            got.append(d, len);
            if (++chunks == hang_up_after && got.rfind("data: ", 0) == 0) hung_up = true;  // an event stream
            return !hung_up;
          };
          httplib::Response res;
          httplib::Error err = httplib::Error::Success;
          const bool sent = c.send(req, res, err);
          if (hung_up) {
            out = Outcome::hung_up;
          } else if (!sent) {
            why = "stream failed: " + httplib::to_string(err);
          } else if (res.status == 200) {
            why = check_stream(got);
            if (why.empty()) out = Outcome::streamed_ok;
          } else {
            out = classify_error(res.status, got);
            if (out == Outcome::bad) why = strfmt("status %d: %s", res.status, got.c_str());
          }
        } else {  // plain: wait for the answer (0), or give up after a few milliseconds (1)
          httplib::Client c("127.0.0.1", s.port);
          if (kind == 1) {
            c.set_read_timeout(0, 1000 * (1 + int(rng() % 20)));
          } else {
            c.set_read_timeout(60, 0);
          }
          auto r = c.Post(path, body.dump(), "application/json");
          if (!r) {
            if (kind == 1) out = Outcome::gave_up;
            else why = "no answer: " + httplib::to_string(r.error());
          } else if (r->status == 200) {
            why = check_plain(r->body, chat);
            if (why.empty()) out = Outcome::ok;
          } else {
            out = classify_error(r->status, r->body);
            if (out == Outcome::bad) why = strfmt("status %d: %s", r->status, r->body.c_str());
          }
        }
      }
      std::lock_guard lock(mu);
      ++counts[out];
      if (out == Outcome::bad) failures.push_back(strfmt("request %d (kind %d): %s", n, kind, why.c_str()));
    }
  };
  std::vector<std::thread> clients;
  for (int i = 0; i < n_clients; ++i) clients.emplace_back(client, i);
  for (auto& t : clients) t.join();

  // the server finishes what clients left behind (bounded wait), then everything is back
  SchedulerMetrics m = s.scheduler->metrics();
  for (int i = 0; i < 600 && (m.active > 0 || m.queued > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    m = s.scheduler->metrics();
  }
  EXPECT_EQ(m.active, 0);
  EXPECT_EQ(m.queued, 0);
  s.engine->expert_store()->drain();
  const ExpertStore::SlotCounts sc = store.slot_counts();
  EXPECT_EQ(sc.other, 0) << "slots pinned or loading after the soak";
  EXPECT_EQ(sc.free + sc.resident + sc.prefetched, store.arena_bytes() / store.slot_bytes());
  // descriptors: the server closes connections on its own schedule (keep-alive); bounded wait
  int64_t fds = open_fds();
  for (int i = 0; i < 200 && fds > fds0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fds = open_fds();
  }
  EXPECT_LE(fds, fds0) << "descriptors still open";
  const int64_t rss = rss_bytes();
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // a sanitizer's quarantine and shadow memory grow the RSS by design (ASan keeps 256 MiB of freed
  // blocks); its leak checker covers leaks instead
  std::printf("soak: RSS not checked under a sanitizer\n");
#else
  EXPECT_LT(rss, rss0 + (64 << 20)) << "RSS grew from " << rss0 / 1048576 << " to " << rss / 1048576 << " MiB";
#endif
  {  // still serving
    auto c = s.client();
    auto r = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }

  for (const std::string& f : failures) ADD_FAILURE() << f;
  const ExpertStoreStats st = store.stats();
  const char* names[] = {"ok", "streamed_ok", "hung_up", "gave_up", "half_request", "queue_full", "too_long", "bad"};
  std::string summary;
  for (const auto& [o, n] : counts) summary += strfmt("%s %d  ", names[int(o)], n);
  std::printf("soak: %d requests from %d clients: %s; %d retries after a 429; %lld accepted, %lld cancelled, %lld completion tokens; "
              "RSS %.1f -> %.1f MiB; expert store: %lld uses, %lld demand reads, %lld prefetches, slots free %lld "
              "resident %lld prefetched %lld\n",
              n_requests, n_clients, summary.c_str(), retries.load(), (long long)m.requests_total, (long long)m.requests_cancelled,
              (long long)m.completion_tokens_total, double(rss0) / 1048576, double(rss) / 1048576,
              (long long)st.accesses, (long long)st.demand_reads, (long long)st.prefetch_reads, (long long)sc.free,
              (long long)sc.resident, (long long)sc.prefetched);
  EXPECT_EQ(counts[Outcome::bad], 0);
  EXPECT_GT(counts[Outcome::ok] + counts[Outcome::streamed_ok], n_requests / 4);  // retried until served
  EXPECT_GT(counts[Outcome::hung_up], 0);
  EXPECT_GT(st.demand_reads, int64_t(store.arena_bytes() / store.slot_bytes()));  // the cache was too small: evictions
}

}  // namespace
}  // namespace strata::server
