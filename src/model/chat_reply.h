// A model's generated text back into an OpenAI-style reply: content, reasoning_content and
// tool_calls, in the syntax of the model's family (found from its chat template). Pure text
// functions: no I/O, no model; the server hands over the text whole (parse_reply) or piece by
// piece while it streams (ReplyStream).
//
// What each family's parser accepts (the exact text its template renders for a call):
//  - hermes:       <tool_call>{"name": N, "arguments": {...}}</tool_call>, blocks in a row
//  - qwen3_coder:  <tool_call><function=N><parameter=K>\nV\n</parameter>...</function></tool_call>
//  - deepseek_v3 / deepseek_v31: <｜tool▁calls▁begin｜> then per call
//                  <｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜> (V3, R1)
//                  or <｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1), then
//                  <｜tool▁calls▁end｜> (either form under either syntax)
//  - deepseek_v4:  DSML: <｜DSML｜tool_calls><｜DSML｜invoke name="N"><｜DSML｜parameter name="K"
//                  string="true|false">V</｜DSML｜parameter>...</｜DSML｜invoke></｜DSML｜tool_calls>
//                  (also <｜DSML｜function_calls>, V3.2's name for the block)
//  - kimi_k2:      <|tool_calls_section_begin|><|tool_call_begin|>functions.N:I
//                  <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>
//  - harmony:      messages [<|start|>assistant][ to=functions.N]<|channel|>C[ to=functions.N]
//                  [ json| <|constrain|>json]<|message|>BODY, ended by <|end|>, <|call|>,
//                  <|return|>, the next <|start|> or the end of the text
//  - glm45:        <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>
//  - minimax_m2:   <minimax:tool_call><invoke name="N"><parameter name="K">V</parameter>...
//                  </invoke>...</minimax:tool_call>
//  - mistral:      [TOOL_CALLS][{"name": N, "arguments": {...}, "id": "..."}, ...] (or one object)
//  - llama3_json:  the whole reply one object {"name": N, "parameters": {...}} ("arguments" too),
//                  optionally after <|python_tag|>
// A block that does not parse as calls stays content, its text unchanged; a block still open at the
// end of the text is calls only if what it holds parses (a closing marker the caller cut off as a
// stop string), so a call truncated mid-arguments stays content. Whitespace between content and a
// call is dropped. Parameter values of the XML syntaxes become JSON when they parse as JSON (42,
// true, {...}) and strings otherwise (DSML's string="true" always a string).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata {

// How a model family writes tool calls and reasoning, found from its chat template's text.
enum class ToolSyntax {
  none,
  hermes,
  qwen3_coder,
  deepseek_v3,
  deepseek_v31,
  deepseek_v4,
  kimi_k2,
  harmony,
  glm45,
  minimax_m2,
  mistral,
  llama3_json
};
// think_tags: <think>...</think> (Qwen3, DeepSeek R1/V3.1/V4, Kimi K2 Thinking, GLM, MiniMax).
enum class ReasoningSyntax { none, think_tags, harmony };
struct ReplySyntax {
  ToolSyntax tools = ToolSyntax::none;
  ReasoningSyntax reasoning = ReasoningSyntax::none;
};

// From markers in the template source ("<tool_call>", "<|channel|>", DeepSeek's tool tokens...),
// not from its exact text, so other templates of a family are recognized too.
ReplySyntax detect_reply_syntax(std::string_view chat_template);
std::string_view tool_syntax_name(ToolSyntax s);  // "hermes", "deepseek_v31", ...

// id: "call_" + 24 alphanumerics, or the one the syntax carries (Kimi K2's "functions.N:I",
// Mistral's); Mistral calls without one get 9 alphanumerics, the only ids its template takes back.
// arguments: a JSON object as compact text (what OpenAI sends: a JSON string).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};
struct Reply {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
};

// `text`: the whole generated text, special tokens spelled out ("<|im_end|>" and the like already
// cut off by the caller; "<|channel|>" etc. present for harmony). `in_reasoning`: the prompt ended
// inside an open reasoning block (prompt_opens_reasoning), so the text starts as reasoning. Reasoning
// is trimmed, and so is the whitespace that starts the content after "</think>"; an unterminated
// think block is all reasoning. Never throws.
Reply parse_reply(const ReplySyntax& s, std::string_view text, bool in_reasoning);

// Streaming: each feed returns what can be sent now without ever taking it back. Text that might
// still become a marker (a partial "<tool_call" at the end), whitespace that a call might follow,
// and a tool-call block until it is closed and parsed are held back; a call is released whole, as
// two deltas: {index, id, name, arguments ""}, then {index, arguments}. finish() releases the
// rest. The concatenated deltas equal reply(), and reply() after finish() equals parse_reply of the
// whole text (ids aside). Each feed re-parses the text so far: O(length) a piece. Not thread-safe.
struct ToolCallDelta {
  int index = 0;
  std::string id, name, arguments;  // id and name: set only in a call's first delta
};
struct ReplyDelta {
  std::string content, reasoning;
  std::vector<ToolCallDelta> tool_calls;
};
class ReplyStream {
 public:
  ReplyStream(ReplySyntax s, bool in_reasoning);
  ReplyDelta feed(std::string_view piece);  // nothing after finish()
  ReplyDelta finish();
  const Reply& reply() const { return reply_; }  // what was released so far

 private:
  ReplyDelta release(bool final);

  ReplySyntax syntax_;
  bool in_reasoning_;
  bool finished_ = false;
  std::string text_;  // everything fed
  Reply reply_;
};

// Whether the rendered prompt leaves the reply inside an open reasoning block: think_tags and the
// prompt ends with "<think>" (and perhaps whitespace), as R1's, MiniMax's and V4's thinking
// prompts do.
bool prompt_opens_reasoning(const ReplySyntax& s, std::string_view prompt);

}  // namespace strata
