// StopStrings (stop_strings.h).
#include "stop_strings.h"

#include <algorithm>

namespace sluice::server {

std::string StopStrings::push(const std::string& text) {
  if (stopped_) return {};
  pending_ += text;
  // The earliest stop string in the pending text ends the generation there.
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) {
    if (s.empty()) continue;
    const size_t at = pending_.find(s);
    if (at != std::string::npos && at < cut) {
      cut = at;
      matched_ = s;
    }
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is a prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStrings::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace sluice::server
