// StopStrings: the text of a generation, emitted as it completes, cut at the first stop
// string (OpenAI's `stop`). Text that could still be the start of a stop string is held back
// until it is decided, so a streaming client never sees a stop string or a piece of one.
#pragma once

#include <string>
#include <vector>

namespace sluice::server {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Appends generated text; returns the text that is now safe to emit. After a stop string
  // appeared, stopped() is true and the text before it is all that was emitted.
  std::string push(const std::string& text);
  // The held-back text at the end of a generation that ended otherwise.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string found (stopped())

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace sluice::server
