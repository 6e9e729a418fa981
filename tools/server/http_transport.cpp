// HttpTransport (http_transport.h): one poll() loop over the listening socket, an eventfd
// that other threads write to when an Exchange has output, and every connection.
#include "http_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>

namespace sluice::server {

using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kReadChunk = 64 << 10;                           // bytes per recv
constexpr auto kLingerTime = std::chrono::milliseconds(2000);     // reading after an error answer
constexpr size_t kLingerBytes = 16 << 20;                         // at most this many discarded
constexpr size_t kOutputPause = 1 << 20;  // unsent answers beyond which a connection's next requests wait

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 421: return "Misdirected Request";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

}  // namespace

struct Exchange::Shared {
  int wake_fd = -1;
  size_t max_pending_output = 4 << 20;
  ~Shared() {
    if (wake_fd >= 0) ::close(wake_fd);
  }
  void wake() const {
    const uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }
};

Exchange::Exchange(std::shared_ptr<Shared> shared, bool keep_alive, bool head_only, bool http10)
    : shared_(std::move(shared)), head_only_(head_only), http10_(http10), keep_alive_(keep_alive) {}

bool Exchange::keep_alive() const {
  std::lock_guard<std::mutex> lk(mu_);
  return keep_alive_;
}

std::string Exchange::head(int status, const std::string& content_type, const HeaderList& extra,
                           const std::string& framing) const {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
  h += framing;
  for (const auto& [k, v] : extra) h += k + ": " + v + "\r\n";
  h += keep_alive_ ? "Connection: keep-alive\r\nKeep-Alive: timeout=5\r\n" : "Connection: close\r\n";
  return h + "\r\n";
}

void Exchange::push(std::string bytes, bool finished) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (gone_ || finished_) return;
    pending_ += bytes;
    finished_ = finished;
  }
  shared_->wake();
}

void Exchange::respond(int status, const std::string& content_type, std::string body, const HeaderList& extra) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (status_ != 0) return;  // one answer per request
    status_ = status;
  }
  std::string bytes = head(status, content_type, extra, "Content-Length: " + std::to_string(body.size()) + "\r\n");
  if (!head_only_) bytes += body;
  push(std::move(bytes), true);
}

void Exchange::begin_stream(int status, const std::string& content_type, const HeaderList& extra, bool keep_alive) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (status_ != 0) return;
    status_ = status;
    streaming_ = true;
    keep_alive_ = keep_alive_ && keep_alive;
  }
  push(head(status, content_type, extra, http10_ ? "" : "Transfer-Encoding: chunked\r\n"), false);
}

bool Exchange::write(std::string_view data) {
  if (data.empty()) return !gone();
  char size[24];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string bytes = http10_ ? std::string(data) : size + std::string(data) + "\r\n";
  bool overflow = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (gone_) return false;
    overflow = pending_.size() + bytes.size() > shared_->max_pending_output;
  }
  if (overflow) {  // the client does not read its stream: dropped like a client that left
    mark_gone();
    shared_->wake();
    return false;
  }
  push(std::move(bytes), false);
  return true;
}

void Exchange::end_stream() { push(http10_ ? std::string() : std::string("0\r\n\r\n"), true); }

void Exchange::on_gone(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!gone_) {
      on_gone_ = std::move(fn);
      return;
    }
  }
  fn();
}

bool Exchange::gone() const {
  std::lock_guard<std::mutex> lk(mu_);
  return gone_;
}

int Exchange::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  return status_;
}

bool Exchange::take_output(std::string* out, bool* finished) {
  std::lock_guard<std::mutex> lk(mu_);
  const bool any = !pending_.empty();
  out->append(pending_);
  pending_.clear();
  *finished = finished_;
  return any;
}

void Exchange::mark_gone() {
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (gone_) return;
    gone_ = true;
    fn = std::move(on_gone_);
    on_gone_ = nullptr;
  }
  if (fn) fn();
}

struct HttpTransport::Impl {
  struct Conn {
    int fd = -1;
    std::string in;                 // read, not yet parsed (the next pipelined request)
    RequestParser parser;
    std::shared_ptr<Exchange> ex;   // the request being answered
    std::string out;                // taken from ex, not yet sent
    size_t out_at = 0;
    bool ex_finished = false;       // ex's last byte is in out
    bool close_after = false;       // close once out is sent
    bool continue_sent = false;     // "100 Continue" for this request
    bool peer_closed = false;
    bool dead = false;              // closed; removed from conns at the next sweep
    uint64_t serial = 0;            // tells a reused descriptor's new connection from the old
    std::optional<Clock::time_point> linger_until;  // an error was answered: reading to discard
    size_t lingered = 0;
    size_t held = 0;                // bytes counted in buffered_input for this connection
    Clock::time_point idle_since, head_since, body_since, write_since;
    bool head_started = false, body_started = false;
    explicit Conn(const HttpLimits& l) : parser(l) {}
  };

  TransportOptions opt;
  RequestHandler handler;
  ErrorBody error_body;
  std::shared_ptr<Exchange::Shared> shared = std::make_shared<Exchange::Shared>();
  int listen_fd = -1;
  std::map<int, std::unique_ptr<Conn>> conns;
  size_t buffered_input = 0;
  uint64_t serials = 0;
  std::atomic<bool> stopping{false};
  std::atomic<size_t> n_conns{0};

  Impl(const TransportOptions& o, RequestHandler h, ErrorBody e) : opt(o), handler(std::move(h)), error_body(std::move(e)) {
    shared->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    shared->max_pending_output = opt.max_pending_output;
  }
  ~Impl() {
    for (auto& [fd, c] : conns)
      if (!c->dead) ::close(fd);
    if (listen_fd >= 0) ::close(listen_fd);
  }

  void hold(Conn& c, size_t now_held) {
    buffered_input = buffered_input - c.held + now_held;
    c.held = now_held;
  }

  // Closes the socket now; the Conn leaves `conns` at the loop's next sweep (callers up the
  // stack may still hold it: they check `dead`).
  void close_conn(Conn& c) {
    if (c.dead) return;
    c.dead = true;
    if (c.ex && !(c.ex_finished && c.out_at == c.out.size())) c.ex->mark_gone();
    hold(c, 0);
    ::close(c.fd);
  }

  void sweep() {
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->second->dead) it = conns.erase(it);
      else ++it;
    }
    n_conns = conns.size();
  }

  // An answer of the transport's own (a malformed, oversized or late request); the connection
  // closes after it, reading and dropping what the client still sends for a moment so that
  // the answer is not lost to a reset.
  void answer_error(Conn& c, int status, const std::string& message, const std::string& path) {
    auto ex = std::make_shared<Exchange>(shared, false, false, false);
    ex->respond(status, "application/json", error_body(status, message, path));
    bool fin = false;
    ex->take_output(&c.out, &fin);
    c.ex.reset();
    c.ex_finished = true;
    c.close_after = true;
    c.in.clear();
    hold(c, 0);
    c.write_since = Clock::now();
  }

  void dispatch(Conn& c, HttpRequest&& req) {
    if (stopping) {
      answer_error(c, 503, "the server is shutting down", req.path);
      return;
    }
    // HTTP/1.0 closes after every answer: a stream has no other end there.
    const bool keep = req.keep_alive() && req.version_minor >= 1;
    auto ex = std::make_shared<Exchange>(shared, keep, req.method == "HEAD", req.version_minor == 0);
    c.ex = ex;
    c.ex_finished = false;
    c.close_after = !keep;
    c.write_since = Clock::now();
    hold(c, c.in.size() + req.body.size());  // the body is held until the answer ends
    const std::string path = req.path;
    try {
      handler(std::move(req), ex);
    } catch (const std::exception& e) {
      ex->respond(500, "application/json", error_body(500, e.what(), path));
    }
    collect(c);
  }

  // Parses what the connection has read, dispatching whole requests (one at a time).
  void advance(Conn& c) {
    while (!c.dead && !c.ex && !c.close_after && !c.in.empty() && c.out.size() < kOutputPause) {
      const Clock::time_point now = Clock::now();
      if (!c.head_started) {
        c.head_started = true;
        c.head_since = now;
      }
      size_t used = 0;
      const RequestParser::Result r = c.parser.feed(c.in.data(), c.in.size(), &used);
      c.in.erase(0, used);
      if (c.parser.in_body() && !c.body_started) {
        c.body_started = true;
        c.body_since = now;
      }
      if (r == RequestParser::Result::error) {
        answer_error(c, c.parser.error_status(), c.parser.error_message(), c.parser.path());
        return;
      }
      if (r == RequestParser::Result::more) {
        hold(c, c.in.size() + c.parser.buffered());
        if (c.parser.expects_continue() && !c.continue_sent) {
          c.continue_sent = true;
          c.out += "HTTP/1.1 100 Continue\r\n\r\n";
          c.write_since = now;
          flush(c);
        }
        return;
      }
      HttpRequest req = c.parser.take();
      c.head_started = c.body_started = c.continue_sent = false;
      dispatch(c, std::move(req));
    }
    if (!c.ex && !c.close_after && c.in.empty() && !c.parser.started()) hold(c, 0);
  }

  // Moves the exchange's output to the connection and sends what the socket takes; ends the
  // exchange when its last byte went out.
  void collect(Conn& c) {
    if (c.ex) {
      bool fin = false;
      if (c.ex->take_output(&c.out, &fin) && c.out_at == 0) c.write_since = Clock::now();
      c.ex_finished = fin;
      if (c.ex->gone() && !fin) {  // dropped as too slow a reader
        close_conn(c);
        return;
      }
    }
    flush(c);
  }

  // Sends pending output; closes or goes back to reading when the answer is complete. The
  // Conn may be gone afterwards: callers look it up again.
  void flush(Conn& c) {
    if (c.dead) return;
    while (c.out_at < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_at, c.out.size() - c.out_at, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_at += static_cast<size_t>(n);
        c.write_since = Clock::now();
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0 && errno == EINTR) continue;
      close_conn(c);  // the client is gone
      return;
    }
    if (c.out_at == c.out.size()) {
      c.out.clear();
      c.out_at = 0;
    } else if (c.out.size() - c.out_at > opt.max_pending_output && c.ex && !c.ex_finished) {
      close_conn(c);  // a stream its client does not read
      return;
    }
    const bool answered = c.out.empty() && (c.ex ? c.ex_finished : c.close_after);
    if (!answered) return;
    if (c.close_after || stopping || c.peer_closed || (c.ex && !c.ex->keep_alive())) {
      // The answer is complete: end our side and read what the client may still send until it
      // closes (or kLingerTime): closing with unread bytes would reset the connection and
      // could lose the answer's tail in flight.
      if (!c.linger_until && !c.peer_closed && !stopping) {
        ::shutdown(c.fd, SHUT_WR);
        c.linger_until = Clock::now() + kLingerTime;
        return;
      }
      if (!c.linger_until) close_conn(c);
      return;
    }
    c.ex.reset();
    c.ex_finished = false;
    c.idle_since = Clock::now();
    hold(c, c.in.size());
    // A pipelined request may wait in c.in: advance() loops over them, or the main loop
    // resumes it.
  }

  // Reads what the socket has; false when the connection closed.
  void read_some(Conn& c) {
    static thread_local char buf[kReadChunk];
    for (int round = 0; round < 4 && !c.dead; ++round) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        c.peer_closed = true;
        return;
      }
      if (c.linger_until) {
        c.lingered += static_cast<size_t>(n);
        if (c.lingered > kLingerBytes) close_conn(c);
        continue;
      }
      if (buffered_input + static_cast<size_t>(n) > opt.max_buffered_input) {
        answer_error(c, 503, "the server holds too many request bytes from its clients; try again later", c.parser.path());
        return;
      }
      c.in.append(buf, static_cast<size_t>(n));
      hold(c, c.held + static_cast<size_t>(n));
      advance(c);
      if (c.ex || c.close_after) return;  // the next request waits until this one is answered
    }
  }

  size_t live() const {
    size_t n = 0;
    for (const auto& [fd, c] : conns) n += !c->dead;
    return n;
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of descriptors (the next poll tries again)
      if (live() >= opt.max_connections && !evict_one()) {
        static const std::string busy = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        (void)!::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL);
        ::close(fd);
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Conn>(opt.limits);
      c->fd = fd;
      c->serial = ++serials;
      c->idle_since = Clock::now();
      conns[fd] = std::move(c);
      n_conns = conns.size();
    }
  }

  // Closes the connection that waited longest without a request being answered; false when
  // every connection has one in progress.
  bool evict_one() {
    int victim = -1;
    Clock::time_point oldest = Clock::time_point::max();
    for (auto& [fd, c] : conns) {
      if (c->dead || c->ex || !c->out.empty()) continue;
      const Clock::time_point since = c->head_started ? c->head_since : c->idle_since;
      if (since < oldest) {
        oldest = since;
        victim = fd;
      }
    }
    if (victim < 0) return false;
    close_conn(*conns[victim]);
    return true;
  }

  // Closes connections past their deadline; returns the time until the next one.
  std::chrono::milliseconds expire(Clock::time_point now) {
    Clock::time_point next = now + std::chrono::seconds(1);
    std::vector<std::pair<int, int>> late;  // fd, 408 or 0 (close without a word)
    for (auto& [fd, cp] : conns) {
      Conn& c = *cp;
      if (c.dead) continue;
      Clock::time_point due;
      int status = 0;
      if (c.linger_until) {
        due = *c.linger_until;
      } else if (!c.out.empty()) {
        due = c.write_since + opt.write_timeout;
      } else if (c.ex) {
        continue;  // being answered: the answer's own time
      } else if (c.body_started) {
        due = c.body_since + opt.body_timeout;
        status = 408;
      } else if (c.head_started) {
        due = c.head_since + opt.head_timeout;
        status = 408;
      } else {
        due = c.idle_since + opt.idle_timeout;
      }
      if (due <= now) late.emplace_back(fd, status);
      else next = std::min(next, due);
    }
    for (auto [fd, status] : late) {
      Conn& c = *conns[fd];
      if (status != 0) {
        answer_error(c, status,
                     c.body_started ? "the request body did not arrive in time" : "the request head did not arrive in time",
                     c.parser.path());
        c.peer_closed = true;  // no lingering for a client this slow: what fits the socket now
        flush(c);
      }
      close_conn(c);
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(next - now) + std::chrono::milliseconds(1);
  }

  void run() {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, uint64_t>> order;  // fd and serial of fds[first + i]
    std::optional<Clock::time_point> drain_until;
    for (;;) {
      const Clock::time_point now = Clock::now();
      if (stopping && !drain_until) {
        drain_until = now + opt.drain_timeout;
        if (listen_fd >= 0) ::close(listen_fd);
        listen_fd = -1;
        for (auto& [fd, c] : conns)  // idle, lingering after an answer, or still sending a request
          if ((!c->ex || c->linger_until) && c->out.empty()) close_conn(*c);
        sweep();
      }
      if (drain_until && (conns.empty() || now >= *drain_until)) break;
      const std::chrono::milliseconds wait = expire(now);
      fds.clear();
      order.clear();
      fds.push_back({shared->wake_fd, POLLIN, 0});
      if (listen_fd >= 0) fds.push_back({listen_fd, POLLIN, 0});
      for (auto& [fd, c] : conns) {
        if (c->dead) continue;
        short ev = POLLRDHUP;
        if ((!c->ex && !c->close_after && c->out.size() < kOutputPause) || c->linger_until) ev |= POLLIN;
        if (!c->out.empty()) ev |= POLLOUT;
        fds.push_back({fd, ev, 0});
        order.emplace_back(fd, c->serial);
      }
      const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(wait.count(), 1000)));
      if (ready < 0 && errno != EINTR) break;
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        while (::read(shared->wake_fd, &v, sizeof v) > 0) {
        }
      }
      // Output other threads handed over (the wake-up), for every connection being answered.
      for (auto& [fd, c] : conns)
        if (!c->dead && c->ex) collect(*c);
      const size_t first = listen_fd >= 0 ? 2 : 1;
      if (listen_fd >= 0 && (fds[1].revents & POLLIN)) {
        sweep();  // a closed descriptor may come back from accept
        accept_all();
      }
      for (size_t i = 0; i < order.size(); ++i) {
        const short rev = fds[first + i].revents;
        if (!rev) continue;
        auto it = conns.find(order[i].first);
        if (it == conns.end() || it->second->dead || it->second->serial != order[i].second) continue;
        Conn& c = *it->second;
        if (rev & POLLIN) read_some(c);
        if (c.dead) continue;
        if ((rev & (POLLRDHUP | POLLHUP | POLLERR)) && !(rev & POLLIN)) c.peer_closed = true;
        if (c.peer_closed) {
          // A client that left: its request, unless already answered in full, is cancelled.
          if (c.linger_until || !c.ex || !c.ex_finished || (rev & (POLLHUP | POLLERR))) {
            close_conn(c);
            continue;
          }
        }
        if (rev & POLLOUT) flush(c);
      }
      // Connections whose answer ended with pipelined requests waiting.
      for (auto& [fd, c] : conns)
        if (!c->dead && !c->ex && !c->close_after && !c->in.empty()) advance(*c);
      sweep();
    }
    for (auto& [fd, c] : conns) close_conn(*c);
    sweep();
  }
};

HttpTransport::HttpTransport(const TransportOptions& options, RequestHandler handler, ErrorBody error_body)
    : impl_(std::make_unique<Impl>(options, std::move(handler), std::move(error_body))) {}

HttpTransport::~HttpTransport() = default;

bool HttpTransport::bind(const std::string& host, int port, std::string* error) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res) != 0 || !res) {
    if (error) *error = "cannot listen on " + host + ":" + service + " (the host is not an address of this machine)";
    return false;
  }
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) break;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    if (error)
      *error = "cannot listen on " + host + ":" + service + " (the port is in use, or the host is not an address of this machine)";
    return false;
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  impl_->listen_fd = fd;
  return true;
}

void HttpTransport::run() {
  if (impl_->listen_fd < 0 && !impl_->stopping) return;
  impl_->run();
}

void HttpTransport::stop() {
  impl_->stopping = true;
  impl_->shared->wake();
}

size_t HttpTransport::connections() const { return impl_->n_conns; }

}  // namespace sluice::server
