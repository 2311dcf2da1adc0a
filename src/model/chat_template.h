// Chat formatting. A model's own template (the GGUF's tokenizer.chat_template, or a file) is
// rendered by strata's Jinja engine (src/jinja) exactly as transformers' apply_chat_template
// renders it: ChatTemplate. For a GGUF without a template, a named built-in format stands in
// (--template NAME); these are approximations of their families' templates:
//  - qwen3 (ChatML with <think>): <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n,
//    and with thinking off the empty block "<think>\n\n</think>\n\n" after the assistant header
//    (Qwen3's enable_thinking=false).
//  - chatml (Qwen2 and others without <think>): the same without the think block.
//  - deepseek3 (DeepSeek V3 / R1): <｜begin▁of▁sentence｜>system<｜User｜>u<｜Assistant｜>a
//    <｜end▁of▁sentence｜>...<｜Assistant｜>; R1's templates open the reply with "<think>\n".
//  - harmony (gpt-oss): <|start|>system<|message|>...<|end|> with the model's identity, reasoning
//    effort and channels, then <|start|>user<|message|>u<|end|>, past replies as
//    <|start|>assistant<|channel|>final<|message|>a<|end|>, and <|start|>assistant to reply.
//    (The real template's knowledge-cutoff / date lines and tool sections are left out.)
//  - raw: the turns' contents concatenated, for models without a template.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "jinja/jinja.h"
#include "model/chat_reply.h"

namespace strata {

enum class ChatFormat { raw, chatml, qwen3, deepseek3, harmony };

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

Result<ChatFormat> chat_format_from_name(std::string_view name);  // "qwen3", "chatml", ...
std::string_view chat_format_name(ChatFormat f);

struct ChatOptions {
  bool add_generation_prompt = true;  // end with the assistant header
  bool thinking = true;               // qwen3: false adds the empty think block
  const char* reasoning = "medium";   // harmony: reasoning effort (low, medium, high)
};

// The prompt text of `messages`; special tokens are spelled out (tokenize with parse_special).
std::string format_chat(ChatFormat f, const std::vector<ChatMessage>& messages, const ChatOptions& o = {});

// What a conversation is rendered with: the variables transformers passes to a chat template.
struct ChatInput {
  jinja::Json messages = jinja::Json::array();  // {role, content, tool_calls (arguments as objects), ...}
  jinja::Json tools;                            // null: none offered (the template sees it undefined)
  bool add_generation_prompt = true;
  jinja::Json kwargs = jinja::Json::object();   // extra variables: enable_thinking, reasoning_effort, ...
};

// A model's chat template: its Jinja source, or a built-in format for models without one.
class ChatTemplate {
 public:
  // Parses `source`; bos/eos: the vocabulary's BOS and EOS texts (bos_token / eos_token). A
  // syntax error names the line.
  static Result<ChatTemplate> from_source(std::string_view source, std::string bos, std::string eos);
  static ChatTemplate builtin(ChatFormat f);

  // The prompt text (special tokens spelled out; tokenize with parse_special). Errors: what the
  // template raised (raise_exception's message) or why it failed.
  Result<std::string> render(const ChatInput& in, const jinja::RenderOptions& o = {}) const;
  // How the model writes tool calls and reasoning (from the template's text).
  const ReplySyntax& reply_syntax() const { return syntax_; }
  // "jinja" for a template, else the built-in format's name.
  std::string name() const;
  bool is_jinja() const { return jinja_.has_value(); }

 private:
  std::optional<jinja::Template> jinja_;
  ChatFormat builtin_ = ChatFormat::raw;
  std::string bos_, eos_;
  ReplySyntax syntax_;
};

class GgufFile;
class Tokenizer;
// The chat template a front end uses: the file `template_file` when given (--chat-template-file),
// else the built-in format `builtin_name` when given (--template), else the GGUF's own
// tokenizer.chat_template, else the raw format (turns concatenated). Errors name the file or the
// template's syntax error.
Result<ChatTemplate> load_chat_template(const GgufFile& file, const Tokenizer& tok, const std::string& template_file,
                                        const std::string& builtin_name);

}  // namespace strata
