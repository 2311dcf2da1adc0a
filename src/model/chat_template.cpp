#include "model/chat_template.h"

#include <fstream>
#include <sstream>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace strata {

Result<ChatFormat> chat_format_from_name(std::string_view name) {
  for (ChatFormat f : {ChatFormat::raw, ChatFormat::chatml, ChatFormat::qwen3, ChatFormat::deepseek3,
                       ChatFormat::harmony})
    if (chat_format_name(f) == name) return f;
  return Error{strfmt("unknown chat template '%.*s' (known: raw, chatml, qwen3, deepseek3, harmony)",
                      int(name.size()), name.data())};
}

std::string_view chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::raw: return "raw";
    case ChatFormat::chatml: return "chatml";
    case ChatFormat::qwen3: return "qwen3";
    case ChatFormat::deepseek3: return "deepseek3";
    case ChatFormat::harmony: return "harmony";
  }
  return "?";
}

std::string format_chat(ChatFormat f, const std::vector<ChatMessage>& messages, const ChatOptions& o) {
  std::string out;
  switch (f) {
    case ChatFormat::raw:
      for (const ChatMessage& m : messages) out += m.content;
      return out;
    case ChatFormat::chatml:
    case ChatFormat::qwen3:
      for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (o.add_generation_prompt) {
        out += "<|im_start|>assistant\n";
        if (f == ChatFormat::qwen3 && !o.thinking) out += "<think>\n\n</think>\n\n";
      }
      return out;
    case ChatFormat::deepseek3: {
      out = "<｜begin▁of▁sentence｜>";
      for (const ChatMessage& m : messages)
        if (m.role == "system") out += m.content;
      for (const ChatMessage& m : messages) {
        if (m.role == "user") out += "<｜User｜>" + m.content;
        else if (m.role == "assistant") out += "<｜Assistant｜>" + m.content + "<｜end▁of▁sentence｜>";
      }
      if (o.add_generation_prompt) out += "<｜Assistant｜>";
      return out;
    }
    case ChatFormat::harmony: {
      out = std::string("<|start|>system<|message|>You are ChatGPT, a large language model trained by "
                        "OpenAI.\n\nReasoning: ") + o.reasoning +
            "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every "
            "message.<|end|>";
      std::string developer;
      for (const ChatMessage& m : messages)
        if (m.role == "system") developer += m.content;
      if (!developer.empty())
        out += "<|start|>developer<|message|># Instructions\n\n" + developer + "<|end|>";
      for (const ChatMessage& m : messages) {
        if (m.role == "user") out += "<|start|>user<|message|>" + m.content + "<|end|>";
        else if (m.role == "assistant") out += "<|start|>assistant<|channel|>final<|message|>" + m.content + "<|end|>";
      }
      if (o.add_generation_prompt) out += "<|start|>assistant";
      return out;
    }
  }
  return out;
}


Result<ChatTemplate> ChatTemplate::from_source(std::string_view source, std::string bos, std::string eos) {
  auto t = jinja::Template::parse(source);
  if (!t) return Error{"chat template: " + t.error().message};
  ChatTemplate c;
  c.jinja_ = std::move(*t);
  c.bos_ = std::move(bos);
  c.eos_ = std::move(eos);
  c.syntax_ = detect_reply_syntax(source);
  return c;
}

ChatTemplate ChatTemplate::builtin(ChatFormat f) {
  ChatTemplate c;
  c.builtin_ = f;
  if (f == ChatFormat::qwen3) c.syntax_ = {ToolSyntax::hermes, ReasoningSyntax::think_tags};
  if (f == ChatFormat::chatml) c.syntax_ = {ToolSyntax::hermes, ReasoningSyntax::none};
  if (f == ChatFormat::deepseek3) c.syntax_ = {ToolSyntax::deepseek_v3, ReasoningSyntax::think_tags};
  if (f == ChatFormat::harmony) c.syntax_ = {ToolSyntax::harmony, ReasoningSyntax::harmony};
  return c;
}

std::string ChatTemplate::name() const { return jinja_ ? "jinja" : std::string(chat_format_name(builtin_)); }

Result<std::string> ChatTemplate::render(const ChatInput& in, const jinja::RenderOptions& o) const {
  if (jinja_) {
    // the variables apply_chat_template passes: the extra keyword arguments first, so that
    // messages, tools and the special tokens always mean what they say
    jinja::Json ctx = in.kwargs.is_object() ? in.kwargs : jinja::Json::object();
    ctx["messages"] = in.messages;
    if (!in.tools.is_null()) ctx["tools"] = in.tools;
    ctx["add_generation_prompt"] = in.add_generation_prompt;
    ctx["bos_token"] = bos_;
    ctx["eos_token"] = eos_;
    return jinja_->render(ctx, o);
  }
  // a built-in format: the turns' text; tool calls and reasoning are the template's business
  std::vector<ChatMessage> messages;
  for (const jinja::Json& m : in.messages) {
    std::string content;
    if (m.contains("content") && m["content"].is_string()) content = m["content"].get<std::string>();
    messages.push_back({m.value("role", std::string()), std::move(content)});
  }
  ChatOptions co;
  co.add_generation_prompt = in.add_generation_prompt;
  if (in.kwargs.is_object() && in.kwargs.contains("enable_thinking") && in.kwargs["enable_thinking"].is_boolean())
    co.thinking = in.kwargs["enable_thinking"].get<bool>();
  return format_chat(builtin_, messages, co);
}

Result<ChatTemplate> load_chat_template(const GgufFile& file, const Tokenizer& tok, const std::string& template_file,
                                        const std::string& builtin_name) {
  auto special = [&](TokenId id) { return id == kNoToken ? std::string() : tok.token_text(id); };
  if (!template_file.empty()) {
    std::ifstream in(template_file, std::ios::binary);
    if (!in) return Error{"cannot read the chat template file '" + template_file + "'"};
    std::stringstream ss;
    ss << in.rdbuf();
    auto t = ChatTemplate::from_source(ss.str(), special(tok.bos()), special(tok.eos()));
    if (!t) return Error{template_file + ": " + t.error().message};
    return t;
  }
  if (!builtin_name.empty()) {
    auto f = chat_format_from_name(builtin_name);
    if (!f) return f.error();
    return ChatTemplate::builtin(*f);
  }
  auto src = file.get_string("tokenizer.chat_template");
  if (!src) return src.error();
  if (!src->has_value() || (*src)->empty()) return ChatTemplate::builtin(ChatFormat::raw);
  return ChatTemplate::from_source(**src, special(tok.bos()), special(tok.eos()));
}

}  // namespace strata
