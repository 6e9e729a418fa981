// libFuzzer target for the HTTP/1.1 request parser of `sluice serve` (tools/server/http_request.h):
// the input is a connection's bytes, fed in pieces whose sizes the first bytes choose (as reads
// split them), requests taken one after another as a pipelining client sends them. Every request
// must keep the bounds (body, header count, head size) and every error must be a 4xx/5xx the
// transport answers; a crash, a sanitizer report or a violated invariant (__builtin_trap) is a bug.
//   build-fuzz/bin/fuzz_http_request -dict=tests/fuzz/http_request.dict tests/fuzz/corpus_http_request
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/http_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::server::RequestParser;
  sluice::server::HttpLimits limits;
  limits.max_line = 256;  // small bounds so that inputs of a few KB reach them
  limits.max_head = 1024;
  limits.max_headers = 16;
  limits.max_body = 2048;
  if (size < 2) return 0;
  const size_t piece = 1 + data[0] % 64;  // bytes per feed
  data += 1;
  size -= 1;
  RequestParser parser(limits);
  std::string in;
  size_t at = 0;
  for (;;) {
    if (at < size) {  // the next read's bytes
      const size_t take = std::min(piece, size - at);
      in.append(reinterpret_cast<const char*>(data) + at, take);
      at += take;
    } else if (in.empty()) {
      break;
    }
    size_t used = 0;
    const RequestParser::Result r = parser.feed(in.data(), in.size(), &used);
    if (used > in.size()) __builtin_trap();
    in.erase(0, used);
    if (r == RequestParser::Result::error) {
      const int s = parser.error_status();
      if (s < 400 || s > 505 || parser.error_message().empty()) __builtin_trap();
      return 0;
    }
    if (r == RequestParser::Result::more) {
      if (!in.empty()) __builtin_trap();  // "more" only once every byte was taken
      continue;
    }
    const sluice::server::HttpRequest req = parser.take();
    if (req.body.size() > limits.max_body || req.headers.size() > limits.max_headers) __builtin_trap();
    if (req.method.empty() || req.path.empty() || (req.path[0] != '/' && req.path != "*")) __builtin_trap();
    if (req.version_minor != 0 && req.version_minor != 1) __builtin_trap();
    for (const auto& [k, v] : req.headers)
      for (char c : k)
        if (c >= 'A' && c <= 'Z') __builtin_trap();  // names are lower-cased
  }
  return 0;
}
