// The environment switches the library reads: every one declared once, in kSwitches below
// (in the order of Switch), with its name, kind, values, default and meaning;
// docs/configuration.md lists the same table, and a test keeps the two equal. switches.cpp
// reads them all from the environment at the first use of any, once, and holds the
// library's only read of the environment. C++17: the .cu files include it.
//
// One rule for every value:
//   flag      "1" on, "0" off;
//   integer   decimal digits, within the switch's bounds;
//   integers  decimal integers separated by commas (as many as the switch takes);
// unset or empty: the default. Any other value is an error naming the variable and what it
// takes (Status::invalid_argument), raised at the first use of any switch, so that a typo
// never silently runs the default.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sluice {

enum class Switch : int {
  threads,
  cuda_graphs,
  cuda_tensor_cores,
  cuda_cublas,
  cuda_moe_decode,
  cuda_attention_mma,
  cuda_host_routed,
  cuda_profile,
  cuda_handshake_times,
  cuda_gqa_shape,
};

namespace switches {

enum class Kind {
  setting,     // how the library runs, for users
  fallback,    // turns a fast path off: for a GPU, driver or build without it, or to rule it out
  diagnostic,  // measures, or runs the reference path beside the fast one (tests, benchmarks)
};

enum class Type { flag, integer, integers };

struct Info {
  Switch id;
  const char* name;
  Kind kind;
  Type type;
  const char* default_value;  // as it would be written in the environment
  int64_t min = 0, max = 0;   // the bounds of an integer, or of each of the integers
  int count = 0;              // integers: how many the switch takes
  const char* meaning = "";
};

// clang-format off
inline constexpr Info kSwitches[] = {
    {Switch::threads, "SLUICE_THREADS", Kind::setting, Type::integer, "0", 0, 1024, 0,
     "CPU threads of the process's thread pool, 0 to 1024 (0: every core); `--threads` takes "
     "precedence"},
    {Switch::cuda_graphs, "SLUICE_CUDA_GRAPHS", Kind::fallback, Type::flag, "1", 0, 0, 0,
     "a resident model's one-token decode step is captured once a sequence as a CUDA graph and "
     "replayed; 0 enqueues every step's kernels one by one (the same logits, bit for bit)"},
    {Switch::cuda_tensor_cores, "SLUICE_CUDA_TENSOR_CORES", Kind::fallback, Type::flag, "1", 0, 0, 0,
     "the built-in tensor-core tiles (mma_tile.cuh) take the prefill products of int8 and q4 "
     "weights (bf16 ones where cuBLAS does not) and the grouped prefill experts; 0 sends them to "
     "the f32 FMA tiles"},
    {Switch::cuda_cublas, "SLUICE_CUDA_CUBLAS", Kind::fallback, Type::flag, "1", 0, 0, 0,
     "prefill products of bf16 weights run on cuBLAS (opened at the first product; the built-in "
     "tiles when it cannot be loaded); 0 sends them to the built-in tensor-core tiles"},
    {Switch::cuda_moe_decode, "SLUICE_CUDA_MOE_DECODE", Kind::diagnostic, Type::flag, "1", 0, 0, 0,
     "MoE experts of bf16, int8, q4 and mxfp4 decode batches run on the decode kernels "
     "(moe_decode.cu); 0 keeps the generic per-pair kernels, which give the same bits (the GPU "
     "tests and `bench_cuda --moe` compare the two)"},
    {Switch::cuda_attention_mma, "SLUICE_CUDA_ATTENTION_MMA", Kind::diagnostic, Type::flag, "1", 0, 0, 0,
     "decode attention over a bf16 cache with 2 to 16 query heads a kv head and 64 or 128 dims "
     "runs on the tensor cores (attention_decode_mma.cu); 0 keeps the FMA kernel (the GPU tests "
     "compare the two)"},
    {Switch::cuda_host_routed, "SLUICE_CUDA_HOST_ROUTED", Kind::diagnostic, Type::flag, "0", 0, 0, 0,
     "1 routes gpt-oss's, Gemma 4's and Llama 4's experts on the host and computes them with "
     "the generic ops, as sigmoid routers past the device top-k's bounds always are (the GPU "
     "tests keep that path covered)"},
    {Switch::cuda_profile, "SLUICE_CUDA_PROFILE", Kind::diagnostic, Type::flag, "0", 0, 0, 0,
     "1 profiles every graph the CUDA backend captures: each kernel node launched alone, the "
     "times summed per kernel against one replay of the whole graph (a table on stderr)"},
    {Switch::cuda_handshake_times, "SLUICE_CUDA_HANDSHAKE_TIMES", Kind::diagnostic, Type::flag, "0", 0, 0, 0,
     "1 times the streamed decode step on the device: when the CUDA streamer closes, a table on "
     "stderr of each MoE layer's handshake points and the waits for the host"},
    {Switch::cuda_gqa_shape, "SLUICE_CUDA_GQA_SHAPE", Kind::diagnostic, Type::integers, "0,0,0,0", 0, 64, 4,
     "HPW,C,NST,S overrides the FMA grouped-query decode attention's launch shape (query heads "
     "a warp, chunks of 32 keys a stage, stage buffers, splits; 0 keeps the default), for "
     "benchmarks (`bench_cuda --attention-decode`)"},
};
// clang-format on

const Info& info(Switch s);
const char* kind_name(Kind k);   // "setting", "fallback", "diagnostic"
std::string takes(const Info& s);  // the values it takes, in words: "1 (on) or 0 (off)"

// The switch's value as the environment held it at the first use (or the last reload).
bool on(Switch s);                          // a flag
int64_t integer(Switch s);                  // an integer
const std::vector<int64_t>& integers(Switch s);  // integers: exactly info(s).count of them

// Reads every switch now, if no use has yet: a front end calls it at start, so that an invalid
// value is its first error rather than one raised on whichever thread reads a switch first.
void load();

// Reads every switch from the environment again. For tests and benchmarks that set a switch
// for a scope (tests/gpu/scoped_env.h); a value in use by another thread is kept alive, so a
// reader never sees freed memory, but nothing orders a reload against kernels already
// enqueued or graphs already captured: those keep what they were enqueued with. An invalid
// value throws and leaves the values in use as they were.
void reload();

}  // namespace switches
}  // namespace sluice
