// TextPieceReader (see text_pieces.h): read(2) into a carry buffer, cut, hand out.
#include "format/text_pieces.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.h"
#include "format/file_io.h"

namespace sluice {

size_t text_piece_cut(std::string_view text) {
  for (size_t i = text.size(); i-- > 1;) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (text[i - 1] == '\n' && c > ' ' && c < 0x7f) return i;
  }
  // No line break to cut at: step back over at most 3 continuation bytes (10xxxxxx) to the
  // lead byte of the last character, which may be incomplete, and cut before it.
  for (size_t back = 1; back <= 4 && back <= text.size(); ++back) {
    const unsigned char c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) != 0x80) return c < 0x80 ? text.size() : text.size() - back;
  }
  return text.size();  // not UTF-8 at all: the tokenizer reports it
}

TextPieceReader::TextPieceReader(const std::filesystem::path& path, size_t piece_bytes)
    : path_(path.string()), piece_bytes_(std::max<size_t>(piece_bytes, 16)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0 && (errno == ENOENT || errno == ENOTDIR)) fail(Status::not_found, path_, ": no such file");
  if (fd_ < 0) fail(Status::io, path_, ": cannot open: ", errno_text(errno));
  struct stat st {};
  if (::fstat(fd_, &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      ::close(fd_);
      fd_ = -1;
      fail(Status::invalid_argument, path_, ": is a directory (expected a text file)");
    }
    if (S_ISREG(st.st_mode)) size_ = static_cast<uint64_t>(st.st_size);
  }
}

TextPieceReader::~TextPieceReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool TextPieceReader::next(std::string& piece) {
  // Fill the carry up to piece_bytes (a pipe may return less per read).
  while (!eof_ && carry_.size() < piece_bytes_) {
    const size_t have = carry_.size();
    carry_.resize(piece_bytes_);
    const ssize_t n = ::read(fd_, carry_.data() + have, piece_bytes_ - have);
    const int err = errno;
    carry_.resize(have + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n < 0 && err == EINTR) continue;
    if (n < 0) fail(Status::io, path_, ": read failed at byte ", bytes_read_, ": ", errno_text(err));
    if (n == 0) eof_ = true;
    bytes_read_ += static_cast<uint64_t>(std::max<ssize_t>(n, 0));
  }
  if (carry_.empty()) return false;
  size_t cut = eof_ ? carry_.size() : text_piece_cut(carry_);
  if (cut == 0) cut = carry_.size();
  piece.assign(carry_, 0, cut);
  carry_.erase(0, cut);
  piece_offset_ = next_offset_;
  next_offset_ += cut;
  return true;
}

}  // namespace sluice
