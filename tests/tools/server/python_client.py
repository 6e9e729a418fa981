#!/usr/bin/env python3
"""Python's http.client against a running `sluice serve` (tests/tools/server/server_clients_test.cpp):
two requests on one kept-alive connection (a completion and /health), a streamed completion read
line by line, then two requests pipelined in one write and read back in order. Prints one JSON
object. Arguments: PORT PROMPT MAX_TOKENS."""
import http.client
import json
import socket
import sys

port, prompt, max_tokens = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
headers = {"Content-Type": "application/json"}
out = {}

conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
conn.request("POST", "/v1/completions", json.dumps(body), headers)
r = conn.getresponse()
out["completion_status"] = r.status
out["completion"] = json.loads(r.read())["choices"][0]["text"]
first_sock = conn.sock

conn.request("GET", "/health")
r = conn.getresponse()
out["health"] = json.loads(r.read())["status"]
out["same_connection"] = conn.sock is first_sock  # kept alive across both

# A stream ends with its connection's close (Connection: close after the chunked end);
# http.client opens a new one for the next request by itself.

conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), headers)
r = conn.getresponse()
text, done = "", False
for line in r:  # the chunked body, decoded by http.client, one SSE line at a time
    line = line.decode().strip()
    if not line.startswith("data: "):
        continue
    if line == "data: [DONE]":
        done = True
        continue
    text += json.loads(line[6:])["choices"][0]["text"]
out["stream"] = text
out["stream_done"] = done
out["stream_closes"] = r.getheader("Connection") == "close"
conn.request("GET", "/health")
out["health_after_stream"] = json.loads(conn.getresponse().read())["status"]

# Pipelining: two requests in one write, both answers read back in order on that socket.
s = socket.create_connection(("127.0.0.1", port), timeout=120)
payload = json.dumps(body).encode()
req = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
       b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
s.sendall(req + b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")



class SharedReader:
    """The socket as http.client sees it, with one buffered reader for every response: each
    HTTPResponse would otherwise make its own (the first swallowing the second's bytes) and
    close it after its body."""

    class File:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def close(self):
            pass

    def __init__(self, sock):
        self.file = SharedReader.File(sock.makefile("rb"))

    def makefile(self, *args, **kwargs):
        return self.file


reader = SharedReader(s)
pipelined = []
for method in ("POST", "GET"):
    resp = http.client.HTTPResponse(reader, method=method)
    resp.begin()
    pipelined.append({"status": resp.status, "body": json.loads(resp.read())})
s.close()
out["pipelined_text"] = pipelined[0]["body"]["choices"][0]["text"]
out["pipelined_health"] = pipelined[1]["body"]["status"]
print(json.dumps(out))
