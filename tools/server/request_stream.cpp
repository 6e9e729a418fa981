// RequestStream (request_stream.h).
#include "request_stream.h"

namespace sluice::server {

bool RequestStream::on_token(int32_t id) {
  std::string piece;
  try {
    piece = decoder_.push(id);
  } catch (const Error&) {
    piece.clear();  // an id the tokenizer does not know (a padded output row) prints nothing
  }
  std::string out = stops_.push(piece);
  std::lock_guard<std::mutex> lk(mu_);
  text_ += out;
  cv_.notify_all();
  return !stops_.stopped() && !closed_;
}

void RequestStream::on_done(const CompletionResult& result) {
  std::string tail;
  if (!stops_.stopped()) tail = stops_.push(decoder_.flush()) + stops_.flush();
  std::lock_guard<std::mutex> lk(mu_);
  text_ += tail;
  done_ = result;
  cv_.notify_all();
}

std::optional<RequestStream::Event> RequestStream::next(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, wait, [&] { return !text_.empty() || done_.has_value(); });
  if (text_.empty() && !done_) return std::nullopt;
  Event e;
  e.text.swap(text_);
  e.done = done_;
  return e;
}

void RequestStream::close() {
  std::lock_guard<std::mutex> lk(mu_);
  closed_ = true;
}

std::string RequestStream::stop_matched() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stops_.stopped() ? stops_.matched() : std::string();
}

bool RequestStream::closed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return closed_;
}

}  // namespace sluice::server
