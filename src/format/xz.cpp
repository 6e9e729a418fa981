// .xz decompression through liblzma (xz.h).
#include "format/xz.h"

#include <lzma.h>

#include "core/error.h"
#include "format/file_io.h"

namespace sluice {

bool is_xz_path(const std::filesystem::path& path) { return path.extension() == ".xz"; }

std::string read_xz_file(const std::filesystem::path& path, uint64_t size_max) {
  // The compressed file is bounded by what it may decompress to (xz never grows data much).
  const std::string in = read_file_bytes(path, size_max, "xz file");
  lzma_stream strm = LZMA_STREAM_INIT;
  lzma_ret r = lzma_stream_decoder(&strm, UINT64_MAX, LZMA_CONCATENATED);
  SLUICE_CHECK(r == LZMA_OK, Status::out_of_memory, path.string(), ": cannot start the xz decoder (liblzma error ",
               static_cast<int>(r), ")");
  struct End {
    lzma_stream* s;
    ~End() { lzma_end(s); }
  } end{&strm};
  std::string out;
  strm.next_in = reinterpret_cast<const uint8_t*>(in.data());
  strm.avail_in = in.size();
  constexpr size_t kChunk = size_t{1} << 20;
  for (;;) {
    const size_t have = out.size();
    SLUICE_CHECK(have < size_max, Status::corrupt, path.string(), ": decompresses to more than ", size_max, " bytes");
    out.resize(have + kChunk);
    strm.next_out = reinterpret_cast<uint8_t*>(out.data()) + have;
    strm.avail_out = kChunk;
    r = lzma_code(&strm, LZMA_FINISH);
    out.resize(have + (kChunk - strm.avail_out));
    if (r == LZMA_STREAM_END) break;
    SLUICE_CHECK(r == LZMA_OK, Status::corrupt, path.string(), ": not a valid .xz file (",
                 r == LZMA_FORMAT_ERROR ? "not in the xz format"
                 : r == LZMA_DATA_ERROR ? "damaged data"
                 : r == LZMA_BUF_ERROR  ? "truncated"
                                        : "liblzma error " + std::to_string(static_cast<int>(r)),
                 ")");
  }
  SLUICE_CHECK(out.size() <= size_max, Status::corrupt, path.string(), ": decompresses to more than ", size_max, " bytes");
  return out;
}

}  // namespace sluice
