// CudaStreamer: construction, the model thread's side of a MoE layer (the device-side router,
// the handshake enqueued ahead, the two phases and the combine), barriers with the service
// thread, and the statistics.
#include "experts/cuda/cuda_streamer.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/router_group_topk.h"
#include "core/bits.h"
#include "core/log.h"
#include "core/units.h"
#include "core/router_scoring.h"
#include "core/switches.h"
#include "experts/cuda/streamer_impl.h"

namespace sluice {

namespace {
std::atomic<int64_t> g_decode_one_down{0};  // CudaStreamer::decode_one_down
}  // namespace
int64_t CudaStreamer::decode_one_down() { return g_decode_one_down.load(std::memory_order_relaxed); }

CudaStreamer::Impl::Impl(std::shared_ptr<const Pack> p, DType k, int64_t topk, CudaBackend& b,
                         const StreamerOptions& o)
    : StreamState(std::move(p), k, topk, o, [this](int32_t slot, int64_t record, DType kd) { unmap_slot(slot, record, kd); }),
      be(b), stream(b.stream()),
      wait_mode(o.wait_mode == WaitMode::spin ? cuda::HostWait::spin : cuda::HostWait::block) {
  n_embd = pack->manifest().n_embd;
  n_ff = pack->manifest().n_ff;
  CUDA_CHECK(cudaSetDevice(be.device()));
  slots = cuda::DeviceBuffer(static_cast<size_t>(layout.n_slots) * slot_bytes,
                             str("the expert cache (", layout.n_slots, " slots of ", byte_size_text(slot_bytes),
                                 "; ask for a smaller --expert-cache)")
                                 .c_str());
  if (host)
    host_mem = cuda::RegisteredHostBuffer(static_cast<size_t>(layout.host_slots) * slot_bytes, "the host expert tier");
  // Staging: a buffer per device slot (a slot's record waits in it until the device copied
  // it), fewer with a host tier, where reads land in the tier.
  const int32_t n_staging = host ? std::max(4, 2 * opt.io_depth) : layout.n_slots;
  staging_mem = cuda::RegisteredHostBuffer(static_cast<size_t>(n_staging) * slot_bytes, "expert read staging");
  for (int32_t i = n_staging - 1; i >= 0; --i) staging_free.push_back(i);

  if (host && opt.host_cache_preload) preload_host_tier();
  hs = std::make_unique<cuda::Handshake>(n_layers);
  const int64_t n_records = pack->manifest().n_records();
  hit_slot_mem = cuda::MappedHostBuffer(static_cast<size_t>(n_records) * sizeof(int32_t), "the device's slot map");
  std::fill(hit_slots(), hit_slots() + n_records, -1);
  d_slot_ref = cuda::DeviceBuffer(sizeof(cuda::ExpertRef), "the slot map's table entry");
  calls.assign(static_cast<size_t>(n_layers), 0);
  calls_done.assign(static_cast<size_t>(n_layers), 0);
  wave_tables = cuda::MappedHostBuffer(kPrefillWaves * static_cast<size_t>(n_expert) * sizeof(cuda::ExpertRef),
                                       "the prefill wave tables");
  d_wave_tables = cuda::DeviceBuffer(kPrefillWaves * static_cast<size_t>(n_expert) * sizeof(cuda::ExpertRef),
                                     "the prefill wave tables");
  d_phase = cuda::DeviceBuffer(settled_table_offset() + static_cast<size_t>(n_expert) * sizeof(cuda::ExpertRef),
                               "the expert table and copy list");
  // The device's header and call counters are zeroed on the streamer's stream (a non-blocking
  // one, which a plain cudaMemset's legacy stream is not ordered with): the first handshake
  // kernel reads them after the zeroing, not a freed buffer's old counts.
  CUDA_CHECK(cudaMemsetAsync(d_phase.as(), 0, settled_table_offset(), stream));
  d_calls = cuda::DeviceBuffer(static_cast<size_t>(n_layers) * sizeof(uint64_t), "the device's call counters");
  CUDA_CHECK(cudaMemsetAsync(d_calls.as(), 0, static_cast<size_t>(n_layers) * sizeof(uint64_t), stream));
  if (switches::on(Switch::cuda_handshake_times)) {
    const size_t bytes = (1 + static_cast<size_t>(n_layers) * cuda::kTimelinePoints * cuda::kTimelineSums) * sizeof(uint64_t);
    d_times = cuda::DeviceBuffer(bytes, "the handshake timeline");
    CUDA_CHECK(cudaMemsetAsync(d_times.as(), 0, bytes, stream));
  }
  device_failed = cuda::MappedHostBuffer(64, "the device-side wait's failure flag");
  *reinterpret_cast<volatile uint32_t*>(device_failed.data()) = 0;
  if (opt.lookahead && layout.speculative_slots == 0)
    LOG_WARN("--lookahead needs more slots than the ", top_k, " of one token; prefetching is off");
  if (opt.fake_experts)
    LOG_WARN("--fake-experts: expert reads are skipped and the slots computed as they are; the output is meaningless");
  LOG_INFO("cuda expert streaming: ", layout.n_slots, " device slots of ", byte_size_text(slot_bytes), " (",
           expert_kind_name(kind), opt.miss_kind ? str(", misses may use ", expert_kind_name(*opt.miss_kind)) : "",
           "), ", layout.speculative_slots, " speculative, policy ", policy_name(opt.policy), ", ",
           io->file_is_direct(files[kind]) ? "O_DIRECT" : "buffered", " reads, depth ", opt.io_depth,
           host ? str(", pinned host tier of ", host->n_slots(), " records") : std::string(), ", ",
           opt.wait_mode == WaitMode::spin ? "spinning" : "blocking", " host waits");
  service = std::thread([this] { service_loop(); });
}

CudaStreamer::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lk(q_mu);
    Job stop;
    stop.kind = Job::Kind::stop;
    jobs.push_back(stop);
  }
  q_cv.notify_all();
  if (service.joinable()) service.join();
  // The service thread is gone: answer whatever the device may still wait for (a call whose
  // enqueue failed half-way), so the stream drains. Errors here are not actionable.
  if (hs && layer_mem.data()) {
    for (int64_t L = 0; L < n_layers; ++L) {
      const uint64_t v = calls[static_cast<size_t>(L)];
      if (hs->load(L, cuda::Signal::resident_ready) < v) {
        clear_phase(layer_view(L, v).phase1);
        hs->store(L, cuda::Signal::resident_ready, v);
      }
      if (hs->load(L, cuda::Signal::misses_ready) < v) {
        clear_phase(layer_view(L, v).phase2);
        hs->store(L, cuda::Signal::misses_ready, v);
      }
    }
  }
  cudaStreamSynchronize(stream);
  print_handshake_times();
  bool drained = true;
  try {
    drained = io->drain(opt.io_timeout);
  } catch (...) {
    drained = false;
  }
  io.reset();
  if (!drained) {
    LOG_ERROR("cuda expert streamer: reads still in flight at shutdown; leaving their memory allocated");
    host_mem.leak();
    staging_mem.leak();
  }
}

// The handshake timeline (d_times) as a table on stderr: for each MoE layer and point (phase
// 1's handshake, phase 2's, the combine's end), the mean microseconds a call from the point
// before to this one's start, waiting for the host, and reading the list (the combine's end:
// the first alone); then the means over the layers. Nothing when off, or on error.
void CudaStreamer::Impl::print_handshake_times() {
  if (!d_times.as()) return;
  constexpr int P = cuda::kTimelinePoints, S = cuda::kTimelineSums;
  std::vector<uint64_t> t(1 + static_cast<size_t>(n_layers) * P * S);
  if (cudaMemcpy(t.data(), d_times.as(), t.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost) != cudaSuccess) return;
  std::string out = "| MoE layer | point | calls | before it, us | waiting for the host, us | list read, us |\n|---|---|---|---|---|---|\n";
  const char* names[P] = {"phase 1", "phase 2", "combine end"};
  double sum[P][3] = {}, n[P] = {};
  auto fixed = [](double v, int digits) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*f", digits, v);
    return std::string(b);
  };
  auto columns = [&](int ph, const double* v, double c) {  // the point's means; the combine's end has one
    std::string r = str(" | ", fixed(v[0] / c, 2));
    for (int i = 1; i < 3; ++i) r += ph == 2 ? std::string(" | -") : str(" | ", fixed(v[i] / c, 2));
    return r + " |\n";
  };
  for (int64_t L = 0; L < n_layers; ++L)
    for (int ph = 0; ph < P; ++ph) {
      const uint64_t* s = t.data() + 1 + (L * P + ph) * S;
      if (s[3] == 0) continue;
      double v[3];
      for (int i = 0; i < 3; ++i) {
        v[i] = static_cast<double>(s[i]) / 1e3;
        sum[ph][i] += v[i];
      }
      n[ph] += static_cast<double>(s[3]);
      out += str("| ", L, " | ", names[ph], " | ", s[3]) + columns(ph, v, static_cast<double>(s[3]));
    }
  for (int ph = 0; ph < P; ++ph)
    if (n[ph] > 0) out += str("| all | ", names[ph], " | ", static_cast<uint64_t>(n[ph])) + columns(ph, sum[ph], n[ph]);
  if (barriers_timed > 0)
    out += str("forward_done (the model thread waiting for the service thread after a forward): ",
               fixed(barrier_seconds / static_cast<double>(barriers_timed) * 1e6, 2), " us a forward over ",
               barriers_timed, "\n");
  std::fprintf(stderr, "cuda streamer: the handshake timeline (SLUICE_CUDA_HANDSHAKE_TIMES)\n%s", out.c_str());
}

// ---- the model thread ----

void CudaStreamer::Impl::throw_if_failed() {
  if (failed) {
    std::lock_guard<std::mutex> lk(q_mu);
    throw *error;
  }
  throw_if_device_timed_out();
}

void CudaStreamer::Impl::throw_if_device_timed_out() const {
  const uint32_t layer1 = std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(device_failed.data()))
                              .load(std::memory_order_acquire);
  if (layer1 == 0) return;
  const int64_t L = static_cast<int64_t>(layer1) - 1;
  fail(Status::timeout, "MoE layer ", L, " (model layer ", model_layer(L), "): the device waited more than ",
       std::chrono::duration<double>(opt.wait_timeout).count(),
       " s for the expert streamer's tables and computed the layer without its experts");
}

void CudaStreamer::Impl::barrier() {
  std::unique_lock<std::mutex> lk(q_mu);
  const uint64_t id = ++barriers_asked;
  Job b;
  b.kind = Job::Kind::barrier;
  b.value = id;
  jobs.push_back(b);
  q_cv.notify_all();
  const auto limit = 2 * opt.wait_timeout + std::chrono::seconds(5);
  const bool ok = done_cv.wait_for(lk, limit, [&] { return barriers_done >= id; });
  SLUICE_CHECK(ok, Status::timeout, "cuda expert streamer: the service thread did not finish the MoE layers in flight ",
               "within ", std::chrono::duration<double>(limit).count(), " s");
}

// A layer's handshake memory: [predicted ids][predicted weights][phase 1's list][phase 2's
// list][kRoutingRing x (ids, weights)], each routing array nk bytes (cap_rows * top_k values,
// 64-byte aligned).
CudaStreamer::Impl::LayerView CudaStreamer::Impl::layer_view(int64_t L, uint64_t call) const {
  uint8_t* base = layer_mem.data() + static_cast<size_t>(L) * layer_stride;
  const size_t nk = round_up(static_cast<size_t>(cap_rows * top_k) * 4, 64);
  LayerView v;
  v.pred_ids = reinterpret_cast<int32_t*>(base);
  v.pred_weights = reinterpret_cast<float*>(base + nk);
  v.phase1 = phase_list_at(base + 2 * nk);
  v.phase2 = phase_list_at(base + 2 * nk + phase_list_bytes());  // right after phase 1's (next_list_offset)
  uint8_t* entry = base + 2 * nk + 2 * phase_list_bytes() + static_cast<size_t>(call % kRoutingRing) * 2 * nk;
  v.ids = reinterpret_cast<int32_t*>(entry);
  v.weights = reinterpret_cast<float*>(entry + nk);
  return v;
}

void CudaStreamer::Impl::wait_routing_slot(int64_t L, uint64_t call) {
  if (call <= kRoutingRing) return;
  std::unique_lock<std::mutex> lk(q_mu);
  const auto limit = 2 * opt.wait_timeout + std::chrono::seconds(5);
  const bool ok = done_cv.wait_for(lk, limit, [&] { return calls_done[static_cast<size_t>(L)] + kRoutingRing >= call; });
  SLUICE_CHECK(ok, Status::timeout, "cuda expert streamer: MoE layer ", L, "'s call ", call - kRoutingRing,
               " was not answered by the service thread within ", std::chrono::duration<double>(limit).count(), " s");
}

CudaStreamer::Impl::ExpertInputs CudaStreamer::Impl::expert_inputs(const MoeLayerCall& c, const cuda::MoeShape& shape,
                                                                    int64_t row0) const {
  if (!c.math.scale_input)
    return {c.h.ptr<float>() + row0 * n_embd, shape, d_w.as<float>() + row0 * top_k};
  return {d_x.as<float>() + row0 * top_k * n_embd, cuda::pairs_as_rows(shape), nullptr};  // weights of 1
}

void CudaStreamer::Impl::ensure_capacity(int64_t n) {
  if (n <= cap_rows) return;
  // Nothing may use the buffers while they are replaced.
  if (cap_rows > 0) {
    barrier();
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::lock_guard<std::mutex> g(mu);
  const int64_t cap = std::max<int64_t>(n, 16);
  const size_t pairs = static_cast<size_t>(cap * top_k);
  const size_t nk = round_up(pairs * 4, 64);
  layer_stride = (2 + 2 * kRoutingRing) * nk + 2 * phase_list_bytes();  // layer_view's layout
  layer_mem = cuda::MappedHostBuffer(static_cast<size_t>(n_layers) * layer_stride, "the expert handshake tables");
  d_ids = cuda::DeviceBuffer(pairs * 4, "routing ids");
  d_w = cuda::DeviceBuffer(pairs * 4, "routing weights");
  d_pids = cuda::DeviceBuffer(pairs * 4, "predicted ids");
  d_pw = cuda::DeviceBuffer(pairs * 4, "predicted weights");
  d_done = cuda::DeviceBuffer(pairs, "expert pair flags");
  d_act = cuda::DeviceBuffer(pairs * static_cast<size_t>(n_ff) * 4, "expert activations");
  d_pair = cuda::DeviceBuffer(pairs * static_cast<size_t>(n_embd) * 4, "expert outputs");
  d_plog = cuda::DeviceBuffer(static_cast<size_t>(cap * n_expert) * 4, "lookahead logits");
  cuda::MoeShape most{cap, top_k, n_embd, n_ff, n_expert, cuda::WType::unavailable};
  if (math.scale_input) {  // expert_inputs: a row per pair
    d_x = cuda::DeviceBuffer(pairs * static_cast<size_t>(n_embd) * 4, "the experts' scaled inputs");
    d_pair_sum = cuda::DeviceBuffer(pairs * static_cast<size_t>(n_embd) * 4, "the pairs' outputs");
    most = cuda::pairs_as_rows(most);
  }
  d_group = cuda::DeviceBuffer(static_cast<size_t>(cuda::moe_grouped_scratch_bytes(most)), "grouped expert scratch");
  cap_rows = cap;
}

const float* CudaStreamer::Impl::expert_scale_on_device(int64_t layer, std::span<const float> scale) {
  if (scale.empty()) return nullptr;
  SLUICE_CHECK(static_cast<int64_t>(scale.size()) == n_expert, Status::internal, "cuda expert streamer: ", scale.size(),
               " expert scales for ", n_expert, " experts");
  if (expert_scale_copied.empty()) {
    d_expert_scale = cuda::DeviceBuffer(static_cast<size_t>(n_layers * n_expert) * sizeof(float), "expert scales");
    expert_scale_copied.assign(static_cast<size_t>(n_layers), false);
  }
  float* dst = d_expert_scale.as<float>() + layer * n_expert;
  if (!expert_scale_copied[static_cast<size_t>(layer)]) {  // pageable source: staged before the call returns
    CUDA_CHECK(cudaMemcpyAsync(dst, scale.data(), scale.size_bytes(), cudaMemcpyHostToDevice, stream));
    expert_scale_copied[static_cast<size_t>(layer)] = true;
  }
  return dst;
}

// ---- CudaStreamer ----

CudaStreamer::CudaStreamer(std::shared_ptr<const Pack> pack, DType kind, int64_t top_k, CudaBackend& backend,
                           const StreamerOptions& opt) {
  impl_ = std::make_unique<Impl>(std::move(pack), kind, top_k, backend, opt);
}

CudaStreamer::~CudaStreamer() = default;

bool CudaStreamer::routes_on_device(const ExpertMath& math, const RouterSpec& router) const {
  const bool plain = math.activation == ExpertActivation::swiglu && !math.scale_input &&
                     router.scoring == RouterScoring::softmax && !impl_->pack->kind(impl_->kind).has_biases() &&
                     impl_->kind != DType::mxfp4;
  // gpt-oss's experts (biases, the clamped SwiGLU, MXFP4), Gemma 4's (GeGLU, per-expert
  // routing scales) and Llama 4's (sigmoid routing whose weights scale the inputs) route on the
  // device too; they take the host-routed path with SLUICE_CUDA_HOST_ROUTED=1, as layers past
  // the device top-k's bounds do (the resident table's rule: router_fits_device).
  return plain || (!switches::on(Switch::cuda_host_routed) &&
                   cuda::router_fits_device(router.scoring, router.n_expert, router.n_expert_used, router.grouped.n_group));
}

void CudaStreamer::moe(Backend& be, const MoeLayerCall& c) {
  Impl& m = *impl_;
  const auto enqueue0 = StreamerClock::now();
  m.throw_if_failed();
  SLUICE_CHECK(&be == &m.be, Status::internal, "cuda expert streamer: called with another backend (", be.name(), ")");
  SLUICE_CHECK(c.router, Status::internal, "cuda expert streamer: a MoE call without its router");
  const int64_t L = c.moe_layer, n = c.h.rows(), k = m.top_k, E = m.n_expert;
  SLUICE_CHECK(L >= 0 && L < m.n_layers, Status::internal, "cuda expert streamer: MoE layer ", L, " outside the pack's ",
               m.n_layers);
  if (!m.math_known) {  // the first call, before its job is queued (Impl::math)
    m.math = c.math;
    m.math_known = true;
  }
  if (!m.slot_ref_uploaded) {  // slot 0's entry, which needs math (ref)
    const cuda::ExpertRef r0 = m.ref(0, m.kind);
    CUDA_CHECK(cudaMemcpyAsync(m.d_slot_ref.as(), &r0, sizeof r0, cudaMemcpyHostToDevice, m.stream));
    m.slot_ref_uploaded = true;
  }
  SLUICE_CHECK(c.math == m.math, Status::internal, "cuda expert streamer: MoE calls with different expert math");
  if (c.routing) {
    SLUICE_CHECK(c.routing->n_rows == n && c.routing->k == k && c.h.cols() == m.n_embd && c.out.rows() == n,
                 Status::internal, "cuda expert streamer: a host routing of ", c.routing->n_rows, " rows of top-",
                 c.routing->k, " for ", n, " rows of width ", c.h.cols(), " (the pack: top-", k, ", width ", m.n_embd,
                 ")");
    if (n > 0) m.host_routed(be, c);
    return;
  }
  SLUICE_CHECK(routes_on_device(c.math, *c.router), Status::internal,
               "cuda expert streamer: a call without a host routing for experts the device kernels do not compute");
  SLUICE_CHECK(c.router_logits.rows() == n && c.router_logits.cols() == E && c.router_logits.dtype == DType::f32,
               Status::internal, "cuda expert streamer: router logits ", c.router_logits.shape_str(), " for ", n,
               " rows of ", E, " experts");
  SLUICE_CHECK(c.router->n_expert_used == k && c.h.cols() == m.n_embd && c.out.rows() == n,
               Status::internal, "cuda expert streamer: the call does not match the pack (top-k ", c.router->n_expert_used,
               ", width ", c.h.cols(), ")");
  if (n == 0) return;
  m.ensure_capacity(n);
  // Without a low-bit miss kind every slot holds the one kind: the kernels are compiled for it.
  const cuda::MoeShape shape{n, k, m.n_embd, m.n_ff, E, m.opt.miss_kind ? cuda::WType::unavailable : cuda::matmul_wtype_of(m.kind, "the expert cache")};
  cudaStream_t s = m.stream;
  const bool norm = c.router->norm_topk_prob;
  const RouterScoring scoring = c.router->scoring;
  // This call's handshake value if it takes the two phases (the grouped path does not count
  // one and reads its routing from the same entry).
  const uint64_t call = m.calls[static_cast<size_t>(L)] + 1;
  m.wait_routing_slot(L, call);
  const Impl::LayerView lv = m.layer_view(L, call);
  // Group-limited routing's parameters with this layer's (and for lookahead the next layer's)
  // correction bias.
  auto group_of = [&](const Tensor& bias) {
    const GroupedRouting& g = c.router->grouped;
    return cuda::RouterGroupParams{g.n_group, g.topk_group, g.routed_scaling_factor, g.norm_eps,
                                 bias.empty() ? nullptr : bias.ptr<float>()};
  };
  const cuda::RouterGroupParams group = group_of(c.score_bias), next_group = group_of(c.next_score_bias);
  // The routing goes to the host-mapped handshake memory too, where the service thread reads it.
  // A replayed routing (benchmarks) is stored where the top-k stores the router's.
  const RoutingReplayTable* replay = c.replay ? c.replay.replay->device(be) : nullptr;
  SLUICE_CHECK(!c.replay || replay, Status::internal, "cuda expert streamer: a replayed routing without its device table");
  if (replay)
    cuda::launch_router_replay(cuda::replay_source(*replay, L, false), c.replay.first, n, norm, m.d_ids.as<int32_t>(),
                               m.d_w.as<float>(), s, m.expert_scale_on_device(L, c.expert_scale),
                               {m.layer_mem.dev(lv.ids), m.layer_mem.dev(lv.weights)});
  else
    cuda::launch_router(scoring, c.router_logits.ptr<float>(), n, E, k, norm, m.d_ids.as<int32_t>(), m.d_w.as<float>(),
                        s, m.expert_scale_on_device(L, c.expert_scale),
                        {m.layer_mem.dev(lv.ids), m.layer_mem.dev(lv.weights)}, &group);
  // Weights that scale the experts' inputs (Llama 4): each pair's input row is its own
  // (Impl::d_x), computed as a top-1 row, and the pairs' outputs are summed with weight 1.
  if (c.math.scale_input)
    cuda::launch_scale_pair_inputs(c.h.ptr<float>(), m.d_w.as<float>(), m.d_x.as<float>(), n, k, m.n_embd, s);
  // The union of n rows fits the cache when n * k slots (or every expert) do; else group.
  // An exact prompt chunk with enough pairs an expert takes the grouped path too, as one
  // group when its union fits: its experts then run on the grouped tensor-core kernels, as
  // the resident prefill's do (bit for bit), instead of the per-pair kernels of the two
  // phases below, which overlap resident compute with the misses' loads but compute a prompt
  // several times slower (RESULTS: the host-tier prefill at 5.7x its compute bound).
  const int64_t slots = m.residency->n_slots();
  if ((n * k > slots && E > slots) ||
      (c.phase == StreamPhase::prefill && Impl::grouped_kernels_apply(shape) && !m.opt.lossy())) {
    m.grouped(c, shape, lv);
    return;
  }
  const size_t nk = static_cast<size_t>(n * k);
  // With a replayed routing lookahead predicts with the replay's predictions (none: no lookahead).
  const bool look = m.opt.lookahead && !c.next_router.empty() && L + 1 < m.n_layers &&
                    m.residency->speculative_capacity() > 0 && (!replay || c.replay.replay->predicts(L));
  if (look) {
    Tensor plog(DType::f32, {n, E}, m.d_plog.as());
    be.matmul(c.h, c.next_router, plog);
    if (!c.next_router_bias.empty()) be.add_bias(plog, c.next_router_bias);
    if (replay)
      cuda::launch_router_replay(cuda::replay_source(*replay, L, true), c.replay.first, n, false,
                                 m.d_pids.as<int32_t>(), m.d_pw.as<float>(), s, nullptr,
                                 {m.layer_mem.dev(lv.pred_ids), m.layer_mem.dev(lv.pred_weights)});
    else
      cuda::launch_router(scoring, plog.ptr<float>(), n, E, k, norm, m.d_pids.as<int32_t>(), m.d_pw.as<float>(), s,
                          nullptr, {m.layer_mem.dev(lv.pred_ids), m.layer_mem.dev(lv.pred_weights)}, &next_group);
  }
  const uint64_t v = ++m.calls[static_cast<size_t>(L)];
  SLUICE_ASSERT(v == call);
  // The job goes first: whatever of this call reaches the device gets its signals answered,
  // also when enqueueing the rest fails (the service thread then times out on router_ready).
  const Impl::Job j{Impl::Job::Kind::layer, L, v, n, look, c.phase};
  {
    std::lock_guard<std::mutex> lk(m.q_mu);
    m.jobs.push_back(j);
  }
  m.q_cv.notify_all();
  // Everything after each wait reads what the host published before the signal: the phase's
  // list (taken to the device by its handshake kernel), then the landed records' copies
  // (phase 1's by leading blocks of its gate/up launch, phase 2's by the copy kernel); the
  // pairs' done flags are zeroed before phase 1. No kernel marks the pairs done: phase 2's
  // handshake kernel marks phase 1's (from the table before it takes phase 2's), and the
  // combine counts the pairs whose entry phase 2's table holds (phase 1's and the landed
  // misses').
  const Impl::ExpertInputs in = m.expert_inputs(c, shape);
  // The phases compute the gate/up products alone and one down + combine over the pairs
  // phase 2's table holds follows; pairs run as rows of their own (scaled inputs: their
  // combine sums k rows) take a down a phase and the combine apart.
  const bool one_down = in.shape.k == shape.k;
  const cuda::ExpertRef* table = m.enqueue_phase(L, v, lv.phase1, cuda::Signal::router_ready,
                                                 cuda::Signal::resident_ready, nk, m.d_done.as(), /*from_map=*/!look);
  if (one_down)
    cuda::launch_moe_gate_up(in.h, m.d_ids.as<int32_t>(), table, m.d_done.as(), m.d_act.as<float>(), in.shape, s,
                             m.device_copies());
  else
    cuda::launch_moe_experts(in.h, m.d_ids.as<int32_t>(), table, m.d_done.as(), m.d_act.as<float>(),
                             m.d_pair.as<float>(), in.shape, s, /*mark=*/false, m.device_copies());
  table = m.enqueue_phase(L, v, lv.phase2, cuda::Signal::resident_done, cuda::Signal::misses_ready, nk, nullptr);
  if (one_down) {
    cuda::launch_moe_gate_up(in.h, m.d_ids.as<int32_t>(), table, m.d_done.as(), m.d_act.as<float>(), in.shape, s);
    cuda::launch_moe_down_combine_table(m.d_ids.as<int32_t>(), in.combine_weights, table, m.d_act.as<float>(),
                                        m.d_pair.as<float>(), c.out.ptr<float>(), shape, s);
    g_decode_one_down.fetch_add(1, std::memory_order_relaxed);
  } else {
    cuda::launch_moe_experts(in.h, m.d_ids.as<int32_t>(), table, m.d_done.as(), m.d_act.as<float>(),
                             m.d_pair.as<float>(), in.shape, s, /*mark=*/false);
    cuda::launch_moe_combine_done(m.d_pair.as<float>(), in.combine_weights, nullptr, c.out.ptr<float>(), shape, s,
                                  m.d_ids.as<int32_t>(), table);
  }
  if (m.d_times.as()) cuda::launch_timeline_stamp(m.d_times.as<uint64_t>(), L, s);
  const auto enqueue1 = StreamerClock::now();
  LOG_DEBUG("cuda streamer: MoE layer ", L, " call ", v, " enqueued in ", seconds_between(enqueue0, enqueue1) * 1e3,
            " ms, ", seconds_between(m.last_enqueue, enqueue0) * 1e3, " ms after the previous layer's");
  m.last_enqueue = enqueue1;
}

void CudaStreamer::Impl::end_forward() {
  const auto until = StreamerClock::now() + std::chrono::microseconds(100);
  for (;;) {
    bool idle = false;
    {
      std::lock_guard<std::mutex> lk(q_mu);
      idle = jobs.empty() && !layer_job_running;
    }
    if (idle) {  // only this thread queues jobs: none comes before the lock below
      std::lock_guard<std::mutex> g(mu);
      release_pins();
      retire();  // the logits reached the host: the device is idle
      return;
    }
    if (StreamerClock::now() >= until) break;
    std::this_thread::yield();
  }
  barrier();
  std::lock_guard<std::mutex> g(mu);
  retire();
}

void CudaStreamer::forward_done() {
  const auto t0 = StreamerClock::now();
  impl_->end_forward();
  if (impl_->d_times.as()) {  // SLUICE_CUDA_HANDSHAKE_TIMES: the wait's share of the token boundary
    impl_->barrier_seconds += seconds_between(t0, StreamerClock::now());
    ++impl_->barriers_timed;
  }
  impl_->throw_if_failed();
}

// Every layer job is versioned by its call (Impl::calls) and runs in order, and the pins and
// copies of a layer are released when the device reaches the next one (run_layer), so the
// next forward's layers may queue behind this one's.
bool CudaStreamer::forwards_overlap() const { return true; }

// A failure of a layer sets `failed` before its signals are answered (release_device), so one
// that touched a forward whose result reached the host is seen here.
void CudaStreamer::forward_checked() { impl_->throw_if_failed(); }

RunStats CudaStreamer::stats() const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> g(m.mu);
  RunStats s = m.run_stats();
  s.h2d_bytes = m.h2d_bytes - m.h2d_base;
  return s;
}

bool CudaStreamer::drain(std::chrono::milliseconds wait) {
  Impl& m = *impl_;
  m.barrier();
  const auto until = StreamerClock::now() + wait;
  std::lock_guard<std::mutex> g(m.mu);
  // Background reads (cut experts, prefetches) land and are copied here, on this thread.
  while (m.in_flight() > 0 || !m.retiring.empty()) {
    if (StreamerClock::now() >= until) return false;
    if (m.pump() == 0) cuda::host_idle(m.wait_mode);
    m.copy_landed_on_stream();
    CUDA_CHECK(cudaStreamSynchronize(m.stream));
    m.retire();
  }
  return true;
}

void CudaStreamer::reset_stats() {
  drain(impl_->opt.io_timeout);
  Impl& m = *impl_;
  std::lock_guard<std::mutex> g(m.mu);
  m.reset_counters();
  m.h2d_base = m.h2d_bytes;
}

int32_t CudaStreamer::n_slots() const { return impl_->residency->n_slots(); }
uint64_t CudaStreamer::slot_bytes() const { return impl_->slot_bytes; }
DType CudaStreamer::kind() const { return impl_->kind; }
const StreamerOptions& CudaStreamer::options() const { return impl_->opt; }
const Residency& CudaStreamer::residency() const { return *impl_->residency; }

void CudaStreamer::set_routing_observer(RoutingObserver observer) {
  impl_->barrier();
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->observer = std::move(observer);
}

std::shared_ptr<StreamingProvider> make_cuda_streamer(std::shared_ptr<const Pack> pack, DType kind, int64_t top_k,
                                                      Backend& backend, const StreamerOptions& opt) {
  auto* cb = dynamic_cast<CudaBackend*>(&backend);
  if (!cb) return nullptr;
  return std::make_shared<CudaStreamer>(std::move(pack), kind, top_k, *cb, opt);
}

}  // namespace sluice
