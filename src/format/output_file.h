// OutputFile: how sluice writes a file the user names (logits --out, --trace-routing,
// --stats, a pack's manifest). The path is followed through symlinks to what it names:
//   - a regular file, or nothing yet: written under `<target>.tmp` beside it and renamed over
//     it at commit(), so a reader sees the old file or the whole new one and a failed run
//     leaves the old file (a symlink stays a symlink; its target is what is replaced);
//   - a device, FIFO or socket (/dev/null, /dev/stdout, a named pipe): written in place and
//     never replaced (renaming over /dev/null would break every program that uses it);
//   - a directory: Error(invalid_argument).
// Every write, the close and the rename are checked: a full disk, /dev/full or a closed pipe
// is Error(io) naming the path.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace sluice {

class OutputFile {
 public:
  explicit OutputFile(const std::filesystem::path& path);
  ~OutputFile();  // without commit(): the temporary file is removed, the target untouched
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(std::span<const uint8_t> bytes);
  void write(std::string_view text);
  // Writes what is buffered, closes, and renames the temporary file into place.
  void commit();
  bool in_place() const { return tmp_.empty(); }  // a device, FIFO or socket
  const std::string& path() const { return path_; }

 private:
  void write_now(const uint8_t* data, size_t n);
  void flush_buffer();

  std::string path_;              // as given, for messages
  std::filesystem::path target_;  // symlinks resolved
  std::filesystem::path tmp_;     // empty when written in place
  int fd_ = -1;
  bool committed_ = false;
  std::string buffer_;  // small writes gathered up to kBufferBytes before one write(2)
  static constexpr size_t kBufferBytes = size_t{1} << 20;
};

}  // namespace sluice
