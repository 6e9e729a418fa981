// The chat page `sluice serve` answers GET / with: one HTML document (no build step, no
// external files) that streams replies from /v1/chat/completions (or /v1/completions for a
// model without a chat template) and shows the expert cache at work: tokens/s, bytes read per
// second per tier, and a heat map of every MoE layer's hit rate over time, from /v1/cache.
#pragma once

#include <string>

namespace sluice::server {

const std::string& chat_page_html();

}  // namespace sluice::server
