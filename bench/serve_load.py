#!/usr/bin/env python3
"""serve_load.py: load a running `sluice serve` with concurrent streaming clients.

For each concurrency C of --clients, C threads start together and each sends --requests
streaming requests one after another (a fixed prompt of about --prompt-tokens tokens,
--max-tokens, temperature 0, stream_options.include_usage). Per request it records the time
to the first non-empty text (TTFT), the tokens generated (the usage chunk's
completion_tokens: a chunk may carry several tokens) and the time to the last chunk, and
checks the answer: HTTP 200, a finish_reason, the usage, `data: [DONE]`, no error event.

Prints one markdown row per level (JSON with --json; --json FILE writes it beside the table): total generated tokens/s is the sum
of the level's tokens over its wall time (first request sent to last answer done, prefill
included); decode tok/s is per request, (tokens - 1) / (last chunk - first text), averaged.
The server has no ignore_eos: a request that samples the end-of-text token ends early
(finish_reason "stop", counted in `stop`), and its tokens are counted as generated.

Python 3 standard library only. Exit status: 0, 1 when any request failed, 2 when the
server cannot be reached or the arguments are wrong.
"""
import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse

# A fixed English passage; the prompt is its first W words, repeated as needed, with W chosen
# at start so that the server counts about --prompt-tokens tokens (calibrate_prompt).
PASSAGE = (
    "The river ran slowly past the old mill, where the miller's children used to sit on the "
    "stone wall and count the boats that came up from the harbour in the morning. In the "
    "evening the boats went back down again, heavy with grain and wool, and the children "
    "counted them once more before their mother called them in for supper. Years later, "
    "when the mill had closed and the wall had fallen, one of them wrote a book about the "
    "river, and the people of the town read it aloud to each other in the long winter nights."
).split()


def prompt_text(n_words):
    return " ".join(PASSAGE[i % len(PASSAGE)] for i in range(max(1, n_words)))


class Target:
    def __init__(self, url, api_key, timeout):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"--url {url}: expected http://HOST:PORT")
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.base = u.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key

    def connect(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def get_json(self, path):
        conn = self.connect()
        try:
            conn.request("GET", self.base + path, headers=self.headers)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {resp.status}: {body[:200]!r}")
            return json.loads(body)
        finally:
            conn.close()


def error_message(body):
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


# --response-format json_schema: a record an app might ask for (strings, a number, an enum, a
# bounded array), compiled by the server to a grammar and enforced token by token.
RESPONSE_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "year": {"type": "integer"},
        "kind": {"enum": ["book", "film", "album"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    },
    "required": ["name", "year", "kind", "tags"],
    "additionalProperties": False,
}


def one_request(target, endpoint, payload):
    """Sends one streaming request; returns a dict of its measures (error: None or a reason)."""
    r = {"ttft_s": None, "total_s": None, "decode_s": None, "tokens": 0, "prompt_tokens": None,
         "chunks": 0, "finish_reason": None, "error": None}
    path = target.base + ("/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
    body = json.dumps(payload).encode()
    conn = target.connect()
    t0 = time.perf_counter()
    t_last = None
    usage = None
    done = False
    try:
        conn.request("POST", path, body=body, headers=target.headers)
        resp = conn.getresponse()
        if resp.status != 200:
            r["error"] = f"HTTP {resp.status}: {error_message(resp.read())}"
            return r
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line or line.startswith(b":"):  # event separator, keep-alive comment
                continue
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                r["error"] = "error event: " + str(ev["error"].get("message", ev["error"]))
                break
            if ev.get("usage"):
                usage = ev["usage"]
            for choice in ev.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") if endpoint == "chat" else choice.get("text")
                if text:
                    now = time.perf_counter()
                    if r["ttft_s"] is None:
                        r["ttft_s"] = now - t0
                    r["chunks"] += 1
                    t_last = now
                if choice.get("finish_reason"):
                    r["finish_reason"] = choice["finish_reason"]
                    t_last = time.perf_counter()
    except (OSError, http.client.HTTPException, ValueError) as e:
        r["error"] = f"{type(e).__name__}: {e}"
        return r
    finally:
        conn.close()
    r["total_s"] = time.perf_counter() - t0
    if r["error"]:
        return r
    if not done:
        r["error"] = "the stream ended without data: [DONE]"
    elif r["finish_reason"] is None:
        r["error"] = "no finish_reason"
    elif usage is None:
        r["error"] = "no usage chunk"
    else:
        r["tokens"] = int(usage.get("completion_tokens", 0))
        r["prompt_tokens"] = usage.get("prompt_tokens")
        if r["ttft_s"] is None and r["tokens"] > 0:
            r["error"] = f"{r['tokens']} tokens generated but no text streamed"
        elif r["ttft_s"] is not None:
            r["decode_s"] = t_last - t0 - r["ttft_s"]
    return r


def calibrate_prompt(target, endpoint, payload, n_tokens):
    """The payload with a prompt of about n_tokens tokens as the server counts them (a few
    requests of max_tokens 1, which also warm the server up); raises RuntimeError on failure."""
    words, best = n_tokens, None
    for _ in range(6):
        p = dict(payload, max_tokens=1)
        text = prompt_text(words)
        if endpoint == "chat":
            p["messages"] = [{"role": "user", "content": text}]
        else:
            p["prompt"] = text
        r = one_request(target, endpoint, p)
        if r["error"]:
            raise RuntimeError(f"a prompt of {words} words: {r['error']}")
        got = r["prompt_tokens"]
        if best is None or abs(got - n_tokens) < abs(best[1] - n_tokens):
            best = (p, got)
        if abs(got - n_tokens) <= max(1, n_tokens // 100) or got <= 0:
            break
        words = max(1, words + round((n_tokens - got) * words / got))
    p = dict(best[0], max_tokens=payload["max_tokens"])
    return p, best[1]


def percentile(xs, p):
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def run_level(target, endpoint, payload, clients, requests):
    results = [[] for _ in range(clients)]
    start = threading.Barrier(clients + 1)

    def client(i):
        start.wait()
        for _ in range(requests):
            results[i].append(one_request(target, endpoint, payload))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    flat = [r for rs in results for r in rs]
    ok = [r for r in flat if not r["error"]]
    ttft = [r["ttft_s"] * 1e3 for r in ok if r["ttft_s"] is not None]
    decode = [(r["tokens"] - 1) / r["decode_s"] for r in ok if r["decode_s"] and r["tokens"] > 1]
    tokens = sum(r["tokens"] for r in ok)
    prompt = [r["prompt_tokens"] for r in ok if r["prompt_tokens"] is not None]
    return {
        "clients": clients,
        "requests": len(flat),
        "errors": len(flat) - len(ok),
        "error_messages": sorted({r["error"] for r in flat if r["error"]}),
        "finish_length": sum(1 for r in ok if r["finish_reason"] == "length"),
        "finish_stop": sum(1 for r in ok if r["finish_reason"] != "length"),
        "prompt_tokens_mean": mean(prompt),
        "generated_tokens": tokens,
        "generated_tokens_per_request": tokens / len(ok) if ok else None,
        "wall_s": wall,
        "total_tokens_per_s": tokens / wall if wall > 0 else None,
        "ttft_ms_mean": mean(ttft),
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_p90": percentile(ttft, 90),
        "decode_tokens_per_s_mean": mean(decode),
    }


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(rows, title):
    out = []
    if title:
        out.append(f"{title}\n")
    out.append("| clients | requests | prompt tok | gen tok/req | total gen tok/s | TTFT mean ms | TTFT p50 ms "
               "| TTFT p90 ms | decode tok/s/req | length/stop | errors |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        out.append(f"| {r['clients']} | {r['requests']} | {fmt(r['prompt_tokens_mean'], 0)} "
                   f"| {fmt(r['generated_tokens_per_request'])} | {fmt(r['total_tokens_per_s'])} "
                   f"| {fmt(r['ttft_ms_mean'])} | {fmt(r['ttft_ms_p50'])} | {fmt(r['ttft_ms_p90'])} "
                   f"| {fmt(r['decode_tokens_per_s_mean'])} | {r['finish_length']}/{r['finish_stop']} | {r['errors']} |")
    return "\n".join(out)


def positive_list(s):
    try:
        xs = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: expected integers separated by commas")
    if not xs or min(xs) < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: expected positive integers separated by commas")
    return xs


def main():
    ap = argparse.ArgumentParser(description="concurrent streaming clients against a running sluice serve")
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="the server (default http://127.0.0.1:8080)")
    ap.add_argument("--clients", type=positive_list, default=[1, 8, 32, 64],
                    help="concurrency levels, comma-separated (default 1,8,32,64)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client at each level (default 2)")
    ap.add_argument("--prompt-tokens", type=int, default=128,
                    help="prompt length in tokens as the server counts them, to within 1%% (default 128)")
    ap.add_argument("--max-tokens", type=int, default=128, help="max_tokens of each request (default 128)")
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                    help="completions (default: the prompt as sent) or chat (through the model's chat template)")
    ap.add_argument("--response-format", choices=["text", "json_object", "json_schema"], default="text",
                    help="text (default), json_object, or json_schema (RESPONSE_SCHEMA below): constrained sampling")
    ap.add_argument("--timeout", type=float, default=300, help="socket timeout of each request in seconds (default 300)")
    ap.add_argument("--api-key", default="", help="sent as Authorization: Bearer KEY")
    ap.add_argument("--title", default="", help="a line printed above the table")
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="write the levels as JSON to FILE (the table still printed), or alone: print JSON instead of the table")
    a = ap.parse_args()
    if a.requests < 1 or a.max_tokens < 1 or a.prompt_tokens < 1:
        ap.error("--requests, --max-tokens and --prompt-tokens must be positive")

    try:
        target = Target(a.url, a.api_key, a.timeout)
        models = target.get_json("/v1/models")
        model = models["data"][0]["id"]
    except (OSError, http.client.HTTPException, RuntimeError, ValueError, KeyError, IndexError, TypeError) as e:
        print(f"serve_load: error: cannot reach a server at {a.url}: {e}", file=sys.stderr)
        return 2

    payload = {"model": model, "max_tokens": a.max_tokens, "temperature": 0, "stream": True,
               "stream_options": {"include_usage": True}}
    if a.response_format == "json_object":
        payload["response_format"] = {"type": "json_object"}
    elif a.response_format == "json_schema":
        payload["response_format"] = {"type": "json_schema", "json_schema": {"name": "record", "schema": RESPONSE_SCHEMA}}
    try:  # the calibration requests also warm the server up; none of them is counted
        payload, n_prompt = calibrate_prompt(target, a.endpoint, payload, a.prompt_tokens)
    except RuntimeError as e:
        print(f"serve_load: error: {e}", file=sys.stderr)
        return 1
    print(f"serve_load: {a.url} ({model}): prompt of {n_prompt} tokens, max_tokens {a.max_tokens}", file=sys.stderr)
    rows = []
    for c in a.clients:
        row = run_level(target, a.endpoint, payload, c, a.requests)
        rows.append(row)
        for m in row["error_messages"][:3]:
            print(f"serve_load: {c} clients: {m}", file=sys.stderr)
        print(f"serve_load: {c} clients: {row['requests']} requests in {row['wall_s']:.1f} s", file=sys.stderr)
    doc = json.dumps({"url": a.url, "model": model, "endpoint": a.endpoint, "response_format": a.response_format,
                      "max_tokens": a.max_tokens,
                      "prompt_tokens": n_prompt, "title": a.title, "levels": rows}, indent=1)
    if a.json == "-":
        print(doc)
    else:
        print(markdown(rows, a.title))
        if a.json:
            with open(a.json, "w") as f:
                f.write(doc + "\n")
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("serve_load: interrupted", file=sys.stderr)
        sys.exit(130)
