// safetensors header validation, the mmap reader and the writer. The header is untrusted:
// every length and offset is checked against the file before it is used, and nothing is
// allocated from a size the file states (only in proportion to bytes actually present).
#include "format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "format/file_io.h"
#include "format/json_file.h"

namespace sluice {

using json = nlohmann::json;

namespace {

// Containers in a valid header nest at most 3 deep (root object, tensor object, shape
// array) and arrays hold at most 8 elements (a shape); anything beyond is rejected while
// parsing, which bounds the memory a hostile header can make the parser use.
constexpr size_t header_nesting_max = 3;
constexpr size_t header_array_max = safetensors_ndim_max;

// A name as it appears in messages: quoted, control bytes escaped, long names cut short.
std::string quoted(std::string_view s) {
  constexpr size_t shown_max = 200;
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < shown_max; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > shown_max) out += "...";
  return out + "\"";
}

[[noreturn]] void fail_tensor(Status status, std::string_view file, std::string_view tensor, const std::string& what) {
  fail(status, file, ": tensor ", quoted(tensor), ": ", what);
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Safetensors dtype names sluice loads, and the other names the format defines (reported as
// unsupported rather than corrupt).
std::optional<DType> loadable_dtype(std::string_view name) {
  if (name == "F32") return DType::f32;
  if (name == "BF16") return DType::bf16;
  if (name == "F16") return DType::f16;
  if (name == "I32") return DType::i32;
  if (name == "I64") return DType::i64;
  if (name == "U8") return DType::u8;
  if (name == "I8") return DType::i8;
  if (name == "F8_E4M3") return DType::f8_e4m3;  // block-scaled FP8 weights (format/fp8.h)
  if (name == "F8_E5M2") return DType::f8_e5m2;
  return std::nullopt;
}

bool known_dtype(std::string_view name) {
  static const char* const names[] = {"BOOL", "F4", "F6_E2M3", "F6_E3M2", "F8_E8M0",
                                      "I16", "U16", "U32", "U64", "F64", "C64", "E8M0"};
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

// Tracks the container stack while nlohmann parses, to reject duplicate keys (nlohmann would
// silently keep the last one), deep nesting and long arrays as soon as they appear.
class HeaderScanner {
 public:
  explicit HeaderScanner(std::string_view file) : file_(file) {}

  bool on_event(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        count_element();
        if (stack_.size() >= header_nesting_max) fail_here("containers nested more than 3 deep");
        stack_.push_back({event == json::parse_event_t::array_start, 0, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        stack_.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (stack_.size() == 1) tensor_ = key;
        if (!stack_.back().keys.insert(key).second) {
          if (stack_.size() == 1) fail(Status::corrupt, file_, ": duplicate tensor name ", quoted(key));
          fail_here(str("duplicate key ", quoted(key)));
        }
        break;
      }
      case json::parse_event_t::value:
        count_element();
        break;
    }
    return true;
  }

 private:
  struct Level {
    bool is_array;
    size_t n_element;
    std::set<std::string> keys;  // objects only
  };

  void count_element() {
    if (stack_.empty() || !stack_.back().is_array) return;
    if (++stack_.back().n_element > header_array_max)
      fail_here(str("array longer than ", header_array_max, " elements (a shape has at most ",
                    safetensors_ndim_max, " dimensions)"));
  }

  [[noreturn]] void fail_here(const std::string& what) {
    if (stack_.size() >= 2) fail_tensor(Status::corrupt, file_, tensor_, what);
    fail(Status::corrupt, file_, ": header: ", what);
  }

  std::string_view file_;
  std::string tensor_;  // the root key being parsed
  std::vector<Level> stack_;
};

// A JSON number as a non-negative integer; `what` names the field for the message.
uint64_t read_unsigned(const json& v, std::string_view file, std::string_view tensor, std::string_view what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) fail_tensor(Status::corrupt, file, tensor, str(what, " is negative (", v.get<int64_t>(), ")"));
  fail_tensor(Status::corrupt, file, tensor, str(what, " is not a non-negative integer"));
}

SafetensorsEntry parse_entry(const std::string& name, const json& info, uint64_t data_size, std::string_view file) {
  if (!info.is_object()) fail_tensor(Status::corrupt, file, name, "entry is not a JSON object");
  auto dtype_it = info.find("dtype");
  auto shape_it = info.find("shape");
  auto offsets_it = info.find("data_offsets");
  if (dtype_it == info.end()) fail_tensor(Status::corrupt, file, name, "missing \"dtype\"");
  if (shape_it == info.end()) fail_tensor(Status::corrupt, file, name, "missing \"shape\"");
  if (offsets_it == info.end()) fail_tensor(Status::corrupt, file, name, "missing \"data_offsets\"");

  SafetensorsEntry e;
  e.name = name;
  if (!dtype_it->is_string()) fail_tensor(Status::corrupt, file, name, "\"dtype\" is not a string");
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = loadable_dtype(dtype_name);
  if (!dtype) {
    if (known_dtype(dtype_name)) fail(Status::unsupported, file, ": unsupported dtype ", dtype_name, " for tensor ", quoted(name));
    fail_tensor(Status::corrupt, file, name, str("unknown dtype ", quoted(dtype_name)));
  }
  e.dtype = *dtype;

  if (!shape_it->is_array()) fail_tensor(Status::corrupt, file, name, "\"shape\" is not an array");
  if (shape_it->size() > safetensors_ndim_max)
    fail_tensor(Status::corrupt, file, name, str("shape has ", shape_it->size(), " dimensions (at most ", safetensors_ndim_max, ")"));
  uint64_t n_element = 1;  // [] is a scalar
  bool overflow = false;
  for (const json& d : *shape_it) {
    uint64_t dim = read_unsigned(d, file, name, "a shape dimension");
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_tensor(Status::corrupt, file, name, str("shape dimension ", dim, " is too large"));
    e.shape.push_back(static_cast<int64_t>(dim));
    overflow = overflow || __builtin_mul_overflow(n_element, dim, &n_element);
  }
  uint64_t n_byte = 0;
  overflow = overflow || __builtin_mul_overflow(n_element, static_cast<uint64_t>(dtype_size(e.dtype)), &n_byte);

  if (!offsets_it->is_array() || offsets_it->size() != 2)
    fail_tensor(Status::corrupt, file, name, "\"data_offsets\" is not an array [begin, end]");
  e.begin = read_unsigned((*offsets_it)[0], file, name, "data_offsets begin");
  e.end = read_unsigned((*offsets_it)[1], file, name, "data_offsets end");
  if (e.begin > e.end) fail_tensor(Status::corrupt, file, name, str("data_offsets [", e.begin, ", ", e.end, "] are reversed"));
  if (e.end > data_size)
    fail_tensor(Status::corrupt, file, name,
                str("data_offsets [", e.begin, ", ", e.end, "] run past the end of the data section (", data_size,
                    " bytes; truncated file?)"));
  auto shape_text = [&] {
    std::string s = "[";
    for (size_t i = 0; i < e.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(e.shape[i]);
    return s + "]";
  };
  if (overflow)
    fail_tensor(Status::corrupt, file, name, str("shape ", shape_text(), " x ", dtype_name, " overflows 64 bits"));
  if (n_byte != e.end - e.begin)
    fail_tensor(Status::corrupt, file, name,
                str("data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin, " bytes but shape ", shape_text(),
                    " x ", dtype_name, " needs ", n_byte));
  return e;
}

}  // namespace

std::vector<SafetensorsEntry> parse_safetensors_header(std::span<const uint8_t> file, std::string_view file_name,
                                                       std::map<std::string, std::string>* metadata) {
  SLUICE_CHECK(file.size() >= 8, Status::corrupt, file_name, ": ", file.size(),
               " bytes is too short for a safetensors file (the header length alone is 8 bytes)");
  uint64_t header_len = read_u64_le(file.data());
  SLUICE_CHECK(header_len <= safetensors_header_max, Status::corrupt, file_name, ": header length ", header_len,
               " exceeds the limit of ", safetensors_header_max, " bytes (not a safetensors file?)");
  SLUICE_CHECK(header_len <= file.size() - 8, Status::corrupt, file_name, ": header length ", header_len,
               " runs past the end of the ", file.size(), "-byte file (truncated?)");
  const uint8_t* header = file.data() + 8;
  uint64_t data_size = file.size() - 8 - header_len;

  HeaderScanner scanner(file_name);
  json root;
  try {
    root = json::parse(header, header + header_len,
                       [&](int depth, json::parse_event_t event, json& parsed) { return scanner.on_event(depth, event, parsed); });
  } catch (const json::exception& e) {
    std::string_view text(reinterpret_cast<const char*>(header), header_len);
    fail(Status::corrupt, file_name, ": header is not valid JSON (", describe_json_error(e, text), ")");
  }
  SLUICE_CHECK(root.is_object(), Status::corrupt, file_name, ": header is JSON ", root.type_name(), ", not an object");

  std::vector<SafetensorsEntry> entries;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      SLUICE_CHECK(it->is_object(), Status::corrupt, file_name, ": \"__metadata__\" is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        SLUICE_CHECK(m->is_string(), Status::corrupt, file_name, ": \"__metadata__\" value for ", quoted(m.key()),
                     " is not a string");
        if (metadata) (*metadata)[m.key()] = m->get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(it.key(), *it, data_size, file_name));
  }

  std::sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  // Empty tensors occupy no bytes and cannot overlap; the others must be disjoint.
  const SafetensorsEntry* last = nullptr;  // the non-empty tensor reaching furthest so far
  for (const SafetensorsEntry& e : entries) {
    if (e.begin == e.end) continue;
    if (last && e.begin < last->end)
      fail(Status::corrupt, file_name, ": tensor ", quoted(e.name), " [", e.begin, ", ", e.end, ") overlaps tensor ",
           quoted(last->name), " [", last->begin, ", ", last->end, ")");
    if (!last || e.end > last->end) last = &e;
  }
  return entries;
}

// ---- SafetensorsFile ----

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(addr); }
};

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const std::string name = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) fail(Status::not_found, name, ": no such file");
    fail(Status::io, name, ": cannot open: ", errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail(Status::io, name, ": cannot stat: ", errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(Status::invalid_argument, name, ": not a regular file");
  }
  auto mapping = std::make_shared<Mapping>();
  size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {  // mmap of 0 bytes fails; the parser reports the short file instead
    void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail(Status::io, name, ": mmap of ", size, " bytes failed: ", errno_text(err));
    }
    mapping->addr = addr;
    mapping->size = size;
  }
  ::close(fd);  // the mapping holds its own reference to the file

  f->entries_ = parse_safetensors_header({mapping->bytes(), mapping->size}, name, &f->metadata_);
  f->data_offset_ = 8 + read_u64_le(mapping->bytes());
  for (size_t i = 0; i < f->entries_.size(); ++i) f->index_[f->entries_[i].name] = i;
  f->mapping_ = std::move(mapping);
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::span<const uint8_t> SafetensorsFile::bytes(const SafetensorsEntry& entry) const {
  SLUICE_ASSERT(entry.begin <= entry.end && data_offset_ + entry.end <= mapping_->size);
  return {mapping_->bytes() + data_offset_ + entry.begin, entry.end - entry.begin};
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) fail(Status::not_found, path_.string(), ": no tensor ", quoted(name));
  if (e->shape.size() > 4)
    fail_tensor(Status::unsupported, path_.string(), name, str(e->shape.size(), " dimensions (sluice tensors hold at most 4)"));
  Tensor t;
  t.dtype = e->dtype;
  if (e->shape.empty()) {
    t.shape[0] = 1;
    t.ndim = 1;
  } else {
    for (int64_t d : e->shape) t.shape[t.ndim++] = d;
  }
  std::span<const uint8_t> raw = bytes(*e);
  const size_t align = dtype_size(e->dtype);
  if (!raw.empty() && reinterpret_cast<uintptr_t>(raw.data()) % align != 0) {
    // new[] returns memory aligned for any scalar type, so the copy is aligned.
    auto copy = std::make_shared<std::vector<uint8_t>>(raw.begin(), raw.end());
    t.data = copy->data();
    t.storage = std::move(copy);
    return t;
  }
  t.data = const_cast<uint8_t*>(raw.data());  // read-only mapping: see the class comment
  t.storage = std::shared_ptr<void>(mapping_, t.data);
  return t;
}

// ---- writer ----

std::string_view safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::i8: return "I8";
    case DType::f8_e4m3: return "F8_E4M3";
    case DType::f8_e5m2: return "F8_E5M2";
    case DType::q8: case DType::q4: case DType::q2: case DType::mxfp4: break;  // pack-only kinds: no safetensors name
  }
  return "?";
}

void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string file = path.string();
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    SLUICE_CHECK(name != "__metadata__", Status::invalid_argument, file, ": \"__metadata__\" is not a tensor name");
    SLUICE_CHECK(seen.insert(name).second, Status::invalid_argument, file, ": duplicate tensor name ", quoted(name));
    SLUICE_CHECK(t.ndim >= 1 && t.ndim <= 4, Status::invalid_argument, file, ": tensor ", quoted(name), " has ", t.ndim,
                 " dimensions");
    for (int i = 0; i < t.ndim; ++i)
      SLUICE_CHECK(t.shape[i] >= 0, Status::invalid_argument, file, ": tensor ", quoted(name), " shape ", t.shape_str());
    SLUICE_CHECK(t.data || t.numel() == 0, Status::invalid_argument, file, ": tensor ", quoted(name), " has no data");
    SLUICE_CHECK(!dtype_is_quantized(t.dtype), Status::invalid_argument, file, ": tensor ", quoted(name),
                 " has the pack-only dtype ", dtype_name(t.dtype));
  }

  // Larger elements first keeps every tensor aligned to its element size (the data section
  // itself starts 8-aligned); the reference writer orders by alignment the same way.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].second.dtype) > dtype_size(tensors[b].second.dtype);
  });

  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<std::span<const uint8_t>> parts(1);  // parts[0]: length + header, filled below
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
    uint64_t n = t.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype)}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    if (n) parts.emplace_back(static_cast<const uint8_t*>(t.data), n);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    fail(Status::invalid_argument, file, ": a tensor name or metadata string is not valid UTF-8 (", e.what(), ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  head += text;
  parts[0] = {reinterpret_cast<const uint8_t*>(head.data()), head.size()};
  write_file_atomic(path, parts);
}

}  // namespace sluice
