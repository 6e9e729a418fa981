// Checkpoint: finds the safetensors files of a model directory, opens and cross-checks them
// against the shard index, and records which tensors the loader consumed.
#include "format/checkpoint.h"

#include <algorithm>
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
  return c;
}

void Checkpoint::add_file(std::shared_ptr<SafetensorsFile> file) {
  for (const SafetensorsEntry& e : file->entries()) tensors_[e.name] = {file, &e};
}

const Checkpoint::Location& Checkpoint::locate(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(Status::not_found, "tensor \"", name, "\" not found in checkpoint ", dir_.string());
  return it->second;
}

bool Checkpoint::has(const std::string& name) const { return tensors_.count(name) != 0; }

Tensor Checkpoint::get(const std::string& name) {
  const Location& loc = locate(name);
  Tensor t = loc.file->tensor(name);
  consumed_.insert(name);
  return t;
}

void Checkpoint::consume(const std::string& name) {
  locate(name);
  consumed_.insert(name);
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
