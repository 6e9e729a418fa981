// HTTP/1.1 requests as `sluice serve` reads them: an incremental parser fed the bytes of a
// connection as they arrive, with one set of bounds whatever the framing. The request line
// and each header line are bounded, so are the head and its header count (431); a body is
// framed by Content-Length or chunked transfer coding and bounded after decoding (413, known
// from Content-Length before a byte of it is read); compressed bodies are refused (415), a
// body without a length is 411 (no body runs to the end of the connection), any other
// transfer coding 501, other HTTP versions 505. Pipelined requests: the parser stops after
// each request and the rest of the bytes begin the next one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::server {

struct HttpLimits {
  size_t max_line = 8192;       // the request line, each header line, a chunk-size line (bytes)
  size_t max_head = 32768;      // request line and headers together (bytes)
  size_t max_headers = 100;     // header fields
  size_t max_body = 8 << 20;    // the body after chunked decoding (bytes)
};

struct HttpRequest {
  std::string method;   // as sent (case-sensitive, as HTTP says)
  std::string target;   // as sent: "/v1/completions?x=1"
  std::string path;     // the target's path, without the query
  int version_minor = 1;  // HTTP/1.0 or HTTP/1.1
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, values trimmed
  std::string body;     // decoded
  bool expect_continue = false;  // "Expect: 100-continue"

  // The first value of a header (name in lower case), "" when absent.
  const std::string& header(std::string_view name) const;
  bool has_header(std::string_view name) const;
  // Whether the connection stays open after the answer (HTTP/1.1 unless "Connection: close";
  // HTTP/1.0 only with "Connection: keep-alive").
  bool keep_alive() const;
};

class RequestParser {
 public:
  enum class Result { more, request, error };

  explicit RequestParser(const HttpLimits& limits) : limits_(limits) {}

  // Reads from data[0, n) until a whole request (request: take() it), an error (error_status()
  // and error_message() say which; the connection must close), or the bytes run out (more).
  // *used: the bytes consumed; after a request, the rest belongs to the next one.
  Result feed(const char* data, size_t n, size_t* used);
  // The request just completed; the parser starts over for the next one.
  HttpRequest take();

  bool started() const { return phase_ != Phase::head || !line_.empty() || !req_.method.empty(); }
  bool in_body() const { return phase_ != Phase::head && phase_ != Phase::done && phase_ != Phase::failed; }
  // The head asked for "100 Continue" before its body (read, body pending).
  bool expects_continue() const { return in_body() && req_.expect_continue; }
  // Bytes held for the request in progress (its head and body so far).
  size_t buffered() const { return head_bytes_ + req_.body.size(); }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }
  // The path of the request in progress once its request line is read ("" before): whose API
  // an error answer speaks for.
  const std::string& path() const { return req_.path; }

 private:
  enum class Phase { head, body, chunk_size, chunk_data, chunk_end, trailers, done, failed };
  Result fail(int status, std::string message);
  // One line of the head (without its line ending); false when it failed the request.
  bool head_line(std::string_view line);
  // The head ended: decide the body's framing; false when it failed the request.
  bool head_end();

  HttpLimits limits_;
  Phase phase_ = Phase::head;
  HttpRequest req_;
  std::string line_;        // a line in progress (head, chunk size, trailer)
  size_t head_bytes_ = 0;   // of the head so far
  uint64_t left_ = 0;       // body or chunk bytes still to read
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace sluice::server
