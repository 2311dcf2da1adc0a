// The OpenAI-compatible server over real HTTP on loopback (src/server): an in-process server on a
// free port with the bundled model, driven by httplib's client. Plain and streamed completions,
// concurrent requests sharing steps, every kind of bad request, a client that disconnects mid-stream,
// more requests than slots, the API key. Every request loop is bounded.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/http_server.h"
#include "test_support.h"

namespace strata::server {
namespace {

using nlohmann::json;

struct TestServer {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  ModelSummary summary;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;

  explicit TestServer(SchedulerOptions so = {}, HttpOptions ho = {}) {
    auto m = Model::load((test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf").string());
    EXPECT_TRUE(m);
    model = std::move(*m);
    auto t = Tokenizer::from_gguf(model->file());
    EXPECT_TRUE(t);
    tok = std::make_unique<Tokenizer>(std::move(*t));
    summary = *summarize_model(model->file());
    if (so.ctx == 4096) so.ctx = 256;
    scheduler = std::make_unique<Scheduler>(*model, *tok, so);
    ho.port = 0;
    http = std::make_unique<HttpServer>(*scheduler, *tok, ChatFormat::chatml, "tiny", summary, ho);
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

}  // namespace
}  // namespace strata::server
