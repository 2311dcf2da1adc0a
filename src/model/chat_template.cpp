#include "model/chat_template.h"

namespace strata {

namespace {
bool has(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }
}  // namespace

Result<ChatFormat> detect_chat_format(std::string_view t) {
  if (t.empty()) return ChatFormat::raw;
  if (has(t, "<｜User｜>") && has(t, "<｜Assistant｜>")) return ChatFormat::deepseek3;
  if (has(t, "<|im_start|>")) return has(t, "<think>") ? ChatFormat::qwen3 : ChatFormat::chatml;
  if (has(t, "<|start|>") && has(t, "<|message|>") && has(t, "<|channel|>")) return ChatFormat::harmony;
  return Error{"the model's chat template is not one strata knows (it formats qwen3, chatml, "
               "deepseek3 and harmony); pass --template NAME or --raw"};
}

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

}  // namespace strata
