// TextPieceReader: a text file (or a pipe, or /dev/zero) read a piece of about piece_bytes
// at a time, so a file of any size is tokenized with bounded memory. A piece ends where no
// pre-tokenizer joins the bytes on either side: after a line break that a printable ASCII
// character follows (the byte-level BPE split patterns keep "\n" apart from a following
// word, digit or punctuation), so encoding the pieces one by one gives the ids of encoding
// the whole file. A stretch of piece_bytes without such a point (one endless line: minified
// text, /dev/zero) is cut at a UTF-8 character boundary instead; the tokens at that cut may
// then differ from a whole-file encoding.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace sluice {

class TextPieceReader {
 public:
  // Errors name the path: not_found, a directory (invalid_argument), io.
  explicit TextPieceReader(const std::filesystem::path& path, size_t piece_bytes = size_t{1} << 20);
  ~TextPieceReader();
  TextPieceReader(const TextPieceReader&) = delete;
  TextPieceReader& operator=(const TextPieceReader&) = delete;

  // The next piece (never empty); false at the end of the file.
  bool next(std::string& piece);
  uint64_t piece_offset() const { return piece_offset_; }  // file offset of the last piece
  uint64_t bytes_read() const { return bytes_read_; }
  std::optional<uint64_t> size() const { return size_; }  // a regular file's size (for progress)

 private:
  std::string path_;
  int fd_ = -1;
  size_t piece_bytes_;
  std::string carry_;  // bytes read after the last cut
  bool eof_ = false;
  uint64_t piece_offset_ = 0, next_offset_ = 0, bytes_read_ = 0;
  std::optional<uint64_t> size_;
};

// Where a piece of `text` may end (see above), searching back from its end: the position
// after a "\n" followed by a printable ASCII byte, else the last UTF-8 character boundary
// (text.size() when the text ends on one or holds none).
size_t text_piece_cut(std::string_view text);

}  // namespace sluice
