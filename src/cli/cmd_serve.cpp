// strata serve: the OpenAI-compatible HTTP server (docs/server.md) on the bundled model when -m is
// not given. Listens on loopback unless told otherwise; Ctrl-C stops it.

#include <csignal>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/speculative.h"
#include "server/http_server.h"

namespace strata::cli {
namespace {

struct ServeOptions {
  CommonOptions common;
  std::optional<std::string> host;
  std::optional<int> port;
  std::optional<std::string> api_key;
  std::optional<int> max_sequences;
  std::string template_name;
  std::string template_file;
  std::string alias;
  DraftOptions draft;
};

server::HttpServer* g_server = nullptr;
server::Scheduler* g_scheduler = nullptr;
extern "C" void on_signal(int) {
  // running sequences end at the next step, so the connections waiting on them close
  if (g_scheduler) g_scheduler->cancel_all();
  if (g_server) g_server->stop();
}

int fail(const std::string& m) {
  std::fprintf(stderr, "strata serve: %s\n", m.c_str());
  return 1;
}

int run_serve(ServeOptions o) {
  // the flags name config keys, like -t and --ctx
  if (o.host) o.common.sets.push_back("server.host=\"" + *o.host + "\"");
  if (o.port) o.common.sets.push_back("server.port=" + std::to_string(*o.port));
  if (o.max_sequences) o.common.sets.push_back("server.max_sequences=" + std::to_string(*o.max_sequences));
  if (Status st = check_drafter_name(o.draft.drafter); !st) return fail(st.error().message);
  auto loaded = load_model(o.common, "strata serve");
  if (!loaded) return fail(loaded.error().message);
  const Engine& engine = **loaded;
  const Config& c = engine.config();
  const Model& m = engine.model();
  auto tok = Tokenizer::from_gguf(m.file());
  if (!tok) return fail(tok.error().message);
  auto chat_template = load_chat_template(m.file(), *tok, o.template_file, o.template_name);
  if (!chat_template) return fail(chat_template.error().message);
  server::SchedulerOptions so;
  so.max_sequences = c.max_sequences;
  so.max_queue = c.max_queue;
  so.ctx = int(context_limit(m, c, 4096));
  so.kv_type = c.kv_type;
  so.cache_prompt = c.cache_prompt;
  so.prefill_chunk = c.prefill_chunk;
  if (o.draft.drafter == "mtp" && m.mtp == nullptr) return fail("--draft mtp: " + m.mtp_error);
  so.drafter = o.draft.drafter.empty() ? "none" : o.draft.drafter;
  so.max_draft = o.draft.max;
  server::Scheduler scheduler(engine, *tok, so);
  server::HttpOptions ho;
  ho.host = c.host;
  ho.port = c.port;
  ho.api_key = o.api_key ? *o.api_key : c.api_key;
  ho.max_body = size_t(c.max_body);
  std::string id = o.alias;
  if (id.empty()) {
    id = c.model_path.substr(c.model_path.rfind('/') == std::string::npos ? 0 : c.model_path.rfind('/') + 1);
    if (id.size() > 5 && id.substr(id.size() - 5) == ".gguf") id.resize(id.size() - 5);
  }
  const std::string template_name = chat_template->name();
  server::HttpServer http(scheduler, *tok, std::move(*chat_template), id, engine.summary(), ho);
  auto port = http.bind();
  if (!port) return fail(port.error().message);
  g_server = &http;
  g_scheduler = &scheduler;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::fprintf(stderr,
               "strata serve: model '%s' (template %s) on http://%s:%d/v1: %d sequences of %d tokens, queue %d%s%s\n",
               id.c_str(), template_name.c_str(), ho.host.c_str(), *port, so.max_sequences,
               so.ctx, so.max_queue, ho.api_key.empty() ? "" : ", API key required",
               so.drafter == "none" ? "" : strfmt(", drafts: %s up to %d", so.drafter.c_str(), so.max_draft).c_str());
  http.run();
  g_server = nullptr;
  g_scheduler = nullptr;
  std::fprintf(stderr, "strata serve: stopped\n");
  return 0;
}

}  // namespace

Runner add_serve_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat and text completions, streaming)");
  auto o = std::make_shared<ServeOptions>();
  add_common(sub, o->common);
  sub->add_option("--host", o->host, "address to listen on (server.host; default 127.0.0.1)");
  sub->add_option("--port", o->port, "port (server.port; default 8080)")->check(CLI::Range(0, 65535));
  sub->add_option("--api-key", o->api_key, "require Authorization: Bearer KEY (server.api_key)");
  sub->add_option("--max-sequences", o->max_sequences, "sequences decoded together (server.max_sequences; default 4)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--chat-template-file", o->template_file, "a Jinja chat template to use instead of the GGUF's");
  sub->add_option("--template", o->template_name,
                  "a built-in chat format for GGUFs without a template: qwen3, chatml, deepseek3, harmony, raw");
  sub->add_option("--alias", o->alias, "model id reported by /v1/models (default: the file name)");
  add_draft_options(sub, o->draft);
  return [o] { return run_serve(*o); };
}

}  // namespace strata::cli
