// HttpServer: routes, authentication, error bodies, and the completion handlers (one answer,
// or server-sent events).
#include "http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <ctime>

#include "anthropic_api.h"
#include "chat_page.h"
#include "core/log.h"
#include "format/utf8.h"
#include "metrics.h"
#include "request_stream.h"
#include "serve_context.h"
#include "structured_output.h"

namespace sluice::server {

using nlohmann::json;

namespace {

constexpr auto kKeepAlive = std::chrono::milliseconds(250);  // a waiting streaming client is probed this often

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

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  // Text a client sent is checked before it can reach an answer; replacing ill-formed bytes
  // here only guards against a bug (dump() would throw).
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// The JSON path of the first string (key or value) of a request that is not valid UTF-8, or
// empty. nlohmann::json's parser keeps such bytes; an answer could not quote them.
std::string invalid_utf8_path(const json& j, const std::string& at) {
  if (j.is_string()) return utf8_find_invalid(j.get_ref<const std::string&>()) ? at : std::string();
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i)
      if (std::string p = invalid_utf8_path(j[i], str(at, "[", i, "]")); !p.empty()) return p;
  }
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (utf8_find_invalid(it.key())) return at.empty() ? "a key" : at + " (a key)";
      if (std::string p = invalid_utf8_path(it.value(), at.empty() ? it.key() : at + "." + it.key()); !p.empty())
        return p;
    }
  }
  return {};
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, e.to_json()); }

ApiError api_error(int status, std::string message, std::string type, std::string code = {}) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

std::string sse(const json& j) { return "data: " + j.dump() + "\n\n"; }

// cpp-httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed when Debian
// built the library): a burst of connections beyond it waits for SYN retransmits, and clients
// give up on some. Calling listen() again on the bound socket raises the backlog; the library
// does not expose the socket, so it is found by its port among this process's descriptors.
void raise_listen_backlog(int port) {
  for (int fd = 3; fd < 4096; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    const int p = addr.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                  : addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                               : -1;
    if (p == port) ::listen(fd, SOMAXCONN);
  }
}

}  // namespace

struct HttpServer::Impl {
  LoadedModel& model;
  BatchEngine& engine;
  ServerOptions opt;
  httplib::Server svr;
  ServerMetrics metrics;
  std::optional<ModelChatTemplate> chat;
  std::optional<ReplyFormat> reply_format;  // how the model writes reasoning and tool calls
  StructuredOutput structured;
  std::atomic<bool> stopping{false};
  // run()'s progress: 0 not called, 1 inside (listening or about to), 2 returned. stop() and
  // run() each write their flag before reading the other's (sequentially consistent), so a
  // stop either finds run() inside and waits for it, or run() finds the stop and returns.
  std::atomic<int> run_state{0};

  Impl(LoadedModel& m, BatchEngine& e, const ServerOptions& o) : model(m), engine(e), opt(o), structured(*m.tokenizer) {}

  // The API key as a bearer token (OpenAI) or x-api-key (Anthropic).
  bool authorized(const httplib::Request& req) const {
    return key_matches(req.get_header_value("Authorization"), req.get_header_value("x-api-key"));
  }
  bool key_matches(const std::string& authorization, const std::string& x_api_key) const {
    if (opt.api_key.empty()) return true;
    return authorization == "Bearer " + opt.api_key || x_api_key == opt.api_key;
  }

  // The route a request counts under in the metrics (a fixed set, so labels stay bounded).
  static std::string route_of(const httplib::Request& req) {
    for (const char* r : {"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/models",
                          "/v1/cache", "/health", "/metrics", "/"})
      if (req.path == r) return r;
    return "other";
  }

  void routes();
  void complete(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  // The prompt's tokens; sent: the request as sent (key order kept), for chats with tools;
  // rendered: the chat's prompt text.
  std::vector<int32_t> prompt_of(const ParsedRequest& pr, const nlohmann::ordered_json& sent, std::string* rendered = nullptr);
  Generation start(const ParsedRequest& pr, const nlohmann::ordered_json& sent);
  ServeContext context();
};

void HttpServer::Impl::routes() {
  svr.set_payload_max_length(opt.max_body_bytes);
  svr.set_read_timeout(std::chrono::seconds(30));
  svr.set_write_timeout(std::chrono::seconds(30));
  const int threads = opt.http_threads > 0 ? opt.http_threads
                                           : engine.options().n_parallel + static_cast<int>(engine.options().max_queue) + 8;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };

  // Every answer without a body of its own (404, 405, 413 from the library) gets OpenAI's
  // error object; every answer is counted.
  svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const int s = res.status;
    const std::string msg = s == 404   ? "no such route: " + req.method + " " + req.path
                            : s == 405 ? "method " + req.method + " is not allowed on " + req.path
                            : s == 413 ? "the request body is larger than " + std::to_string(opt.max_body_bytes) + " bytes"
                            : s == 400 ? "malformed HTTP request"
                                       : "HTTP error " + std::to_string(s);
    if (is_anthropic_route(req.path)) {  // Anthropic's error shape on its routes
      send_json(res, s, anthropic_error_json(anthropic_error_type(s), msg));
      return;
    }
    send_json(res, s, api_error(s, msg, s == 413 ? "invalid_request_error" : s >= 500 ? "server_error" : "invalid_request_error").to_json());
  });
  svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    if (is_anthropic_route(req.path)) send_json(res, 500, anthropic_error_json("api_error", what));
    else send_error(res, api_error(500, what, "server_error"));
  });
  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics.count_response(route_of(req), res.status);
  });
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const bool open = req.path == "/" || req.path == "/health";
    if (!open && !authorized(req) && is_anthropic_route(req.path)) {
      send_json(res, 401, anthropic_error_json("authentication_error", "a valid API key is required (x-api-key: KEY)"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!open && !authorized(req)) {
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, api_error(401, "a valid API key is required (Authorization: Bearer KEY)", "authentication_error",
                                "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  svr.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(chat_page_html(), "text/html; charset=utf-8"); });
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping) send_json(res, 503, {{"status", "shutting down"}});
    else send_json(res, 200, {{"status", "ok"}});
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", json::array({{{"id", opt.model_name}, {"object", "model"}, {"created", unix_now()},
                                      {"owned_by", "sluice"}}})}});
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.prometheus(engine.counters()), "text/plain; version=0.0.4; charset=utf-8");
  });
  svr.Get("/v1/cache", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, metrics.live_json(engine.counters()));
  });
  svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    complete(req, res, Endpoint::completions);
  });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    complete(req, res, Endpoint::chat);
  });
  register_anthropic_routes(svr, context());
}

ServeContext HttpServer::Impl::context() {
  ServeContext c;
  c.model_name = opt.model_name;
  c.default_sampling = opt.default_sampling;
  c.prompt = [this](const ParsedRequest& pr, const nlohmann::ordered_json& sent) { return prompt_of(pr, sent); };
  c.start = [this](const ParsedRequest& pr, const nlohmann::ordered_json& sent) { return start(pr, sent); };
  c.cancel = [this](const Generation& g) {
    g.stream->close();
    engine.cancel(g.id);
  };
  c.authorized = [this](const std::string& a, const std::string& x) { return key_matches(a, x); };
  return c;
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

Generation HttpServer::Impl::start(const ParsedRequest& pr, const nlohmann::ordered_json& sent) {
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
  g.stream = std::make_shared<RequestStream>(*model.tokenizer, stops, !(g.parse_reply && reply_format_keeps_special(g.format)));
  cr.prompt = std::move(prompt);
  cr.max_tokens = max_tokens;
  cr.sampling = pr.sampling;
  cr.eos_id = model.eos_id();
  auto stream = g.stream;
  cr.on_token = [stream](int32_t id) { return stream->on_token(id); };
  cr.on_done = [stream](const CompletionResult& r) { stream->on_done(r); };
  try {
    g.id = engine.submit(std::move(cr));
  } catch (const Error& e) {
    if (e.status() == Status::unavailable) throw api_error(503, e.what(), "server_error", "unavailable");
    throw api_error(400, e.what(), "invalid_request_error", "invalid_value");
  }
  return g;
}

void HttpServer::Impl::complete(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::parse_error& e) {
    // nlohmann's message starts with its error id; the client needs the reason and where.
    std::string what = e.what();
    const size_t at = what.find("] ");
    send_error(res, api_error(400, "the body is not valid JSON: " + (at == std::string::npos ? what : what.substr(at + 2)),
                              "invalid_request_error", "invalid_json"));
    return;
  }
  if (const std::string bad = invalid_utf8_path(body, ""); !bad.empty()) {
    send_error(res, api_error(400, "the body is not valid JSON: '" + bad + "' holds bytes that are not UTF-8",
                              "invalid_request_error", "invalid_json"));
    return;
  }
  ParsedRequest pr;
  Generation gen;
  try {
    pr = parse_request(body, endpoint, opt.default_sampling);
    gen = start(pr, nlohmann::ordered_json::parse(req.body));
  } catch (const ApiError& e) {
    send_error(res, e);
    return;
  }
  auto stream = gen.stream;
  const uint64_t id = gen.id;
  ResponseIds ids{random_id(endpoint == Endpoint::chat ? "chatcmpl" : "cmpl"), unix_now(),
                  pr.model.empty() ? opt.model_name : pr.model};

  if (!pr.stream) {
    std::string text;
    for (;;) {
      std::optional<RequestStream::Event> ev = stream->next(kKeepAlive);
      if (!ev) continue;
      text += ev->text;
      if (!ev->done) continue;
      if (ev->done->reason == FinishReason::error) {
        send_error(res, api_error(500, ev->done->error, "server_error"));
        return;
      }
      if (gen.parse_reply) {
        const ParsedReply reply = parse_reply(gen.format, text, gen.reply_options);
        send_json(res, 200, completion_response(ids, endpoint, reply.content, *ev->done, reply.calls, reply.reasoning));
        return;
      }
      send_json(res, 200, completion_response(ids, endpoint, text, *ev->done));
      return;
    }
  }

  // Server-sent events: a chunk per piece of text (reasoning as delta.reasoning_content), each
  // tool call once complete, the last chunk with its finish_reason, the usage when asked for,
  // then [DONE]. A keep-alive comment while nothing comes: a client that went away fails the
  // write, and its request ends at the engine's next step.
  res.set_header("Cache-Control", "no-cache");
  const bool include_usage = pr.include_usage;
  auto first = std::make_shared<bool>(true);
  auto reply = gen.parse_reply ? std::make_shared<ReplyStream>(gen.format, gen.reply_options) : nullptr;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, stream, ids, endpoint, include_usage, first, reply](size_t, httplib::DataSink& sink) {
        if (*first && endpoint == Endpoint::chat) {  // the role comes first, as OpenAI sends it
          *first = false;
          const std::string s = sse(stream_chunk(ids, endpoint, "", true, std::nullopt));
          if (!sink.write(s.data(), s.size())) return false;
        }
        *first = false;
        std::optional<RequestStream::Event> ev = stream->next(kKeepAlive);
        if (!ev) {
          static const std::string ping = ": keep-alive\n\n";
          return sink.write(ping.data(), ping.size());
        }
        std::string out;
        auto emit = [&](const ReplyStream::Delta& d) {
          if (!d.reasoning.empty()) out += sse(stream_reasoning_chunk(ids, d.reasoning));
          if (!d.content.empty()) out += sse(stream_chunk(ids, endpoint, d.content, false, std::nullopt));
          if (!d.calls.empty()) out += sse(stream_tool_calls_chunk(ids, d.calls, reply->calls_emitted() - d.calls.size()));
        };
        if (reply) emit(reply->push(ev->text));
        else if (!ev->text.empty()) out += sse(stream_chunk(ids, endpoint, ev->text, false, std::nullopt));
        if (ev->done) {
          if (reply) emit(reply->finish());
          if (ev->done->reason == FinishReason::error) out += sse(api_error(500, ev->done->error, "server_error").to_json());
          else if (reply && reply->calls_emitted() > 0) out += sse(stream_tool_calls_end(ids));
          else out += sse(stream_chunk(ids, endpoint, "", false, ev->done->reason));
          if (include_usage) out += sse(stream_usage_chunk(ids, endpoint, *ev->done));
          out += "data: [DONE]\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (ev->done) sink.done();
        return true;
      },
      [this, stream, id](bool success) {
        if (success) return;
        stream->close();  // the client went away: free its sequence
        engine.cancel(id);
      });
}

HttpServer::HttpServer(LoadedModel& model, BatchEngine& engine, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(model, engine, options)) {
  SLUICE_CHECK(model.tokenizer.has_value(), Status::invalid_argument, "sluice serve needs a tokenizer.json in ",
               model.dir.string());
  impl_->chat = load_chat_template(model.dir);
  if (!impl_->chat) LOG_WARN("serve: ", model.dir.string(), " has no chat template: /v1/chat/completions answers 400");
  impl_->reply_format = reply_format_for(model.config.value("model_type", ""), impl_->chat ? impl_->chat->tmpl.source() : "");
  impl_->routes();
}

HttpServer::~HttpServer() { stop(); }

bool HttpServer::bind(std::string* error) {
  if (impl_->opt.port == 0) {
    port_ = impl_->svr.bind_to_any_port(impl_->opt.host);
  } else if (impl_->svr.bind_to_port(impl_->opt.host, impl_->opt.port)) {
    port_ = impl_->opt.port;
  }
  if (port_ > 0) {
    raise_listen_backlog(port_);
    return true;
  }
  if (error)
    *error = str("cannot listen on ", impl_->opt.host, ":", impl_->opt.port,
                 " (the port is in use, or the host is not an address of this machine)");
  return false;
}

void HttpServer::run() {
  impl_->run_state = 1;
  if (!impl_->stopping) impl_->svr.listen_after_bind();
  impl_->run_state = 2;
}

void HttpServer::stop() {
  if (!impl_->stopping.exchange(true)) impl_->engine.stop();  // every request ends; their handlers finish
  // httplib's stop does nothing until its listen loop has begun: a stop that came between
  // run()'s start and the loop's would be lost (the server listening forever), so ask until
  // run() has returned.
  while (impl_->run_state == 1) {
    impl_->svr.stop();
    if (impl_->run_state == 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void HttpServer::update_cache_stats(const RunStats& stats) { impl_->metrics.set_cache_stats(stats); }

}  // namespace sluice::server
