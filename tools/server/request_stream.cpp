// RequestStream (request_stream.h).
#include "request_stream.h"

#include "core/error.h"

namespace sluice::server {

std::string RequestStream::push(int32_t id) {
  std::string piece;
  try {
    piece = decoder_.push(id);
  } catch (const Error&) {
    piece.clear();  // an id the tokenizer does not know (a padded output row) prints nothing
  }
  return stops_.push(piece);
}

std::string RequestStream::finish() {
  if (stops_.stopped()) return {};
  return stops_.push(decoder_.flush()) + stops_.flush();
}

}  // namespace sluice::server
