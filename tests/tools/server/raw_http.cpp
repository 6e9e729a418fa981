// The raw HTTP client of the hostile-client tests (raw_http.h).
#include "tests/tools/server/raw_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace sluice::test {

namespace {

using Clock = std::chrono::steady_clock;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The value of `name` in a head (status line and headers), "" if absent.
std::string head_value(const std::string& head, const std::string& name) {
  const std::string h = lower(head), key = "\r\n" + lower(name) + ":";
  const size_t at = h.find(key);
  if (at == std::string::npos) return {};
  size_t b = at + key.size();
  const size_t e = head.find("\r\n", b);
  while (b < e && (head[b] == ' ' || head[b] == '\t')) ++b;
  return head.substr(b, e - b);
}

}  // namespace

RawConn::RawConn(int port) {
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    fd = -1;
  }
}

RawConn::~RawConn() {
  if (fd >= 0) ::close(fd);
}

bool RawConn::send(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string RawConn::read(double seconds, size_t n) {
  std::string out;
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    if (n > 0 && parse_responses(out).size() >= n) return out;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return out;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[16384];
    const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
    if (got <= 0) return out;
    out.append(buf, static_cast<size_t>(got));
  }
}

bool RawConn::closed_within(double seconds) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
}

std::string RawResponse::header(const std::string& name) const { return head_value(head, name); }

std::vector<RawResponse> parse_responses(const std::string& bytes, bool closed) {
  std::vector<RawResponse> out;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t head_end = bytes.find("\r\n\r\n", at);
    if (head_end == std::string::npos) break;
    RawResponse r;
    r.head = bytes.substr(at, head_end + 2 - at);
    if (r.head.size() < 12 || r.head.compare(0, 5, "HTTP/") != 0) break;
    r.status = std::atoi(r.head.c_str() + 9);
    size_t body = head_end + 4;
    const std::string te = lower(r.header("Transfer-Encoding")), cl = r.header("Content-Length");
    if (r.status == 100) {  // 100 Continue: no body
      at = body;
      continue;
    }
    if (te.find("chunked") != std::string::npos) {
      bool done = false;
      for (;;) {
        const size_t le = bytes.find("\r\n", body);
        if (le == std::string::npos) break;
        const size_t size = std::strtoul(bytes.c_str() + body, nullptr, 16);
        if (size == 0) {
          const size_t end = bytes.find("\r\n\r\n", le);  // trailers, then the blank line
          if (bytes.compare(le, 4, "\r\n\r\n") == 0) body = le + 4, done = true;
          else if (end != std::string::npos) body = end + 4, done = true;
          break;
        }
        if (le + 2 + size + 2 > bytes.size()) break;
        r.body.append(bytes, le + 2, size);
        body = le + 2 + size + 2;
      }
      if (!done) break;
      at = body;
    } else if (!cl.empty()) {
      const size_t n = std::strtoul(cl.c_str(), nullptr, 10);
      if (body + n > bytes.size()) break;
      r.body = bytes.substr(body, n);
      at = body + n;
    } else if (r.status == 204 || r.status == 304) {
      at = body;
    } else {
      if (!closed) break;
      r.body = bytes.substr(body);
      at = bytes.size();
    }
    out.push_back(std::move(r));
  }
  return out;
}

RawResponse raw_exchange(int port, std::string_view request, double seconds) {
  RawConn c(port);
  if (c.fd < 0 || !c.send(request)) return {};
  const std::string got = c.read(seconds, 1);
  std::vector<RawResponse> rs = parse_responses(got, true);
  return rs.empty() ? RawResponse{} : rs.front();
}

std::string post_json(const std::string& path, const std::string& body, const std::string& extra_headers) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace sluice::test
