// The context options (-n, --ctx) checked against the model and the memory once the model is
// loaded and before a sequence's state is allocated, so that `-n 1000000000000` is answered
// with the model's limit rather than an allocator's "cpu alloc: 512000000001536 bytes".
#pragma once

#include <cstdint>

#include "cli_common.h"

namespace sluice::cli {

// sluice run: -n N and --ctx N (0: the prompt's tokens + N) each within the model's context
// (max_position_embeddings), and the state of that context within the backend's memory.
void check_generation_context(const Session& s, int64_t n_prompt, int64_t n_predict, int64_t n_ctx);

// sluice perplexity: windows of --ctx N tokens, the same two checks.
void check_window_context(const Session& s, int64_t n_ctx);

}  // namespace sluice::cli
