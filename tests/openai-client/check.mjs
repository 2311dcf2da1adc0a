// A real client nobody here wrote: the official `openai` npm package runs a plain and a streamed
// chat completion, and a text completion, against a running strata serve. Usage:
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

const completion = await client.completions.create({ model: id, prompt: "The quick brown fox", max_tokens: 8, seed: 1 });
if (typeof completion.choices[0].text !== "string") fail("no completion text");

let refused = false;
try {
  await client.chat.completions.create({ model: id, messages, max_tokens: -3 });
} catch (e) {
  refused = e.status === 400;
}
if (!refused) fail("a bad max_tokens was not refused with 400");

console.log(`openai-client: ok (model ${id}; plain ${plain.usage.completion_tokens} tokens, streamed in ${chunks} chunks, finish ${finish})`);
