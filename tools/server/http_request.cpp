// RequestParser (http_request.h): the head line by line, then the body by its framing.
#include "http_request.h"

#include <algorithm>
#include <cstring>

namespace sluice::server {

namespace {

const std::string kEmpty;

bool is_tchar(char c) {  // RFC 9110's token characters
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A decimal length of at most 18 digits (below 10^18: no overflow), or -1.
int64_t parse_length(std::string_view s) {
  if (s.empty() || s.size() > 18) return -1;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

// The comma-separated list items of a header value, trimmed and lower-cased.
std::vector<std::string> list_items(std::string_view v) {
  std::vector<std::string> out;
  while (true) {
    const size_t comma = v.find(',');
    const std::string_view item = trim(v.substr(0, comma));
    if (!item.empty()) out.push_back(lower(item));
    if (comma == std::string_view::npos) return out;
    v.remove_prefix(comma + 1);
  }
}

}  // namespace

const std::string& HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return kEmpty;
}

bool HttpRequest::has_header(std::string_view name) const {
  return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return h.first == name; });
}

bool HttpRequest::keep_alive() const {
  const std::vector<std::string> conn = list_items(header("connection"));
  const auto has = [&](const char* t) { return std::find(conn.begin(), conn.end(), t) != conn.end(); };
  if (has("close")) return false;
  return version_minor >= 1 || has("keep-alive");
}

RequestParser::Result RequestParser::fail(int status, std::string message) {
  phase_ = Phase::failed;
  error_status_ = status;
  error_message_ = std::move(message);
  return Result::error;
}

bool RequestParser::head_line(std::string_view line) {
  if (req_.method.empty()) {
    // The request line: METHOD SP request-target SP HTTP/1.x
    const size_t sp1 = line.find(' '), sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp1 == 0 || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
      fail(400, "malformed request line");
      return false;
    }
    const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                           version = line.substr(sp2 + 1);
    if (!std::all_of(method.begin(), method.end(), is_tchar)) {
      fail(400, "malformed method");
      return false;
    }
    if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.') {
      fail(400, "malformed HTTP version");
      return false;
    }
    if (version[5] != '1' || (version[7] != '0' && version[7] != '1')) {
      fail(505, std::string("HTTP version ") + std::string(version.substr(5)) + " is not supported (HTTP/1.0 and 1.1 are)");
      return false;
    }
    std::string_view path = target;
    if (path.substr(0, 7) == "http://" || path.substr(0, 8) == "https://") {  // absolute form: its path
      const size_t slash = path.find('/', path.find("//") + 2);
      path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
    }
    if (path.empty() || (path[0] != '/' && path != "*") ||
        std::any_of(target.begin(), target.end(), [](char c) { return static_cast<unsigned char>(c) <= ' ' || c == 0x7f; })) {
      fail(400, "malformed request target");
      return false;
    }
    req_.method = std::string(method);
    req_.target = std::string(target);
    req_.path = std::string(path.substr(0, path.find('?')));
    req_.version_minor = version[7] - '0';
    return true;
  }
  // A header field: name ":" OWS value OWS (no folded lines, no space before the colon).
  if (line[0] == ' ' || line[0] == '\t') {
    fail(400, "folded header lines are not accepted");
    return false;
  }
  const size_t colon = line.find(':');
  if (colon == 0 || colon == std::string_view::npos ||
      !std::all_of(line.begin(), line.begin() + static_cast<std::ptrdiff_t>(colon), is_tchar)) {
    fail(400, "malformed header line");
    return false;
  }
  if (req_.headers.size() >= limits_.max_headers) {
    fail(431, "more than " + std::to_string(limits_.max_headers) + " header fields");
    return false;
  }
  const std::string_view value = trim(line.substr(colon + 1));
  if (std::any_of(value.begin(), value.end(), [](char c) { return c == 0 || c == '\r' || c == '\n'; })) {
    fail(400, "malformed header value");
    return false;
  }
  req_.headers.emplace_back(lower(line.substr(0, colon)), std::string(value));
  return true;
}

bool RequestParser::head_end() {
  if (req_.version_minor >= 1 && !req_.has_header("host")) {
    fail(400, "an HTTP/1.1 request needs a Host header");
    return false;
  }
  // Content-Length: every field (and every item of each) the same digits.
  int64_t length = -1;
  for (const auto& [k, v] : req_.headers) {
    if (k != "content-length") continue;
    for (const std::string& item : list_items(v)) {
      const int64_t n = parse_length(item);
      if (n < 0 && !item.empty() && std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        fail(413, "the request body is larger than " + std::to_string(limits_.max_body) + " bytes");
        return false;
      }
      if (n < 0 || (length >= 0 && n != length)) {
        fail(400, "malformed Content-Length");
        return false;
      }
      length = n;
    }
  }
  std::vector<std::string> coding;
  for (const auto& [k, v] : req_.headers)
    if (k == "transfer-encoding")
      for (std::string& item : list_items(v)) coding.push_back(std::move(item));
  const bool chunked = !coding.empty();
  if (chunked && (coding.size() != 1 || coding[0] != "chunked")) {
    fail(501, "transfer coding '" + req_.header("transfer-encoding") + "' is not supported (only chunked)");
    return false;
  }
  if (chunked && length >= 0) {
    fail(400, "a request cannot have both Content-Length and Transfer-Encoding");
    return false;
  }
  for (const std::string& enc : list_items(req_.header("content-encoding")))
    if (enc != "identity") {
      fail(415, "Content-Encoding '" + enc + "' is not accepted: send the body uncompressed");
      return false;
    }
  if (length > static_cast<int64_t>(limits_.max_body)) {
    fail(413, "the request body is larger than " + std::to_string(limits_.max_body) + " bytes");
    return false;
  }
  req_.expect_continue = lower(req_.header("expect")) == "100-continue";
  if (chunked) {
    phase_ = Phase::chunk_size;
  } else if (length > 0) {
    left_ = static_cast<uint64_t>(length);
    req_.body.reserve(static_cast<size_t>(length));
    phase_ = Phase::body;
  } else if (length < 0 && (req_.method == "POST" || req_.method == "PUT" || req_.method == "PATCH")) {
    fail(411, "a " + req_.method + " request needs a Content-Length (or chunked transfer coding)");
    return false;
  } else {
    phase_ = Phase::done;
  }
  return true;
}

RequestParser::Result RequestParser::feed(const char* data, size_t n, size_t* used) {
  size_t i = 0;
  const auto finish = [&](Result r) {
    *used = i;
    return r;
  };
  while (i < n) {
    switch (phase_) {
      case Phase::head:
      case Phase::chunk_size:
      case Phase::trailers: {
        const char* nl = static_cast<const char*>(std::memchr(data + i, '\n', n - i));
        const size_t take = nl ? static_cast<size_t>(nl - (data + i)) + 1 : n - i;
        const size_t max_line = phase_ == Phase::chunk_size ? 1024 : limits_.max_line;
        if (line_.size() + take > max_line + 2) {
          i += take;
          if (phase_ == Phase::head && req_.method.empty()) return finish(fail(414, "the request line is longer than " + std::to_string(limits_.max_line) + " bytes"));
          if (phase_ == Phase::chunk_size) return finish(fail(400, "malformed chunk size line"));
          return finish(fail(431, "a header line is longer than " + std::to_string(limits_.max_line) + " bytes"));
        }
        if (phase_ != Phase::chunk_size) {
          head_bytes_ += take;
          if (head_bytes_ > limits_.max_head) {
            i += take;
            return finish(fail(431, "the request head is larger than " + std::to_string(limits_.max_head) + " bytes"));
          }
        }
        line_.append(data + i, take);
        i += take;
        if (!nl) continue;
        std::string_view line(line_);
        line.remove_suffix(1);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (phase_ == Phase::head) {
          if (line.empty()) {
            if (req_.method.empty()) {  // blank lines before a request line are skipped (RFC 9112 2.2)
              line_.clear();
              head_bytes_ = 0;
              continue;
            }
            line_.clear();
            if (!head_end()) return finish(Result::error);
          } else {
            const bool ok = head_line(line);
            line_.clear();
            if (!ok) return finish(Result::error);
          }
        } else if (phase_ == Phase::chunk_size) {
          const std::string_view hex = trim(line.substr(0, line.find(';')));  // chunk extensions ignored
          uint64_t size = 0;
          if (hex.empty() || hex.size() > 15 ||
              !std::all_of(hex.begin(), hex.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); })) {
            line_.clear();
            return finish(fail(400, "malformed chunk size"));
          }
          for (char c : hex) size = size * 16 + static_cast<uint64_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c | 0x20) - 'a' + 10);
          line_.clear();
          if (req_.body.size() + size > limits_.max_body)
            return finish(fail(413, "the request body is larger than " + std::to_string(limits_.max_body) + " bytes"));
          if (size == 0) {
            phase_ = Phase::trailers;
          } else {
            left_ = size;
            phase_ = Phase::chunk_data;
          }
        } else {  // trailers: read and dropped until the blank line
          const bool blank = line.empty();
          line_.clear();
          if (blank) phase_ = Phase::done;
        }
        break;
      }
      case Phase::body:
      case Phase::chunk_data: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(left_, n - i));
        req_.body.append(data + i, take);
        i += take;
        left_ -= take;
        if (left_ == 0) phase_ = phase_ == Phase::body ? Phase::done : Phase::chunk_end;
        break;
      }
      case Phase::chunk_end: {  // the CRLF after a chunk's data
        const char c = data[i++];
        if (c == '\n') phase_ = Phase::chunk_size;
        else if (c != '\r' || line_.size() > 0) return finish(fail(400, "malformed chunk"));
        else line_ = "\r";
        if (phase_ == Phase::chunk_size) line_.clear();
        break;
      }
      case Phase::done:
      case Phase::failed: break;
    }
    if (phase_ == Phase::done) return finish(Result::request);
    if (phase_ == Phase::failed) return finish(Result::error);
  }
  return finish(phase_ == Phase::done ? Result::request : Result::more);
}

HttpRequest RequestParser::take() {
  HttpRequest r = std::move(req_);
  req_ = HttpRequest{};
  phase_ = Phase::head;
  line_.clear();
  head_bytes_ = 0;
  left_ = 0;
  return r;
}

}  // namespace sluice::server
