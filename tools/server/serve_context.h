// What the routes of other APIs (anthropic_api.h) need from the server: the prompt of a
// request and a generation started on the engine, with the reply's format. The OpenAI routes
// of http_server.cpp use the same.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "openai_api.h"
#include "reply_formats.h"
#include "request_stream.h"

namespace sluice::server {

struct Generation {
  std::shared_ptr<RequestStream> stream;
  uint64_t id = 0;
  int64_t prompt_tokens = 0;
  bool parse_reply = false;  // a chat: reasoning and tool calls are split from the content
  ReplyFormat format = ReplyFormat::hermes;
  ReplyOptions reply_options;
};

struct ServeContext {
  std::string model_name;
  SamplingParams default_sampling;  // the command line's (requests override)
  // The prompt's tokens of a request (chat: sent is the OpenAI-shaped body, key order kept).
  // Throws ApiError.
  std::function<std::vector<int32_t>(const ParsedRequest&, const nlohmann::ordered_json& sent)> prompt;
  // Checks the request against the context, builds its constraint and submits it. Throws ApiError.
  std::function<Generation(const ParsedRequest&, const nlohmann::ordered_json& sent)> start;
  // The client went away: frees the generation's sequence.
  std::function<void(const Generation&)> cancel;
  // Whether a request carries the API key (Authorization: Bearer or x-api-key).
  std::function<bool(const std::string& authorization, const std::string& x_api_key)> authorized;
};

}  // namespace sluice::server
