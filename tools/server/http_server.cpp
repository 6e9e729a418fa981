// HttpServer: routes, the checks every request passes (Host, Origin, API key, method, media
// type), the worker threads, and the start of a generation that hands a request to the engine
// (shared by the OpenAI and Anthropic routes through serve_context.h).
#include "http_server.h"

#include <arpa/inet.h>

#include <condition_variable>
#include <ctime>
#include <deque>
#include <system_error>
#include <thread>

#include "anthropic_api.h"
#include "chat_page.h"
#include "completion_answer.h"
#include "core/log.h"
#include "http_transport.h"
#include "metrics.h"
#include "request_body.h"
#include "serve_context.h"
#include "structured_output.h"

namespace sluice::server {

using nlohmann::json;

namespace {

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  const uint64_t n = counter.fetch_add(1) + 1;
  const uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%012llx%06llx", prefix, static_cast<unsigned long long>(t & 0xffffffffffffULL),
                static_cast<unsigned long long>(n & 0xffffff));
  return buf;
}

// Text a client sent is checked before it can reach an answer; replacing ill-formed bytes
// here only guards against a bug (dump() would throw).
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

ApiError api_error(int status, std::string message, std::string type = "invalid_request_error", std::string code = {}) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

// The host of "host", "host:port", "[v6]" or "[v6]:port", lower-cased, brackets kept off.
std::string host_of(const std::string& authority) {
  std::string a = lower(authority);
  if (!a.empty() && a[0] == '[') return a.substr(1, a.find(']') == std::string::npos ? std::string::npos : a.find(']') - 1);
  return a.substr(0, a.find(':'));
}

bool is_ip_literal(const std::string& host) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

bool listed(const std::vector<std::string>& list, const std::string& v) {
  for (const std::string& x : list)
    if (x == "*" || lower(x) == v) return true;
  return false;
}

// The bounded worker threads that parse, check and tokenize requests (never one per request
// or connection): requests wait in a queue, bounded by the connections.
class WorkerPool {
 public:
  explicit WorkerPool(int n) {
    try {
      for (int i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
    } catch (const std::system_error& e) {
      stop();
      fail(Status::unavailable, "cannot start the server's ", n, " worker threads: ", e.what());
    }
  }
  ~WorkerPool() { stop(); }
  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  // Runs the jobs already posted, then joins.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// A request being handled: where its answer goes and what it counts under.
struct Call {
  HttpRequest req;
  std::shared_ptr<Exchange> ex;
  std::string route;       // the metrics' label
  HeaderList cors;         // Access-Control-Allow-Origin for an allowed Origin
  bool anthropic = false;  // an Anthropic route: errors in its shape
};

// An error in its API's shape: Anthropic's on its routes, OpenAI's elsewhere.
json error_json(bool anthropic, const ApiError& e) {
  return anthropic ? anthropic_error_json(anthropic_error_type(e.status), e.message) : e.to_json();
}

}  // namespace

struct HttpServer::Impl {
  LoadedModel& model;
  BatchEngine& engine;
  ServerOptions opt;
  ServerMetrics metrics;
  std::optional<ModelChatTemplate> chat;
  std::optional<ReplyFormat> reply_format;  // how the model writes reasoning and tool calls
  StructuredOutput structured;
  std::unique_ptr<HttpTransport> transport;
  std::unique_ptr<WorkerPool> workers;
  std::atomic<bool> stopping{false};
  // run()'s progress: 0 not called, 1 inside, 2 returned. stop() and run() each write their
  // flag before reading the other's (sequentially consistent), so a stop either finds run()
  // inside and waits for it, or run() finds the stop and returns.
  std::atomic<int> run_state{0};

  Impl(LoadedModel& m, BatchEngine& e, const ServerOptions& o) : model(m), engine(e), opt(o), structured(*m.tokenizer) {}

  void reply(Call& c, int status, const json& body, HeaderList extra = {}) {
    metrics.count_response(c.route, status);
    extra.insert(extra.end(), c.cors.begin(), c.cors.end());
    c.ex->respond(status, "application/json", dump(body), extra);
  }
  void reply_error(Call& c, const ApiError& e, HeaderList extra = {}) {
    reply(c, e.status, error_json(c.anthropic, e), std::move(extra));
  }

  // The route a request counts under in the metrics (a fixed set, so labels stay bounded).
  static std::string route_of(const std::string& path) {
    for (const char* r : {"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens",
                          "/v1/models", "/v1/cache", "/health", "/metrics", "/"})
      if (path == r) return r;
    return "other";
  }
  static const char* method_of(const std::string& route) {
    return route == "/v1/completions" || route == "/v1/chat/completions" || route == "/v1/messages" ||
                   route == "/v1/messages/count_tokens"
               ? "POST"
               : "GET";
  }
  // The API key as a bearer token (OpenAI) or x-api-key (Anthropic), on any route.
  bool authorized(const HttpRequest& req) const {
    return opt.api_key.empty() || req.header("authorization") == "Bearer " + opt.api_key ||
           req.header("x-api-key") == opt.api_key;
  }

  bool host_allowed(const HttpRequest& req) const {
    if (!req.has_header("host")) return true;  // HTTP/1.0 (1.1 requires it: the parser's 400)
    const std::string host = host_of(req.header("host"));
    return is_ip_literal(host) || host == "localhost" || (host.size() > 10 && host.ends_with(".localhost")) ||
           host == lower(opt.host) || listed(opt.allow_hosts, host);
  }
  // An Origin header: the server's own page (its authority is the Host), or one allowed.
  bool origin_allowed(const HttpRequest& req, const std::string& origin) const {
    const std::string o = lower(origin);
    const size_t scheme = o.find("://");
    if (scheme != std::string::npos && o.substr(scheme + 3) == lower(req.header("host")) &&
        (o.starts_with("http://") || o.starts_with("https://")))
      return true;
    return listed(opt.allow_origins, o);
  }

  void handle(HttpRequest&& req, std::shared_ptr<Exchange> ex);
  // The POST routes, on a worker thread; they throw ApiError.
  void post(Call& c);
  void complete(Call& c, Endpoint endpoint);
  // The prompt's tokens; sent: the request as sent (key order kept), for chats with tools;
  // rendered: the chat's prompt text.
  std::vector<int32_t> prompt_of(const ParsedRequest& pr, const nlohmann::ordered_json& sent, std::string* rendered = nullptr);
  // Checks a request against the context, builds its constraint and submits it, its answer
  // written by the writer `make` returns (serve_context.h).
  void start(Call& c, const ParsedRequest& pr, const nlohmann::ordered_json& sent, const WriterFactory& make);
  ServeContext context(Call& c);
};

void HttpServer::Impl::handle(HttpRequest&& req, std::shared_ptr<Exchange> ex) {
  auto c = std::make_shared<Call>();
  c->route = route_of(req.path);
  c->anthropic = is_anthropic_route(req.path);
  c->ex = std::move(ex);
  const std::string origin = req.header("origin");
  const bool keyless = opt.api_key.empty();
  if (keyless && !host_allowed(req)) {
    reply_error(*c, api_error(403,
                              "the Host header '" + req.header("host") +
                                  "' does not name this server (an IP address, localhost, or a name given with "
                                  "--allow-host); without --api-key, web pages elsewhere must not reach it",
                              "invalid_request_error", "host_not_allowed"));
    return;
  }
  if (!origin.empty()) {
    if (keyless && !origin_allowed(req, origin)) {
      reply_error(*c, api_error(403,
                                "requests from the page at '" + origin +
                                    "' are not allowed (the server's own page is; --allow-origin allows others)",
                                "invalid_request_error", "origin_not_allowed"));
      return;
    }
    if (listed(opt.allow_origins, lower(origin))) c->cors = {{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}};
  }
  if (c->route == "other") {
    reply_error(*c, api_error(404, "no such route: " + req.method + " " + req.path, "invalid_request_error", "not_found"));
    return;
  }
  const std::string method = method_of(c->route);
  if (req.method == "OPTIONS" && !c->cors.empty()) {  // a CORS preflight from an allowed origin
    HeaderList h = c->cors;
    h.insert(h.end(), {{"Access-Control-Allow-Methods", method + ", OPTIONS"},
                       {"Access-Control-Allow-Headers",
                        "Authorization, Content-Type, X-Api-Key, Anthropic-Version, Anthropic-Beta, "
                        "Anthropic-Dangerous-Direct-Browser-Access"},
                       {"Access-Control-Max-Age", "600"}});
    metrics.count_response(c->route, 204);
    c->ex->respond(204, "", "", h);
    return;
  }
  if (req.method != method && !(method == "GET" && req.method == "HEAD")) {
    reply_error(*c,
                api_error(405, "method " + req.method + " is not allowed on " + req.path + " (" + method + " is)",
                          "invalid_request_error", "method_not_allowed"),
                {{"Allow", method == "GET" ? "GET, HEAD" : method}});
    return;
  }
  const bool open = c->route == "/" || c->route == "/health";
  if (!open && !authorized(req)) {
    if (c->anthropic)
      reply_error(*c, api_error(401, "a valid API key is required (x-api-key: KEY)", "authentication_error"));
    else
      reply_error(*c,
                  api_error(401, "a valid API key is required (Authorization: Bearer KEY)", "authentication_error",
                            "invalid_api_key"),
                  {{"WWW-Authenticate", "Bearer"}});
    return;
  }
  if (c->route == "/") {
    metrics.count_response(c->route, 200);
    c->ex->respond(200, "text/html; charset=utf-8", chat_page_html(), c->cors);
  } else if (c->route == "/health") {
    if (stopping) reply(*c, 503, {{"status", "shutting down"}});
    else reply(*c, 200, {{"status", "ok"}});
  } else if (c->route == "/v1/models") {
    reply(*c, 200,
          {{"object", "list"},
           {"data", json::array({{{"id", opt.model_name}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "sluice"}}})}});
  } else if (c->route == "/metrics") {
    metrics.count_response(c->route, 200);
    c->ex->respond(200, "text/plain; version=0.0.4; charset=utf-8", metrics.prometheus(engine.counters()), c->cors);
  } else if (c->route == "/v1/cache") {
    reply(*c, 200, metrics.live_json(engine.counters()));
  } else {
    // POST: a JSON body. Without a key, nothing else: a cross-site form or text/plain post
    // (which a browser sends without asking the server first) cannot reach the engine.
    const std::string type = lower(req.header("content-type"));
    if (keyless && type.substr(0, type.find(';')) != "application/json") {
      reply_error(*c, api_error(415, "the body must be sent as Content-Type: application/json (got '" +
                                         req.header("content-type") + "')",
                                "invalid_request_error", "unsupported_media_type"));
      return;
    }
    c->req = std::move(req);
    workers->post([this, c] {
      try {
        post(*c);
      } catch (const ApiError& e) {
        reply_error(*c, e);
      } catch (const std::exception& e) {
        reply_error(*c, api_error(500, e.what(), "server_error"));
      }
    });
  }
}

void HttpServer::Impl::post(Call& c) {
  if (c.route == "/v1/completions") complete(c, Endpoint::completions);
  else if (c.route == "/v1/chat/completions") complete(c, Endpoint::chat);
  else if (c.route == "/v1/messages") anthropic_messages(context(c));
  else anthropic_count_tokens(context(c));
}

ServeContext HttpServer::Impl::context(Call& c) {
  ServeContext ctx;
  ctx.model_name = opt.model_name;
  ctx.default_sampling = opt.default_sampling;
  ctx.limits.max_messages = ctx.limits.max_prompt_ids = static_cast<size_t>(engine.options().n_ctx);
  ctx.body = c.req.body;
  ctx.prompt = [this](const ParsedRequest& pr, const nlohmann::ordered_json& sent) { return prompt_of(pr, sent); };
  ctx.start = [this, &c](const ParsedRequest& pr, const nlohmann::ordered_json& sent, const WriterFactory& make) {
    start(c, pr, sent, make);
  };
  ctx.respond = [this, &c](int status, const json& body) { reply(c, status, body); };
  return ctx;
}

std::vector<int32_t> HttpServer::Impl::prompt_of(const ParsedRequest& pr, const nlohmann::ordered_json& sent,
                                                std::string* rendered) {
  const Tokenizer& tok = *model.tokenizer;
  try {
    if (pr.endpoint == Endpoint::completions) {
      if (!pr.prompt_text) return pr.prompt_ids;
      std::vector<int32_t> ids = tok.encode(*pr.prompt_text, tok.add_bos());
      if (ids.empty() && model.bos_id()) ids.push_back(*model.bos_id());  // "" is the bos token, as `sluice run`
      return ids;
    }
    if (!chat)
      throw api_error(400, "this model has no chat template (tokenizer_config.json chat_template); use /v1/completions",
                      "invalid_request_error", "no_chat_template");
    ChatRenderOptions ro;
    ro.add_generation_prompt = true;
    ro.bos_token = chat->bos_token;
    ro.eos_token = chat->eos_token;
    const bool with_tools = !pr.tools.is_null() && !pr.tool_choice_none;
    bool tool_messages = false;
    for (const ChatMessage& m : pr.messages) tool_messages |= m.role == "tool" || !m.tool_calls.is_null();
    if (with_tools && (!reply_format || chat->tmpl.source().find("tools") == std::string::npos))
      throw api_error(400,
                      "'tools': this model's chat template does not show tools, or sluice does not know how the model "
                      "writes tool calls (docs/server.md lists the formats: <tool_call>, harmony, ...)",
                      "invalid_request_error", "unsupported");
    std::string text;
    if (with_tools || tool_messages) {
      // The messages as OpenAI JSON (tool_calls, tool_call_id), in the client's key order, so
      // that tojson prints schemas and arguments as sent; content is the joined text.
      nlohmann::ordered_json messages = sent["messages"];
      for (size_t i = 0; i < messages.size(); ++i)
        if (messages[i].contains("content") && !messages[i]["content"].is_null())
          messages[i]["content"] = pr.messages[i].content;
      if (with_tools) ro.extra_ordered["tools"] = sent["tools"];
      text = chat->tmpl.render_json(messages, ro);
    } else {
      std::vector<ChatTurn> turns;
      for (const ChatMessage& m : pr.messages) turns.push_back({m.role, m.content});
      text = chat->tmpl.render(turns, ro);
    }
    if (rendered) *rendered = text;
    return tok.encode(text, false);  // the template writes the bos token itself when the model wants one
  } catch (const Error& e) {
    throw api_error(400, e.what(), "invalid_request_error", e.status() == Status::invalid_argument ? "invalid_value" : "");
  }
}

void HttpServer::Impl::start(Call& c, const ParsedRequest& pr, const nlohmann::ordered_json& sent, const WriterFactory& make) {
  std::string rendered;
  std::vector<int32_t> prompt = prompt_of(pr, sent, &rendered);
  const int64_t n_ctx = engine.options().n_ctx, n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt == 0) throw api_error(400, "the prompt is empty", "invalid_request_error", "invalid_value");
  if (n_prompt >= n_ctx)
    throw api_error(400,
                    "the prompt is " + std::to_string(n_prompt) + " tokens; the context holds " + std::to_string(n_ctx) +
                        " (prompt and completion together)",
                    "invalid_request_error", "context_length_exceeded");
  // OpenAI's defaults: completions 16 tokens, chat until the end of the context.
  const int64_t max_tokens = pr.max_tokens.value_or(pr.endpoint == Endpoint::completions ? 16 : n_ctx - n_prompt);
  if (n_prompt + max_tokens > n_ctx)
    throw api_error(400,
                    "the prompt (" + std::to_string(n_prompt) + " tokens) and max_tokens (" + std::to_string(max_tokens) +
                        ") exceed the context of " + std::to_string(n_ctx) + " tokens",
                    "invalid_request_error", "context_length_exceeded");
  Generation g;
  g.prompt_tokens = n_prompt;
  // A chat's reply is split into reasoning, content and tool calls by its family's format.
  g.parse_reply = pr.endpoint == Endpoint::chat && reply_format.has_value();
  g.format = reply_format.value_or(ReplyFormat::hermes);
  g.reply_options.reasoning_open = prompt_opens_reasoning(rendered);
  g.reply_options.reasoning_inline = pr.reasoning_inline;
  g.reply_options.parse_calls = !pr.tools.is_null() && !pr.tool_choice_none;
  g.reply_options.tools = pr.tools;
  CompletionRequest cr;
  try {
    if (!pr.response_format.is_null())
      cr.constraint = structured.response_format(pr.response_format, model.eos_id());
    else if (g.reply_options.parse_calls && (pr.tool_choice_required || pr.tool_choice_name))
      cr.constraint = structured.forced_calls(g.format, pr.tools, pr.tool_choice_name, pr.parallel_tool_calls, model.eos_id());
  } catch (const Error& e) {
    throw api_error(400, e.what(), "invalid_request_error", "unsupported_schema");
  }
  // Harmony ends a call with <|call|>, which is not the end-of-sequence token: the reply stops there.
  std::vector<std::string> stops = pr.stop;
  if (g.parse_reply && g.format == ReplyFormat::harmony) stops.push_back("<|call|>");
  const std::string route = c.route;
  auto answer = std::make_shared<CompletionAnswer>(
      c.ex, *model.tokenizer, std::move(stops), !(g.parse_reply && reply_format_keeps_special(g.format)), pr.stream,
      make(g), [this, route](int status) { metrics.count_response(route, status); }, c.cors);
  cr.prompt = std::move(prompt);
  cr.max_tokens = max_tokens;
  cr.sampling = pr.sampling;
  cr.eos_id = model.eos_id();
  cr.on_token = [answer](int32_t id) { return answer->on_token(id); };
  cr.on_done = [answer](const CompletionResult& r) { answer->on_done(r); };
  uint64_t id = 0;
  try {
    id = engine.submit(std::move(cr));
  } catch (const Error& e) {
    if (e.status() == Status::unavailable) throw api_error(503, e.what(), "server_error", "unavailable");
    throw api_error(400, e.what(), "invalid_request_error", "invalid_value");
  }
  // A client that leaves (at once if it already has) frees its sequence at the next step.
  c.ex->on_gone([this, id] { engine.cancel(id); });
  answer->begin();
}

void HttpServer::Impl::complete(Call& c, Endpoint endpoint) {
  const nlohmann::ordered_json sent = parse_body_json(c.req.body);
  RequestLimits limits;
  limits.max_messages = limits.max_prompt_ids = static_cast<size_t>(engine.options().n_ctx);
  const ParsedRequest pr = parse_request(json(sent), endpoint, opt.default_sampling, limits);
  ResponseIds ids{random_id(endpoint == Endpoint::chat ? "chatcmpl" : "cmpl"), unix_now(),
                  pr.model.empty() ? opt.model_name : pr.model};
  start(c, pr, sent, [&](const Generation& g) { return std::make_unique<OpenAiReply>(pr, ids, g); });
}

HttpServer::HttpServer(LoadedModel& model, BatchEngine& engine, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(model, engine, options)) {
  SLUICE_CHECK(model.tokenizer.has_value(), Status::invalid_argument, "sluice serve needs a tokenizer.json in ",
               model.dir.string());
  impl_->chat = load_chat_template(model.dir);
  if (!impl_->chat) LOG_WARN("serve: ", model.dir.string(), " has no chat template: /v1/chat/completions answers 400");
  impl_->reply_format = reply_format_for(model.config.value("model_type", ""), impl_->chat ? impl_->chat->tmpl.source() : "");
  TransportOptions to;
  to.limits.max_body = options.max_body_bytes;
  to.max_connections = options.max_connections > 0
                           ? options.max_connections
                           : static_cast<size_t>(engine.options().n_parallel) + engine.options().max_queue + 256;
  to.max_buffered_input = std::max<size_t>(size_t{64} << 20, 4 * options.max_body_bytes);
  to.idle_timeout = options.idle_timeout;
  to.head_timeout = options.head_timeout;
  to.body_timeout = options.body_timeout;
  to.write_timeout = options.write_timeout;
  Impl* impl = impl_.get();
  impl_->transport = std::make_unique<HttpTransport>(
      to, [impl](HttpRequest&& req, std::shared_ptr<Exchange> ex) { impl->handle(std::move(req), std::move(ex)); },
      [impl](int status, const std::string& message, const std::string& path) {
        impl->metrics.count_response(Impl::route_of(path), status);
        const ApiError e = api_error(status, message, status >= 500 ? "server_error" : "invalid_request_error");
        return dump(error_json(is_anthropic_route(path), e));
      });
  impl_->workers = std::make_unique<WorkerPool>(std::max(1, options.workers));
}

HttpServer::~HttpServer() {
  stop();
  impl_->workers->stop();
}

bool HttpServer::bind(std::string* error) {
  if (!impl_->transport->bind(impl_->opt.host, impl_->opt.port, error)) return false;
  port_ = impl_->transport->port();
  return true;
}

void HttpServer::run() {
  impl_->run_state = 1;
  if (!impl_->stopping) impl_->transport->run();
  impl_->run_state = 2;
}

void HttpServer::stop() {
  // The transport first: it takes no new request and closes each connection as its answer
  // ends; then the engine ends every request, and each stream gets its end.
  impl_->transport->stop();
  if (!impl_->stopping.exchange(true)) impl_->engine.stop();
  while (impl_->run_state == 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

size_t HttpServer::connections() const { return impl_->transport->connections(); }

void HttpServer::update_cache_stats(const RunStats& stats) { impl_->metrics.set_cache_stats(stats); }

}  // namespace sluice::server
