// RequestStream: a request's generated text as the engine thread produces it: tokens decoded
// (a UTF-8 character split over tokens waits for its last byte) and cut at the first stop
// string (text that may begin one is held back until it is known not to).
#pragma once

#include <string>
#include <vector>

#include "format/tokenizer.h"
#include "stop_strings.h"

namespace sluice::server {

class RequestStream {
 public:
  // skip_special: special tokens print nothing (reply formats whose markers are special
  // tokens keep them: reply_formats.h).
  RequestStream(const Tokenizer& tokenizer, std::vector<std::string> stops, bool skip_special = true)
      : decoder_(tokenizer, skip_special), stops_(std::move(stops)) {}

  // The text token `id` adds (may be empty; an id the tokenizer does not know adds none).
  std::string push(int32_t id);
  // A stop string was reached: the request should end.
  bool stopped() const { return stops_.stopped(); }
  // At the request's end: the text held back.
  std::string finish();
  // The stop string that ended the request, or "".
  std::string stop_matched() const { return stops_.stopped() ? stops_.matched() : std::string(); }

 private:
  StreamDecoder decoder_;
  StopStrings stops_;
};

}  // namespace sluice::server
