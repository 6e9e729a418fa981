// The hybrid families' ops (Gated DeltaNet, hyper-connections, QSA, PLE) on CUDA: not yet
// written. Each reports a clear unsupported error instead of computing anything, so a user
// who picks --backend cuda for qwen3_next / qwen3_5(_moe) / qwen4_exp learns to use the CPU.
#include "backends/cuda/cuda_backend.h"

namespace sluice {
namespace {
[[noreturn]] void pending(const char* op) {
  fail(Status::unsupported, "the CUDA backend does not implement ", op,
       " yet (hybrid Qwen families run with --backend cpu)");
}
}  // namespace

void CudaBackend::copy_cols(const Tensor&, int64_t, const Tensor&, int64_t, int64_t) { pending("copy_cols"); }
void CudaBackend::activate(const Tensor&, Activation, float, float) { pending("activate"); }
void CudaBackend::mul(const Tensor&, const Tensor&) { pending("mul"); }
void CudaBackend::rms_norm_groups(const Tensor&, const Tensor&, float, int64_t, const Tensor&) {
  pending("rms_norm_groups");
}
void CudaBackend::causal_conv1d(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, bool) {
  pending("causal_conv1d");
}
void CudaBackend::delta_net_gates(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&) {
  pending("delta_net_gates");
}
void CudaBackend::gated_delta_rule(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   const Tensor&, const Tensor&, const DeltaRuleParams&) {
  pending("gated_delta_rule");
}
void CudaBackend::hyper_mix(const Tensor&, const Tensor&, const Tensor&) { pending("hyper_mix"); }
void CudaBackend::hyper_inject(const Tensor&, const Tensor&, const Tensor&) { pending("hyper_inject"); }
void CudaBackend::ple_gate(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { pending("ple_gate"); }
void CudaBackend::mean_rows(const Tensor&, int64_t, const Tensor&) { pending("mean_rows"); }
void CudaBackend::qsa_select(const Tensor&, const Tensor&, const Tensor&, const QsaParams&) { pending("qsa_select"); }
void CudaBackend::attention_indexed(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) {
  pending("attention_indexed");
}

}  // namespace sluice
