// The OpenAI-compatible HTTP front of the scheduler (docs/server.md): POST /v1/chat/completions
// and /v1/completions (streamed as server-sent events or not), GET /v1/models, /health and
// /metrics (Prometheus text). Chat requests are rendered with the model's own chat template
// (tools, tool results, reasoning history, chat_template_kwargs); replies are parsed back into
// content, reasoning_content and tool_calls (model/chat_reply.h). Every malformed request, and a
// template that refuses it, gets an OpenAI-shaped JSON error with a 4xx status; a client that
// disconnects mid-stream cancels its sequence.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "base/error.h"
#include "model/chat_template.h"
#include "model/model_info.h"
#include "server/scheduler.h"

namespace httplib {
class Server;
}

namespace strata::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: any free port (tests)
  std::string api_key;         // empty: no authentication
  size_t max_body = 4u << 20;  // bytes of a request body
  int http_threads = 32;       // connections served at once (streams hold one each)
};

class HttpServer {
 public:
  HttpServer(Scheduler& scheduler, const Tokenizer& tok, ChatTemplate chat_template, std::string model_id,
             const ModelSummary& summary, HttpOptions o);
  ~HttpServer();

  // Binds the socket; returns the port (useful with port 0) or an Error naming host and port.
  Result<int> bind();
  // Serves until stop() (blocks).
  void run();
  void stop();
  // One connection's bytes (request line, headers, body; possibly several requests) answered
  // through the same parser and routes as a socket, without one: the raw response bytes
  // (fuzz/fuzz_http_request.cpp). Blocks until every response is complete.
  std::string handle_bytes(std::string_view input);

 private:
  void routes();
  Scheduler& scheduler_;
  const Tokenizer& tok_;
  const ChatTemplate template_;
  const std::string model_id_;
  const ModelSummary summary_;
  const HttpOptions o_;
  const int64_t created_;
  std::unique_ptr<httplib::Server> http_;
};

// A completion request's body, checked: the request (sampling, limits, stop strings, logprobs;
// prompt ids not yet filled), the prompt text (chat messages rendered with the template), and how
// to answer.
struct ParsedCompletion {
  CompletionRequest request;
  std::string prompt;
  bool stream = false, include_usage = false;
  bool parse_reply = false;        // chat: split the reply into content, reasoning and tool calls
  bool in_reasoning = false;       // the prompt leaves the reply inside an open reasoning block
  bool parallel_tool_calls = true; // false: only the first call is kept
  bool logprobs = false;
  // A forced tool call (tool_choice a named function, or "required" with one tool, where the
  // template writes the arguments as JSON): the prompt goes on with `forced_opener` (the template's
  // own text of a call of that function up to its arguments), the reply is held to one JSON
  // object, and `forced_closer` (what the template writes after the arguments) ends the call.
  bool forced = false;
  std::string forced_opener, forced_closer;
};
// What to answer instead (status 0: the body is fine).
struct RequestError {
  int status = 0;
  std::string message, param;
};
// The body of POST /v1/chat/completions (chat) or /v1/completions. Any bytes: a ParsedCompletion,
// or a 400 with a message naming the field or what the template raised; never a crash
// (fuzz/fuzz_http_request.cpp). `render` fixes strftime_now's time (tests).
RequestError parse_completion_body(const std::string& body, bool chat, const ChatTemplate& tmpl, ParsedCompletion& out,
                                   const jinja::RenderOptions& render = {});

// Constant-time comparison (API keys): the time does not depend on where the strings differ.
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace strata::server
