#include "server/http_server.h"


#include <httplib.h>

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

namespace strata::server {

using nlohmann::json;
using ojson = nlohmann::ordered_json;  // requests: templates see the keys in the client's order

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
void read_common(const ojson& body, CompletionRequest& r, bool& stream, bool& include_usage) {
  auto number = [&](const char* key, double lo, double hi, double def) {
    if (!body.contains(key) || body[key].is_null()) return def;
    const ojson& v = body[key];
    if (!v.is_number()) throw BadField{key, std::string("'") + key + "' must be a number"};
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi))
      throw BadField{key, strfmt("'%s' must be between %g and %g, got %g", key, lo, hi, x)};
    return x;
  };
  auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t def) {
    if (!body.contains(key) || body[key].is_null()) return def;
    const ojson& v = body[key];
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
    const ojson& s = body["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const ojson& x : s) {
        if (!x.is_string()) throw BadField{"stop", "'stop' must be a string or an array of up to 4 strings"};
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw BadField{"stop", "'stop' must be a string or an array of up to 4 strings"};
    }
  }
  // llama.cpp's extension: generate up to max_tokens whatever the model says (benchmarks)
  if (body.contains("ignore_eos") && !body["ignore_eos"].is_null()) {
    if (!body["ignore_eos"].is_boolean()) throw BadField{"ignore_eos", "'ignore_eos' must be a boolean"};
    r.ignore_eos = body["ignore_eos"].get<bool>();
  }
  stream = false;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) throw BadField{"stream", "'stream' must be a boolean"};
    stream = body["stream"].get<bool>();
  }
  include_usage = false;
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    const ojson& so = body["stream_options"];
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean())
        throw BadField{"stream_options.include_usage", "'stream_options.include_usage' must be a boolean"};
      include_usage = so["include_usage"].get<bool>();
    }
  }
}

// messages[i].content: a string, or an array of {"type": "text", "text": ...} parts.
std::string message_text(const ojson& content, size_t i) {
  const std::string param = strfmt("messages[%zu].content", i);
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array()) throw BadField{param, "'" + param + "' must be a string or an array of text parts"};
  std::string text;
  for (const ojson& part : content) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw BadField{param, "'" + param + "': only parts of type \"text\" with a string \"text\" are supported"};
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

namespace {

// One OpenAI message as the template sees it: content as text, an assistant's tool calls with
// their JSON-string arguments turned into objects (what templates iterate over), a tool
// result's name found from the call it answers when the client left it out.
ojson template_message(const ojson& m, size_t i, const ojson& earlier) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
    throw BadField{strfmt("messages[%zu].role", i), strfmt("'messages[%zu]' needs a string 'role'", i)};
  std::string role = m["role"].get<std::string>();
  if (role == "developer") role = "system";
  if (role != "system" && role != "user" && role != "assistant" && role != "tool")
    throw BadField{strfmt("messages[%zu].role", i), "unknown role '" + role + "'"};
  ojson out = {{"role", role}, {"content", message_text(m.contains("content") ? m["content"] : ojson(nullptr), i)}};
  if (role == "assistant") {
    for (const char* k : {"reasoning_content", "thinking"}) {
      if (m.contains(k) && m[k].is_string()) out["reasoning_content"] = m[k];
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const std::string param = strfmt("messages[%zu].tool_calls", i);
      if (!m["tool_calls"].is_array()) throw BadField{param, "'" + param + "' must be an array"};
      ojson calls = ojson::array();
      for (size_t c = 0; c < m["tool_calls"].size(); ++c) {
        const ojson& tc = m["tool_calls"][c];
        const std::string at = strfmt("%s[%zu]", param.c_str(), c);
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object() ||
            !tc["function"].contains("name") || !tc["function"]["name"].is_string())
          throw BadField{at, "'" + at + "' needs a 'function' with a string 'name'"};
        const ojson& f = tc["function"];
        ojson args = ojson::object();
        if (f.contains("arguments") && f["arguments"].is_string()) {
          const std::string text = f["arguments"].get<std::string>();
          args = ojson::parse(text.empty() ? "{}" : text, nullptr, false);
          if (args.is_discarded())
            throw BadField{at + ".function.arguments", "'" + at + ".function.arguments' is not valid JSON"};
        } else if (f.contains("arguments") && f["arguments"].is_object()) {
          args = f["arguments"];
        }
        ojson call = {{"id", tc.contains("id") && tc["id"].is_string() ? tc["id"] : ojson(strfmt("call_%zu", c))},
                      {"type", "function"},
                      {"function", {{"name", f["name"]}, {"arguments", args}}}};
        calls.push_back(call);
      }
      if (!calls.empty()) out["tool_calls"] = calls;
    }
  }
  if (role == "tool") {
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) out["tool_call_id"] = m["tool_call_id"];
    if (m.contains("name") && m["name"].is_string()) {
      out["name"] = m["name"];
    } else if (out.contains("tool_call_id")) {
      for (const ojson& e : earlier)
        if (e.contains("tool_calls"))
          for (const ojson& c : e["tool_calls"])
            if (c["id"] == out["tool_call_id"]) out["name"] = c["function"]["name"];
    }
  }
  if (m.contains("name") && m["name"].is_string() && !out.contains("name")) out["name"] = m["name"];
  return out;
}

// tools: [{"type": "function", "function": {"name", "description", "parameters"}}], passed to
// the template as the client sent them. tool_choice "none" offers none; a named function offers
// only that one.
ojson read_tools(const ojson& body) {
  if (!body.contains("tools") || body["tools"].is_null()) return nullptr;
  const ojson& tools = body["tools"];
  if (!tools.is_array()) throw BadField{"tools", "'tools' must be an array"};
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    if (!t.is_object() || t.value("type", std::string()) != "function" || !t.contains("function") ||
        !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string())
      throw BadField{strfmt("tools[%zu]", i),
                     strfmt("'tools[%zu]' must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i)};
  }
  if (tools.empty()) return nullptr;
  if (!body.contains("tool_choice") || body["tool_choice"].is_null()) return tools;
  const ojson& choice = body["tool_choice"];
  if (choice.is_string()) {
    const std::string c = choice.get<std::string>();
    if (c == "none") return nullptr;
    if (c == "auto" || c == "required") return tools;
    throw BadField{"tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function"};
  }
  if (choice.is_object() && choice.contains("function") && choice["function"].is_object() &&
      choice["function"].contains("name") && choice["function"]["name"].is_string()) {
    ojson only = ojson::array();
    for (const ojson& t : tools)
      if (t["function"]["name"] == choice["function"]["name"]) only.push_back(t);
    if (only.empty()) throw BadField{"tool_choice", "'tool_choice' names a function that is not in 'tools'"};
    return only;
  }
  throw BadField{"tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function"};
}

// The name a tool_choice forces: a named function, or "required" with one tool offered.
std::string forced_name(const ojson& body, const ojson& tools) {
  if (tools.is_null() || !body.contains("tool_choice")) return "";
  const ojson& choice = body["tool_choice"];
  if (choice.is_object()) return choice["function"]["name"].get<std::string>();
  if (choice == "required" && tools.size() == 1) return tools[0]["function"]["name"].get<std::string>();
  return "";
}

// What the template writes for an assistant call of `name`, split around its arguments: the
// conversation with such a call rendered without a generation prompt starts with the prompt, and
// the placeholder arguments' JSON text marks where they go. False where the template does not
// write the call that way (XML arguments, a history it renders differently).
bool forced_call_text(const ChatTemplate& tmpl, ChatInput in, const std::string& prompt, const std::string& name,
                      const jinja::RenderOptions& render, ParsedCompletion& out) {
  const ojson args = {{"strata_forced_arguments", 1}};
  in.messages.push_back({{"role", "assistant"},
                         {"content", ""},
                         {"tool_calls", ojson::array({{{"id", "call0000a"},
                                                       {"type", "function"},
                                                       {"function", {{"name", name}, {"arguments", args}}}}})}});
  in.add_generation_prompt = false;
  auto full = tmpl.render(in, render);
  if (!full || full->compare(0, prompt.size(), prompt) != 0) return false;
  const std::string rest = full->substr(prompt.size());
  // tojson's separators, or compact
  for (const std::string a : {R"({"strata_forced_arguments": 1})", R"({"strata_forced_arguments":1})"}) {
    const size_t at = rest.find(a);
    if (at == std::string::npos) continue;
    out.forced = true;
    out.forced_opener = rest.substr(0, at);
    out.forced_closer = rest.substr(at + a.size());
    return true;
  }
  return false;
}

}  // namespace

RequestError parse_completion_body(const std::string& text, bool chat, const ChatTemplate& tmpl, ParsedCompletion& out,
                                   const jinja::RenderOptions& render) {
  ojson body;
  try {
    body = ojson::parse(text);
  } catch (const ojson::exception& e) {
    return {400, std::string("the body is not valid JSON: ") + e.what(), ""};
  }
  if (!body.is_object()) return {400, "the body must be a JSON object", ""};
  try {
    read_common(body, out.request, out.stream, out.include_usage);
    if (chat) {
      if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
        throw BadField{"messages", "'messages' must be a non-empty array"};
      ChatInput in;
      for (size_t i = 0; i < body["messages"].size(); ++i) in.messages.push_back(template_message(body["messages"][i], i, in.messages));
      in.tools = read_tools(body);
      if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
        if (!body["chat_template_kwargs"].is_object())
          throw BadField{"chat_template_kwargs", "'chat_template_kwargs' must be an object"};
        in.kwargs = body["chat_template_kwargs"];
      }
      if (body.contains("reasoning_effort") && body["reasoning_effort"].is_string() && !in.kwargs.contains("reasoning_effort"))
        in.kwargs["reasoning_effort"] = body["reasoning_effort"];
      if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null()) {
        if (!body["parallel_tool_calls"].is_boolean())
          throw BadField{"parallel_tool_calls", "'parallel_tool_calls' must be a boolean"};
        out.parallel_tool_calls = body["parallel_tool_calls"].get<bool>();
      }
      auto prompt = tmpl.render(in, render);
      if (!prompt) return {400, "the chat template refused the request: " + prompt.error().message, "messages"};
      out.prompt = std::move(*prompt);
      const ReplySyntax& rs = tmpl.reply_syntax();
      out.parse_reply = rs.tools != ToolSyntax::none || rs.reasoning != ReasoningSyntax::none;
      out.in_reasoning = prompt_opens_reasoning(rs, out.prompt);
      out.request.special_text = out.parse_reply;
      if (const std::string name = forced_name(body, in.tools); !name.empty() && out.parse_reply)
        forced_call_text(tmpl, in, out.prompt, name, render, out);
      if (body.contains("logprobs") && !body["logprobs"].is_null()) {
        if (!body["logprobs"].is_boolean()) throw BadField{"logprobs", "'logprobs' must be a boolean"};
        out.logprobs = body["logprobs"].get<bool>();
      }
      if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
        if (!body["top_logprobs"].is_number_integer() || body["top_logprobs"].get<int64_t>() < 0 ||
            body["top_logprobs"].get<int64_t>() > 20)
          throw BadField{"top_logprobs", "'top_logprobs' must be an integer between 0 and 20"};
        if (!out.logprobs) throw BadField{"top_logprobs", "'top_logprobs' needs 'logprobs': true"};
        out.request.top_logprobs = int(body["top_logprobs"].get<int64_t>());
      } else if (out.logprobs) {
        out.request.top_logprobs = 0;
      }
    } else {
      if (!body.contains("prompt")) throw BadField{"prompt", "'prompt' is required"};
      const ojson& p = body["prompt"];
      if (p.is_string()) {
        out.prompt = p.get<std::string>();
      } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
        out.prompt = p[0].get<std::string>();
      } else {
        throw BadField{"prompt", "'prompt' must be a string (or an array of one string)"};
      }
      // the legacy endpoint: logprobs is the number of alternatives (0..5)
      if (body.contains("logprobs") && !body["logprobs"].is_null()) {
        if (!body["logprobs"].is_number_integer() || body["logprobs"].get<int64_t>() < 0 ||
            body["logprobs"].get<int64_t>() > 5)
          throw BadField{"logprobs", "'logprobs' must be an integer between 0 and 5"};
        out.logprobs = true;
        out.request.top_logprobs = int(body["logprobs"].get<int64_t>());
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
          {"total_tokens", s.prompt_tokens + s.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.cached_tokens}}}};
}

std::string finish_reason(const CompletionSummary& s) {
  return s.finish_reason == "length" ? "length" : "stop";
}

json bytes_of(const std::string& t) {
  json b = json::array();
  for (unsigned char c : t) b.push_back(int(c));
  return b;
}

// OpenAI's logprobs object: chat's {"content": [...]}, or the legacy endpoint's parallel arrays
// (`offset`: the text's length before these tokens).
json logprobs_json(const std::vector<TokenLogprob>& lps, bool chat, size_t offset = 0) {
  if (chat) {
    json content = json::array();
    for (const TokenLogprob& t : lps) {
      json top = json::array();
      for (const auto& [tok, lp] : t.top) top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", bytes_of(tok)}});
      content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytes_of(t.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const TokenLogprob& t : lps) {
    tokens.push_back(t.token);
    token_logprobs.push_back(t.logprob);
    json alts = json::object();
    for (const auto& [tok, lp] : t.top) alts[tok] = lp;
    top.push_back(alts);
    offsets.push_back(offset);
    offset += t.token.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

// `text` up to the first end-of-generation token or text (<|im_end|> and the like, also where the
// vocabulary lacks it): what a forced call's closer keeps; the rest ends the turn.
std::string until_end_of_turn(const Tokenizer& tok, const std::string& text) {
  size_t end = text.size();
  auto cut_at = [&](std::string_view marker) {
    if (const size_t at = text.find(marker); !marker.empty() && at < end) end = at;
  };
  for (std::string_view m : end_of_generation_texts()) cut_at(m);
  for (TokenId t : tok.eog_tokens()) cut_at(tok.token_text(t));
  return text.substr(0, end);
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls)
    out.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

}  // namespace

HttpServer::HttpServer(Scheduler& scheduler, const Tokenizer& tok, ChatTemplate chat_template, std::string model_id,
                       const ModelSummary& summary, HttpOptions o)
    : scheduler_(scheduler),
      tok_(tok),
      template_(std::move(chat_template)),
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
    metric("strata_prompt_cached_tokens_total", "counter", "prompt tokens reused from a slot's prompt cache", double(m.cached_tokens_total));
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
    if (RequestError e = parse_completion_body(req.body, chat, template_, parsed); e.status != 0) {
      send_error(res, e.status, e.message, "invalid_request_error", e.param);
      return;
    }
    CompletionRequest r = std::move(parsed.request);
    const bool stream = parsed.stream, include_usage = parsed.include_usage;
    const std::string& prompt = parsed.prompt;
    if (parsed.forced) {
      r.json_object = true;
      r.suffix = until_end_of_turn(tok_, parsed.forced_closer);
    }
    const std::string opener = parsed.forced_opener;
    // chat templates spell out BOS where they want one; raw text gets the vocabulary's own
    r.prompt = tok_.tokenize(prompt + opener, !chat || (!template_.is_jinja() && template_.name() == "raw"), chat);
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
    const ReplySyntax syntax = template_.reply_syntax();
    const bool split = chat && parsed.parse_reply, parallel = parsed.parallel_tool_calls, logprobs = parsed.logprobs;
    if (!stream) {
      std::vector<TokenLogprob> lps;
      const std::string text = opener + j->wait_all(&lps);
      const CompletionSummary sum = j->summary();
      if (sum.finish_reason == "error") {
        send_error(res, 500, sum.error, "server_error");
        return;
      }
      const json lp = logprobs ? logprobs_json(lps, chat) : json(nullptr);
      json choice;
      if (chat) {
        json message = {{"role", "assistant"}, {"content", text}};
        std::string reason = finish_reason(sum);
        if (split) {
          Reply reply = parse_reply(syntax, text, parsed.in_reasoning);
          if (!parallel && reply.tool_calls.size() > 1) reply.tool_calls.resize(1);
          message["content"] = reply.content.empty() && !reply.tool_calls.empty() ? json(nullptr) : json(reply.content);
          if (!reply.reasoning.empty()) message["reasoning_content"] = reply.reasoning;
          if (!reply.tool_calls.empty()) {
            message["tool_calls"] = tool_calls_json(reply.tool_calls);
            reason = "tool_calls";
          }
        }
        choice = {{"index", 0}, {"message", message}, {"finish_reason", reason}, {"logprobs", lp}};
      } else {
        choice = {{"index", 0}, {"text", text}, {"finish_reason", finish_reason(sum)}, {"logprobs", lp}};
      }
      json out = {{"id", id},          {"object", object},  {"created", created_},
                  {"model", model_id_}, {"choices", json::array({choice})}, {"usage", usage_json(sum)}};
      res.set_content(dump(out), "application/json");
      return;
    }
    // server-sent events: one chunk per piece of text (content, reasoning and tool-call deltas
    // apart), then the finish reason, then [DONE]
    const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
    const int64_t created = created_;
    const std::string model = model_id_;
    auto reply = split ? std::make_shared<ReplyStream>(syntax, parsed.in_reasoning) : nullptr;
    ReplyDelta opened;  // a forced call's opening text: held back by the parser until the call closes
    if (reply) opened = reply->feed(opener);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [j, id, chunk_object, created, model, chat, include_usage, reply, parallel, logprobs, opened, first = true,
         calls = false, offset = size_t(0)](size_t, httplib::DataSink& sink) mutable {
          auto send = [&](const json& choice, const json& usage) {
            json c = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                      {"choices", choice.is_null() ? json::array() : json::array({choice})}};
            if (!usage.is_null()) c["usage"] = usage;
            const std::string line = "data: " + dump(c) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          // a chat delta of what the reply parser released (or the text as it is)
          auto delta_of = [&](const ReplyDelta& d) {
            json delta = json::object();
            if (!d.content.empty()) delta["content"] = d.content;
            if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
            json tcs = json::array();
            for (const ToolCallDelta& t : d.tool_calls) {
              if (!parallel && t.index > 0) continue;
              json tc = {{"index", t.index}, {"function", {{"arguments", t.arguments}}}};
              if (!t.name.empty()) {
                tc["id"] = t.id;
                tc["type"] = "function";
                tc["function"]["name"] = t.name;
              }
              tcs.push_back(tc);
            }
            if (!tcs.empty()) {
              delta["tool_calls"] = tcs;
              calls = true;
            }
            return delta;
          };
          auto send_delta = [&](const json& delta, const std::vector<TokenLogprob>& lps) {
            if (delta.empty() && lps.empty()) return true;
            json choice = {{"index", 0}, {"delta", delta}, {"finish_reason", nullptr}};
            if (logprobs) choice["logprobs"] = logprobs_json(lps, true);
            return send(choice, nullptr);
          };
          if (first && chat) {
            first = false;
            if (!send({{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}, nullptr) ||
                !send_delta(delta_of(opened), {})) {
              j->cancel();
              return false;
            }
          }
          JobPiece piece;
          if (j->next(piece)) {
            bool ok = true;
            if (!chat) {
              json choice = {{"index", 0}, {"text", piece.text}, {"finish_reason", nullptr}};
              if (logprobs) choice["logprobs"] = logprobs_json(piece.logprobs, false, offset);
              offset += piece.text.size();
              ok = send(choice, nullptr);
            } else if (reply) {
              ok = send_delta(delta_of(reply->feed(piece.text)), piece.logprobs);
            } else {
              ok = send_delta(piece.text.empty() ? json::object() : json{{"content", piece.text}}, piece.logprobs);
            }
            if (!ok) {
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
            if (reply) send_delta(delta_of(reply->finish()), {});
            const std::string reason = calls ? "tool_calls" : finish_reason(sum);
            const json choice = chat ? json{{"index", 0}, {"delta", json::object()}, {"finish_reason", reason}}
                                     : json{{"index", 0}, {"text", ""}, {"finish_reason", reason}};
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
