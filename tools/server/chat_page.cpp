// The chat page (chat_page.h): HTML, CSS and a little JavaScript in one string.
#include "chat_page.h"

namespace sluice::server {

const std::string& chat_page_html() {
  static const std::string page = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sluice</title>
<style>
  body { font: 15px/1.45 system-ui, sans-serif; margin: 0; display: flex; height: 100vh; color: #222; }
  main { flex: 3; display: flex; flex-direction: column; padding: 12px; min-width: 0; }
  aside { flex: 2; border-left: 1px solid #ddd; padding: 12px; background: #fafafa; min-width: 0; }
  #log { flex: 1; overflow-y: auto; }
  .msg { margin: 6px 0; padding: 8px 10px; border-radius: 8px; white-space: pre-wrap; }
  .user { background: #e8f0fe; }
  .assistant { background: #f1f3f4; }
  .error { background: #fde8e8; }
  form { display: flex; gap: 8px; margin-top: 8px; }
  textarea { flex: 1; font: inherit; padding: 6px; height: 3.2em; }
  button { font: inherit; padding: 0 16px; }
  .figures { display: grid; grid-template-columns: auto auto; gap: 2px 12px; margin-bottom: 10px; }
  .figures span:nth-child(odd) { color: #666; }
  canvas { width: 100%; height: 260px; image-rendering: pixelated; border: 1px solid #ddd; background: #fff; }
  .note { color: #666; font-size: 13px; }
</style>
</head>
<body>
<main>
  <div id="log"></div>
  <form id="form">
    <textarea id="input" placeholder="Type a message; Enter sends, Shift+Enter adds a line"></textarea>
    <button id="send" type="submit">Send</button>
  </form>
</main>
<aside>
  <h3 style="margin-top:0">sluice at work</h3>
  <div class="figures">
    <span>tokens/s</span><span id="tps">0</span>
    <span>expert cache hit rate</span><span id="hit">-</span>
    <span>read from disk</span><span id="disk">-</span>
    <span>read from host RAM</span><span id="host">-</span>
    <span>sequences / queued</span><span id="seq">0 / 0</span>
  </div>
  <canvas id="heat" width="120" height="48"></canvas>
  <p class="note" id="heatnote">Hit rate of each MoE layer (a row) over time (a column a sample; green: hits, red: misses).</p>
</aside>
<script>
"use strict";
const log = document.getElementById("log"), input = document.getElementById("input");
const messages = [];
let useChat = true;

function bubble(role, text) {
  const d = document.createElement("div");
  d.className = "msg " + role;
  d.textContent = text;
  log.appendChild(d);
  log.scrollTop = log.scrollHeight;
  return d;
}

// Reads server-sent events from a fetch response; calls onData with each parsed data line.
async function readEvents(res, onData) {
  const reader = res.body.getReader(), dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let at;
    while ((at = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, at);
      buf = buf.slice(at + 2);
      for (const line of ev.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

async function send(text) {
  messages.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant", "");
  out.dataset.state = "streaming";
  const body = useChat
    ? { messages, stream: true }  // the reply may run to the end of the context
    : { prompt: messages.map(m => m.content).join("\n"), stream: true, max_tokens: 128 };
  try {
    const res = await fetch(useChat ? "/v1/chat/completions" : "/v1/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    if (!res.ok) {
      const err = await res.json().catch(() => ({ error: { message: res.statusText } }));
      if (useChat && err.error && err.error.code === "no_chat_template") {
        useChat = false;  // this model completes text: ask again that way
        messages.pop(); log.removeChild(out); log.removeChild(log.lastChild);
        return send(text);
      }
      throw new Error(err.error ? err.error.message : res.statusText);
    }
    await readEvents(res, chunk => {
      if (chunk.error) throw new Error(chunk.error.message);
      const c = chunk.choices && chunk.choices[0];
      if (!c) return;
      out.textContent += useChat ? (c.delta && c.delta.content || "") : (c.text || "");
      log.scrollTop = log.scrollHeight;
    });
    messages.push({ role: "assistant", content: out.textContent });
    out.dataset.state = "done";
  } catch (e) {
    out.className = "msg error";
    out.textContent = String(e.message || e);
    out.dataset.state = "error";
  }
}

document.getElementById("form").addEventListener("submit", ev => {
  ev.preventDefault();
  const text = input.value.trim();
  if (!text) return;
  input.value = "";
  send(text);
});
input.addEventListener("keydown", ev => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); document.getElementById("form").requestSubmit(); }
});

// The live panel: a sample every half second; the heat map scrolls left.
const heat = document.getElementById("heat"), ctx = heat.getContext("2d");
function rate(bps) { return bps > 1e9 ? (bps / 1e9).toFixed(2) + " GB/s" : (bps / 1e6).toFixed(1) + " MB/s"; }
async function poll() {
  try {
    const s = await (await fetch("/v1/cache")).json();
    document.getElementById("tps").textContent = s.tokens_per_second.toFixed(1);
    document.getElementById("seq").textContent = s.active_sequences + " / " + s.queued;
    if (s.streaming) {
      document.getElementById("hit").textContent = s.hit_rate.toFixed(3);
      document.getElementById("disk").textContent = rate(s.disk_bytes_per_second);
      document.getElementById("host").textContent = rate(s.host_bytes_per_second);
      const n = s.layers.length;
      if (n > 0) {
        if (heat.height !== n) { heat.height = n; }
        const img = ctx.getImageData(1, 0, heat.width - 1, heat.height);
        ctx.putImageData(img, 0, 0);
        s.layers.forEach((l, i) => {
          const h = Math.max(0, Math.min(1, l.hit_rate));
          ctx.fillStyle = "rgb(" + Math.round(220 * (1 - h)) + "," + Math.round(180 * h) + ",60)";
          ctx.fillRect(heat.width - 1, i, 1, 1);
        });
      }
    } else {
      document.getElementById("heatnote").textContent = "Every expert is resident: nothing is streamed.";
    }
  } catch (e) { /* the server went away; try again */ }
  setTimeout(poll, 500);
}
poll();
</script>
</body>
</html>
)HTML";
  return page;
}

}  // namespace sluice::server
