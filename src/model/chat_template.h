// Chat formatting for the model families strata targets, chosen from the GGUF's
// tokenizer.chat_template. strata does not run Jinja: it recognises the template families by their
// markers and formats conversations the way those templates do.
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

#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace strata {

enum class ChatFormat { raw, chatml, qwen3, deepseek3, harmony };

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The format of a chat template text. An empty template is nullopt-like: raw with `known` false.
// An unrecognised template is an Error that names the flags to use instead.
Result<ChatFormat> detect_chat_format(std::string_view chat_template);
Result<ChatFormat> chat_format_from_name(std::string_view name);  // "qwen3", "chatml", ...
std::string_view chat_format_name(ChatFormat f);

struct ChatOptions {
  bool add_generation_prompt = true;  // end with the assistant header
  bool thinking = true;               // qwen3: false adds the empty think block
  const char* reasoning = "medium";   // harmony: reasoning effort (low, medium, high)
};

// The prompt text of `messages`; special tokens are spelled out (tokenize with parse_special).
std::string format_chat(ChatFormat f, const std::vector<ChatMessage>& messages, const ChatOptions& o = {});

}  // namespace strata
