// Backend: the narrow interface that model code runs on. The CPU backend (backends/cpu) is
// the reference implementation; the CUDA backend must match it op by op. Model code sees
// only this header: it never includes a backend's own headers.
//
// Conventions: activations are f32, row-major, contiguous; weights may be f32, bf16 or f16
// (quantized kinds come with the pack format). "rows" is the product of all but the
// innermost dimension. Ops may run asynchronously on a device; to_host synchronizes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/expert_weights.h"
#include "core/router_scoring.h"
#include "core/tensor.h"
#include "core/sampling.h"

namespace sluice {

// One MoE layer's resident routed experts prepared for a backend's device-side dispatch
// (Backend::make_expert_table); opaque to model code.
class ExpertTable {
 public:
  virtual ~ExpertTable() = default;
};

// A recorded routing that a device step replays in place of its router's top-k (benchmarks,
// --replay-routing: experts/routing_replay.h), made once by Backend::make_routing_replay;
// opaque to model code.
class RoutingReplayTable {
 public:
  virtual ~RoutingReplayTable() = default;
};

// The rows of one MoE layer call that a replay table gives: layer `layer`'s rows first,
// first + 1, ... (wrapping at the table's tokens), the weights renormalized to sum 1 a row
// when `normalize` (the family's norm_topk_prob). table null: the router routes.
struct ReplayRows {
  const RoutingReplayTable* table = nullptr;
  int64_t layer = 0;
  int64_t first = 0;
  bool normalize = false;
};

// A readback buffer of a few bytes (Backend::make_readback): begin(src) enqueues the copy of
// src (at most the buffer's bytes) after the work enqueued so far and returns; end(dst) waits
// for the copy begun last and writes its bytes to dst. The default copies at begin.
class HostReadback {
 public:
  virtual ~HostReadback() = default;
  virtual void begin(const Tensor& src) = 0;
  virtual void end(void* dst) = 0;
};

enum class Activation : uint8_t {
  sigmoid,    // 1 / (1 + e^-x)
  silu,       // x / (1 + e^-x)
  gelu_tanh,  // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (PyTorch's gelu, approximate "tanh")
  tanh,       // tanh(x) (with in_div and out_mul: a logit softcap, cap tanh(x / cap))
};

struct DeltaRuleParams {
  int64_t chunk_size = 64;  // > 0: the chunked (WY) form over chunks of this many tokens; 0: recurrent
};

struct QsaParams {
  int64_t n_past = 0;          // position of query row 0
  int64_t compress_ratio = 0;  // tokens per key block (c)
  int64_t block_topk = 0;      // complete blocks kept per query (the token budget / c)
};

struct AttentionParams {
  int64_t n_past = 0;          // position of query row 0; query row i sits at n_past + i
  float scale = 1.0f;          // applied to q.k, usually 1/sqrt(head_dim)
  int64_t sliding_window = 0;  // 0: full causal; w > 0: query at p sees keys in (p - w, p]
  // Optional per-head attention sinks (gpt-oss), [n_head] f32/bf16/f16: head h's softmax
  // denominator gains exp(sinks[h] - max), the max taken over the scores and the sink, and
  // the sink takes no value (its share of the probability mass is dropped).
  Tensor sinks;
  // Chunked attention (Llama 4's rope layers): a query at p sees only keys of its own chunk,
  // [p - p % chunk, p] (and the window's bound, where both are set); 0: no chunks.
  int64_t chunk = 0;
  // Attention temperature tuning (Llama 4's NoPE layers): the query at p is scaled by
  // log1p(floor((p + 1) / floor_scale)) * attn_scale + 1; floor_scale 0: off.
  int64_t temperature_floor_scale = 0;
  float temperature_attn_scale = 0.0f;
  // Optional i32 tensor on the backend whose element 0 is n_past, read when the op runs (a
  // captured decode graph replays at every position). It holds n_past whenever the op is
  // enqueued eagerly; a backend that does not capture graphs may use n_past instead.
  Tensor n_past_at;
};

// A captured sequence of ops that can be replayed (graph_begin / graph_end).
class BackendGraph {
 public:
  virtual ~BackendGraph() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory ----
  // An uninitialized tensor of this backend.
  virtual Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) = 0;
  // A weight given in host memory (for example a file mapping) made usable by this backend.
  // The CPU backend returns it as is (no copy); a device backend copies it.
  virtual Tensor upload(const Tensor& host) = 0;
  virtual void to_host(const Tensor& src, void* dst) = 0;      // src.nbytes() bytes; synchronizes
  virtual void from_host(const Tensor& dst, const void* src) = 0;  // dst.nbytes() bytes
  // A few bytes the host reads back without waiting at once (a decode step's drawn token, so
  // that the host can enqueue the next step before it waits): see HostReadback.
  virtual std::unique_ptr<HostReadback> make_readback(size_t bytes);
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;     // same dtype and numel
  virtual void fill(const Tensor& dst, float value) = 0;            // f32 dst
  virtual void synchronize() = 0;
  // Bytes alloc() can still hand out (host RAM the kernel reports available, free device
  // memory), to check a large allocation such as a long context before making it; nullopt
  // when the backend cannot tell.
  virtual std::optional<uint64_t> memory_available() const { return std::nullopt; }

  // ---- ops ----
  // y[n, m] = x[n, k] . w[m, k]^T; w is f32, bf16, f16 or quantized (q8, q4, q2, mxfp4: routed
  // experts, and dense matrices of a pack converted with --dense int8|q4); y is f32 and may
  // not alias x.
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor& y) = 0;
  // y[r, :] += b[:] for every row r (b has y.cols() elements, f32/bf16/f16).
  virtual void add_bias(const Tensor& y, const Tensor& b) = 0;
  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:]; w has x.cols() elements (any
  // weight dtype) or is empty (no scale). y may alias x.
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) = 0;
  // Rotary embedding in place on x[n, n_head, head_dim], over the first rot_dim dims of each
  // head. cos and sin are f32 [n, rot_dim / 2] (one row per token of x). Neox layout
  // (interleaved = false) pairs dim i with i + rot_dim/2; GPT-J layout pairs 2i with 2i+1.
  virtual void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim,
                    bool interleaved) = 0;
  // x += y, then out = rms_norm(x, w, eps) (the residual add and the next norm of a layer).
  // Default: add, then rms_norm.
  virtual void add_rms_norm(const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out);
  // x += a . w^T (a [n, k], w [m, k], x [n, m]), then out = rms_norm(x, norm, eps): a layer's
  // output projection with the residual add and the next norm after it. Default: matmul into
  // a temporary, then add_rms_norm (the CUDA backend fuses them for a decode row, bit for bit).
  virtual void matmul_add_rms_norm(const Tensor& a, const Tensor& w, const Tensor& x, const Tensor& norm, float eps,
                                   const Tensor& out);
  // The inputs of attention for n tokens, in place: per-head RMSNorm of q [n, n_head, d] and
  // k [n, n_kv, d] (q_norm, k_norm: [d] weights; empty: no norm), rotary embedding of both
  // (cos/sin [n, rot_dim / 2], as rope), then k and v [n, n_kv, d] written into the caches
  // k_cache / v_cache [n_ctx, n_kv, d] at rows positions[i] (i32 [n] on this backend) or,
  // positions empty, n_past + i. Default: rms_norm, rope and copy / scatter_rows_at.
  virtual void attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                const Tensor& k_norm, float eps, const Tensor& cos, const Tensor& sin,
                                int64_t rot_dim, bool interleaved, const Tensor& k_cache, const Tensor& v_cache,
                                int64_t n_past, const Tensor& positions);
  // The caches of a batch decode step (attention_inputs_rows, attention_rows): row b of the
  // batch is one token of a sequence of its own, with caches k[b], v[b] [n_ctx_b, n_kv, d] and
  // position n_past[b]; positions (i32 [B] on this backend, or empty) holds the same, read when
  // the ops run (a captured batch step replays at other positions).
  struct RowCaches {
    std::span<const Tensor> k, v;
    std::span<const int64_t> n_past;
    Tensor positions;
  };
  // attention_inputs of B rows, row b into its own caches. Default: attention_inputs a row at
  // a time (CUDA: one launch for the batch).
  virtual void attention_inputs_rows(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                     const Tensor& k_norm, float eps, const Tensor& cos, const Tensor& sin,
                                     int64_t rot_dim, bool interleaved, const RowCaches& caches);
  // attention of B rows (q, out [B, n_head, d]), row b against its own caches at its own
  // position, causal (sliding_window and sinks as AttentionParams). Default: attention a row
  // at a time.
  virtual void attention_rows(const Tensor& q, const Tensor& out, const RowCaches& caches, float scale,
                              int64_t sliding_window, const Tensor& sinks = {});
  // ---- multi-head latent attention (models/mla.h) ----
  // y[:, h, :] = x[:, h, :] . w[h m .. (h + 1) m, :]^T for each of the H heads: x [n, H, k] f32,
  // w [H m, k] (f32, bf16 or f16), y [n, H, m] f32 (y may not alias x). Each head's rows are
  // what matmul gives them. Default: one matmul a head (over copies of the head's columns
  // unless n == 1).
  virtual void matmul_heads(const Tensor& x, const Tensor& w, const Tensor& y);
  // The absorbed form's attention of H query heads over a latent cache: q [n, H, Dk]; cache
  // [n_ctx, 1, Dk] (f32 or bf16: the keys, and its first Dv columns the values) holding
  // positions [0, n_past + n); out [n, H, Dv]:
  //   out[i, h, :] = sum over j <= n_past + i of softmax_j(scale q[i, h] . cache[j]) cache[j, :Dv]
  // (params: n_past, n_past_at and scale; no window, sinks, chunks or temperature). Default:
  // attention() with the cache as the one kv head of both keys and values, then out's columns.
  virtual void attention_latent(const Tensor& q, const Tensor& cache, const Tensor& out, const AttentionParams& params);
  // attention_latent of B rows (q [B, H, Dk], out [B, H, Dv]), row b against the latent cache
  // caches.k[b] at its own position. Default: a row at a time.
  virtual void attention_latent_rows(const Tensor& q, const Tensor& out, const RowCaches& caches, float scale);
  // The latent cache's append: dst's rows positions[i] (i32 [n] on this backend, read when the
  // op runs: a captured step) or, positions empty, row0 + i, set to src's rows (f32 [n, c])
  // converted to dst's dtype (f32, or bf16 rounded to nearest even). dst [rows, c]. Default:
  // copy or scatter_rows_at (through a bf16 copy of the rows for a bf16 dst).
  virtual void write_rows(const Tensor& src, const Tensor& dst, int64_t row0, const Tensor& positions);
  // Whether a prompt chunk (several rows of one sequence) takes MLA's expanded form: every
  // head's keys and values formed from the cached latents, then attention(). True where
  // per-head attention runs on faster kernels (CUDA's tensor cores); false (the default, the
  // CPU): the absorbed form for every row, whose results do not depend on the chunk, so that
  // decoding gives a teacher-forced pass's logits bit for bit.
  virtual bool latent_attention_expands_prompts() const { return false; }
  // The head size at which attention() runs its fastest kernel for heads of d dims (>= d; the
  // caller pads q, k and v with zeros). Default: d.
  virtual int64_t attention_padded_dim(int64_t d) const { return d; }
  // One weight holding the rows of parts one after another (same dtype and columns), so
  // that a decode step reads them in one product; the parts are then row slices of it.
  // Empty: this backend gains nothing from it (the default).
  virtual Tensor concat_rows(std::span<const Tensor> parts) { return {}; }
  // Causal grouped-query attention. q [n, n_head, d]; k, v [n_ctx, n_kv_head, d] holding
  // positions [0, n_past + n); out [n, n_head, d]. Query head h reads kv head
  // h / (n_head / n_kv_head). Softmax in f32.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const AttentionParams& params) = 0;
  // out = silu(gate) * up, elementwise; out may alias gate or up.
  virtual void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // gpt-oss's clamped SwiGLU, elementwise (f32; out may alias gate or up): g = min(gate,
  // limit), u = clamp(up, -limit, limit), out = (u + 1) * (g * sigmoid(alpha * g)), sigmoid(x)
  // = 1 / (1 + e^-x), in that order (transformers' GptOssExperts); NaN stays NaN.
  virtual void swiglu_clamped(const Tensor& gate, const Tensor& up, const Tensor& out, float alpha, float limit) = 0;
  // x += y, elementwise.
  virtual void add(const Tensor& x, const Tensor& y) = 0;
  // x = min(max(x, lo), hi), elementwise, in place (f32).
  virtual void clamp(const Tensor& x, float lo, float hi) = 0;
  // out[i, :] = table[ids[i], :] converted to f32; table is f32/bf16/f16 [n_rows, cols], or
  // quantized (q8/q4/q2: rows dequantized exactly as core/quant.h defines).
  virtual void get_rows(const Tensor& table, std::span<const int32_t> ids, const Tensor& out) = 0;
  // out[i, :] = src[idx[i], :] (f32).
  virtual void gather_rows(const Tensor& src, std::span<const int32_t> idx, const Tensor& out) = 0;
  // dst[idx[i], :] = src[i, :] (f32).
  virtual void scatter_rows(const Tensor& src, std::span<const int32_t> idx, const Tensor& dst) = 0;
  // get_rows and scatter_rows with the indices in a tensor of this backend (i32 [n]), so that
  // nothing goes through the host (a captured graph reads them at replay). Default: copy
  // the indices to the host, then the span form. get_rows_at on CUDA reads row 0 for an id
  // outside the table instead of failing (ids a device step drew; the host checks them).
  virtual void get_rows_at(const Tensor& table, const Tensor& ids, const Tensor& out);
  virtual void scatter_rows_at(const Tensor& src, const Tensor& idx, const Tensor& dst);
  // Mixture combine, in routing-rank order so the result never depends on which expert ran
  // first: out[t, :] = sum over r = 0..k-1 of weights[t*k + r] * expert_out[t*k + r, :].
  // expert_out [n*k, c], out [n, c], weights has n*k entries (host memory).
  virtual void moe_combine(const Tensor& expert_out, std::span<const float> weights, int64_t k,
                           const Tensor& out) = 0;

  // ---- device-side MoE (every expert of a layer resident) ----
  // A table over one layer's resident experts (same dtype and shapes: gate/up [n_ff, n_embd],
  // down [n_embd, n_ff]) that compute `math`, routed as `routing` says (the scoring; Gemma 4's
  // per-expert scales), built once at load, for moe_routed. Null: this backend routes on the
  // host (the CPU backend, or experts whose math, biases or routing its kernels do not
  // compute; the reference is route_topk + routed_experts in models/blocks.h).
  virtual std::unique_ptr<ExpertTable> make_expert_table(std::span<const ExpertWeights> experts,
                                                         const ExpertMath& math, const TableRouting& routing = {}) {
    return nullptr;
  }
  // The routed half of a MoE layer with no host round trip: the top-k of logits[n, E] as
  // route_topk does it with the table's scoring (k = n_expert_used; softmax weights
  // renormalized when norm_topk; times the table's expert scales), then out[n, n_embd] = sum
  // over ranks r of weight[r] x expert[id[r]](h[row]) in rank order (moe_combine), or with
  // math.scale_input the unweighted sum of expert[id[r]](weight[r] h[row]).
  // table: from this backend's make_expert_table. With replay.table the ids and weights are
  // the replay's rows instead of the top-k of logits (times the table's expert scales still).
  virtual void moe_routed(const ExpertTable& table, const Tensor& logits, int64_t n_expert_used, bool norm_topk,
                          const Tensor& h, const Tensor& out, const ReplayRows& replay = {});
  // A replay table on this backend: per MoE layer, n_tokens rows of k ids and weights
  // ([n_layers, n_tokens, k], i32 and f32) and the next layer's predicted ids at each row
  // (same shape, -1 where none; empty: none at all). Null: this backend routes on the host,
  // where the replayed routing is used as it is.
  virtual std::unique_ptr<RoutingReplayTable> make_routing_replay(int64_t n_layers, int64_t n_tokens, int64_t k,
                                                                  std::span<const int32_t> ids,
                                                                  std::span<const float> weights,
                                                                  std::span<const int32_t> predicted) {
    return nullptr;
  }

  // ---- captured graphs (CUDA graphs; optional) ----
  // True when this backend can capture the ops between graph_begin and graph_end into a
  // graph that graph_launch replays with the same buffers. While capturing, ops are recorded,
  // not run; allocations come from memory the graph owns; to_host, from_host and host-side
  // index spans are not allowed. Default: false, and the three calls fail.
  virtual bool graphs_enabled() const { return false; }
  virtual void graph_begin();
  // Ends the capture (also after an error inside it: the caller then drops the result).
  virtual std::unique_ptr<BackendGraph> graph_end();
  virtual void graph_launch(const BackendGraph& graph);

  // ---- hybrid families: Gated DeltaNet, gated attention, QSA, hyper-connections, PLE ----
  // All tensors f32 unless said otherwise; "rows" as above. Outputs may not overlap inputs
  // unless said so.

  // dst[r, dst_col + j] = src[r, src_col + j] for j in [0, n_cols), every row r. src and dst
  // have the same number of rows.
  virtual void copy_cols(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                         int64_t n_cols) = 0;
  // x = out_mul * act(x / in_div), elementwise, in place.
  virtual void activate(const Tensor& x, Activation act, float in_div = 1.0f, float out_mul = 1.0f) = 0;
  // x *= y, in place: y has x.numel() elements (elementwise), or is [x.rows(), 1] (one factor
  // per row).
  virtual void mul(const Tensor& x, const Tensor& y) = 0;
  // RMSNorm over groups: every row of x [rows, c] is cut into c / group groups of `group`
  // elements, each scaled by 1 / sqrt(mean(group^2) + eps); then y[r, :] *= w[:] (w f32 [c],
  // or empty: no scale). group == c is rms_norm. y may alias x.
  virtual void rms_norm_groups(const Tensor& x, const Tensor& w, float eps, int64_t group, const Tensor& y) = 0;
  // Causal depthwise 1-D convolution with carried state, then optionally SiLU. With
  // S = (K - 1) * dilation and xx = [state; x] (state [S, c]: the S latest earlier inputs,
  // oldest first; zeros at the start of a sequence):
  //   out[t, ch] = act(sum over j in [0, K) of w[ch, j] * xx[S + t - (K - 1 - j) * dilation, ch])
  // for t in [0, n); then state = the last S rows of xx. x, out [n, c]; w [c, K].
  virtual void causal_conv1d(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& out,
                             int64_t dilation, bool silu) = 0;
  // Gated DeltaNet gates: g[t, h] = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h]) with
  // softplus(x) = x above 20, else log(1 + e^x); beta[t, h] = sigmoid(b[t, h]).
  // a, b, g, beta [n, H]; A_log, dt_bias [H].
  virtual void delta_net_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                               const Tensor& g, const Tensor& beta) = 0;
  // The gated delta rule over n consecutive tokens, state S [Hv, dk, dv] read and updated in
  // place. Value head h reads key head h / (Hv / Hk); q and k are L2-normalized
  // (x / sqrt(sum(x^2) + 1e-6)) and q scaled by 1 / sqrt(dk). For t in order:
  //   S = exp(g[t, h]) S;  S += k_t (beta[t, h] (v_t - S^T k_t))^T;  out_t = S^T q_t.
  // q, k [n, Hk, dk]; v, out [n, Hv, dv]; g, beta [n, Hv]. chunk_size > 0 computes the same
  // sums in transformers' chunked form (intra-chunk triangular solve, one state update per
  // chunk), which rounds differently from the token-by-token form (cpu/delta_net.cpp).
  virtual void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, const Tensor& state, const Tensor& out,
                                const DeltaRuleParams& params) = 0;
  // Hyper-connection input mix over n_stream = xn.cols() / out.cols() streams:
  //   out[r, :] = (sum over s of sigmoid(logits[r, s, :]) * xn[r, s, :]) / n_stream
  // xn, logits [n, n_stream * c]; out [n, c].
  virtual void hyper_mix(const Tensor& xn, const Tensor& logits, const Tensor& out) = 0;
  // Hyper-connection injection: x[r, s, :] += y[r, :] * w[r, s] (product rounded, then the
  // sum). x [n, n_stream * c], y [n, c], w [n, n_stream].
  virtual void hyper_inject(const Tensor& x, const Tensor& y, const Tensor& w) = 0;
  // PLE gate, per row r and stream s: a = (sum over i of key[r, s, i] * query[r, s, i]) / sqrt(c);
  // a = sqrt(max(|a|, 1e-6)) * sign(a); out[r, s, :] = sigmoid(a) * value[r, :].
  // key, query, out [n, n_stream * c]; value [n, c].
  virtual void ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& out) = 0;
  // dst[i, :] = (sum over j in [0, group) of src[i * group + j, :]) / group, j in order.
  // src [m * group, c], dst [m, c].
  virtual void mean_rows(const Tensor& src, int64_t group, const Tensor& dst) = 0;
  // QSA block selection for query rows at positions p = n_past + i. Block b holds tokens
  // [b c, (b + 1) c); it is complete for p when (b + 1) c <= p + 1, so p has m = (p + 1) / c
  // complete blocks. When m > block_topk each block b < m scores
  //   (sum over heads h of relu(q[i, h, :] . block_keys[b, :])) / sqrt(d)
  // and the block_topk best are kept (equal scores: the blocks torch.topk keeps on the CPU,
  // core/torch_topk.h, as transformers' indexer does); else all m are.
  // idx[i, :] = the kept blocks' tokens and the tail [m c, p], ascending, then -1 to the end.
  // q [n, n_head, d]; block_keys [>= (n_past + n) / c, d]; idx i32 [n, block_topk c + c - 1].
  virtual void qsa_select(const Tensor& q, const Tensor& block_keys, const Tensor& idx, const QsaParams& params) = 0;
  // Grouped-query attention where query row i sees only the key positions idx[i, :] (i32,
  // ascending, -1 entries ignored, at least one valid); otherwise as attention (softmax in f32
  // over the listed keys). q, out [n, n_head, d]; k, v [n_ctx, n_kv_head, d]; idx [n, m].
  virtual void attention_indexed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& idx,
                                 const Tensor& out, float scale) = 0;

  // ---- sampling ----
  // The next token of each row of logits [n, >= n_valid] f32 under `rule` (core/sampling.h:
  // greedy, temperature, top-k, top-p; only ids < n_valid are drawn). uniform: i64 [n], each
  // a draw u * 2^53 in [0, 2^53) (unused when greedy); ids: i32 [n] out, -1 for a row that
  // holds NaN or +inf. The default runs core/sampling.h on the host; CUDA samples on the
  // device, so that a decode step returns a token id and not a row of logits.
  virtual void sample(const Tensor& logits, int64_t n_valid, const SampleRule& rule, const Tensor& uniform,
                      const Tensor& ids);

  // ---- the KV cache ----
  // The dtype of the attention caches models allocate on this backend (DecoderModel: every
  // layer's K and V [n_ctx, n_kv, d]): f32 (the default), or bf16 where kv_dtype_supported
  // (half the bytes; each element rounded to nearest even when written, read as its exact
  // f32 value, all arithmetic in f32). The CPU and CUDA backends read and write both. Set it
  // before a model makes its states.
  DType kv_dtype() const { return kv_dtype_; }
  virtual bool kv_dtype_supported(DType t) const { return t == DType::f32; }
  // What --kv-cache auto picks here: f32 (the CPU, the reference), bf16 on CUDA (half the
  // bytes, decode at long context faster: bench/RESULTS.md).
  virtual DType auto_kv_dtype() const { return DType::f32; }
  void set_kv_dtype(DType t);  // Error(unsupported), one line naming the backend, when not supported

 private:
  DType kv_dtype_ = DType::f32;
};

std::unique_ptr<Backend> make_cpu_backend();
// Only in builds with SLUICE_CUDA (cuda_built() says whether this one is).
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
bool cuda_built();
// By name: "cpu", "cuda" or "cuda:N", or "auto" (CUDA when built and a device answers, else
// the CPU). An unknown name or an unusable GPU is a clear error.
std::unique_ptr<Backend> make_backend(const std::string& name);

}  // namespace sluice
