// The official `openai` and `@anthropic-ai/sdk` npm clients against a running `sluice serve`
// (tests/tools/server/agent_api_test.cpp): JSON-schema replies (checked with ajv), forced tool
// calls, Anthropic messages streamed and not, a tool_use / tool_result round trip,
// count_tokens and an error in Anthropic's shape. Prints one JSON object on stdout.
// Environment: BASE_URL (http://127.0.0.1:PORT), API_KEY. Runs on Node 18 and 20.
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import Ajv from "ajv";

const base = process.env.BASE_URL;
const key = process.env.API_KEY;
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0 });
const ajv = new Ajv({ strict: false });
const out = { schema_replies: [], schema_failures: [] };

const schemas = [
  { type: "object", properties: { name: { type: "string", maxLength: 6 }, n: { type: "integer", minimum: 0, maximum: 99 } },
    required: ["name", "n"], additionalProperties: false },
  { type: "array", items: { enum: ["a", "b", "c"] }, minItems: 1, maxItems: 3 },
  { anyOf: [{ type: "boolean" }, { type: "object", properties: { ok: { const: true } }, required: ["ok"] }] },
];
for (const [i, schema] of schemas.entries()) {
  for (const seed of [1, 2]) {
    for (const stream of [false, true]) {
      const req = { model: "any", messages: [{ role: "user", content: "Give JSON." }], max_tokens: 120, temperature: 1, seed,
                    response_format: { type: "json_schema", json_schema: { name: "s" + i, schema, strict: true } } };
      let text = "", finish = null;
      if (stream) {
        const s = await openai.chat.completions.create({ ...req, stream: true });
        for await (const chunk of s) {
          text += chunk.choices[0]?.delta?.content ?? "";
          finish = chunk.choices[0]?.finish_reason ?? finish;
        }
      } else {
        const r = await openai.chat.completions.create(req);
        text = r.choices[0].message.content;
        finish = r.choices[0].finish_reason;
      }
      out.schema_replies.push({ schema: i, seed, stream, finish, text });
      let ok = false;
      try { ok = ajv.validate(schema, JSON.parse(text)); } catch (e) { ok = false; }
      if (finish === "stop" && !ok) out.schema_failures.push({ schema: i, seed, stream, text, errors: ajv.errors });
    }
  }
}

// Small: the fixture holds 256 positions of a byte-level tokenizer, tools and call included.
const tools = [{ type: "function", function: { name: "look",
  parameters: { type: "object", properties: { w: { type: "string", maxLength: 4 } }, required: ["w"] } } }];
const forced = await openai.chat.completions.create({ model: "any", messages: [{ role: "user", content: "cat" }],
  tools, tool_choice: { type: "function", function: { name: "look" } }, max_tokens: 90, temperature: 0 });
out.openai_call = forced.choices[0].message.tool_calls?.[0] ?? null;
out.openai_call_finish = forced.choices[0].finish_reason;

const atools = [{ name: "look", input_schema: { type: "object", properties: { w: { type: "string", maxLength: 4 } }, required: ["w"] } }];
const plain = await anthropic.messages.create({ model: "any", max_tokens: 8, temperature: 0, system: "Be brief.",
  messages: [{ role: "user", content: "Hello" }] });
out.anthropic_plain = plain;

const events = [];
let streamed = "";
const stream = await anthropic.messages.create({ model: "any", max_tokens: 8, temperature: 0, system: "Be brief.",
  messages: [{ role: "user", content: "Hello" }], stream: true });
for await (const ev of stream) {
  events.push(ev.type);
  if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") streamed += ev.delta.text;
}
out.anthropic_events = events;
out.anthropic_streamed = streamed;

const call = await anthropic.messages.create({ model: "any", max_tokens: 90, temperature: 0, tools: atools,
  tool_choice: { type: "any", disable_parallel_tool_use: true }, messages: [{ role: "user", content: "cat" }] });
out.anthropic_call = call;
const use = call.content.find((b) => b.type === "tool_use");
if (use) {
  const followup = await anthropic.messages.create({ model: "any", max_tokens: 2, temperature: 0, tools: atools,
    messages: [{ role: "user", content: "cat" }, { role: "assistant", content: call.content },
               { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "ok" }] }] });
  out.anthropic_followup = followup;
}
// The streaming helper of the SDK gathers the events into a final message.
const helper = anthropic.messages.stream({ model: "any", max_tokens: 90, temperature: 0, tools: atools,
  tool_choice: { type: "tool", name: "look" }, messages: [{ role: "user", content: "dog" }] });
out.anthropic_stream_final = await helper.finalMessage();

out.count = await anthropic.messages.countTokens({ model: "any", system: "Be brief.", messages: [{ role: "user", content: "Hello" }] });

try {
  await anthropic.messages.create({ model: "any", max_tokens: 8, messages: [{ role: "user", content: [{ type: "image" }] }] });
  out.bad_status = 200;
} catch (e) {
  out.bad_status = e.status;
  out.bad_error = e.error;
}
console.log(JSON.stringify(out));
