#include <gtest/gtest.h>

#include "model/chat_template.h"

namespace strata {
namespace {

// Fragments of the real templates shipped in the GGUFs of these families.
constexpr const char* kQwen3 =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}";
constexpr const char* kQwen2 = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}";
constexpr const char* kDeepSeek3 =
    "{{bos_token}}{{ns.system_prompt}}{%- if message['role'] == 'user' %}{{'<｜User｜>' + "
    "message['content']}}{%- endif %}{{'<｜Assistant｜>'}}";

constexpr const char* kHarmony =
    "{{- '<|start|>system<|message|>' }}{%- if message.role == 'assistant' %}{{- '<|start|>assistant"
    "<|channel|>final<|message|>' + message.content + '<|end|>' }}";

TEST(ChatTemplate, DetectsFamilies) {
  EXPECT_EQ(*detect_chat_format(kHarmony), ChatFormat::harmony);
  EXPECT_EQ(*detect_chat_format(kQwen3), ChatFormat::qwen3);
  EXPECT_EQ(*detect_chat_format(kQwen2), ChatFormat::chatml);
  EXPECT_EQ(*detect_chat_format(kDeepSeek3), ChatFormat::deepseek3);
  EXPECT_EQ(*detect_chat_format(""), ChatFormat::raw);
  auto unknown = detect_chat_format("{{ '[INST] ' + message }}");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("--raw"), std::string::npos);
  EXPECT_FALSE(chat_format_from_name("jinja").ok());
  EXPECT_EQ(*chat_format_from_name("deepseek3"), ChatFormat::deepseek3);
}

TEST(ChatTemplate, Qwen3WithAndWithoutThinking) {
  std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(format_chat(ChatFormat::qwen3, m),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(format_chat(ChatFormat::qwen3, m, {.thinking = false}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, DeepSeek3MultiTurn) {
  std::vector<ChatMessage> m = {{"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  EXPECT_EQ(format_chat(ChatFormat::deepseek3, m),
            "<｜begin▁of▁sentence｜>S<｜User｜>a<｜Assistant｜>b<｜end▁of▁sentence｜><｜User｜>c<｜Assistant｜>");
}

TEST(ChatTemplate, HarmonyTurns) {
  std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "?"}};
  const std::string p = format_chat(ChatFormat::harmony, m, {.reasoning = "low"});
  EXPECT_EQ(p.rfind("<|start|>system<|message|>", 0), 0u);
  EXPECT_NE(p.find("Reasoning: low"), std::string::npos);
  EXPECT_NE(p.find("<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"), std::string::npos);
  const std::string tail =
      "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello<|end|>"
      "<|start|>user<|message|>?<|end|><|start|>assistant";
  EXPECT_EQ(p.substr(p.size() - tail.size()), tail);
}

TEST(ChatTemplate, EachTurnExtendsThePreviousPrompt) {
  // strata chat relies on this to keep the KV cache between turns
  std::vector<ChatMessage> m = {{"user", "a"}};
  for (ChatFormat f : {ChatFormat::chatml, ChatFormat::deepseek3, ChatFormat::harmony, ChatFormat::raw}) {
    std::string before = format_chat(f, m, {.add_generation_prompt = true});
    auto m2 = m;
    m2.push_back({"assistant", "b"});
    m2.push_back({"user", "c"});
    std::string after = format_chat(f, m2);
    EXPECT_EQ(after.rfind(before, 0), 0u) << chat_format_name(f);
  }
}

}  // namespace
}  // namespace strata
