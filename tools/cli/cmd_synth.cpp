// sluice synth: a pack with a real model's dimensions and random weights, written straight
// to disk (no HF checkpoint), for speed measurements at scale. Progress on stderr; Ctrl-C
// stops cleanly, leaving no output. --dry-run prints the sizes without writing.
#include <cstdio>
#include <string>

#include "cli_common.h"
#include "convert/synth.h"
#include "core/thread_pool.h"
#include "format/json_file.h"

namespace sluice::cli {

namespace {

std::string kinds_text(const std::vector<DType>& kinds) {
  std::string s;
  for (DType k : kinds) s += (s.empty() ? "" : ",") + std::string(expert_kind_name(k));
  return s;
}

}  // namespace

void register_synth(CLI::App& app) {
  struct Options {
    std::string like, config, out_dir, kinds = "q4", dense = "bf16";
    int64_t layers = 0, experts = 0;
    uint64_t seed = 1;
    bool force = false, quiet = false, dry_run = false;
    int threads = 0;
  };
  auto opt = std::make_shared<Options>();
  std::string like_help = "the model to imitate:";
  for (const SynthPreset& p : synth_presets()) like_help += str("\n  ", p.name, ": ", p.description);
  CLI::App* cmd = app.add_subcommand("synth", "write a pack of a model's real dimensions with random weights");
  cmd->add_option("OUT_DIR", opt->out_dir, "pack directory to create");
  auto* like = cmd->add_option("--like", opt->like, like_help);
  auto* config = cmd->add_option("--config", opt->config, "a config.json of any supported family, instead of --like");
  like->excludes(config);
  cmd->add_option("--kinds", opt->kinds, "expert kinds to write, comma-separated: bf16, int8, q4, q2, mxfp4 (default q4)");
  cmd->add_option("--dense", opt->dense,
                  "dense tensor dtype: bf16, f32, int8 or q4 (int8/q4: the matrices quantized, the rest bf16; "
                  "default bf16)");
  add_integer(*cmd, "--layers", opt->layers, IntRange::at_least(1),
              "keep only the first N layers (a smaller pack of the same record size)");
  add_integer(*cmd, "--experts", opt->experts, IntRange::at_least(1),
              "keep only N routed experts per layer (top-k capped to N)");
  add_seed(*cmd, "--seed", opt->seed, "random seed, 0 to 2^64-1 (default 1); the bytes depend only on it");
  cmd->add_flag("--force", opt->force, "replace an existing pack at OUT_DIR");
  cmd->add_flag("--dry-run", opt->dry_run, "print the files and sizes the pack would have, write nothing");
  cmd->add_flag("-q,--quiet", opt->quiet, "no progress output");
  add_threads(*cmd, opt->threads, "generator threads");
  cmd->callback([opt] {
    if (opt->threads > 0) ThreadPool::set_global_threads(opt->threads);
    SLUICE_CHECK(!opt->like.empty() || !opt->config.empty(), Status::invalid_argument,
                 "synth needs --like NAME or --config FILE (see sluice synth --help for the names)");
    SLUICE_CHECK(opt->dry_run || !opt->out_dir.empty(), Status::invalid_argument, "synth needs OUT_DIR (or --dry-run)");
    if (!opt->config.empty()) expect_input_file(opt->config, "--config", "a config.json file");
    nlohmann::json config = opt->like.empty() ? read_json_file(opt->config) : synth_preset_config(opt->like);
    synth_scale_config(config, opt->layers ? std::optional<int64_t>(opt->layers) : std::nullopt,
                       opt->experts ? std::optional<int64_t>(opt->experts) : std::nullopt);
    const std::string name = opt->like.empty() ? opt->config : opt->like;
    SynthOptions so;
    so.kinds = parse_expert_kinds(opt->kinds);
    so.dense = parse_dense_option(opt->dense);
    so.force = opt->force;
    so.seed = opt->seed;

    if (opt->dry_run) {
      const SynthPlan plan = synth_plan(config, so.kinds, so.dense);
      const PackManifest& m = plan.manifest;
      std::printf("%s (%s): %lld MoE layers x %lld experts of [%lld, %lld], %zu dense tensors\n", name.c_str(),
                  m.family.c_str(), static_cast<long long>(m.moe_layers.size()), static_cast<long long>(m.n_expert),
                  static_cast<long long>(m.n_ff), static_cast<long long>(m.n_embd), m.dense.size());
      std::printf("  %-18s %16llu bytes  %8.3f GB\n", kPackDenseName, static_cast<unsigned long long>(plan.dense_bytes),
                  plan.dense_bytes / 1e9);
      for (const auto& [kind, info] : m.kinds) {
        const uint64_t bytes = kPackHeaderBytes + static_cast<uint64_t>(m.n_records()) * info.record_stride;
        std::printf("  %-18s %16llu bytes  %8.3f GB  (%lld records x %llu-byte stride)\n", info.file.c_str(),
                    static_cast<unsigned long long>(bytes), bytes / 1e9, static_cast<long long>(m.n_records()),
                    static_cast<unsigned long long>(info.record_stride));
      }
      std::printf("  %-18s %16llu bytes  %8.3f GB\n", "total", static_cast<unsigned long long>(plan.total_bytes()),
                  plan.total_bytes() / 1e9);
      return;
    }

    Progress progress("synth");
    if (!opt->quiet) {
      so.progress = [&](const SynthProgress& p) {
        progress.update(str(p.records_done, "/", p.records_total, " records"), p.bytes_done, p.bytes_total, p.seconds);
      };
    }
    InterruptFlag interrupt;
    so.cancel = interrupt.flag();
    SynthSummary s;
    try {
      s = synth_pack(config, opt->out_dir, so);
    } catch (...) {
      progress.finish();
      throw;
    }
    progress.finish();
    std::fprintf(stderr, "sluice: synthesized %s (%s) at %s: %lld records x {%s}, %.3f GB written in %.1f s, %.0f MB/s (%s)\n",
                 name.c_str(), s.family.c_str(), s.out_dir.string().c_str(), static_cast<long long>(s.n_records),
                 kinds_text(s.kinds).c_str(), s.bytes_out / 1e9, s.seconds, s.seconds > 0 ? s.bytes_out / 1e6 / s.seconds : 0.0,
                 s.direct ? "O_DIRECT" : "buffered");
  });
}

}  // namespace sluice::cli
