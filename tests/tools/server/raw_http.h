// A raw HTTP/1.1 client over TCP to 127.0.0.1 for the hostile-client tests: bytes exactly as
// written (malformed, trickled, pipelined), and the answers read back with a deadline.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sluice::test {

// A connected socket to 127.0.0.1:port (closed by the destructor); fd < 0 when refused.
struct RawConn {
  int fd = -1;
  explicit RawConn(int port);
  ~RawConn();
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;
  // Writes every byte; false once the peer is gone.
  bool send(std::string_view bytes);
  // Reads what arrives until the peer closes, `seconds` pass, or the bytes read hold `n`
  // complete responses (n = 0: read until close or timeout).
  std::string read(double seconds, size_t n = 0);
  // Whether the peer closed the connection (a read returns 0 or an error) within `seconds`.
  bool closed_within(double seconds);
};

struct RawResponse {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;  // chunked bodies decoded
  std::string header(const std::string& name) const;  // first value, case-insensitive; "" if none
};

// The complete responses at the start of `bytes` (Content-Length or chunked bodies; a body
// that runs to the close is complete only when `closed`).
std::vector<RawResponse> parse_responses(const std::string& bytes, bool closed = false);

// One request on a fresh connection and its response (status 0 when none came within
// `seconds`).
RawResponse raw_exchange(int port, std::string_view request, double seconds = 30);

// "POST path HTTP/1.1" with Host 127.0.0.1, Content-Type application/json and the length.
std::string post_json(const std::string& path, const std::string& body, const std::string& extra_headers = "");

}  // namespace sluice::test
