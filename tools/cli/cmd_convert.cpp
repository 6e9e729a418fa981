// sluice convert: an HF checkpoint directory to a pack (manifest.json, dense.bin,
// experts.<kind>.bin). Progress on stderr; Ctrl-C stops cleanly, leaving no output but the
// hidden partial pack that the same command resumes.
#include <cstdio>
#include <string>

#include "cli_common.h"
#include "convert/convert.h"
#include "core/thread_pool.h"

namespace sluice::cli {

void register_convert(CLI::App& app) {
  struct Options {
    std::string hf_dir, out_dir, kinds = "bf16,q4,q2", dense;
    bool force = false, quiet = false, no_resume = false;
    int threads = 0;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("convert", "convert an HF checkpoint directory to a pack");
  cmd->add_option("HF_DIR", opt->hf_dir, "HF checkpoint directory (config.json, *.safetensors, tokenizer files)")->required();
  cmd->add_option("OUT_DIR", opt->out_dir, "pack directory to create")->required();
  cmd->add_option("--kinds", opt->kinds, "expert kinds to write, comma-separated: bf16, int8, q4, q2, mxfp4 (default bf16,q4,q2)");
  cmd->add_option("--dense", opt->dense,
                  "dense tensor dtype: bf16, f32, int8 or q4 (int8/q4: attention, shared-expert and dense MLP "
                  "projections, router, embeddings and output head quantized, norms and small vectors kept; "
                  "default: bf16 when the checkpoint is all bf16, else f32)");
  cmd->add_flag("--force", opt->force, "replace an existing pack at OUT_DIR");
  cmd->add_flag("--no-resume", opt->no_resume,
                "start over instead of resuming the partial pack an interrupted convert of the same checkpoint "
                "and options left (by default it is checked and resumed)");
  cmd->add_flag("-q,--quiet", opt->quiet, "no progress output");
  add_threads(*cmd, opt->threads, "quantization threads");
  cmd->callback([opt] {
    if (opt->threads > 0) ThreadPool::set_global_threads(opt->threads);
    ConvertOptions co;
    co.kinds = parse_expert_kinds(opt->kinds);
    if (!opt->dense.empty()) co.dense_dtype = parse_dense_option(opt->dense);
    co.force = opt->force;
    co.resume = !opt->no_resume;
    Progress progress("convert");
    if (!opt->quiet) {
      co.progress = [&](const ConvertProgress& p) {
        progress.update(str(p.records_done, "/", p.records_total, " records"), p.bytes_done, p.bytes_total, p.seconds);
      };
    }
    InterruptFlag interrupt;
    co.cancel = interrupt.flag();
    ConvertSummary s;
    try {
      s = convert_checkpoint(opt->hf_dir, opt->out_dir, co);
    } catch (...) {
      progress.finish();
      throw;
    }
    progress.finish();
    std::string kinds;
    for (DType k : s.kinds) kinds += (kinds.empty() ? "" : ",") + std::string(expert_kind_name(k));
    const std::string experts =
        s.kinds.empty() ? std::string("no routed experts") : str(s.n_records, " records x {", kinds, "}");
    const std::string dense = s.dense_quant ? str(dense_dtype_name(*s.dense_quant), " (", s.n_dense_quantized, " of ", s.n_dense,
                                                  " tensors; the others ", dtype_name(s.dense_dtype), ")")
                                            : std::string(dtype_name(s.dense_dtype));
    const std::string resumed =
        s.resumed_records ? str(" (resumed after ", s.resumed_records, " records already written)") : std::string();
    std::fprintf(stderr, "sluice: converted %s (%s) to %s: %s, dense %s, %.3f GB in, %.3f GB out, %.1f s, %.2f GB/s%s\n",
                 opt->hf_dir.c_str(), s.family.c_str(), s.out_dir.string().c_str(), experts.c_str(),
                 dense.c_str(), s.bytes_in / 1e9, s.bytes_out / 1e9,
                 s.seconds, s.seconds > 0 ? s.bytes_in / 1e9 / s.seconds : 0.0, resumed.c_str());
  });
}

}  // namespace sluice::cli
