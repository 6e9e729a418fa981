// load_model: config, registry, checkpoint, tokenizer.
#include "models/load.h"

#include "core/log.h"
#include "core/paths.h"
#include "experts/streaming_provider.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "models/registry.h"

namespace sluice {

namespace {

// The families' messages name config.json, where a checkpoint keeps its config; a pack keeps
// it in manifest.json ("config"), so an error raised while loading a pack names that file.
[[noreturn]] void rethrow_naming_manifest(const Error& e, const std::filesystem::path& dir) {
  std::string message = e.what();
  const std::string manifest = (dir / kPackManifestName).string();
  for (size_t at = message.find("config.json"); at != std::string::npos;
       at = message.find("config.json", at + manifest.size()))
    message.replace(at, std::string_view("config.json").size(), manifest);
  throw Error(e.status(), message);
}

}  // namespace

std::optional<int32_t> LoadedModel::bos_id() const {
  if (tokenizer && tokenizer->bos_id()) return tokenizer->bos_id();
  return model->info().bos_id;
}

std::optional<int32_t> LoadedModel::eos_id() const {
  if (tokenizer && tokenizer->eos_id()) return tokenizer->eos_id();
  return model->info().eos_id;
}

LoadedModel load_model(const std::filesystem::path& dir, Backend& backend, const LoadOptions& options) {
  std::error_code ec;
  expect_directory(dir, "model", "a directory with config.json and *.safetensors, or a pack");
  LoadedModel out;
  out.dir = dir;
  const bool streamed = options.streaming && options.streaming->enabled();
  if (Pack::is_pack(dir)) {
    // A streamed run never maps the expert files: records are read into the cache on demand.
    std::shared_ptr<Pack> pack = Pack::open(dir, !streamed);
    out.pack = pack;
    std::vector<DType> kinds;
    for (const auto& [k, info] : pack->manifest().kinds) kinds.push_back(k);
    const bool has_experts = !kinds.empty();
    SLUICE_CHECK(has_experts || !options.expert_kind, Status::invalid_argument, "--expert-kind: ", dir.string(),
                 " is a pack without routed experts");
    SLUICE_CHECK(has_experts || !streamed, Status::invalid_argument, dir.string(),
                 ": a pack without routed experts has nothing to stream");
    const DType kind = has_experts ? options.expert_kind.value_or(default_expert_kind(kinds)) : DType::bf16;
    if (has_experts) pack->kind(kind);  // an error naming the kinds the pack has
    out.config = pack->manifest().config;
    const Family* family = nullptr;
    try {
      family = &find_family(out.config);
      SLUICE_CHECK(family->model_type == pack->manifest().family, Status::corrupt, dir.string(), ": manifest family '",
                   pack->manifest().family, "' does not match its config (", family->model_type, ")");
      PackSource source(pack, kind, streamed, options.ngram_tables);
      out.model = family->load(out.config, source, backend);
    } catch (const Error& e) {
      rethrow_naming_manifest(e, dir);
    }
    if (has_experts) out.expert_kind = kind;
    if (streamed) {
      const ModelInfo& info = out.model->info();
      SLUICE_CHECK(!info.moe_layers.empty(), Status::invalid_argument, dir.string(), ": a ", family->model_type,
                   " model without routed experts has nothing to stream");
      SLUICE_CHECK(info.moe_layers == pack->manifest().moe_layers, Status::corrupt, dir.string(),
                   ": the model's MoE layers do not match the pack's records (manifest experts.layers)");
      out.streamer = make_streamer(pack, kind, info.n_expert_used, backend, *options.streaming);
      out.model->set_expert_provider(out.streamer);
    }
  } else {
    SLUICE_CHECK(!options.expert_kind, Status::invalid_argument, "--expert-kind needs a pack, and ", dir.string(),
                 " is an HF checkpoint (make a pack with sluice convert)");
    SLUICE_CHECK(!streamed, Status::invalid_argument, "expert streaming (--expert-cache, --expert-slots) needs a pack, and ",
                 dir.string(), " is an HF checkpoint (make a pack with sluice convert)");
    out.config = read_json_file(dir / "config.json");
    const Family& family = find_family(out.config);
    CheckpointSource source(Checkpoint::open(dir));
    out.model = family.load(out.config, source, backend);
  }
  if (Tokenizer::present(dir)) out.tokenizer = Tokenizer::load(dir);
  else LOG_INFO("no tokenizer.json or tiktoken.model in ", dir.string(), ": token ids only");
  if (out.tokenizer && out.tokenizer->vocab_size() > out.model->info().n_vocab)
    fail(Status::corrupt, "tokenizer has ", out.tokenizer->vocab_size(), " tokens but the model's vocabulary is ",
         out.model->info().n_vocab);
  return out;
}

void check_pack_model(const std::filesystem::path& dir) {
  SLUICE_CHECK(Pack::is_pack(dir), Status::invalid_argument, dir.string(), " is not a pack (no ", kPackManifestName, ")");
  auto backend = make_cpu_backend();  // its uploads are views of the mappings: no weight is read
  LoadOptions options;
  options.ngram_tables.cache_bytes = 0;  // no row cache: the tables are only checked, never read
  load_model(dir, *backend, options);
}

}  // namespace sluice
