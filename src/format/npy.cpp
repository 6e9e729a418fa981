// .npy reader and writer. The header is a Python dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ended by '\n' so the data starts 64-byte aligned. The reader parses
// exactly that grammar (string keys; string, bool and int-tuple values) with every length
// checked against the bytes present before anything is allocated.
#include "format/npy.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "format/file_io.h"

namespace sluice {

namespace {

constexpr char npy_magic[] = "\x93NUMPY";
constexpr size_t npy_magic_len = 6;
// Largest file read_npy loads whole (reference tensors are megabytes; this only stops a
// mistaken path to something enormous).
constexpr uint64_t npy_file_max = uint64_t{1} << 34;

// Recursive-descent parser over the header dict text.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view file) : s_(text), file_(file) {}

  std::string descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
  bool has_descr = false;

  void parse() {
    skip_ws();
    expect('{');
    for (;;) {
      skip_ws();
      if (peek() == '}') break;
      std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (has_descr) bad("duplicate key 'descr'");
        descr = parse_string();
        has_descr = true;
      } else if (key == "fortran_order") {
        if (fortran_order) bad("duplicate key 'fortran_order'");
        fortran_order = parse_bool();
      } else if (key == "shape") {
        if (shape) bad("duplicate key 'shape'");
        shape = parse_tuple();
      } else {
        bad(str("unexpected key '", key, "'"));
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') bad("expected ',' or '}'");
    }
    ++pos_;
    skip_ws();
    if (pos_ != s_.size()) bad("unexpected text after the dict");
    if (!has_descr) bad("missing 'descr'");
    if (!fortran_order) bad("missing 'fortran_order'");
    if (!shape) bad("missing 'shape'");
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(Status::corrupt, file_, ": malformed .npy header at byte ", pos_, ": ", what);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void expect(char c) {
    if (peek() != c) bad(str("expected '", c, "'"));
    ++pos_;
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  std::string parse_string() {
    char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string");
    size_t start = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\') bad("escapes are not supported in header strings");
      ++pos_;
    }
    if (pos_ >= s_.size()) bad("unterminated string");
    return std::string(s_.substr(start, pos_++ - start));
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    bad("expected True or False");
  }
  // "()", "(3,)", "(2, 3)", "(2, 3,)"; Python 2 wrote longs as "3L".
  std::vector<int64_t> parse_tuple() {
    expect('(');
    std::vector<int64_t> dims;
    for (;;) {
      skip_ws();
      if (peek() == ')') break;
      if (dims.size() >= npy_ndim_max) bad(str("more than ", npy_ndim_max, " dimensions"));
      if (peek() < '0' || peek() > '9') bad("expected a non-negative integer dimension");
      int64_t d = 0;
      while (peek() >= '0' && peek() <= '9') {
        int digit = peek() - '0';
        if (d > (std::numeric_limits<int64_t>::max() - digit) / 10) bad("dimension does not fit 64 bits");
        d = d * 10 + digit;
        ++pos_;
      }
      if (peek() == 'L') ++pos_;
      dims.push_back(d);
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != ')') bad("expected ',' or ')'");
    }
    ++pos_;
    return dims;
  }

  std::string_view s_;
  std::string_view file_;
  size_t pos_ = 0;
};

float f64_to_f32(double d) {
  // Out-of-range finite doubles do not convert to float in C++ (undefined): saturate to inf.
  if (d > std::numeric_limits<float>::max()) return std::numeric_limits<float>::infinity();
  if (d < -std::numeric_limits<float>::max()) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(d);
}

}  // namespace

NpyArray parse_npy(std::span<const uint8_t> file, std::string_view file_name) {
  SLUICE_CHECK(file.size() >= 10 && std::memcmp(file.data(), npy_magic, npy_magic_len) == 0, Status::corrupt, file_name,
               ": not a .npy file (bad magic)");
  const int major = file[6], minor = file[7];
  SLUICE_CHECK((major == 1 || major == 2 || major == 3) && minor == 0, Status::unsupported, file_name,
               ": .npy format version ", major, ".", minor, " (sluice reads 1.0, 2.0 and 3.0)");
  uint64_t header_len;
  size_t header_start;
  if (major == 1) {
    header_len = file[8] | (uint64_t{file[9]} << 8);
    header_start = 10;
  } else {
    SLUICE_CHECK(file.size() >= 12, Status::corrupt, file_name, ": truncated .npy header");
    header_len = file[8] | (uint64_t{file[9]} << 8) | (uint64_t{file[10]} << 16) | (uint64_t{file[11]} << 24);
    header_start = 12;
  }
  SLUICE_CHECK(header_len <= file.size() - header_start, Status::corrupt, file_name, ": header length ", header_len,
               " runs past the end of the ", file.size(), "-byte file (truncated?)");
  std::string_view header(reinterpret_cast<const char*>(file.data()) + header_start, header_len);

  HeaderParser p(header, file_name);
  p.parse();

  size_t item_size = 0;
  if (p.descr == "<f4") {
    item_size = 4;
  } else if (p.descr == "<f2") {
    item_size = 2;
  } else if (p.descr == "<f8") {
    item_size = 8;
  } else if (!p.descr.empty() && p.descr[0] == '>') {
    fail(Status::unsupported, file_name, ": big-endian data ('", p.descr, "'); sluice reads little-endian only");
  } else {
    fail(Status::unsupported, file_name, ": dtype '", p.descr, "' (sluice reads '<f4', '<f2' and '<f8')");
  }
  SLUICE_CHECK(!*p.fortran_order, Status::unsupported, file_name, ": Fortran-order array (sluice reads C order only)");

  uint64_t n_element = 1, n_byte = 0;
  bool overflow = false;
  for (int64_t d : *p.shape) overflow = overflow || __builtin_mul_overflow(n_element, static_cast<uint64_t>(d), &n_element);
  overflow = overflow || __builtin_mul_overflow(n_element, uint64_t{item_size}, &n_byte);
  const uint64_t data_start = header_start + header_len;
  const uint64_t available = file.size() - data_start;
  auto shape_text = [&] {
    std::string s = "(";
    for (size_t i = 0; i < p.shape->size(); ++i) s += (i ? ", " : "") + std::to_string((*p.shape)[i]);
    return s + ")";
  };
  SLUICE_CHECK(!overflow, Status::corrupt, file_name, ": shape ", shape_text(), " overflows 64 bits");
  SLUICE_CHECK(n_byte <= available, Status::corrupt, file_name, ": shape ", shape_text(), " of '", p.descr, "' needs ",
               n_byte, " bytes of data but the file holds ", available, " (truncated?)");
  SLUICE_CHECK(n_byte == available, Status::corrupt, file_name, ": ", available - n_byte,
               " bytes after the data of shape ", shape_text());

  NpyArray out;
  out.shape = *p.shape;
  out.data.resize(n_element);  // n_byte <= file size: bounded by bytes actually present
  const uint8_t* src = file.data() + data_start;
  if (item_size == 4) {
    if (n_byte) std::memcpy(out.data.data(), src, n_byte);
  } else if (item_size == 2) {
    for (uint64_t i = 0; i < n_element; ++i) out.data[i] = f16_to_f32(static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8)));
  } else {
    for (uint64_t i = 0; i < n_element; ++i) {
      double d;
      std::memcpy(&d, src + 8 * i, 8);
      out.data[i] = f64_to_f32(d);
    }
  }
  return out;
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::string bytes = read_file_bytes(path, npy_file_max, "a .npy file");
  return parse_npy({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, path.string());
}

void write_npy(const std::filesystem::path& path, const float* data, std::span<const int64_t> shape) {
  uint64_t n_element = 1, n_byte = 0;
  bool overflow = false;
  std::string dims;
  for (int64_t d : shape) {
    SLUICE_CHECK(d >= 0, Status::invalid_argument, path.string(), ": negative dimension ", d);
    overflow = overflow || __builtin_mul_overflow(n_element, static_cast<uint64_t>(d), &n_element);
    dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  }
  if (shape.size() == 1) dims += ',';  // Python's one-element tuple: "(3,)"
  overflow = overflow || __builtin_mul_overflow(n_element, uint64_t{4}, &n_byte);
  SLUICE_CHECK(!overflow, Status::invalid_argument, path.string(), ": shape overflows 64 bits");
  SLUICE_CHECK(data || n_byte == 0, Status::invalid_argument, path.string(), ": no data");
  SLUICE_CHECK(shape.size() <= npy_ndim_max, Status::invalid_argument, path.string(), ": more than ", npy_ndim_max,
               " dimensions");

  // NumPy pads the header so that magic + version + length + header is a multiple of 64,
  // with '\n' as its last byte.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t prefix = 10;
  size_t total = prefix + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  SLUICE_ASSERT(header.size() <= 0xffff);  // 64 dimensions of 19 digits fit easily
  std::string head(npy_magic, npy_magic_len);
  head += '\x01';
  head += '\x00';
  head += static_cast<char>(header.size() & 0xff);
  head += static_cast<char>(header.size() >> 8);
  head += header;
  std::span<const uint8_t> parts[2] = {{reinterpret_cast<const uint8_t*>(head.data()), head.size()},
                                       {reinterpret_cast<const uint8_t*>(data), static_cast<size_t>(n_byte)}};
  write_file_atomic(path, parts);
}

}  // namespace sluice
