// strata template: renders a chat template with a context, exactly as transformers'
// apply_chat_template does (the prompt strata's server and chat would send the model), and prints
// it with nothing added. The template is the GGUF's (-m) or a file (-t); CONTEXT.json holds the
// variables (messages, tools, add_generation_prompt, bos_token, eos_token, extra keyword
// arguments such as enable_thinking), the "context" object of a ../shared/chat vector.
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "jinja/jinja.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace strata::cli {
namespace {

struct TemplateOptions {
  std::string model;
  std::string file;
  std::string context;
  std::string now;
};

int fail(const std::string& m) {
  std::fprintf(stderr, "strata template: %s\n", m.c_str());
  return 1;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{"cannot read '" + path + "'"};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run_template(const TemplateOptions& o) {
  if (o.model.empty() == o.file.empty()) return fail("give the template as -m MODEL.gguf or -t FILE.jinja (one of them)");
  auto ctx_text = read_file(o.context);
  if (!ctx_text) return fail(ctx_text.error().message);
  jinja::Json ctx = jinja::Json::parse(*ctx_text, nullptr, false);
  if (ctx.is_discarded() || !ctx.is_object()) return fail(o.context + ": not a JSON object");
  jinja::RenderOptions ro;
  if (!o.now.empty()) {
    std::tm tm{};
    std::istringstream in(o.now);
    in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
    if (in.fail()) return fail("--now must look like 2026-12-02T09:30:00, got '" + o.now + "'");
    tm.tm_isdst = -1;
    std::time_t t = std::mktime(&tm);  // fills the weekday and day of the year
    localtime_r(&t, &tm);
    ro.now = tm;
  }
  std::string source;
  if (!o.file.empty()) {
    auto s = read_file(o.file);
    if (!s) return fail(s.error().message);
    source = std::move(*s);
  } else {
    auto file = GgufFile::open(o.model);
    if (!file) return fail(file.error().message);
    auto s = file->get_string("tokenizer.chat_template");
    if (!s) return fail(s.error().message);
    if (!s->has_value()) return fail(o.model + " has no tokenizer.chat_template");
    source = std::move(**s);
    // the vocabulary's BOS and EOS where the context does not give them
    if (!ctx.contains("bos_token") || !ctx.contains("eos_token")) {
      auto tok = Tokenizer::from_gguf(*file);
      if (!tok) return fail(tok.error().message);
      auto text = [&](TokenId id) { return id == kNoToken ? std::string() : tok->token_text(id); };
      if (!ctx.contains("bos_token")) ctx["bos_token"] = text(tok->bos());
      if (!ctx.contains("eos_token")) ctx["eos_token"] = text(tok->eos());
    }
  }
  auto t = jinja::Template::parse(source);
  if (!t) return fail((o.file.empty() ? o.model : o.file) + ": " + t.error().message);
  auto out = t->render(ctx, ro);
  if (!out) return fail(out.error().message);
  std::fwrite(out->data(), 1, out->size(), stdout);
  return 0;
}

}  // namespace

Runner add_template_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("template", "render a chat template with a context (what the model is sent)");
  auto o = std::make_shared<TemplateOptions>();
  sub->add_option("-m,--model", o->model, "the GGUF whose tokenizer.chat_template to render");
  sub->add_option("-t,--template-file", o->file, "a Jinja template file to render");
  sub->add_option("--context", o->context, "JSON object of the template's variables (messages, tools, ...)")->required();
  sub->add_option("--now", o->now, "the local time strftime_now formats (default: now), e.g. 2026-12-02T09:30:00");
  return [o] { return run_template(*o); };
}

}  // namespace strata::cli
