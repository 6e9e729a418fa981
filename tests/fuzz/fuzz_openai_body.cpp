// libFuzzer target for the checks a `sluice serve` request body passes before the engine sees
// it (tools/server/json_bounds.h, openai_api.h): the bounds on the text, the JSON parse, then
// parse_request for completions and chat. Any input must end as a ParsedRequest within the
// limits or as an ApiError (a 4xx with a message); the parsed value's dump (recursive) must
// never overflow the stack, since the bounds came first. A crash, a sanitizer report or a
// violated invariant (__builtin_trap) is a bug.
//   build-fuzz/bin/fuzz_openai_body -dict=tests/fuzz/openai_body.dict tests/fuzz/corpus_openai_body
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/json_bounds.h"
#include "server/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice::server;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!json_bounds_error(text, JsonBounds{}).empty()) return 0;
  const nlohmann::json body = nlohmann::json::parse(text, nullptr, false);
  if (body.is_discarded()) return 0;
  (void)body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // the walks a reply makes
  RequestLimits limits;
  limits.max_messages = limits.max_prompt_ids = 64;
  for (const Endpoint e : {Endpoint::completions, Endpoint::chat}) {
    try {
      const ParsedRequest r = parse_request(body, e, sluice::SamplingParams{}, limits);
      if (r.stop.size() > 4 || r.messages.size() > limits.max_messages || r.prompt_ids.size() > limits.max_prompt_ids)
        __builtin_trap();
      if (e == Endpoint::completions && !r.prompt_text && r.prompt_ids.empty()) __builtin_trap();
      if (e == Endpoint::chat && r.messages.empty()) __builtin_trap();
      if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1) || !(r.sampling.temperature >= 0)) __builtin_trap();
      if (r.max_tokens && *r.max_tokens < 0) __builtin_trap();
      for (int32_t id : r.prompt_ids)
        if (id < 0) __builtin_trap();
      if (r.include_usage && !r.stream) __builtin_trap();
    } catch (const ApiError& err) {
      if (err.status != 400 || err.message.empty()) __builtin_trap();
      (void)err.to_json().dump();
    }
  }
  return 0;
}
