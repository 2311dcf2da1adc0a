// A Jinja2 template engine for LLM chat templates (HuggingFace `tokenizer.chat_template`): renders
// byte for byte what Python's jinja2 renders under transformers' `apply_chat_template` rules, i.e.
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols) with the
// globals raise_exception and strftime_now and transformers' tojson filter. Values follow Python
// semantics (repr printing of lists and dicts, floor division, code-point string indexing).
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace strata::jinja {

// Ordered: Python dicts keep insertion order, and tojson must too.
using Json = nlohmann::ordered_json;

struct RenderOptions {
  std::optional<std::tm> now;  // what strftime_now formats; nullopt: the local time now
};

// A parsed template: immutable, cheap to copy (shared), safe to render from several threads.
class Template {
 public:
  // Parses a template; a syntax error is an Error "line N: ..." (message one line).
  static Result<Template> parse(std::string_view source);
  // Renders with `context` (a JSON object: its keys become the template's variables). A template
  // error (raise_exception(msg), calling an undefined function, a type error, a runaway
  // loop/recursion/output-size limit) is an Error whose message is what Python's jinja2 puts in
  // the exception: for raise_exception("x") the message is "x".
  Result<std::string> render(const Json& context, const RenderOptions& o = {}) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace strata::jinja
