// What the routes of other APIs (anthropic_api.h) need from the server for one request: its
// body, the prompt of a request, a generation started on the engine whose answer the route's
// ReplyWriter writes (completion_answer.h), and a whole answer. The OpenAI routes of
// http_server.cpp use the same. A route runs on one of the server's worker threads; an
// ApiError it throws is answered in its API's shape.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "completion_answer.h"
#include "openai_api.h"

namespace sluice::server {

struct ServeContext {
  std::string model_name;
  SamplingParams default_sampling;  // the command line's (requests override)
  RequestLimits limits;             // what a request may ask before its prompt is rendered
  std::string_view body;            // the request's body (held by the server until it is answered)
  // The prompt's tokens of a request (chat: sent is the OpenAI-shaped body, key order kept).
  // Throws ApiError.
  std::function<std::vector<int32_t>(const ParsedRequest&, const nlohmann::ordered_json& sent)> prompt;
  // Checks the request against the context, builds its constraint and submits it; the writer
  // that `make` returns writes the answer as the engine produces it, and the client's leaving
  // cancels it. Throws ApiError (then nothing was answered).
  std::function<void(const ParsedRequest&, const nlohmann::ordered_json& sent, const WriterFactory& make)> start;
  // A whole answer (JSON) with its status.
  std::function<void(int status, const nlohmann::json& body)> respond;
};

}  // namespace sluice::server
