// HttpTransport: the connections of `sluice serve`, all on one thread that never blocks. It
// accepts, reads and parses requests (http_request.h), hands each whole request to the
// server's handler, and writes answers that any thread hands it through the request's
// Exchange. No thread belongs to a connection: a client that trickles its head, sends nothing,
// never reads its answer or holds a stream open costs a socket and its buffered bytes, never a
// worker, so the handler (and so /health) is reached whatever other clients do.
//
// Bounds (TransportOptions): connections (at the cap, the one idle longest is closed for a new
// one), the bytes buffered from clients across all connections (beyond: 503), the time to
// send a head, a body and to come back on a kept-alive connection (408 or a close), and a
// stalled reader (its unsent answer over a bound, or no progress for write_timeout: closed,
// its request cancelled). A client that closes its connection is noticed at once, mid-stream
// or not: its Exchange says so (on_gone) and the server cancels the request. Pipelined
// requests are answered in order, one at a time.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "http_request.h"

namespace sluice::server {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct TransportOptions {
  HttpLimits limits;
  size_t max_connections = 1024;
  size_t max_buffered_input = 64 << 20;  // bytes read and not yet handled, all connections together
  size_t max_pending_output = 4 << 20;   // a stream's answer written and not yet read by its client
  std::chrono::milliseconds idle_timeout{5000};    // a kept-alive connection without a new request
  std::chrono::milliseconds head_timeout{10000};   // from a request's first byte to its head's end
  std::chrono::milliseconds body_timeout{30000};   // from the head's end to the body's end
  std::chrono::milliseconds write_timeout{30000};  // an answer that makes no progress
  std::chrono::milliseconds drain_timeout{10000};  // after stop: answers still being written
};

// One request's answer, written from any thread: a whole response, or a stream of chunks.
class Exchange {
 public:
  struct Shared;  // the transport's side (wake-up, output)
  Exchange(std::shared_ptr<Shared> shared, bool keep_alive, bool head_only, bool http10);

  // The whole answer. `extra` headers come after Content-Type and Content-Length.
  void respond(int status, const std::string& content_type, std::string body, const HeaderList& extra = {});
  // Starts a streamed answer (chunked; HTTP/1.0: to the connection's close). keep_alive false:
  // the connection closes after the stream's end (announced with Connection: close).
  void begin_stream(int status, const std::string& content_type, const HeaderList& extra = {}, bool keep_alive = true);
  // A piece of the stream; false when the client is gone or too slow to read (then the
  // stream is dropped and on_gone runs).
  bool write(std::string_view data);
  void end_stream();

  // Runs fn once when the client goes away before the answer was written (at once when it
  // already went); from the transport's thread, or the caller's.
  void on_gone(std::function<void()> fn);
  bool gone() const;
  // The status, once the answer began (0 before).
  int status() const;

  // The transport's side.
  bool take_output(std::string* out, bool* finished);  // appends pending bytes; true when any
  void mark_gone();
  bool keep_alive() const;

 private:
  std::string head(int status, const std::string& content_type, const HeaderList& extra, const std::string& framing) const;
  void push(std::string bytes, bool finished);

  std::shared_ptr<Shared> shared_;
  const bool head_only_, http10_;
  mutable std::mutex mu_;
  bool keep_alive_;                // under mu_
  std::string pending_;            // under mu_
  bool finished_ = false;          // under mu_: the last byte is in pending_ (or was taken)
  bool gone_ = false;              // under mu_
  bool streaming_ = false;         // under mu_
  int status_ = 0;                 // under mu_
  std::function<void()> on_gone_;  // under mu_
};

// The handler: called on the transport's thread for every request; it must not block (hand
// slow work to another thread with the Exchange).
using RequestHandler = std::function<void(HttpRequest&&, std::shared_ptr<Exchange>)>;
// The body of an answer the transport makes itself (a malformed request: 400, 408, 411, 413,
// 414, 415, 431, 501, 503, 505), from its status, message and the request's path ("" when the
// request line was not read).
using ErrorBody = std::function<std::string(int status, const std::string& message, const std::string& path)>;

class HttpTransport {
 public:
  HttpTransport(const TransportOptions& options, RequestHandler handler, ErrorBody error_body);
  ~HttpTransport();

  // Binds host:port (port 0: a free one); false with *error set.
  bool bind(const std::string& host, int port, std::string* error);
  int port() const { return port_; }
  // Serves until stop(); after it, stops accepting, answers what is being written (at most
  // drain_timeout), closes every connection and returns.
  void run();
  // From any thread; run() returns soon after (at once when it has not begun).
  void stop();

  // Connections open now (for tests and metrics).
  size_t connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace sluice::server
