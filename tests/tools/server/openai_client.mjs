// The official `openai` npm client against a running `sluice serve` (tests/tools/server/serve_cli_test.cpp):
// completions and chat, with and without streaming, greedy; and a bad request's status. Prints one
// JSON object on stdout. Environment: BASE_URL (http://127.0.0.1:PORT), PROMPT, MAX_TOKENS,
// CHAT_MESSAGES (JSON), API_KEY (optional).
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: process.env.API_KEY || "unused", maxRetries: 0 });
const prompt = process.env.PROMPT;
const max_tokens = Number(process.env.MAX_TOKENS);
const messages = JSON.parse(process.env.CHAT_MESSAGES);
const out = {};

const c = await client.completions.create({ model: "any", prompt, max_tokens, temperature: 0 });
out.completion = c.choices[0].text;
out.completion_finish = c.choices[0].finish_reason;
out.completion_usage = c.usage;

let text = "";
let usage = null;
const stream = await client.completions.create({ model: "any", prompt, max_tokens, temperature: 0, stream: true,
                                                  stream_options: { include_usage: true } });
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  if (chunk.choices.length) text += chunk.choices[0].text;
}
out.completion_stream = text;
out.completion_stream_usage = usage;

const chat = await client.chat.completions.create({ model: "any", messages, max_tokens, temperature: 0 });
out.chat = chat.choices[0].message.content;
out.chat_role = chat.choices[0].message.role;

text = "";
const chatStream = await client.chat.completions.create({ model: "any", messages, max_tokens, temperature: 0, stream: true });
for await (const chunk of chatStream) text += chunk.choices[0]?.delta?.content ?? "";
out.chat_stream = text;

try {
  await client.completions.create({ model: "any", prompt, max_tokens, n: 2 });
  out.bad_status = 200;
} catch (e) {
  out.bad_status = e.status;
  out.bad_message = e.error?.message ?? e.message;
}
console.log(JSON.stringify(out));
