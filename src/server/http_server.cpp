#include "server/http_server.h"


#include <httplib.h>

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

namespace strata::server {

using nlohmann::json;

bool constant_time_equal(const std::string& a, const std::string& b) {
  // compare over the longer length so that neither content nor a common prefix shows in the time
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

namespace {

// A connection held in memory: reads come from a buffer, writes go to a string.
class BufferStream final : public httplib::Stream {
 public:
  explicit BufferStream(std::string_view in) : in_(in) {}
  bool is_readable() const override { return true; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size() - pos_);
    std::memcpy(ptr, in_.data() + pos_, n);
    pos_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out.append(ptr, size);
    return ssize_t(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  socket_t socket() const override { return INVALID_SOCKET; }
  bool at_end() const { return pos_ >= in_.size(); }
  std::string out;

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

// httplib's per-connection request loop, reachable for a stream that is not a socket.
class RawServer final : public httplib::Server {
 public:
  void serve(BufferStream& s) {
    // keep-alive: one request after the other until the input ends or one fails to parse
    for (int i = 0; i < 64 && !s.at_end(); ++i) {
      bool closed = false;
      if (!process_request(s, false, closed, nullptr) || closed) break;
    }
  }
};

// Model text may hold invalid UTF-8 (a byte-level token split or a random-weight model): it is
// sent with U+FFFD in place of the bad bytes rather than failing the response.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// An OpenAI-shaped error.
void send_error(httplib::Response& res, int status, const std::string& message, const char* type,
                const std::string& param = "", const char* code = nullptr) {
  json e = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code ? json(code) : json(nullptr)}};
  res.status = status;
  res.set_content(dump(json{{"error", e}}), "application/json");
}

// A request field that is not what the API allows: the message names it.
struct BadField {
  std::string param;
  std::string message;
};

std::string random_id(const char* prefix) {
  static std::mt19937_64 rng{std::random_device{}()};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buf;
}

// Sampling and limits shared by both endpoints; throws BadField.
void read_common(const json& body, CompletionRequest& r, bool& stream, bool& include_usage) {
  auto number = [&](const char* key, double lo, double hi, double def) {
    if (!body.contains(key) || body[key].is_null()) return def;
    const json& v = body[key];
    if (!v.is_number()) throw BadField{key, std::string("'") + key + "' must be a number"};
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi))
      throw BadField{key, strfmt("'%s' must be between %g and %g, got %g", key, lo, hi, x)};
    return x;
  };
  auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t def) {
    if (!body.contains(key) || body[key].is_null()) return def;
    const json& v = body[key];
    if (!v.is_number_integer()) throw BadField{key, std::string("'") + key + "' must be an integer"};
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) throw BadField{key, strfmt("'%s' must be between %lld and %lld", key, (long long)lo, (long long)hi)};
    return x;
  };
  r.sampling.temperature = float(number("temperature", 0.0, 2.0, 1.0));
  r.sampling.top_p = float(number("top_p", 0.0, 1.0, 1.0));
  r.sampling.top_k = 0;
  r.sampling.min_p = 0.0f;
  r.sampling.repeat_penalty = 1.0f;
  const double presence = number("presence_penalty", -2.0, 2.0, 0.0);
  const double frequency = number("frequency_penalty", -2.0, 2.0, 0.0);
  if (presence != 0.0 || frequency != 0.0) {
    // the closest strata has: llama.cpp's repetition penalty over the last 64 tokens
    r.sampling.repeat_penalty = float(1.0 + std::max(0.0, std::max(presence, frequency)) / 2.0);
  }
  r.sampling.seed = body.contains("seed") && !body["seed"].is_null()
                        ? uint64_t(integer("seed", INT64_MIN, INT64_MAX, 0))
                        : uint64_t(std::random_device{}());
  const int64_t max_tokens = body.contains("max_completion_tokens") ? integer("max_completion_tokens", 1, 1 << 20, 256)
                                                                    : integer("max_tokens", 1, 1 << 20, 256);
  r.max_tokens = int(max_tokens);
  if (integer("n", 1, 1, 1) != 1) throw BadField{"n", "'n' must be 1"};
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& s = body["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const json& x : s) {
        if (!x.is_string()) throw BadField{"stop", "'stop' must be a string or an array of up to 4 strings"};
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw BadField{"stop", "'stop' must be a string or an array of up to 4 strings"};
    }
  }
  stream = false;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) throw BadField{"stream", "'stream' must be a boolean"};
    stream = body["stream"].get<bool>();
  }
  include_usage = false;
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    const json& so = body["stream_options"];
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean())
        throw BadField{"stream_options.include_usage", "'stream_options.include_usage' must be a boolean"};
      include_usage = so["include_usage"].get<bool>();
    }
  }
}

// messages[i].content: a string, or an array of {"type": "text", "text": ...} parts.
std::string message_text(const json& content, size_t i) {
  const std::string param = strfmt("messages[%zu].content", i);
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array()) throw BadField{param, "'" + param + "' must be a string or an array of text parts"};
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw BadField{param, "'" + param + "': only parts of type \"text\" with a string \"text\" are supported"};
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

RequestError parse_completion_body(const std::string& text, bool chat, ChatFormat format, ParsedCompletion& out) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {
    return {400, std::string("the body is not valid JSON: ") + e.what(), ""};
  }
  if (!body.is_object()) return {400, "the body must be a JSON object", ""};
  try {
    read_common(body, out.request, out.stream, out.include_usage);
    if (chat) {
      if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
        throw BadField{"messages", "'messages' must be a non-empty array"};
      std::vector<ChatMessage> messages;
      for (size_t i = 0; i < body["messages"].size(); ++i) {
        const json& m = body["messages"][i];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
          throw BadField{strfmt("messages[%zu].role", i), strfmt("'messages[%zu]' needs a string 'role'", i)};
        std::string role = m["role"].get<std::string>();
        if (role == "developer") role = "system";
        if (role != "system" && role != "user" && role != "assistant" && role != "tool")
          throw BadField{strfmt("messages[%zu].role", i), "unknown role '" + role + "'"};
        messages.push_back({role, message_text(m.contains("content") ? m["content"] : json(nullptr), i)});
      }
      out.prompt = format_chat(format, messages, {});
    } else {
      if (!body.contains("prompt")) throw BadField{"prompt", "'prompt' is required"};
      const json& p = body["prompt"];
      if (p.is_string()) {
        out.prompt = p.get<std::string>();
      } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
        out.prompt = p[0].get<std::string>();
      } else {
        throw BadField{"prompt", "'prompt' must be a string (or an array of one string)"};
      }
    }
  } catch (const BadField& b) {
    return {400, b.message, b.param};
  } catch (const json::exception& e) {
    return {400, std::string("bad request: ") + e.what(), ""};
  }
  return {};
}

namespace {

json usage_json(const CompletionSummary& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.completion_tokens},
          {"total_tokens", s.prompt_tokens + s.completion_tokens}};
}

std::string finish_reason(const CompletionSummary& s) {
  return s.finish_reason == "length" ? "length" : "stop";
}

}  // namespace

HttpServer::HttpServer(Scheduler& scheduler, const Tokenizer& tok, ChatFormat format, std::string model_id,
                       const ModelSummary& summary, HttpOptions o)
    : scheduler_(scheduler),
      tok_(tok),
      format_(format),
      model_id_(std::move(model_id)),
      summary_(summary),
      o_(std::move(o)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()),
      http_(std::make_unique<RawServer>()) {
  routes();
}

HttpServer::~HttpServer() { stop(); }

Result<int> HttpServer::bind() {
  int port = o_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(o_.host);
    if (port < 0) return Error{"cannot bind " + o_.host + " to a free port"};
    return port;
  }
  if (!http_->bind_to_port(o_.host, port))
    return Error{strfmt("cannot bind %s:%d (in use, or not an address of this machine)", o_.host.c_str(), port)};
  return port;
}

void HttpServer::run() { http_->listen_after_bind(); }
std::string HttpServer::handle_bytes(std::string_view input) {
  BufferStream s(input);
  static_cast<RawServer&>(*http_).serve(s);
  return std::move(s.out);
}
void HttpServer::stop() {
  if (http_) http_->stop();
}

void HttpServer::routes() {
  httplib::Server& s = *http_;
  s.set_payload_max_length(o_.max_body);
  const int threads = o_.http_threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };

  // authentication first (every route but /health)
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (o_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string want = "Bearer " + o_.api_key;
    if (!constant_time_equal(req.get_header_value("Authorization"), want)) {
      send_error(res, 401, "invalid or missing API key (Authorization: Bearer KEY)", "invalid_request_error", "",
                 "invalid_api_key");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler already wrote its error
    if (res.status == 413) {
      send_error(res, 413, "request body too large", "invalid_request_error");
    } else if (res.status == 404) {
      send_error(res, 404, "no such endpoint", "invalid_request_error");
    } else if (res.status >= 400) {
      send_error(res, res.status, "bad request", "invalid_request_error");
    }
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, 500, "internal error", "server_error");
  });

  s.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", model_id_}, {"object", "model"}, {"created", created_}, {"owned_by", "strata"}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const SchedulerMetrics m = scheduler_.metrics();
    const double weight_bytes = double(summary_.active_bytes_per_token);
    std::string t;
    auto metric = [&](const char* name, const char* type, const char* help, double v, const char* labels = "") {
      t += strfmt("# HELP %s %s\n# TYPE %s %s\n%s%s %.6g\n", name, help, name, type, name, labels, v);
    };
    metric("strata_requests_total", "counter", "requests accepted", double(m.requests_total));
    metric("strata_requests_rejected_total", "counter", "requests refused (queue full, prompt too long)", double(m.requests_rejected));
    metric("strata_requests_cancelled_total", "counter", "requests whose client went away", double(m.requests_cancelled));
    metric("strata_prompt_tokens_total", "counter", "prompt tokens evaluated", double(m.prompt_tokens_total));
    metric("strata_completion_tokens_total", "counter", "tokens generated", double(m.completion_tokens_total));
    metric("strata_steps_total", "counter", "batched forward passes", double(m.steps_total));
    metric("strata_draft_tokens_total", "counter", "tokens drafted for speculative verification", double(m.draft_tokens_total));
    metric("strata_draft_accepted_total", "counter", "drafted tokens accepted", double(m.draft_accepted_total));
    metric("strata_busy_seconds_total", "counter", "seconds spent in forward passes", m.busy_seconds);
    metric("strata_tokens_per_second", "gauge", "tokens generated per second over the last 10 s", m.tokens_per_second);
    metric("strata_sequences_active", "gauge", "sequences being decoded", double(m.active));
    metric("strata_queue_length", "gauge", "requests waiting for a sequence slot", double(m.queued));
    metric("strata_sequence_slots", "gauge", "sequences decoded together at most", double(scheduler_.options().max_sequences));
    // the tiers: routed-expert uses served from each (no tier: every one from RAM) and bytes per link
    const Engine::TierStats& ts = m.tiers;
    auto share = [&](uint64_t n, double none) { return ts.uses ? double(n) / double(ts.uses) : none; };
    t += "# HELP strata_expert_cache_hit_ratio share of routed-expert uses served by each tier (since start)\n"
         "# TYPE strata_expert_cache_hit_ratio gauge\n";
    t += strfmt("strata_expert_cache_hit_ratio{tier=\"vram\"} %.6g\nstrata_expert_cache_hit_ratio{tier=\"ram\"} %.6g\n"
                "strata_expert_cache_hit_ratio{tier=\"nvme\"} %.6g\n",
                share(ts.vram, 0.0), share(ts.ram, 1.0), share(ts.nvme, 0.0));
    t += "# HELP strata_expert_promotions_total routed experts copied into VRAM slots\n"
         "# TYPE strata_expert_promotions_total counter\n";
    t += strfmt("strata_expert_promotions_total %.6g\n", double(ts.promotions));
    t += "# HELP strata_weight_bytes_total weight bytes moved per link (ram: decode steps, estimated per token; "
         "pcie: host-to-device copies of the GPU tier; nvme: bytes read from the model file)\n"
         "# TYPE strata_weight_bytes_total counter\n";
    t += strfmt("strata_weight_bytes_total{link=\"ram\"} %.6g\nstrata_weight_bytes_total{link=\"pcie\"} %.6g\n"
                "strata_weight_bytes_total{link=\"nvme\"} %.6g\n",
                weight_bytes * double(m.completion_tokens_total), double(ts.pcie_bytes), double(ts.nvme_bytes));
    res.set_content(t, "text/plain; version=0.0.4");
  });

  auto completion = [this](const httplib::Request& req, httplib::Response& res, bool chat) {
    ParsedCompletion parsed;
    if (RequestError e = parse_completion_body(req.body, chat, format_, parsed); e.status != 0) {
      send_error(res, e.status, e.message, "invalid_request_error", e.param);
      return;
    }
    CompletionRequest r = std::move(parsed.request);
    const bool stream = parsed.stream, include_usage = parsed.include_usage;
    const std::string& prompt = parsed.prompt;
    // chat templates spell out BOS where they want one; raw text gets the vocabulary's own
    r.prompt = tok_.tokenize(prompt, !chat || format_ == ChatFormat::raw, chat);
    if (r.prompt.empty()) {
      send_error(res, 400, "the prompt is empty", "invalid_request_error", chat ? "messages" : "prompt");
      return;
    }
    auto job = scheduler_.submit(std::move(r));
    if (!job) {
      const std::string& msg = job.error().message;
      if (msg.rfind("context_length_exceeded", 0) == 0) {
        send_error(res, 400, msg, "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded");
      } else if (msg.rfind("queue full", 0) == 0) {
        send_error(res, 429, msg + "; retry later", "rate_limit_error", "", "queue_full");
      } else {
        send_error(res, 400, msg, "invalid_request_error");
      }
      return;
    }
    const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
    const char* object = chat ? "chat.completion" : "text_completion";
    std::shared_ptr<Job> j = *job;
    if (!stream) {
      const std::string text = j->wait_all();
      const CompletionSummary sum = j->summary();
      if (sum.finish_reason == "error") {
        send_error(res, 500, sum.error, "server_error");
        return;
      }
      json choice = chat ? json{{"index", 0},
                                {"message", {{"role", "assistant"}, {"content", text}}},
                                {"finish_reason", finish_reason(sum)},
                                {"logprobs", nullptr}}
                         : json{{"index", 0}, {"text", text}, {"finish_reason", finish_reason(sum)}, {"logprobs", nullptr}};
      json out = {{"id", id},          {"object", object},  {"created", created_},
                  {"model", model_id_}, {"choices", json::array({choice})}, {"usage", usage_json(sum)}};
      res.set_content(dump(out), "application/json");
      return;
    }
    // server-sent events: one chunk per piece of text, then the finish reason, then [DONE]
    const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
    const int64_t created = created_;
    const std::string model = model_id_;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [j, id, chunk_object, created, model, chat, include_usage, first = true](size_t, httplib::DataSink& sink) mutable {
          auto send = [&](const json& choice, const json& usage) {
            json c = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                      {"choices", choice.is_null() ? json::array() : json::array({choice})}};
            if (!usage.is_null()) c["usage"] = usage;
            const std::string line = "data: " + dump(c) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          if (first && chat) {
            first = false;
            if (!send({{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}, nullptr)) {
              j->cancel();
              return false;
            }
          }
          std::string piece;
          if (j->next(piece)) {
            const json choice = chat ? json{{"index", 0}, {"delta", {{"content", piece}}}, {"finish_reason", nullptr}}
                                     : json{{"index", 0}, {"text", piece}, {"finish_reason", nullptr}};
            if (!send(choice, nullptr)) {
              j->cancel();  // the client went away: free its slot at the next step
              return false;
            }
            return true;
          }
          const CompletionSummary sum = j->summary();
          if (sum.finish_reason == "error") {
            const std::string line = "data: " + dump(json{{"error", {{"message", sum.error}, {"type", "server_error"}}}}) + "\n\n";
            sink.write(line.data(), line.size());
          } else {
            const json choice = chat ? json{{"index", 0}, {"delta", json::object()}, {"finish_reason", finish_reason(sum)}}
                                     : json{{"index", 0}, {"text", ""}, {"finish_reason", finish_reason(sum)}};
            send(choice, nullptr);
            if (include_usage) send(nullptr, usage_json(sum));
          }
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        },
        [j](bool) { j->cancel(); });  // released: a no-op after the end, a cancel before it
  };
  s.Post("/v1/chat/completions", [completion](const httplib::Request& req, httplib::Response& res) { completion(req, res, true); });
  s.Post("/v1/completions", [completion](const httplib::Request& req, httplib::Response& res) { completion(req, res, false); });
}

}  // namespace strata::server
