// Context size checks (cli_context.h).
#include "cli_context.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"

namespace sluice::cli {

namespace {

// `option` (e.g. "--ctx") with `tokens` must fit the model's context, max_position_embeddings
// (Model::check_context, the one message for every such limit).
void check_model_limit(const Session& s, std::string_view option, int64_t tokens) {
  s.model.model->check_context(tokens, str(option, " ", tokens));
}

// A sequence state of n_ctx tokens must fit the memory the backend has available; `what`
// says where n_ctx came from. Its size and the KV cache's dtype are logged (-v).
void check_memory(const Session& s, std::string_view what, int64_t n_ctx) {
  const uint64_t need = s.model.model->context_bytes(n_ctx);
  LOG_INFO("a context of ", n_ctx, " tokens: ", byte_size_text(need), " of KV cache and state (--kv-cache ",
           dtype_name(s.backend->kv_dtype()), ")");
  const std::optional<uint64_t> available = s.backend->memory_available();
  if (!available) return;
  SLUICE_CHECK(need <= *available, Status::out_of_memory, what, ": a context of ", n_ctx, " tokens needs ",
               byte_size_text(need), " for its KV cache, more than the ", byte_size_text(*available),
               " of memory available to the ", s.backend->name(), " backend");
}

}  // namespace

void check_generation_context(const Session& s, int64_t n_prompt, int64_t n_predict, int64_t n_ctx) {
  check_model_limit(s, "-n", n_predict);
  if (n_ctx > 0) check_model_limit(s, "--ctx", n_ctx);
  check_memory(s, n_ctx > 0 ? "--ctx" : "the prompt + -n", n_ctx > 0 ? n_ctx : n_prompt + n_predict);
}

void check_window_context(const Session& s, int64_t n_ctx) {
  check_model_limit(s, "--ctx", n_ctx);
  check_memory(s, "--ctx", n_ctx);
}

}  // namespace sluice::cli
