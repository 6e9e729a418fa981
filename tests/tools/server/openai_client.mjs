// The official `openai` npm client against a running `sluice serve` (tests/tools/server/serve_cli_test.cpp),
// through each of its transports: its default (node-fetch over Node's http module and a
// keep-alive agent) and Node's own fetch (undici). For each: completions and chat, with and
// without streaming, greedy; and a bad request's status. Prints one JSON object, a member per
// transport. Environment: BASE_URL (http://127.0.0.1:PORT), PROMPT, MAX_TOKENS, CHAT_MESSAGES
// (JSON), API_KEY (optional).
import OpenAI from "openai";

const prompt = process.env.PROMPT;
const max_tokens = Number(process.env.MAX_TOKENS);
const messages = JSON.parse(process.env.CHAT_MESSAGES);

async function run(client) {
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

  // Streams back to back on the kept-alive connections.
  for (let i = 0; i < 6; ++i) {
    text = "";
    const again = await client.completions.create({ model: "any", prompt, max_tokens, temperature: 0, stream: true });
    for await (const chunk of again) text += chunk.choices[0]?.text ?? "";
    if (text !== out.completion_stream) out.repeat_mismatch = text;
  }

  try {
    await client.completions.create({ model: "any", prompt, max_tokens, n: 2 });
    out.bad_status = 200;
  } catch (e) {
    out.bad_status = e.status;
    out.bad_message = e.error?.message ?? e.message;
  }
  return out;
}

const options = { baseURL: process.env.BASE_URL + "/v1", apiKey: process.env.API_KEY || "unused", maxRetries: 0 };
const result = { node: process.version };
result["node-fetch"] = await run(new OpenAI(options));
if (typeof globalThis.fetch === "function") result["undici"] = await run(new OpenAI({ ...options, fetch: globalThis.fetch }));
console.log(JSON.stringify(result));
