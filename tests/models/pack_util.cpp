// Fixture packs, converted on first use.
#include "tests/models/pack_util.h"

#include <unistd.h>

#include <fstream>
#include <map>
#include <mutex>

#include "convert/convert.h"
#include "engine/generator.h"
#include "tests/models/fixture_util.h"
#include "format/json_file.h"
#include "format/npy.h"

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
  opt.kinds = {DType::bf16, DType::q8, DType::q4, DType::q2, DType::mxfp4};
  convert_checkpoint(fixture_dir(name), out, opt);
  return packs[name] = out;
}

fs::path fixture_with_config(const std::string& fixture, const std::string& name,
                             const std::function<void(nlohmann::json&)>& edit) {
  const fs::path dir = pack_test_dir(name);
  for (const auto& e : fs::directory_iterator(fixture_dir(fixture))) fs::copy_file(e.path(), dir / e.path().filename());
  nlohmann::json cfg = read_json_file(dir / "config.json");
  edit(cfg);
  fs::remove(dir / "config.json");
  std::ofstream(dir / "config.json") << cfg.dump(1);
  return dir;
}

fs::path pack_test_dir(const std::string& name) {
  static int counter = 0;
  fs::path d = root().dir / (name + "-" + std::to_string(counter++));
  fs::create_directories(d);
  return d;
}

void PrintTo(const DensePackCase& c, std::ostream* os) { *os << c.fixture << " --dense " << dense_dtype_name(c.dense); }

fs::path dense_pack(const DensePackCase& c, DType kind, ConvertSummary* summary) {
  const fs::path dir = pack_test_dir(str(c.fixture, "-dense-", dense_dtype_name(c.dense), "-", expert_kind_name(kind)));
  ConvertOptions o;
  o.kinds = {kind};
  o.dense_dtype = c.dense;
  o.force = true;
  ConvertSummary s = convert_checkpoint(fixture_dir(c.fixture), dir, o);
  if (summary) *summary = s;
  return dir;
}

std::vector<int32_t> full_ids(const std::string& fixture) {
  FixtureReference ref = read_reference(fixture);
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  return ids;
}

std::vector<float> teacher_forced(const fs::path& dir, std::span<const int32_t> ids, const LoadOptions& lo) {
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(dir, *backend, lo);
  const int64_t V = m.model->info().n_vocab;
  auto state = m.model->new_state(static_cast<int64_t>(ids.size()));
  std::vector<float> logits(ids.size() * V);
  m.model->forward(ids, *state, logits, true);
  return logits;
}

ReferenceRun run_against_reference(Model& m, const std::string& fixture) {
  const FixtureReference ref = read_reference(fixture);
  const std::vector<int32_t> ids = full_ids(fixture);
  const int64_t V = m.info().n_vocab, n = static_cast<int64_t>(ids.size());
  const NpyArray want = read_npy(fixture_dir(fixture) / "logits_full.npy");
  std::vector<float> forced(n * V), decoded(n * V);
  m.forward(ids, *m.new_state(n), forced, true);
  decode_in_chunks(m, ids, ref.prompt_ids.size(), decoded);
  return {max_abs_diff(forced, want.data), max_abs_diff(decoded, want.data),
          greedy(m, ref.prompt_ids, static_cast<int64_t>(ref.continuation_ids.size()))};
}

std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int64_t n) {
  GenerateOptions opt;
  opt.n_predict = n;
  opt.sampling.temperature = 0;
  std::vector<int32_t> out;
  Generator(m).generate(prompt, opt, [&](int32_t id) {
    out.push_back(id);
    return true;
  });
  return out;
}

}  // namespace sluice::test
