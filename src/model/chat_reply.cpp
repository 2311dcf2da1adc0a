#include "model/chat_reply.h"

#include <optional>
#include <random>

#include <nlohmann/json.hpp>

namespace strata {
namespace {

using Json = nlohmann::ordered_json;  // ordered: arguments keep the model's key order
constexpr size_t npos = std::string_view::npos;

// A call as a parser finds it; the id stays empty unless the syntax carries one.
struct Call {
  std::string name = {}, arguments = {}, id = {};  // "= {}": -Wextra accepts leaving them out
};
// What parse_text found. Partial: only what no later text can change.
struct Parsed {
  std::string content, reasoning;
  std::vector<Call> calls;
};
using Calls = std::optional<std::vector<Call>>;  // nullopt: the text is not calls

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
std::string_view trim_left(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  return s.substr(i);
}
std::string_view trim_right(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && is_space(s[n - 1])) --n;
  return s.substr(0, n);
}
std::string_view trim(std::string_view s) { return trim_right(trim_left(s)); }

// The length of the longest end of `text` that is a proper beginning of `marker`: a marker that may
// still be being written.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}
// `text` without an end that may still become one of `markers`.
std::string_view hold_markers(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t hold = 0;
  for (std::string_view m : markers) hold = std::max(hold, partial_marker(text, m));
  return text.substr(0, text.size() - hold);
}

// Consumes `prefix` from the front of `s`.
bool eat(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}
// The text of `s` before `end`, consuming both; nullopt (and `s` untouched) without `end`.
std::optional<std::string_view> until(std::string_view& s, std::string_view end) {
  const size_t at = s.find(end);
  if (at == npos) return std::nullopt;
  std::string_view before = s.substr(0, at);
  s.remove_prefix(at + end.size());
  return before;
}

std::optional<Json> parse_json(std::string_view text) {
  try {
    Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  } catch (const Json::exception&) {
    return std::nullopt;
  }
}
// Compact, and invalid UTF-8 in a string becomes U+FFFD instead of an exception.
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Arguments as OpenAI sends them, a JSON object in compact text; a string holding an object (some
// models quote their arguments) is unwrapped. nullopt: not an object.
std::optional<std::string> arguments_text(const Json& args) {
  if (args.is_string()) {
    const std::optional<Json> inner = parse_json(args.get_ref<const std::string&>());
    if (inner && inner->is_object()) return dump(*inner);
    return std::nullopt;
  }
  if (!args.is_object()) return std::nullopt;
  return dump(args);
}
std::optional<std::string> arguments_text(std::string_view json_text) {
  const std::optional<Json> j = parse_json(json_text);
  if (!j) return std::nullopt;
  return arguments_text(*j);
}

// A parameter value of the XML syntaxes: the JSON it spells (42, true, {...}), else the string.
Json parameter_value(std::string_view raw) {
  if (std::optional<Json> j = parse_json(raw)) return std::move(*j);
  return Json(std::string(raw));
}

// A function or parameter name: not empty, no whitespace or markup in it.
bool is_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (is_space(c) || c == '<' || c == '>' || c == '"') return false;
  return true;
}

// One past the end of the JSON object or array at text[pos], by bracket balance outside strings;
// npos while it is still open.
size_t json_value_end(std::string_view text, size_t pos) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return npos;
}

// ---- the calls inside one block, per family ----

// {"name": N, "arguments": {...}} (Qwen2.5 writes "parameters" at times; no arguments is {}).
std::optional<Call> json_call(const Json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  Call c{.name = j["name"].get<std::string>()};
  if (!is_name(c.name)) return std::nullopt;
  const char* key = j.contains("arguments") ? "arguments" : "parameters";
  std::optional<std::string> args = j.contains(key) ? arguments_text(j[key]) : std::string("{}");
  if (!args) return std::nullopt;
  c.arguments = std::move(*args);
  return c;
}

Calls hermes_calls(std::string_view body) {
  const std::optional<Json> j = parse_json(body);
  if (!j) return std::nullopt;
  std::optional<Call> c = json_call(*j);
  if (!c) return std::nullopt;
  return std::vector<Call>{std::move(*c)};
}

// <function=N>\n<parameter=K>\nV\n</parameter>\n...</function>, one or more. The template writes
// each value between newlines; a model that leaves out </parameter> ends the value at the next
// parameter or </function>.
Calls qwen3_coder_calls(std::string_view body) {
  std::vector<Call> calls;
  std::string_view s = trim(body);
  while (!s.empty()) {
    if (!eat(s, "<function=")) return std::nullopt;
    const std::optional<std::string_view> name = until(s, ">");
    std::optional<std::string_view> inner = until(s, "</function>");
    if (!name || !inner || !is_name(trim(*name))) return std::nullopt;
    Json args = Json::object();
    std::string_view p = trim_left(*inner);
    while (!p.empty()) {
      if (!eat(p, "<parameter=")) return std::nullopt;
      const std::optional<std::string_view> key = until(p, ">");
      if (!key || !is_name(trim(*key))) return std::nullopt;
      const size_t end = std::min(p.find("</parameter>"), p.find("<parameter="));
      std::string_view value = p.substr(0, end);
      p.remove_prefix(end == npos ? p.size() : end);
      eat(p, "</parameter>");
      if (value.starts_with('\n')) value.remove_prefix(1);
      if (value.ends_with('\n')) value.remove_suffix(1);
      args[std::string(trim(*key))] = parameter_value(value);
      p = trim_left(p);
    }
    calls.push_back({.name = std::string(trim(*name)), .arguments = dump(args)});
    s = trim_left(s);
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>... (values raw: the template writes strings
// as they are and the rest as JSON).
Calls glm45_calls(std::string_view body) {
  std::string_view s = body;
  const size_t first_key = s.find("<arg_key>");
  const std::string_view name = trim(s.substr(0, first_key));
  if (!is_name(name)) return std::nullopt;
  s.remove_prefix(first_key == npos ? s.size() : first_key);
  Json args = Json::object();
  for (s = trim_left(s); !s.empty(); s = trim_left(s)) {
    if (!eat(s, "<arg_key>")) return std::nullopt;
    const std::optional<std::string_view> key = until(s, "</arg_key>");
    if (!key) return std::nullopt;
    s = trim_left(s);
    if (!eat(s, "<arg_value>")) return std::nullopt;
    const std::optional<std::string_view> value = until(s, "</arg_value>");
    if (!value || trim(*key).empty()) return std::nullopt;
    args[std::string(trim(*key))] = parameter_value(*value);
  }
  return std::vector<Call>{{.name = std::string(name), .arguments = dump(args)}};
}

// <P invoke name="N"><P parameter name="K" ...>V</P parameter>...</P invoke>, one or more, where P
// is "" (MiniMax) or "｜DSML｜" (DeepSeek V4). DSML says string="true" for a string value, and
// string="false" for JSON.
Calls invoke_calls(std::string_view body, std::string_view p) {
  const std::string invoke = "<" + std::string(p) + "invoke name=\"";
  const std::string invoke_end = "</" + std::string(p) + "invoke>";
  const std::string param = "<" + std::string(p) + "parameter name=\"";
  const std::string param_end = "</" + std::string(p) + "parameter>";
  std::vector<Call> calls;
  std::string_view s = trim(body);
  while (!s.empty()) {
    if (!eat(s, invoke)) return std::nullopt;
    const std::optional<std::string_view> name = until(s, "\"");
    if (!name || !is_name(*name)) return std::nullopt;
    s = trim_left(s);
    if (!eat(s, ">")) return std::nullopt;
    const std::optional<std::string_view> inner = until(s, invoke_end);
    if (!inner) return std::nullopt;
    Json args = Json::object();
    for (std::string_view q = trim_left(*inner); !q.empty(); q = trim_left(q)) {
      if (!eat(q, param)) return std::nullopt;
      const std::optional<std::string_view> key = until(q, "\"");
      const std::optional<std::string_view> attributes = until(q, ">");
      const std::optional<std::string_view> value = until(q, param_end);
      if (!key || key->empty() || !attributes || !value) return std::nullopt;
      if (attributes->find("string=\"true\"") != npos) args[std::string(*key)] = std::string(*value);
      else args[std::string(*key)] = parameter_value(*value);
    }
    calls.push_back({.name = std::string(*name), .arguments = dump(args)});
    s = trim_left(s);
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// <｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1) or
// <｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜> (V3, R1), one or
// more; the form is told by the code fence.
Calls deepseek_calls(std::string_view body) {
  std::vector<Call> calls;
  std::string_view s = trim(body);
  while (!s.empty()) {
    if (!eat(s, "<｜tool▁call▁begin｜>")) return std::nullopt;
    std::optional<std::string_view> call = until(s, "<｜tool▁call▁end｜>");
    if (!call) return std::nullopt;
    std::optional<std::string_view> before_sep = until(*call, "<｜tool▁sep｜>");
    if (!before_sep) return std::nullopt;
    std::string_view name = *before_sep, args = *call;
    if (call->find("```") != npos) {
      const size_t newline = call->find('\n');
      if (newline == npos) return std::nullopt;
      name = call->substr(0, newline);
      args = trim(call->substr(newline));
      if (!eat(args, "```json") && !eat(args, "```")) return std::nullopt;
      if (!args.ends_with("```")) return std::nullopt;
      args.remove_suffix(3);
    }
    name = trim(name);
    std::optional<std::string> a = arguments_text(args);
    if (!is_name(name) || !a) return std::nullopt;
    calls.push_back({.name = std::string(name), .arguments = std::move(*a)});
    s = trim_left(s);
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// <|tool_call_begin|>functions.N:I<|tool_call_argument_begin|>{...}<|tool_call_end|>, one or
// more; "functions.N:I" is the call's id.
Calls kimi_k2_calls(std::string_view body) {
  std::vector<Call> calls;
  std::string_view s = trim(body);
  while (!s.empty()) {
    if (!eat(s, "<|tool_call_begin|>")) return std::nullopt;
    const std::optional<std::string_view> id = until(s, "<|tool_call_argument_begin|>");
    const std::optional<std::string_view> args = until(s, "<|tool_call_end|>");
    if (!id || !args) return std::nullopt;
    std::string_view name = trim(*id);
    eat(name, "functions.");
    name = name.substr(0, name.rfind(':'));
    std::optional<std::string> a = arguments_text(*args);
    if (!is_name(name) || !a) return std::nullopt;
    calls.push_back({.name = std::string(name), .arguments = std::move(*a), .id = std::string(trim(*id))});
    s = trim_left(s);
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// [{"name": N, "arguments": {...}, "id": "..."}, ...], or one such object.
Calls mistral_calls(std::string_view body) {
  std::optional<Json> j = parse_json(body);
  if (!j) return std::nullopt;
  if (j->is_object()) j = Json::array({std::move(*j)});
  if (!j->is_array() || j->empty()) return std::nullopt;
  std::vector<Call> calls;
  for (const Json& e : *j) {
    std::optional<Call> c = json_call(e);
    if (!c) return std::nullopt;
    if (e.contains("id") && e["id"].is_string()) c->id = e["id"].get<std::string>();
    calls.push_back(std::move(*c));
  }
  return calls;
}

// ---- blocks of calls between content ----

// Where one kind of block of calls begins and ends.
struct BlockMarkers {
  std::string_view begin, end;  // end empty: the block is the JSON value after `begin` (Mistral)
};
struct BlockSyntax {
  std::vector<BlockMarkers> markers;
  Calls (*calls)(std::string_view body);
};

const BlockSyntax& block_syntax(ToolSyntax s) {
  static const BlockSyntax hermes{{{"<tool_call>", "</tool_call>"}}, hermes_calls};
  static const BlockSyntax qwen3_coder{{{"<tool_call>", "</tool_call>"}}, qwen3_coder_calls};
  static const BlockSyntax deepseek{{{"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"}}, deepseek_calls};
  static const BlockSyntax dsml{{{"<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"},
                                 {"<｜DSML｜function_calls>", "</｜DSML｜function_calls>"}},
                                [](std::string_view b) { return invoke_calls(b, "｜DSML｜"); }};
  static const BlockSyntax kimi_k2{{{"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"}},
                                   kimi_k2_calls};
  static const BlockSyntax glm45{{{"<tool_call>", "</tool_call>"}}, glm45_calls};
  static const BlockSyntax minimax{{{"<minimax:tool_call>", "</minimax:tool_call>"}},
                                   [](std::string_view b) { return invoke_calls(b, ""); }};
  static const BlockSyntax mistral{{{"[TOOL_CALLS]", ""}}, mistral_calls};
  switch (s) {
    case ToolSyntax::hermes: return hermes;
    case ToolSyntax::qwen3_coder: return qwen3_coder;
    case ToolSyntax::deepseek_v3:
    case ToolSyntax::deepseek_v31: return deepseek;
    case ToolSyntax::deepseek_v4: return dsml;
    case ToolSyntax::kimi_k2: return kimi_k2;
    case ToolSyntax::glm45: return glm45;
    case ToolSyntax::minimax_m2: return minimax;
    case ToolSyntax::mistral: return mistral;
    case ToolSyntax::none:
    case ToolSyntax::harmony:
    case ToolSyntax::llama3_json: break;
  }
  static const BlockSyntax no_blocks{{}, nullptr};
  return no_blocks;
}

// Where the block whose body starts at `body` ends: the body's end and one past the block's end.
// open: not closed (yet); broken: cannot become a block.
struct BlockEnd {
  enum { closed, open, broken } state;
  size_t body_end = 0, block_end = 0;
};
BlockEnd find_block_end(std::string_view text, size_t body, const BlockMarkers& m) {
  if (m.end.empty()) {
    size_t at = body;
    while (at < text.size() && is_space(text[at])) ++at;
    if (at == text.size()) return {BlockEnd::open};
    if (text[at] != '[' && text[at] != '{') return {BlockEnd::broken};
    const size_t end = json_value_end(text, at);
    if (end == npos) return {BlockEnd::open};
    return {BlockEnd::closed, end, end};
  }
  const size_t at = text.find(m.end, body);
  if (at == npos) return {BlockEnd::open};
  return {BlockEnd::closed, at, at + m.end.size()};
}

// Content and the calls of the blocks in `text`. Whitespace between content and a call is dropped
// (`after_break`: the text starts right after such a point, "</think>"). Partial: stops before an
// open block, and holds back an end that may become a marker or precede one.
void parse_blocks(const BlockSyntax& syntax, std::string_view text, bool partial, bool after_break, Parsed& out) {
  size_t segment = 0;  // where the content not yet appended starts
  size_t search = 0;   // where to look for the next block
  auto append = [&](std::string_view piece) {
    if (after_break) piece = trim_left(piece);
    out.content += piece;
  };
  for (;;) {
    size_t begin = npos;
    const BlockMarkers* m = nullptr;
    for (const BlockMarkers& candidate : syntax.markers) {
      const size_t at = text.find(candidate.begin, search);
      if (at < begin) begin = at, m = &candidate;
    }
    if (begin == npos) break;
    const size_t body = begin + m->begin.size();
    BlockEnd end = find_block_end(text, body, *m);
    if (end.state == BlockEnd::open) {
      if (partial) {
        append(trim_right(text.substr(segment, begin - segment)));
        return;
      }
      // a closing marker cut off as a stop string: the block ends with the text
      end = {BlockEnd::closed, text.size(), text.size()};
    }
    Calls calls;
    if (end.state == BlockEnd::closed) calls = syntax.calls(text.substr(body, end.body_end - body));
    if (!calls) {  // the marker is content; a block may still begin further on
      search = body;
      continue;
    }
    append(trim_right(text.substr(segment, begin - segment)));
    for (Call& c : *calls) out.calls.push_back(std::move(c));
    after_break = true;
    segment = search = end.block_end;
  }
  std::string_view tail = text.substr(segment);
  if (partial) {
    size_t hold = 0;
    for (const BlockMarkers& m : syntax.markers) hold = std::max(hold, partial_marker(tail, m.begin));
    tail = trim_right(tail.substr(0, tail.size() - hold));
  }
  append(tail);
}

// Llama 3: the whole reply is one call object, or it is content. Partial: held back while it may
// still become one.
void parse_llama3_json(std::string_view text, bool partial, bool after_break, Parsed& out) {
  if (after_break) text = trim_left(text);
  constexpr std::string_view python_tag = "<|python_tag|>";
  std::string_view rest = trim_left(text);
  if (partial && python_tag.starts_with(rest)) return;  // also: nothing but whitespace yet
  eat(rest, python_tag);
  rest = trim_left(rest);
  if (rest.empty() && partial) return;
  if (rest.starts_with('{')) {
    const size_t end = json_value_end(rest, 0);
    if (end == npos && partial) return;
    if (end != npos && trim(rest.substr(end)).empty()) {
      const std::optional<Json> j = parse_json(rest.substr(0, end));
      // "parameters" is what the template writes; an object without either is JSON content
      if (j && j->is_object() && (j->contains("parameters") || j->contains("arguments"))) {
        if (std::optional<Call> c = json_call(*j)) {
          if (partial) return;  // text may still follow it, and make it content
          out.calls.push_back(std::move(*c));
          return;
        }
      }
    }
  }
  out.content += text;
}

// gpt-oss: a run of messages, each a header ending in <|message|> and a body. The first header's
// "<|start|>assistant" is the prompt's.
void parse_harmony(std::string_view text, bool partial, Parsed& out) {
  static constexpr std::string_view ends[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
  size_t pos = 0;
  for (bool first = true; pos < text.size(); first = false) {
    size_t header = pos;
    if (text.substr(header).starts_with("<|start|>")) header += 9;
    const size_t message = text.find("<|message|>", header);
    if (message == npos) {
      // a reply without any harmony markup is content; a header cut short is dropped
      const std::string_view rest = text.substr(pos);
      if (!partial && first && rest.find("<|") == npos) out.content += rest;
      return;
    }
    const std::string_view h = text.substr(header, message - header);
    auto word_after = [&](std::string_view key) {
      const size_t at = h.find(key);
      if (at == npos) return std::string_view();
      std::string_view w = h.substr(at + key.size());
      size_t n = 0;
      while (n < w.size() && !is_space(w[n]) && w[n] != '<') ++n;
      return w.substr(0, n);
    };
    const std::string_view channel = word_after("<|channel|>");
    std::string_view recipient = word_after("to=");
    const size_t body = message + 11;
    // the first of `ends`, in one pass: a stream re-parses a long final message at every piece
    size_t end = npos, end_len = 0;
    for (size_t at = text.find("<|", body); at != npos && end == npos; at = text.find("<|", at + 2)) {
      for (std::string_view e : ends) {
        if (!text.substr(at).starts_with(e)) continue;
        end = at;
        end_len = e == "<|start|>" ? 0 : e.size();  // a <|start|> begins the next message
        break;
      }
    }
    std::string_view b = text.substr(body, end == npos ? npos : end - body);
    if (!recipient.empty()) {
      if (end == npos && partial) return;  // the call is undecided until its end
      eat(recipient, "functions.");
      std::optional<std::string> args = arguments_text(b);
      if (args && is_name(recipient)) out.calls.push_back({.name = std::string(recipient), .arguments = std::move(*args)});
      else out.content += b;
    } else {
      if (end == npos && partial) b = hold_markers(b, {"<|end|>", "<|call|>", "<|return|>", "<|start|>"});
      (channel == "analysis" ? out.reasoning : out.content) += b;
    }
    if (end == npos) return;
    pos = end + end_len;
  }
}

// The reply's parts; partial: only what the text to come cannot change (parse_reply of any longer
// text extends each part of it, and keeps its calls).
Parsed parse_text(const ReplySyntax& s, std::string_view text, bool in_reasoning, bool partial) {
  Parsed out;
  if (s.tools == ToolSyntax::harmony || s.reasoning == ReasoningSyntax::harmony) {
    parse_harmony(text, partial, out);
    return out;
  }
  bool after_think = false;
  if (s.reasoning == ReasoningSyntax::think_tags) {
    constexpr std::string_view open = "<think>", close = "</think>";
    size_t start = in_reasoning ? 0 : npos;
    if (!in_reasoning) {
      const std::string_view rest = trim_left(text);
      if (rest.starts_with(open)) start = text.size() - rest.size() + open.size();
      else if (partial && open.starts_with(rest)) return out;  // may still open a think block
    }
    if (start != npos) {
      const size_t end = text.find(close, start);
      if (end == npos) {
        std::string_view r = text.substr(start);
        if (partial) r = hold_markers(r, {close});
        out.reasoning = trim(r);
        return out;
      }
      out.reasoning = trim(text.substr(start, end - start));
      text.remove_prefix(end + close.size());
      after_think = true;
    }
  }
  if (s.tools == ToolSyntax::llama3_json) {
    parse_llama3_json(text, partial, after_think, out);
  } else if (s.tools == ToolSyntax::none) {
    out.content = after_think ? trim_left(text) : text;
  } else {
    parse_blocks(block_syntax(s.tools), text, partial, after_think, out);
  }
  return out;
}

std::string random_alnum(size_t n) {
  static constexpr char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof alnum - 2);
  std::string s(n, ' ');
  for (char& c : s) c = alnum[pick(rng)];
  return s;
}
std::string call_id(ToolSyntax s, const Call& c) {
  if (!c.id.empty()) return c.id;
  return s == ToolSyntax::mistral ? random_alnum(9) : "call_" + random_alnum(24);
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != npos; }

}  // namespace

ReplySyntax detect_reply_syntax(std::string_view t) {
  ReplySyntax s;
  if (contains(t, "<|channel|>")) return {ToolSyntax::harmony, ReasoningSyntax::harmony};
  if (contains(t, "<think>") || contains(t, "</think>")) s.reasoning = ReasoningSyntax::think_tags;
  if (contains(t, "DSML")) s.tools = ToolSyntax::deepseek_v4;
  else if (contains(t, "tool▁calls▁begin") || contains(t, "tool▁call▁begin"))
    s.tools = contains(t, "```json") ? ToolSyntax::deepseek_v3 : ToolSyntax::deepseek_v31;
  else if (contains(t, "<|tool_calls_section_begin|>")) s.tools = ToolSyntax::kimi_k2;
  else if (contains(t, "<minimax:tool_call>")) s.tools = ToolSyntax::minimax_m2;
  else if (contains(t, "<tool_call>") && contains(t, "<arg_key>")) s.tools = ToolSyntax::glm45;
  else if (contains(t, "<tool_call>") && contains(t, "<function=")) s.tools = ToolSyntax::qwen3_coder;
  else if (contains(t, "<tool_call>")) s.tools = ToolSyntax::hermes;
  else if (contains(t, "[TOOL_CALLS]")) s.tools = ToolSyntax::mistral;
  else if (contains(t, "<|start_header_id|>") && (contains(t, "<|python_tag|>") || contains(t, "\"parameters\"")))
    s.tools = ToolSyntax::llama3_json;
  return s;
}

std::string_view tool_syntax_name(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::none: return "none";
    case ToolSyntax::hermes: return "hermes";
    case ToolSyntax::qwen3_coder: return "qwen3_coder";
    case ToolSyntax::deepseek_v3: return "deepseek_v3";
    case ToolSyntax::deepseek_v31: return "deepseek_v31";
    case ToolSyntax::deepseek_v4: return "deepseek_v4";
    case ToolSyntax::kimi_k2: return "kimi_k2";
    case ToolSyntax::harmony: return "harmony";
    case ToolSyntax::glm45: return "glm45";
    case ToolSyntax::minimax_m2: return "minimax_m2";
    case ToolSyntax::mistral: return "mistral";
    case ToolSyntax::llama3_json: return "llama3_json";
  }
  return "none";
}

Reply parse_reply(const ReplySyntax& s, std::string_view text, bool in_reasoning) {
  Parsed p = parse_text(s, text, in_reasoning, /*partial=*/false);
  Reply r{.content = std::move(p.content), .reasoning = std::move(p.reasoning), .tool_calls = {}};
  for (Call& c : p.calls)
    r.tool_calls.push_back({.id = call_id(s.tools, c), .name = std::move(c.name), .arguments = std::move(c.arguments)});
  return r;
}

ReplyStream::ReplyStream(ReplySyntax s, bool in_reasoning) : syntax_(s), in_reasoning_(in_reasoning) {}

ReplyDelta ReplyStream::feed(std::string_view piece) {
  if (finished_) return {};
  text_ += piece;
  return release(false);
}

ReplyDelta ReplyStream::finish() {
  if (finished_) return {};
  finished_ = true;
  return release(true);
}

ReplyDelta ReplyStream::release(bool final) {
  Parsed p = parse_text(syntax_, text_, in_reasoning_, !final);
  ReplyDelta d;
  // parse_text's partial parts only ever grow; what was sent is their beginning
  auto grow = [](std::string& sent, const std::string& now, std::string& delta) {
    if (now.size() <= sent.size() || !now.starts_with(sent)) return;
    delta = now.substr(sent.size());
    sent = now;
  };
  grow(reply_.content, p.content, d.content);
  grow(reply_.reasoning, p.reasoning, d.reasoning);
  for (size_t i = reply_.tool_calls.size(); i < p.calls.size(); ++i) {
    Call& c = p.calls[i];
    ToolCall t{.id = call_id(syntax_.tools, c), .name = std::move(c.name), .arguments = std::move(c.arguments)};
    d.tool_calls.push_back({.index = int(i), .id = t.id, .name = t.name, .arguments = ""});
    d.tool_calls.push_back({.index = int(i), .id = "", .name = "", .arguments = t.arguments});
    reply_.tool_calls.push_back(std::move(t));
  }
  return d;
}

bool prompt_opens_reasoning(const ReplySyntax& s, std::string_view prompt) {
  return s.reasoning == ReasoningSyntax::think_tags && trim_right(prompt).ends_with("<think>");
}

}  // namespace strata
