// Checkpoint: the tensors of a Hugging Face model directory, whichever way they are stored:
// `model.safetensors`, shards listed by `model.safetensors.index.json`, or a directory with
// exactly one other `*.safetensors` file. Tracks which tensors the model loader took, so it
// can assert that every tensor in the checkpoint was used.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "format/safetensors.h"

namespace sluice {

class Checkpoint {
 public:
  // Opens and validates every file up front. Throws Error(not_found) when the directory or a
  // shard is missing, Error(corrupt) for a malformed index (shard names with '/' or "..", a
  // mapped tensor absent from its shard, a tensor in two shards that the index does not
  // assign) and the safetensors parse errors for the files themselves.
  static Checkpoint open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  bool has(const std::string& name) const;
  // A host view of the tensor (see SafetensorsFile::tensor); marks it consumed. A missing
  // name is Error(not_found) naming the tensor and the directory.
  Tensor get(const std::string& name);
  // Marks a tensor consumed without fetching it (for tensors skipped on purpose).
  void consume(const std::string& name);
  std::vector<std::string> names() const;       // sorted
  std::vector<std::string> unconsumed() const;  // sorted; empty once the loader took everything

  // Where a tensor lives, for readers that bypass the mapping (expert streaming): the file
  // and the entry (file offset = file.data_offset() + entry.begin). Does not mark consumed.
  const SafetensorsFile& file_of(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;

 private:
  struct Location {
    std::shared_ptr<SafetensorsFile> file;
    const SafetensorsEntry* entry;  // points into file->entries()
  };
  const Location& locate(const std::string& name) const;
  void add_file(std::shared_ptr<SafetensorsFile> file);

  std::filesystem::path dir_;
  std::map<std::string, Location> tensors_;
  std::set<std::string> consumed_;
};

}  // namespace sluice
