// Fixture packs, converted on first use.
#include "pack_util.h"

#include <unistd.h>

#include <map>
#include <mutex>

#include "convert/convert.h"
#include "fixture_util.h"

namespace sluice::test {

namespace fs = std::filesystem;

namespace {

struct Root {
  fs::path dir = fs::temp_directory_path() / ("sluice-pack-test-" + std::to_string(::getpid()));
  Root() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Root() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

Root& root() {
  static Root r;
  return r;
}

}  // namespace

const fs::path& fixture_pack(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, fs::path> packs;
  std::lock_guard<std::mutex> lock(mu);
  auto it = packs.find(name);
  if (it != packs.end()) return it->second;
  fs::path out = root().dir / ("fixture-" + name);
  ConvertOptions opt;
  opt.kinds = {DType::bf16, DType::q8, DType::q4, DType::q2};
  convert_checkpoint(fixture_dir(name), out, opt);
  return packs[name] = out;
}

fs::path pack_test_dir(const std::string& name) {
  static int counter = 0;
  fs::path d = root().dir / (name + "-" + std::to_string(counter++));
  fs::create_directories(d);
  return d;
}

}  // namespace sluice::test
