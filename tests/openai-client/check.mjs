// A real client nobody here wrote: the official `openai` npm package runs a plain and a streamed
// chat completion, a tool call (forced by tool_choice, plain and streamed) and its result sent
// back, and a text completion, against a running strata serve (with a template that has tools,
// e.g. Qwen3's). Usage:
//   node check.mjs http://127.0.0.1:PORT/v1
import OpenAI from "openai";

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: process.env.STRATA_API_KEY || "none", maxRetries: 0, timeout: 120000 });
const fail = (msg) => { console.error(`openai-client: FAILED: ${msg}`); process.exit(1); };

const models = await client.models.list();
const id = models.data[0]?.id;
if (!id) fail("no model listed");

const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Say hello." }];
const plain = await client.chat.completions.create({ model: id, messages, max_tokens: 16, temperature: 0 });
const text = plain.choices[0].message.content;
if (typeof text !== "string") fail("no message content");
if (!(plain.usage.completion_tokens > 0 && plain.usage.completion_tokens <= 16)) fail(`usage ${JSON.stringify(plain.usage)}`);

const stream = await client.chat.completions.create({ model: id, messages, max_tokens: 16, temperature: 0, stream: true });
let streamed = "", finish = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  const c = chunk.choices[0];
  if (c?.delta?.content) streamed += c.delta.content;
  if (c?.finish_reason) finish = c.finish_reason;
}
if (streamed !== text) fail(`streamed text differs from the plain one: ${JSON.stringify(streamed)} vs ${JSON.stringify(text)}`);
if (!finish) fail("no finish_reason in the stream");

// tools: a call forced by tool_choice, its arguments held to JSON; the same call streamed as
// OpenAI streams it (the name, then argument deltas); then the result goes back to the model
const tools = [{ type: "function", function: { name: "get_weather", description: "Current weather for a city.",
  parameters: { type: "object", properties: { location: { type: "string" } }, required: ["location"] } } }];
const ask = [{ role: "user", content: "Weather in Paris?" }];
const choice = { type: "function", function: { name: "get_weather" } };
const called = await client.chat.completions.create({ model: id, messages: ask, tools, tool_choice: choice, max_tokens: 24, temperature: 0 });
const call = called.choices[0].message.tool_calls?.[0];
if (!call || call.type !== "function" || call.function.name !== "get_weather") fail(`no get_weather call: ${JSON.stringify(called.choices[0])}`);
if (called.choices[0].finish_reason !== "tool_calls") fail(`finish_reason ${called.choices[0].finish_reason}, not tool_calls`);
let args;
try { args = JSON.parse(call.function.arguments); } catch { fail(`arguments are not JSON: ${call.function.arguments}`); }
if (typeof args !== "object" || Array.isArray(args)) fail(`arguments are not an object: ${call.function.arguments}`);
const callStream = await client.chat.completions.create({ model: id, messages: ask, tools, tool_choice: choice, max_tokens: 24, temperature: 0, stream: true });
let callName = "", callArgs = "", callId = null, callFinish = null, nameFirst = true;
for await (const chunk of callStream) {
  const c = chunk.choices[0];
  for (const tc of c?.delta?.tool_calls ?? []) {
    if (tc.id) callId = tc.id;
    if (tc.function?.name) callName += tc.function.name;
    if (tc.function?.arguments) { if (!callName) nameFirst = false; callArgs += tc.function.arguments; }
  }
  if (c?.finish_reason) callFinish = c.finish_reason;
}
if (callName !== "get_weather" || !callId || !nameFirst) fail(`streamed call: name ${callName}, id ${callId}, name first ${nameFirst}`);
if (JSON.stringify(JSON.parse(callArgs)) !== JSON.stringify(args)) fail(`streamed arguments ${callArgs} differ from ${call.function.arguments}`);
if (callFinish !== "tool_calls") fail(`streamed finish_reason ${callFinish}`);
const answer = await client.chat.completions.create({ model: id, tools, max_tokens: 8, temperature: 0, messages: [
  ...ask, called.choices[0].message, { role: "tool", tool_call_id: call.id, content: JSON.stringify({ temperature: 21 }) }] });
if (typeof answer.choices[0].message.content !== "string") fail("no answer after the tool result");

const completion = await client.completions.create({ model: id, prompt: "The quick brown fox", max_tokens: 8, seed: 1 });
if (typeof completion.choices[0].text !== "string") fail("no completion text");

let refused = false;
try {
  await client.chat.completions.create({ model: id, messages, max_tokens: -3 });
} catch (e) {
  refused = e.status === 400;
}
if (!refused) fail("a bad max_tokens was not refused with 400");

console.log(`openai-client: ok (model ${id}; plain ${plain.usage.completion_tokens} tokens, streamed in ${chunks} chunks, finish ${finish}; ` +
            `tool call get_weather(${call.function.arguments}), streamed the same, result answered)`);
