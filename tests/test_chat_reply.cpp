#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/chat_reply.h"

namespace strata {
namespace {

using Json = nlohmann::ordered_json;  // key order matters: arguments keep the model's

const std::string chat_dir = STRATA_SOURCE_DIR "/tests/data/chat";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

const Json& vectors() {
  static const Json v = Json::parse(read_file(chat_dir + "/vectors.json"));
  return v;
}

constexpr ReplySyntax hermes{ToolSyntax::hermes, ReasoningSyntax::think_tags};
constexpr ReplySyntax qwen3_coder{ToolSyntax::qwen3_coder, ReasoningSyntax::none};
constexpr ReplySyntax deepseek_v3{ToolSyntax::deepseek_v3, ReasoningSyntax::think_tags};
constexpr ReplySyntax deepseek_v31{ToolSyntax::deepseek_v31, ReasoningSyntax::think_tags};
constexpr ReplySyntax deepseek_v4{ToolSyntax::deepseek_v4, ReasoningSyntax::think_tags};
constexpr ReplySyntax kimi_k2{ToolSyntax::kimi_k2, ReasoningSyntax::none};
constexpr ReplySyntax kimi_k2_thinking{ToolSyntax::kimi_k2, ReasoningSyntax::think_tags};
constexpr ReplySyntax harmony{ToolSyntax::harmony, ReasoningSyntax::harmony};
constexpr ReplySyntax glm45{ToolSyntax::glm45, ReasoningSyntax::think_tags};
constexpr ReplySyntax minimax_m2{ToolSyntax::minimax_m2, ReasoningSyntax::think_tags};
constexpr ReplySyntax mistral{ToolSyntax::mistral, ReasoningSyntax::none};
constexpr ReplySyntax llama3_json{ToolSyntax::llama3_json, ReasoningSyntax::none};
constexpr ReplySyntax plain{ToolSyntax::none, ReasoningSyntax::none};
const ReplySyntax all_syntaxes[] = {hermes, qwen3_coder, deepseek_v3, deepseek_v31, deepseek_v4, kimi_k2,
                                    kimi_k2_thinking, harmony, glm45, minimax_m2, mistral, llama3_json, plain};

// Each template of vectors.json: its family, and where the assistant's turn with the tool call
// starts and ends in the tool_call_round_trip rendering (after the prompt's part of it: the
// generation prompt the model would have continued from).
struct TemplateFamily {
  std::string name;
  ReplySyntax syntax;
  std::string reply_begin, reply_end;  // reply_end empty: no round trip (the template refuses it)
  bool prompt_opens_reasoning;         // what the vectors' generation prompts leave open
};
const std::vector<TemplateFamily>& template_families() {
  static const std::vector<TemplateFamily> t = {
      {"Qwen-Qwen3-0.6B", hermes, "<|im_start|>assistant\n", "<|im_end|>", false},
      {"Qwen3-Coder", qwen3_coder, "<|im_start|>assistant\n", "<|im_end|>", false},
      {"deepseek-ai-DeepSeek-V3.1", deepseek_v31, "<｜Assistant｜><think></think>", "<｜end▁of▁sentence｜>", false},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", deepseek_v3, "<｜Assistant｜>", "<｜end▁of▁sentence｜>", false},
      {"deepseek-ai-DeepSeek-V4-Flash-0731", deepseek_v4, "<｜Assistant｜></think>", "<｜end▁of▁sentence｜>", false},
      {"moonshotai-Kimi-K2", kimi_k2, "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>", false},
      // <|call|> kept: the caller may or may not cut it off as a stop token
      {"openai-gpt-oss-120b", harmony, "<|start|>assistant", "<|call|>", false},
      {"GLM-4.6", glm45, "<|assistant|>", "<|observation|>", false},
      {"MiniMax-M2", minimax_m2, "]~b]ai\n", "[e~[", true},
      {"mistralai-Mistral-Nemo-Instruct-2407", mistral, "", "", false},
      {"meta-llama-Llama-3.3-70B-Instruct", llama3_json, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
       false},
  };
  return t;
}
const TemplateFamily* family_of(const std::string& name) {
  for (const TemplateFamily& f : template_families())
    if (f.name == name) return &f;
  return nullptr;
}

std::string describe(const ReplySyntax& s) {
  return std::string(tool_syntax_name(s.tools)) + "/" + std::to_string(int(s.reasoning));
}

bool is_alnum_id(std::string_view s) {
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) return false;
  return true;
}
// The ids parse_reply makes up (the syntax carries none): "call_" + 24 alphanumerics, or Mistral's 9.
bool is_made_up_id(ToolSyntax s, std::string_view id) {
  if (s == ToolSyntax::mistral) return id.size() == 9 && is_alnum_id(id);
  return id.size() == 29 && id.starts_with("call_") && is_alnum_id(id.substr(5));
}

// Feeds `text` to a ReplyStream `step` bytes at a time (so inside UTF-8 characters and markers)
// and checks that the deltas add up to `whole` (parse_reply of the text), that each delta only
// extends what was sent (nothing held back leaks out early), and that a call's first delta has its
// id and name and the later ones only arguments.
void expect_stream_matches(const ReplySyntax& s, std::string_view text, bool in_reasoning, const Reply& whole,
                           size_t step) {
  SCOPED_TRACE("step " + std::to_string(step));
  ReplyStream stream(s, in_reasoning);
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  auto take = [&](const ReplyDelta& d) {
    content += d.content;
    reasoning += d.reasoning;
    EXPECT_TRUE(whole.content.starts_with(content)) << "content sent early: " << content;
    EXPECT_TRUE(whole.reasoning.starts_with(reasoning)) << "reasoning sent early: " << reasoning;
    for (const ToolCallDelta& t : d.tool_calls) {
      ASSERT_GE(t.index, 0);
      ASSERT_LE(size_t(t.index), calls.size());
      if (size_t(t.index) == calls.size()) {
        EXPECT_FALSE(t.id.empty());
        EXPECT_FALSE(t.name.empty());
        EXPECT_TRUE(t.arguments.empty());
        calls.push_back({t.id, t.name, ""});
      } else {
        EXPECT_TRUE(t.id.empty());
        EXPECT_TRUE(t.name.empty());
        calls[t.index].arguments += t.arguments;
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += step) take(stream.feed(text.substr(i, step)));
  take(stream.finish());
  EXPECT_EQ(content, whole.content);
  EXPECT_EQ(reasoning, whole.reasoning);
  ASSERT_EQ(calls.size(), whole.tool_calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].name, whole.tool_calls[i].name);
    EXPECT_EQ(calls[i].arguments, whole.tool_calls[i].arguments);
    EXPECT_EQ(calls[i].id, stream.reply().tool_calls[i].id);
  }
  EXPECT_EQ(stream.reply().content, content);
  EXPECT_EQ(stream.reply().reasoning, reasoning);
  EXPECT_TRUE(stream.feed("more").content.empty()) << "nothing is released after finish()";
}

void expect_streams_match(const ReplySyntax& s, std::string_view text, bool in_reasoning) {
  const Reply whole = parse_reply(s, text, in_reasoning);
  for (size_t step : {1, 2, 3, 7}) expect_stream_matches(s, text, in_reasoning, whole, step);
}

TEST(ChatReply, DetectsTheFamilyOfEveryTemplateOfTheVectors) {
  std::set<std::string> seen;
  for (const Json& v : vectors()["vectors"]) {
    const std::string name = v["template"];
    if (!seen.insert(name).second) continue;
    SCOPED_TRACE(name);
    const TemplateFamily* f = family_of(name);
    ASSERT_NE(f, nullptr) << "a template of vectors.json the test does not know";
    const std::string source = read_file(chat_dir + "/templates/" + name + ".jinja");
    ASSERT_FALSE(source.empty());
    const ReplySyntax s = detect_reply_syntax(source);
    EXPECT_EQ(describe(s), describe(f->syntax));
  }
  EXPECT_EQ(seen.size(), template_families().size());
}

TEST(ChatReply, ParsesTheToolCallEachTemplateRenders) {
  const Json weather = {{"location", "Paris, France"}, {"unit", "celsius"}};
  int checked = 0;
  for (const Json& v : vectors()["vectors"]) {
    if (v["case"] != "tool_call_round_trip") continue;
    const std::string name = v["template"];
    SCOPED_TRACE(name);
    const TemplateFamily* f = family_of(name);
    ASSERT_NE(f, nullptr);
    if (f->reply_end.empty()) {
      EXPECT_TRUE(v.contains("error")) << "the template renders the round trip now: cut its reply out";
      continue;
    }
    const std::string expected = v["expected"];
    const size_t user = expected.find("Weather in Paris?");
    ASSERT_NE(user, std::string::npos);
    const size_t begin = expected.find(f->reply_begin, user);
    ASSERT_NE(begin, std::string::npos);
    const size_t start = begin + f->reply_begin.size();
    const size_t end = expected.find(f->reply_end, start);
    ASSERT_NE(end, std::string::npos);
    std::string text = expected.substr(start, end - start);
    if (f->syntax.tools == ToolSyntax::harmony) text += f->reply_end;
    SCOPED_TRACE(text);
    for (bool cut_end : {false, true}) {  // harmony: also with <|call|> cut off as a stop token
      if (cut_end && f->syntax.tools != ToolSyntax::harmony) continue;
      const std::string t = cut_end ? text.substr(0, text.size() - f->reply_end.size()) : text;
      const Reply r = parse_reply(f->syntax, t, false);
      EXPECT_EQ(r.content, "");
      EXPECT_EQ(r.reasoning, "");
      ASSERT_EQ(r.tool_calls.size(), 1u);
      EXPECT_EQ(r.tool_calls[0].name, "get_weather");
      EXPECT_EQ(Json::parse(r.tool_calls[0].arguments), weather);
      if (f->syntax.tools == ToolSyntax::kimi_k2) EXPECT_EQ(r.tool_calls[0].id, "functions.get_weather:0");
      else EXPECT_TRUE(is_made_up_id(f->syntax.tools, r.tool_calls[0].id)) << r.tool_calls[0].id;
      expect_streams_match(f->syntax, t, false);
    }
    ++checked;
  }
  EXPECT_EQ(checked, int(template_families().size()) - 1);  // all but Mistral's
}

TEST(ChatReply, PromptsThatLeaveAThinkBlockOpen) {
  for (const Json& v : vectors()["vectors"]) {
    if (!v["context"].value("add_generation_prompt", false) || !v.contains("expected")) continue;
    const TemplateFamily* f = family_of(v["template"]);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(prompt_opens_reasoning(f->syntax, v["expected"].get<std::string>()), f->prompt_opens_reasoning)
        << v["template"] << " " << v["case"];
  }
  EXPECT_TRUE(prompt_opens_reasoning(deepseek_v3, "<｜User｜>Hi<｜Assistant｜><think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning(deepseek_v4, "<｜User｜>Hi<｜Assistant｜><think>"));
  EXPECT_FALSE(prompt_opens_reasoning(hermes, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning(deepseek_v4, "<｜User｜>Hi<｜Assistant｜></think>"));
  EXPECT_FALSE(prompt_opens_reasoning(plain, "<think>"));
  EXPECT_FALSE(prompt_opens_reasoning(harmony, "<|start|>assistant"));
}

TEST(ChatReply, DetectsFamiliesByTheirMarkers) {
  auto tools = [](std::string_view t) { return std::string(tool_syntax_name(detect_reply_syntax(t).tools)); };
  EXPECT_EQ(tools("{{'<tool_call>\\n' + tc | tojson}}"), "hermes");
  EXPECT_EQ(tools("<tool_call>\n<function={{ n }}>"), "qwen3_coder");
  EXPECT_EQ(tools("<tool_call>{{ n }}<arg_key>"), "glm45");
  EXPECT_EQ(tools("<minimax:tool_call>"), "minimax_m2");
  EXPECT_EQ(tools("<|tool_calls_section_begin|>"), "kimi_k2");
  EXPECT_EQ(tools("<|start|>assistant<|channel|>final"), "harmony");
  EXPECT_EQ(tools("[TOOL_CALLS]"), "mistral");
  EXPECT_EQ(tools("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + name + '<｜tool▁sep｜>"), "deepseek_v31");
  EXPECT_EQ(tools("<｜tool▁call▁begin｜>' + type + '<｜tool▁sep｜>' + name + '\\n```json\\n'"), "deepseek_v3");
  EXPECT_EQ(tools("{% set dsml_token = '｜DSML｜' %}"), "deepseek_v4");
  EXPECT_EQ(tools("<|start_header_id|>{{ '\"parameters\": ' }}"), "llama3_json");
  EXPECT_EQ(tools("<|start_header_id|>user<|end_header_id|>"), "none");  // Llama 3 without tools
  EXPECT_EQ(tools("<|im_start|>assistant\n"), "none");
  EXPECT_EQ(detect_reply_syntax("<|im_start|>assistant\n<think>").reasoning, ReasoningSyntax::think_tags);
  EXPECT_EQ(detect_reply_syntax("{{ content.split('</think>')[-1] }}").reasoning, ReasoningSyntax::think_tags);
  EXPECT_EQ(detect_reply_syntax("<|channel|>").reasoning, ReasoningSyntax::harmony);
  EXPECT_EQ(detect_reply_syntax("<tool_call>").reasoning, ReasoningSyntax::none);
}

// A hand-written reply and what it parses to.
struct ExpectedCall {
  std::string name;
  Json arguments;
  std::string id = {};  // empty: made up by the parser
};
struct Case {
  std::string what;
  ReplySyntax syntax;
  std::string text;
  bool in_reasoning;
  std::string content, reasoning;
  std::vector<ExpectedCall> calls;
};

const std::string weather_call = R"({"name": "get_weather", "arguments": {"location": "Paris"}})";
const Json paris = {{"location", "Paris"}};
const Json none = Json::object();

// A truncated call (cut off mid-arguments) and a malformed one stay content, their text unchanged.
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      // hermes
      {"hermes: two calls", hermes,
       "<tool_call>\n" + weather_call + "\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
       false, "", "", {{"get_weather", paris}, {"get_time", none}}},
      {"hermes: content before and after", hermes, "Let me check.\n\n<tool_call>\n" + weather_call + "\n</tool_call>\n\nDone.",
       false, "Let me check.Done.", "", {{"get_weather", paris}}},
      {"hermes: malformed JSON", hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": }\n</tool_call>",
       false, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": }\n</tool_call>", "", {}},
      {"hermes: truncated", hermes, "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"argum", false,
       "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"argum", "", {}},
      {"hermes: closing tag cut off as a stop string", hermes, "<tool_call>\n" + weather_call + "\n", false, "", "",
       {{"get_weather", paris}}},
      {"hermes: malformed block, then a good one", hermes,
       "<tool_call>oops</tool_call> then <tool_call>" + weather_call + "</tool_call>", false, "<tool_call>oops</tool_call> then",
       "", {{"get_weather", paris}}},
      {"hermes: reasoning and a call", hermes, "<think>\nI should call the tool.\n</think>\n\n<tool_call>\n" + weather_call +
       "\n</tool_call>", false, "", "I should call the tool.", {{"get_weather", paris}}},
      {"hermes: in_reasoning", hermes, "I know this.\n</think>\n\nIt is sunny.", true, "It is sunny.", "I know this.", {}},
      {"hermes: unterminated think", hermes, "<think>\nstill thinking <", false, "", "still thinking <", {}},
      {"hermes: think later is content", hermes, "Hi <think>x</think>", false, "Hi <think>x</think>", "", {}},
      {"hermes: markup that is no call", hermes, "Use <b>bold</b>, <tool and <tool_call", false,
       "Use <b>bold</b>, <tool and <tool_call", "", {}},
      {"hermes: unicode", hermes, "Météo 🌦 à Paris: <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"location\": "
       "\"Zürich \\u00e9\"}}</tool_call>", false, "Météo 🌦 à Paris:", "", {{"get_weather", {{"location", "Zürich é"}}}}},
      {"hermes: quoted arguments", hermes, R"(<tool_call>{"name": "f", "arguments": "{\"a\": [1, 2]}"}</tool_call>)", false,
       "", "", {{"f", {{"a", {1, 2}}}}}},
      {"hermes: no arguments", hermes, R"(<tool_call>{"name": "f"}</tool_call>)", false, "", "", {{"f", none}}},
      {"hermes: arguments not an object", hermes, R"(<tool_call>{"name": "f", "arguments": 3}</tool_call>)", false,
       R"(<tool_call>{"name": "f", "arguments": 3}</tool_call>)", "", {}},
      // qwen3_coder
      {"qwen3_coder: two calls, typed values", qwen3_coder,
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
       "</function>\n</tool_call>\n<tool_call>\n<function=set_prefs>\n<parameter=prefs>\n{\"metric\": true}\n</parameter>\n"
       "<parameter=code>\nline 1\n  line 2\n\n</parameter>\n</function>\n</tool_call>",
       false, "", "",
       {{"get_weather", {{"location", "Paris"}, {"days", 3}}},
        {"set_prefs", {{"prefs", {{"metric", true}}}, {"code", "line 1\n  line 2\n"}}}}},
      {"qwen3_coder: content before", qwen3_coder,
       "I'll look it up.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>",
       false, "I'll look it up.", "", {{"get_weather", paris}}},
      {"qwen3_coder: no </parameter>", qwen3_coder,
       "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</function>\n</tool_call>", false, "", "",
       {{"f", {{"a", "x"}, {"b", "y"}}}}},
      {"qwen3_coder: malformed (no </function>)", qwen3_coder,
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</tool_call>", false,
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</tool_call>", "", {}},
      {"qwen3_coder: truncated", qwen3_coder, "<tool_call>\n<function=get_weather>\n<parameter=location>\nPar", false,
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nPar", "", {}},
      // deepseek_v31
      {"deepseek_v31: reasoning, content, two calls", deepseek_v31,
       "Need weather.</think>Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": "
       "\"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       true, "Checking.", "Need weather.", {{"get_weather", paris}, {"get_time", none}}},
      {"deepseek_v31: malformed", deepseek_v31,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": Paris}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       false,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": Paris}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "", {}},
      {"deepseek_v31: truncated", deepseek_v31, "Hm.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"loc",
       false, "Hm.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"loc", "", {}},
      // deepseek_v3 (R1)
      {"deepseek_v3: reasoning and two calls", deepseek_v3,
       "Let me see.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
       "{\"location\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```"
       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       true, "", "Let me see.", {{"get_weather", paris}, {"get_time", none}}},
      {"deepseek_v3: no code fence end", deepseek_v3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", false,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", {}},
      // deepseek_v4 (DSML)
      {"deepseek_v4: reasoning, content, two calls", deepseek_v4,
       "Think.</think>On it.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"location\" "
       "string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
       "<｜DSML｜parameter name=\"zip\" string=\"true\">75001</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke "
       "name=\"get_time\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
       true, "On it.", "Think.", {{"get_weather", {{"location", "Paris"}, {"days", 3}, {"zip", "75001"}}}, {"get_time", none}}},
      {"deepseek_v4: malformed", deepseek_v4,
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\">1</｜DSML｜invoke>\n</｜DSML｜tool_calls>", false,
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\">1</｜DSML｜invoke>\n</｜DSML｜tool_calls>", "", {}},
      {"deepseek_v4: truncated", deepseek_v4, "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜para", false,
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜para", "", {}},
      {"deepseek_v4: V3.2's function_calls block", deepseek_v4,
       "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", false, "", "",
       {{"f", none}}},
      // kimi_k2
      {"kimi_k2: content and two calls", kimi_k2,
       "Checking both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
       "{\"location\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}"
       "<|tool_call_end|><|tool_calls_section_end|>",
       false, "Checking both.", "", {{"get_weather", paris, "functions.get_weather:0"}, {"get_time", none, "functions.get_time:1"}}},
      {"kimi_k2: malformed", kimi_k2,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{{<|tool_call_end|>"
       "<|tool_calls_section_end|>",
       false,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{{<|tool_call_end|>"
       "<|tool_calls_section_end|>",
       "", {}},
      {"kimi_k2: truncated", kimi_k2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_arg",
       false, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_arg", "", {}},
      {"kimi_k2 thinking: reasoning and a call", kimi_k2_thinking,
       "<think>Weather tool.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
       "<|tool_call_argument_begin|>{\"location\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>",
       false, "", "Weather tool.", {{"get_weather", paris, "functions.get_weather:0"}}},
      // harmony
      {"harmony: analysis and final", harmony,
       "<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>", false,
       "Hello!", "User greets.", {}},
      {"harmony: analysis and a call", harmony,
       "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
       "<|constrain|>json<|message|>{\"location\": \"Paris\"}<|call|>",
       false, "", "Need weather.", {{"get_weather", paris}}},
      {"harmony: preamble and a call", harmony,
       "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary "
       "json<|message|>{\"location\": \"Paris\"}",
       false, "Let me check.", "", {{"get_weather", paris}}},
      {"harmony: malformed call", harmony,
       "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\": <|call|>", false,
       "{\"location\": ", "", {}},
      {"harmony: truncated analysis", harmony, "<|channel|>analysis<|message|>Thinking about <|e", false, "",
       "Thinking about <|e", {}},
      {"harmony: final without an end", harmony, "<|channel|>final<|message|>Done <b>", false, "Done <b>", "", {}},
      {"harmony: no markup at all", harmony, "Just text.", false, "Just text.", "", {}},
      {"harmony: a header cut short", harmony, "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|chan", false, "",
       "a", {}},
      // glm45
      {"glm45: reasoning and two calls", glm45,
       "\n<think>Need both.</think>\n<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>Paris</arg_value>\n"
       "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call>",
       false, "", "Need both.", {{"get_weather", {{"location", "Paris"}, {"days", 3}}}, {"get_time", none}}},
      {"glm45: content before", glm45,
       "\n<think></think>\nSure.\n<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
       false, "Sure.", "", {{"get_weather", paris}}},
      {"glm45: malformed", glm45, "<tool_call>get_weather\n<arg_key>location</arg_key>\n</tool_call>", false,
       "<tool_call>get_weather\n<arg_key>location</arg_key>\n</tool_call>", "", {}},
      {"glm45: truncated", glm45, "<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>Pa", false,
       "<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>Pa", "", {}},
      // minimax_m2
      {"minimax_m2: reasoning, content, two calls", minimax_m2,
       "Plan.\n</think>\n\nChecking.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"location\">Paris"
       "</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n<invoke name=\"get_time\">\n</invoke>\n"
       "</minimax:tool_call>",
       true, "Checking.", "Plan.", {{"get_weather", {{"location", "Paris"}, {"days", 3}}}, {"get_time", none}}},
      {"minimax_m2: malformed", minimax_m2, "<minimax:tool_call>\n<invoke name=get_weather>\n</invoke>\n</minimax:tool_call>",
       false, "<minimax:tool_call>\n<invoke name=get_weather>\n</invoke>\n</minimax:tool_call>", "", {}},
      {"minimax_m2: truncated", minimax_m2, "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"loc", false,
       "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"loc", "", {}},
      // mistral
      {"mistral: the template's form", mistral,
       R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius"}, "id": "abcDEF123"}])",
       false, "", "", {{"get_weather", {{"location", "Paris, France"}, {"unit", "celsius"}}, "abcDEF123"}}},
      {"mistral: content and two calls", mistral,
       R"(Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"location": "Paris"}}, {"name": "get_time", "arguments": {}}])",
       false, "Sure.", "", {{"get_weather", paris}, {"get_time", none}}},
      {"mistral: malformed", mistral, R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"location": Paris}}])", false,
       R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"location": Paris}}])", "", {}},
      {"mistral: truncated", mistral, R"([TOOL_CALLS][{"name": "get_weather", "argu)", false,
       R"([TOOL_CALLS][{"name": "get_weather", "argu)", "", {}},
      {"mistral: not JSON after the marker", mistral, "[TOOL_CALLS] nope", false, "[TOOL_CALLS] nope", "", {}},
      // llama3_json
      {"llama3_json: arguments key", llama3_json, " {\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n", false,
       "", "", {{"get_weather", paris}}},
      {"llama3_json: python tag", llama3_json, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}",
       false, "", "", {{"get_weather", paris}}},
      {"llama3_json: a JSON answer", llama3_json, R"({"name": "Bob", "age": 3})", false, R"({"name": "Bob", "age": 3})", "", {}},
      {"llama3_json: text after the object", llama3_json, R"({"name": "f", "parameters": {}} and more)", false,
       R"({"name": "f", "parameters": {}} and more)", "", {}},
      {"llama3_json: truncated", llama3_json, R"({"name": "get_weather", "parameters": {"loc)", false,
       R"({"name": "get_weather", "parameters": {"loc)", "", {}},
      {"llama3_json: prose", llama3_json, "Hello there {x}", false, "Hello there {x}", "", {}},
      // no tool syntax
      {"plain: markers are content", plain, "<tool_call>" + weather_call + "</tool_call>", false,
       "<tool_call>" + weather_call + "</tool_call>", "", {}},
  };
  return c;
}

TEST(ChatReply, HandWrittenRepliesOfEachFamily) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    const Reply r = parse_reply(c.syntax, c.text, c.in_reasoning);
    EXPECT_EQ(r.content, c.content);
    EXPECT_EQ(r.reasoning, c.reasoning);
    ASSERT_EQ(r.tool_calls.size(), c.calls.size());
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(r.tool_calls[i].name, c.calls[i].name);
      EXPECT_EQ(r.tool_calls[i].arguments, c.calls[i].arguments.dump()) << "compact, in the model's order";
      if (!c.calls[i].id.empty()) EXPECT_EQ(r.tool_calls[i].id, c.calls[i].id);
      else EXPECT_TRUE(is_made_up_id(c.syntax.tools, r.tool_calls[i].id)) << r.tool_calls[i].id;
    }
    if (r.tool_calls.size() == 2) {
      EXPECT_NE(r.tool_calls[0].id, r.tool_calls[1].id);
    }
  }
}

TEST(ChatReply, StreamingReleasesWhatParseReplyFinds) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    expect_streams_match(c.syntax, c.text, c.in_reasoning);
  }
}

TEST(ChatReply, StreamingHoldsBackWhatMayBecomeAMarker) {
  ReplyStream s(hermes, false);
  EXPECT_EQ(s.feed("Hi <").content, "Hi");
  EXPECT_EQ(s.feed("tool_").content, "");
  const ReplyDelta d = s.feed("call>\n" + weather_call + "\n</tool_call>");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[1].arguments, R"({"location":"Paris"})");
  EXPECT_EQ(s.feed(" Bye").content, "Bye");
  EXPECT_EQ(s.finish().content, "");
  EXPECT_EQ(s.reply().content, "HiBye");

  ReplyStream t(deepseek_v31, true);  // reasoning streams as it comes
  EXPECT_EQ(t.feed("Think").reasoning, "Think");
  EXPECT_EQ(t.feed("ing </thi").reasoning, "ing");
  const ReplyDelta e = t.feed("nk>\n\nAnswer");
  EXPECT_EQ(e.reasoning, "");
  EXPECT_EQ(e.content, "Answer");
}

// Random texts and random splices of every family's markers: no crash, and streaming in random
// pieces always adds up to parse_reply.
TEST(ChatReply, RandomTextsAndSplicesOfMarkers) {
  const std::vector<std::string> parts = {
      "<tool_call>", "</tool_call>", "\n", " ", "x", "é", "🌦", "{", "}", "[", "]", "\"", ":", ",", "\\",
      R"({"name": "f", "arguments": {"a": 1}})", R"("name")", R"("parameters")", "<function=f>", "<parameter=a>",
      "</parameter>", "</function>", "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
      "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "function", "```json\n", "```", "<｜DSML｜tool_calls>",
      "</｜DSML｜tool_calls>", "<｜DSML｜invoke name=\"f\">", "</｜DSML｜invoke>", "<｜DSML｜parameter name=\"a\" string=\"true\">",
      "</｜DSML｜parameter>", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.f:0",
      "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool_calls_section_end|>", "<|start|>assistant", "<|channel|>",
      "analysis", "final", "commentary", " to=functions.f", "<|constrain|>json", "<|message|>", "<|end|>", "<|call|>",
      "<|return|>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<minimax:tool_call>", "</minimax:tool_call>",
      "<invoke name=\"f\">", "</invoke>", "<parameter name=\"a\">", "[TOOL_CALLS]", "<|python_tag|>", "<", "|", "\xff",
      "\xe2\x96", std::string(1, '\0')};
  std::mt19937 rng(1234);
  size_t calls = 0, contents = 0, reasonings = 0;
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  for (int iter = 0; iter < 1000; ++iter) {
    std::string text;
    if (iter % 2 == 0) {  // a splice of markers and bytes
      const size_t n = pick(24);
      for (size_t i = 0; i < n; ++i) {
        if (pick(6) == 0) text += char(pick(256));
        else text += parts[pick(parts.size())];
      }
    } else {  // a hand-written reply, mutated: parts inserted, bytes cut out, replies joined
      text = cases()[pick(cases().size())].text;
      for (size_t m = pick(4); m > 0; --m) {
        const size_t at = pick(text.size() + 1);
        switch (pick(3)) {
          case 0: text.insert(at, parts[pick(parts.size())]); break;
          case 1: text.erase(at, pick(8)); break;
          default: text.insert(at, cases()[pick(cases().size())].text); break;
        }
      }
    }
    for (const ReplySyntax& s : all_syntaxes) {
      for (bool in_reasoning : {false, true}) {
        SCOPED_TRACE(describe(s) + (in_reasoning ? " in_reasoning: " : ": ") + text);
        const Reply whole = parse_reply(s, text, in_reasoning);
        for (const ToolCall& c : whole.tool_calls) EXPECT_TRUE(Json::accept(c.arguments)) << c.arguments;
        calls += whole.tool_calls.size();
        contents += !whole.content.empty();
        reasonings += !whole.reasoning.empty();
        expect_stream_matches(s, text, in_reasoning, whole, 1 + pick(8));
        if (testing::Test::HasFailure()) return;
      }
    }
  }
  // the splices reach the parsers' every outcome
  EXPECT_GT(calls, 100u);
  EXPECT_GT(contents, 1000u);
  EXPECT_GT(reasonings, 1000u);
  std::printf("random replies: %zu calls, %zu with content, %zu with reasoning\n", calls, contents, reasonings);
}

}  // namespace
}  // namespace strata
