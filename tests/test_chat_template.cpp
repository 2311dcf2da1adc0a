#include <gtest/gtest.h>

#include "model/chat_template.h"

namespace strata {
namespace {

TEST(ChatTemplate, RendersItsJinjaSourceWithTheVariablesOfApplyChatTemplate) {
  auto t = ChatTemplate::from_source(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if tools is defined %}[{{ tools | length }} tools]{% endif %}"
      "{% if add_generation_prompt %}<assistant>{% if enable_thinking is false %}<no-think>{% endif %}{% endif %}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE(t->is_jinja());
  ChatInput in;
  in.messages = jinja::Json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(*t->render(in), "<s><user>hi<assistant>");
  in.tools = jinja::Json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  in.kwargs["enable_thinking"] = false;
  in.add_generation_prompt = true;
  EXPECT_EQ(*t->render(in), "<s><user>hi[1 tools]<assistant><no-think>");
  // the extra keyword arguments cannot replace the conversation itself
  in.kwargs["messages"] = "not these";
  EXPECT_EQ(*t->render(in), "<s><user>hi[1 tools]<assistant><no-think>");
}

TEST(ChatTemplate, TemplateErrorsAreErrorsWithTheTemplatesMessage) {
  auto t = ChatTemplate::from_source(
      "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
      "{{ m.content }}{% endfor %}",
      "", "");
  ASSERT_TRUE(t.ok());
  ChatInput in;
  in.messages = jinja::Json::parse(R"([{"role": "tool", "content": "x"}])");
  auto r = t->render(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "no tools here");
  auto bad = ChatTemplate::from_source("{% for m in messages %}{{ m.content }}", "", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("chat template"), std::string::npos) << bad.error().message;
}

TEST(ChatTemplate, BuiltinFormatsByName) {
  EXPECT_FALSE(chat_format_from_name("jinja").ok());
  EXPECT_EQ(*chat_format_from_name("deepseek3"), ChatFormat::deepseek3);
  const ChatTemplate t = ChatTemplate::builtin(ChatFormat::chatml);
  EXPECT_FALSE(t.is_jinja());
  EXPECT_EQ(t.name(), "chatml");
  ChatInput in;
  in.messages = jinja::Json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(*t.render(in), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
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
