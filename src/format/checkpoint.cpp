// Checkpoint: finds the safetensors files of a model directory, opens and cross-checks them
// against the shard index, and records which tensors the loader consumed.
#include "format/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <system_error>

#include "core/error.h"
#include "format/json_file.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

constexpr const char* single_file_name = "model.safetensors";
constexpr const char* index_file_name = "model.safetensors.index.json";

// A shard must be a plain file name inside the directory: nothing that could name a path
// elsewhere ('/', '\\', ".."), and no NUL that would cut the path short.
bool shard_name_ok(const std::string& shard) {
  return !shard.empty() && shard.find('/') == std::string::npos && shard.find('\\') == std::string::npos &&
         shard.find("..") == std::string::npos && shard.find('\0') == std::string::npos && shard != ".";
}

bool is_regular(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);  // follows symlinks, as in the Hugging Face cache
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& dir) {
  std::error_code ec;
  SLUICE_CHECK(fs::is_directory(dir, ec), Status::not_found, dir.string(), ": no such model directory");
  Checkpoint c;
  c.dir_ = dir;
  const fs::path index_path = dir / index_file_name;

  if (is_regular(index_path)) {
    const std::string index = index_path.string();
    nlohmann::json j = read_json_file(index_path);
    SLUICE_CHECK(j.is_object(), Status::corrupt, index, ": not a JSON object");
    auto wm = j.find("weight_map");
    SLUICE_CHECK(wm != j.end() && wm->is_object(), Status::corrupt, index, ": missing \"weight_map\" object");

    std::map<std::string, std::string> shard_of;  // tensor -> shard file name
    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      SLUICE_CHECK(it->is_string(), Status::corrupt, index, ": weight_map entry for tensor \"", it.key(),
                   "\" is not a file name");
      const std::string& shard = it->get_ref<const std::string&>();
      SLUICE_CHECK(shard_name_ok(shard), Status::corrupt, index, ": tensor \"", it.key(), "\" maps to shard \"", shard,
                   "\", which is not a plain file name in the model directory");
      shard_of[it.key()] = shard;
      shards[shard];
    }
    for (auto& [shard, file] : shards) {
      try {
        file = SafetensorsFile::open(dir / shard);
      } catch (const Error& e) {
        if (e.status() != Status::not_found) throw;
        fail(Status::not_found, e.what(), " (a shard listed in ", index, ")");
      }
    }
    for (const auto& [name, shard] : shard_of) {
      const auto& file = shards.at(shard);
      const SafetensorsEntry* entry = file->find(name);
      SLUICE_CHECK(entry, Status::corrupt, index, ": maps tensor \"", name, "\" to ", shard, ", which has no such tensor");
      c.tensors_[name] = {file, entry};
    }
    // A shard may hold tensors the index does not list (transformers loads whole shards, so
    // they are real weights): take them too, so unconsumed() reports them, unless two
    // shards disagree about one.
    std::map<std::string, std::string> unlisted;  // tensor -> shard
    for (const auto& [shard, file] : shards) {
      for (const SafetensorsEntry& e : file->entries()) {
        if (shard_of.count(e.name)) continue;
        auto [it, fresh] = unlisted.emplace(e.name, shard);
        SLUICE_CHECK(fresh, Status::corrupt, dir.string(), ": tensor \"", e.name, "\" is in both ", it->second, " and ",
                     shard, " and ", index_file_name, " does not say which");
        c.tensors_[e.name] = {file, &e};
      }
    }
    c.pair_fp8();
    return c;
  }

  fs::path single = dir / single_file_name;
  if (!is_regular(single)) {
    std::vector<fs::path> found;
    for (const fs::directory_entry& de : fs::directory_iterator(dir, ec)) {
      if (de.path().extension() == ".safetensors" && is_regular(de.path())) found.push_back(de.path());
    }
    SLUICE_CHECK(!ec, Status::io, dir.string(), ": cannot list: ", ec.message());
    SLUICE_CHECK(!found.empty(), Status::not_found, dir.string(), ": no ", single_file_name, ", ", index_file_name,
                 " or other .safetensors file");
    if (found.size() > 1) {
      std::sort(found.begin(), found.end());
      std::string list;
      for (const fs::path& p : found) list += (list.empty() ? "" : ", ") + p.filename().string();
      fail(Status::not_found, dir.string(), ": several .safetensors files (", list, ") and no ", index_file_name,
           " saying how they fit together");
    }
    single = found[0];
  }
  c.add_file(SafetensorsFile::open(single));
  c.pair_fp8();
  return c;
}

void Checkpoint::pair_fp8() {
  std::vector<std::string> weights;
  for (const auto& [name, loc] : tensors_)
    if (dtype_is_fp8(loc.entry->dtype)) weights.push_back(name);
  if (weights.empty()) return;
  const std::string& first = weights.front();
  const std::string first_dtype(safetensors_dtype_name(tensors_.at(first).entry->dtype));
  const fs::path config_path = dir_ / "config.json";
  SLUICE_CHECK(is_regular(config_path), Status::unsupported, dir_.string(), ": tensor \"", first, "\" is ", first_dtype,
               " and there is no config.json to give its quantization_config");
  const std::optional<Fp8Config> config = fp8_config_from_json(read_json_file(config_path), config_path.string());
  SLUICE_CHECK(config, Status::unsupported, dir_.string(), ": tensor \"", first, "\" is ", first_dtype,
               " but config.json has no quantization_config (an FP8 checkpoint gives quant_method \"fp8\" and its ",
               "weight_block_size)");
  auto shape_text = [](const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  };
  for (const std::string& w : weights) {
    const SafetensorsEntry& e = *tensors_.at(w).entry;
    const std::string where = str(file_of(w).path().string(), ": tensor \"", w, "\"");
    SLUICE_CHECK(e.shape.size() == 2, Status::unsupported, where, " is ", safetensors_dtype_name(e.dtype), " with ",
                 e.shape.size(), " dimensions (sluice reads FP8 matrices [rows, cols] with block scales)");
    const std::string scale = fp8_scale_name(w);
    auto it = tensors_.find(scale);
    SLUICE_CHECK(it != tensors_.end(), Status::corrupt, where, " is ", safetensors_dtype_name(e.dtype),
                 " but the checkpoint has no scale tensor \"", scale, "\"");
    const SafetensorsEntry& se = *it->second.entry;
    const std::vector<int64_t> want = {fp8_scale_rows(*config, e.shape[0]), fp8_scale_cols(*config, e.shape[1])};
    const bool per_tensor = config->block_rows == 0;
    const bool shape_ok = se.shape == want || (per_tensor && (se.shape.empty() || se.shape == std::vector<int64_t>{1}));
    SLUICE_CHECK(dtype_is_float(se.dtype), Status::corrupt, it->second.file->path().string(), ": scale tensor \"", scale,
                 "\" is ", safetensors_dtype_name(se.dtype), " (expected F32, BF16 or F16)");
    SLUICE_CHECK(shape_ok, Status::corrupt, it->second.file->path().string(), ": scale tensor \"", scale, "\" has shape ",
                 shape_text(se.shape), ", expected ", shape_text(want), " for \"", w, "\" ", shape_text(e.shape),
                 per_tensor ? std::string(" with one scale (no weight_block_size)")
                            : str(" in blocks of [", config->block_rows, ", ", config->block_cols, "]"));
    fp8_[w] = {scale, *config};
    scales_[scale] = it->second;
    tensors_.erase(it);
  }
  bool all_bf16 = true;
  for (const auto& [name, loc] : tensors_)
    if (dtype_is_float(loc.entry->dtype) && loc.entry->dtype != DType::bf16) all_bf16 = false;
  fp8_dtype_ = all_bf16 ? DType::bf16 : DType::f32;
}

void Checkpoint::add_file(std::shared_ptr<SafetensorsFile> file) {
  for (const SafetensorsEntry& e : file->entries()) tensors_[e.name] = {file, &e};
}

const Checkpoint::Location& Checkpoint::locate(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  if (auto s = scales_.find(name); s != scales_.end()) return s->second;
  fail(Status::not_found, "tensor \"", name, "\" not found in checkpoint ", dir_.string());
}

bool Checkpoint::has(const std::string& name) const { return tensors_.count(name) != 0; }

Tensor Checkpoint::get(const std::string& name) {
  SLUICE_CHECK(tensors_.count(name), Status::not_found, "tensor \"", name, "\" not found in checkpoint ", dir_.string());
  Tensor t = fp8_.count(name) ? dequantized(name, fp8_dtype_) : tensors_.at(name).file->tensor(name);
  consumed_.insert(name);
  return t;
}

void Checkpoint::consume(const std::string& name) {
  SLUICE_CHECK(tensors_.count(name), Status::not_found, "tensor \"", name, "\" not found in checkpoint ", dir_.string());
  consumed_.insert(name);
}

DType Checkpoint::dtype(const std::string& name) const {
  return fp8_.count(name) ? fp8_dtype_ : locate(name).entry->dtype;
}

const Fp8Weight* Checkpoint::fp8(const std::string& name) const {
  auto it = fp8_.find(name);
  return it == fp8_.end() ? nullptr : &it->second;
}

Tensor Checkpoint::dequantized(const std::string& name, DType to) const {
  const Fp8Weight* w = fp8(name);
  SLUICE_CHECK(w, Status::internal, "checkpoint: ", name, " is not an FP8 weight");
  SLUICE_ASSERT(to == DType::f32 || to == DType::bf16);
  const Location& loc = locate(name);
  const Location& sl = locate(w->scale);
  const int64_t rows = loc.entry->shape[0], cols = loc.entry->shape[1];
  const std::span<const uint8_t> q = loc.file->bytes(*loc.entry), s = sl.file->bytes(*sl.entry);
  std::vector<float> scales(s.size() / dtype_size(sl.entry->dtype));
  std::vector<uint8_t> s_aligned(s.begin(), s.end());  // the mapping need not be aligned for the scale dtype
  dtype_row_to_f32(s_aligned.data(), sl.entry->dtype, static_cast<int64_t>(scales.size()), scales.data());
  const int64_t br = w->config.block_rows ? w->config.block_rows : rows;
  const int64_t scale_cols = fp8_scale_cols(w->config, cols);
  const std::string where = str(loc.file->path().string(), ": tensor \"", name, "\"");
  auto out = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * cols) * dtype_size(to));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = to == DType::f32 ? reinterpret_cast<float*>(out->data()) + r * cols : row.data();
    fp8_dequantize_rows(loc.entry->dtype, q.data() + r * cols, r, 1, rows, cols, scales.data() + (r / br) * scale_cols,
                        w->config, dst, where);
    if (to == DType::bf16) dtype_convert_row(dst, DType::f32, out->data() + r * cols * 2, DType::bf16, cols);
  }
  Tensor t;
  t.dtype = to;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.ndim = 2;
  t.data = out->data();
  t.storage = std::move(out);
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, loc] : tensors_) out.push_back(name);
  return out;
}

std::vector<std::string> Checkpoint::unconsumed() const {
  std::vector<std::string> out;
  for (const auto& [name, loc] : tensors_)
    if (!consumed_.count(name)) out.push_back(name);
  return out;
}

const SafetensorsFile& Checkpoint::file_of(const std::string& name) const { return *locate(name).file; }

const SafetensorsEntry& Checkpoint::entry(const std::string& name) const { return *locate(name).entry; }

}  // namespace sluice
