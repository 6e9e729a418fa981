// The inside of CudaStreamer (cuda_streamer.h), shared by its files, one concern each:
//   cuda_streamer.cpp  construction, the model thread's enqueue of a MoE layer, statistics
//   fills.cpp          fills: reads into page-locked memory, copies into device slots, the
//                      host tier and its preload
//   service.cpp        the service thread: the handshake's host side and each layer's plan
//   grouped.cpp        the synchronous path for batches whose union may exceed the cache
//   host_routed.cpp    the synchronous path for experts the device kernels do not compute
// Every decision of a step is the planner's (experts/plan.h); this code moves bytes and
// publishes what the plan decided.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_memory.h"
#include "backends/cuda/expert_copy.h"
#include "backends/cuda/moe_kernels.h"
#include "core/bits.h"
#include "experts/cuda/cuda_streamer.h"
#include "experts/cuda/handshake.h"
#include "experts/io_engine.h"
#include "experts/plan.h"
#include "experts/stream_state.h"

namespace sluice {

using StreamerClock = std::chrono::steady_clock;

inline double seconds_between(StreamerClock::time_point a, StreamerClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct CudaStreamer::Impl : StreamState {
  // One record on its way into a device slot: read into page-locked host memory (reading),
  // landed there (landed), then listed for a copy kernel the device runs later (retiring:
  // the slot counts as resident from then on, since every reader of the slot runs after the
  // copy on the same stream; the host memory is reused once the device passed the copy).
  struct Fill {
    int32_t slot = -1;      // device slot (state loading until its copy is listed)
    int64_t record = -1;
    DType kind = DType::bf16;
    IoPriority priority = IoPriority::demand;
    int32_t staging = -1;   // the host source: a staging buffer, or
    int32_t host_slot = -1; // a host-tier record (pinned in the tier until retired)
  };
  struct Job {
    enum class Kind { layer, barrier, stop } kind = Kind::layer;
    int64_t layer = 0;
    uint64_t value = 0;  // the handshake value of this call (layer jobs), or the barrier's id
    int64_t n = 0;
    bool lookahead = false;
    StreamPhase phase = StreamPhase::decode;
  };
  // What one phase of a decode MoE layer reads, laid out as one block (phase_list_bytes) so
  // that one copy takes it to the device: the copy list's length (64 bytes), the expert table
  // [n_expert], the copy list [n_slots]. The host publishes it in the layer's handshake memory;
  // the handshake kernel takes it into d_phase.
  struct PhaseList {
    uint32_t* count;
    uint32_t* settled;  // the header's second word (phase 1's): phase 2's list was final with it
    cuda::ExpertRef* table;
    cuda::CopyDesc* copies;
  };
  // The host-mapped per-layer handshake memory: ids, weights, predicted ids and weights
  // [cap * k] (written there by the top-k kernels, RoutingCopy), the two phases' lists. The
  // ids and weights are a ring of kRoutingRing calls a layer: a layer whose experts were all
  // taken from the slot map on the device does not wait for the service thread, so the device
  // (and the model thread's next forward) may reach the layer's next call before the service
  // thread has read this one's routing. A call waits (wait_routing_slot) until the service
  // thread is done with the call kRoutingRing before it, whose entry it reuses.
  static constexpr uint64_t kRoutingRing = 4;
  struct LayerView {
    int32_t* ids;
    float* weights;
    int32_t* pred_ids;
    float* pred_weights;
    PhaseList phase1, phase2;
  };
  // The plan's fills and waits (StepFills): start_fill, and progress = the landed reads plus
  // what `land` (the phase's copy listing) made of them; an idle step when nothing moved.
  struct Fills final : StepFills {
    Impl& m;
    std::function<size_t()> land;
    Fills(Impl& impl, std::function<size_t()> land_fn) : m(impl), land(std::move(land_fn)) {}
    bool start_fill(const AcquireResult& a, int64_t record, DType kind, IoPriority priority) override {
      return m.start_fill(a, record, kind, priority);
    }
    size_t make_progress() override;
    bool in_flight() const override { return m.in_flight() > 0; }
  };

  Impl(std::shared_ptr<const Pack> p, DType k, int64_t topk, CudaBackend& b, const StreamerOptions& o);
  ~Impl();

  // ---- fills (fills.cpp; callers hold mu) ----
  uint8_t* slot_ptr(int32_t slot) const { return slots.as() + static_cast<uint64_t>(slot) * slot_bytes; }
  uint8_t* host_ptr(int32_t h) const { return host_mem.data() + static_cast<uint64_t>(h) * slot_bytes; }
  uint8_t* staging_ptr(int32_t s) const { return staging_mem.data() + static_cast<uint64_t>(s) * slot_bytes; }
  bool resident(int32_t slot, int64_t record, DType k) const { return slot_holds(*residency, slot, record, k); }
  // The device table entry of the record in `slot`, of kind k.
  cuda::ExpertRef ref(int32_t slot, DType k) const;
  bool start_fill(const AcquireResult& a, int64_t record, DType k, IoPriority priority);
  void submit_read(Fill f, void* dest);
  void fail_fill(const Fill& f);
  void on_read(const ReadCompletion& c);
  size_t pump();  // lands read completions; no CUDA call
  const uint8_t* source(const Fill& f) const { return f.host_slot >= 0 ? host_ptr(f.host_slot) : staging_ptr(f.staging); }
  // Fills waiting for a staging buffer get the free ones and their reads go out.
  void submit_waiting();
  // Lists every landed fill in a copy list (descs[*count ...]) and counts its slot resident.
  size_t list_landed(cuda::CopyDesc* descs, uint32_t& count);
  // Bytes of a PhaseList and where its table and copy list start.
  size_t phase_table_offset() const { return 64; }
  size_t phase_copies_offset() const {
    return phase_table_offset() + round_up(static_cast<size_t>(n_expert) * sizeof(cuda::ExpertRef), 64);
  }
  size_t phase_list_bytes() const {
    return phase_copies_offset() + round_up(static_cast<size_t>(residency->n_slots()) * sizeof(cuda::CopyDesc), 64);
  }
  // Where d_phase keeps phase 2's table entries that phase 1's handshake kernel took when the
  // layer settled at the plan (PhaseHandshake::settled_table_offset), after the list.
  size_t settled_table_offset() const { return phase_list_bytes(); }
  PhaseList phase_list_at(uint8_t* base) const;
  // A phase that computes and copies nothing (every table entry unavailable).
  void clear_phase(const PhaseList& p) const;
  // Model thread: one phase of call v of MoE layer L, enqueued: a handshake kernel stores
  // `out` (router_ready starts a call, resident_done the second phase), waits on the device
  // for `in`, then takes the phase's list the host published in `host` (in phase 2 it also
  // marks the pairs phase 1 computed done). Phase 2 then runs the copy kernel over its landed
  // records; phase 1 runs none: its handshake zeroes clear[0, nk) (the pairs' done flags), and
  // its copies ride with its gate/up launch (device_copies()). Phase 1's list carries phase
  // 2's when the plan settled it (PhaseHandshake::settled_table_offset). Returns the phase's
  // expert table on the device. from_map: phase 1 first tries the hits on the device
  // (PhaseHandshake::hit_slots; not with lookahead, whose prefetches' copies ride in the lists
  // every layer's device must read).
  const cuda::ExpertRef* enqueue_phase(int64_t L, uint64_t v, const PhaseList& host, cuda::Signal out, cuda::Signal in,
                                       size_t nk, uint8_t* clear, bool from_map = false);
  // The phase's copy list in device memory, as launch_moe_experts takes it.
  cuda::CopyList device_copies() const {
    const PhaseList dev = device_phase();
    return {dev.copies, dev.count};
  }
  // The host's slot map the device reads: [n_records] i32, the device slot holding the
  // record's main kind once its copy is listed (or done on the stream), -1 otherwise (free,
  // loading, landed but not listed, evicted). Written by whichever thread changes the cache
  // (under mu); the device reads it only in stream order after that thread's signal or launch.
  cuda::MappedHostBuffer hit_slot_mem;
  int32_t* hit_slots() const { return reinterpret_cast<int32_t*>(hit_slot_mem.data()); }
  // The record in `slot` (the main kind) is in device memory now, or leaves it.
  void map_slot(int32_t slot);
  void unmap_slot(int32_t slot, int64_t record, DType k);
  // The table entry of slot 0 for the main kind (device memory), for the device's entries of
  // the map's hits: uploaded by the model thread at its first decode call (it needs `math`).
  cuda::DeviceBuffer d_slot_ref;
  bool slot_ref_uploaded = false;  // model thread only
  // The device slot a copy descriptor writes to.
  int32_t slot_of(const cuda::CopyDesc& d) const {
    return static_cast<int32_t>((static_cast<const uint8_t*>(d.dst) - slots.as()) / static_cast<ptrdiff_t>(slot_bytes));
  }
  // A device-side wait that timed out (host-mapped u32: the MoE layer + 1, 0: none) as an
  // error naming the layer; nothing when none did.
  void throw_if_device_timed_out() const;
  // The model thread's variant: copies landed fills on the stream itself.
  void copy_landed_on_stream();
  // One landed fill copied into its slot on `on` (cudaMemcpyAsync), its slot resident, the
  // fill retiring once the stream passed the copy.
  void copy_fill(const Fill& f, cudaStream_t on);
  // The device passed the first n listed copies (all of them by default): their host memory
  // is free again, and fills waiting for a staging buffer get it.
  void retire(size_t n = SIZE_MAX);
  size_t in_flight() const { return reading.size() + waiting.size() + landed.size(); }
  void release_pins();
  void preload_host_tier();

  // ---- the service thread (service.cpp) ----
  void service_loop();
  void run_layer(const Job& j);
  void release_device(const Job& j);
  void wait_signal(int64_t layer, cuda::Signal sig, uint64_t value);
  void lookahead(const Job& j, const LayerView& lv, StepFills& fills);
  void set_error(const Error& e);
  int64_t model_layer(int64_t L) const { return pack->manifest().moe_layers[static_cast<size_t>(L)]; }
  // The layer's routing to the observer (--trace-routing), when there is one.
  void observe(int64_t L, int64_t n, const LayerView& lv);

  // ---- the model thread (cuda_streamer.cpp, grouped.cpp) ----
  void throw_if_failed();
  void barrier();
  // The end of a forward whose output the host has read (forward_done): the service thread
  // has answered every layer of it, or is about to. Once it has (polled for up to 100 us) the
  // last step's pins are released and the copies retired here, under mu, without a barrier
  // job (whose two thread hand-offs cost ~35 us a token, bench/RESULTS.md); else the barrier.
  void end_forward();
  void ensure_capacity(int64_t n);
  LayerView layer_view(int64_t L, uint64_t call) const;  // call: the handshake value (its ring entry)
  void wait_routing_slot(int64_t L, uint64_t call);      // model thread, before the call's top-k
  void grouped(const MoeLayerCall& c, const cuda::MoeShape& shape, const LayerView& lv);  // lv: moe()'s
  // A call the model routed on the host (host_routed.cpp): grouped()'s rounds, each group's
  // experts computed by expert_pairs_forward on views of their slots as they become
  // resident (land_group), then one combine.
  void host_routed(Backend& be, const MoeLayerCall& c);
  // The synchronous paths' rounds (grouped.cpp; mu held, device idle at a group's start):
  // load_group plans rows [row0, row1) of ids/weights (the call's routing), reads its misses
  // (with lookahead, the next layer's prediction behind them), copies them on the stream and
  // returns once every expert of the group is resident (a timeout naming the layer
  // otherwise); retire_group waits for the group's compute and unpins its slots.
  // land_synchronously copies landed records on the stream (a StepFills' progress);
  // wait_group_resident is load_group's wait.
  StepPlan load_group(const MoeLayerCall& c, std::span<const int32_t> ids, std::span<const float> weights, int64_t row0,
                      int64_t row1, LayerStats& ls);
  // load_group without the wait: the group's reads (and lookahead) are out when it returns.
  StepPlan plan_group(const MoeLayerCall& c, std::span<const int32_t> ids, std::span<const float> weights, int64_t row0,
                      int64_t row1, LayerStats& ls);
  // The grouped kernels over a group planned by plan_group, in waves as its experts land
  // (moe_kernels.h, launch_moe_grouped_*): the resident ones at once, then the landed ones,
  // while the rest are still being read; at most kPrefillWaves launches, the last once every
  // expert is resident. Returns when the last wave is enqueued (retire_group waits for it).
  void compute_in_waves(const StepPlan& plan, const cuda::MoeGroupedParams& rows, int64_t L, LayerStats& ls);
  // An expert table of plan.experts[i] for i in `experts` (every other entry unavailable),
  // written at `host` (page-locked: it must stay as it is until the stream passed the copy)
  // and copied to `dev` on the stream; returns dev.
  const cuda::ExpertRef* upload_table(const StepPlan& plan, std::span<const size_t> experts, cuda::ExpertRef* host,
                                      cuda::ExpertRef* dev);
  void retire_group();
  size_t land_synchronously();
  // The synchronous paths' wait bound: a timeout naming the layer once nothing landed since
  // `since` for the wait timeout.
  void check_landing(int64_t L, StreamerClock::time_point since) const;
  void wait_group_resident(const StepPlan& plan, int64_t L, LayerStats& ls);
  // The synchronous paths' one loop over a planned group: lands reads (copying them on the
  // stream) until every expert of the plan was handed to `compute` (indices into
  // plan.experts, each once), which gets the resident ones not yet handed over whenever
  // take_now(how many, how many are left) says so; a timeout naming the layer when nothing
  // moved for the wait timeout. The time spent is the layer's demand wait.
  void land_group(const StepPlan& plan, int64_t L, LayerStats& ls,
                  const std::function<bool(size_t ready, size_t left)>& take_now,
                  const std::function<void(std::span<const size_t> experts)>& compute);
  // Whether a call of this shape computes on the grouped (tensor-core) kernels: one expert
  // kind in the cache and enough pairs an expert (moe_kernels.h).
  static bool grouped_kernels_apply(const cuda::MoeShape& shape) {
    return shape.wtype != cuda::WType::unavailable &&
           shape.n_rows * shape.k >= cuda::kMoeGroupedPairsPerExpert * shape.n_expert;
  }

  // The pack, the kinds, the layout, the residencies, the IO engine and the statistics are
  // the StreamState's.
  CudaBackend& be;
  cudaStream_t stream;
  cuda::HostWait wait_mode;
  int64_t n_embd = 0, n_ff = 0;
  // The experts' activation as the model's calls give it (ref() writes it into the table
  // entries): set by the model thread at its first moe() call, before it queues that call's
  // job, so the service thread reads it only after taking a job (under q_mu); every later
  // call must give the same.
  ExpertMath math;
  bool math_known = false;  // model thread only
  // Per-layer routing scales (MoeLayerCall::expert_scale) on the device, copied at a layer's
  // first call: [n_layers][n_expert] f32; model thread only.
  cuda::DeviceBuffer d_expert_scale;
  std::vector<bool> expert_scale_copied;
  const float* expert_scale_on_device(int64_t layer, std::span<const float> scale);

  // The cache's memory: device slots; the pinned host tier (inclusive: every record read from
  // the pack), staging buffers for reads when there is no tier.
  cuda::DeviceBuffer slots;
  cuda::RegisteredHostBuffer host_mem;
  cuda::RegisteredHostBuffer staging_mem;
  std::vector<int32_t> staging_free;

  std::unordered_map<uint64_t, Fill> reading;  // by tag
  uint64_t next_tag = 1;
  std::vector<Fill> landed;    // read, not yet listed for a copy
  std::vector<Fill> retiring;  // listed; their host memory is held until the device passed them
  std::deque<Fill> waiting;    // reads waiting for a staging buffer
  std::vector<ReadCompletion> completions;
  uint64_t h2d_bytes = 0, h2d_base = 0;

  // The handshake and the buffers of the enqueued calls.
  std::unique_ptr<cuda::Handshake> hs;
  std::vector<uint64_t> calls;  // [n_layers] handshake value of the latest call
  StreamerClock::time_point last_enqueue{};  // model thread: when the previous moe() returned (debug timing)
  int64_t cap_rows = 0;
  size_t layer_stride = 0;
  cuda::MappedHostBuffer layer_mem;  // [n_layers * layer_stride]
  cuda::DeviceBuffer d_ids, d_w, d_pids, d_pw, d_done, d_act, d_pair, d_plog;
  cuda::DeviceBuffer d_group;  // the grouped expert kernels' scratch (moe_grouped_scratch_bytes)
  // With inputs scaled by the routing weights (Llama 4, ExpertMath::scale_input; allocated
  // only then): each pair's input row [cap * k, n_embd] and the pairs' combined rows of a
  // grouped call [cap * k, n_embd].
  cuda::DeviceBuffer d_x, d_pair_sum;
  // What the expert kernels of a call's rows from row0 read: the inputs (the call's h, or with
  // scaled inputs d_x, a row per pair), the shape they run as, the combine's weights (the
  // routing's, or null: 1).
  struct ExpertInputs {
    const float* h;
    cuda::MoeShape shape;
    const float* combine_weights;
  };
  ExpertInputs expert_inputs(const MoeLayerCall& c, const cuda::MoeShape& shape, int64_t row0 = 0) const;
  // A streamed prefill group's wave tables (compute_in_waves): [kPrefillWaves][n_expert], each
  // written once a group and copied to its own device slice, so no wave's table is rewritten
  // before the stream passed it (retire_group synchronizes between groups).
  static constexpr int kPrefillWaves = 8;
  cuda::MappedHostBuffer wave_tables;
  cuda::DeviceBuffer d_wave_tables;
  // A phase's list on the device (PhaseList's layout, phase_list_bytes): the decode phases'
  // and the grouped path's expert table and copy list.
  cuda::DeviceBuffer d_phase;
  cuda::DeviceBuffer d_calls;         // [n_layers] u64: the device's count of each layer's calls
  // SLUICE_CUDA_HANDSHAKE_TIMES=1: the handshake kernels' timeline sums
  // (PhaseHandshake::times), printed as a table on stderr when the streamer is destroyed.
  cuda::DeviceBuffer d_times;
  double barrier_seconds = 0;  // with d_times: forward_done's waits for the service thread (model thread)
  uint64_t barriers_timed = 0;
  void print_handshake_times();
  cuda::MappedHostBuffer device_failed;  // u32: the first layer (+ 1) whose device-side wait timed out
  PhaseList device_phase() const { return phase_list_at(d_phase.as()); }

  // The service thread and its queue.
  std::mutex q_mu;
  std::condition_variable q_cv, done_cv;
  std::deque<Job> jobs;
  uint64_t barriers_asked = 0, barriers_done = 0;
  std::vector<uint64_t> calls_done;  // under q_mu: [n_layers] the latest call the service thread finished
  bool layer_job_running = false;  // under q_mu: the service thread is answering a layer
  std::optional<Error> error;  // under q_mu
  std::atomic<bool> failed{false};
  std::thread service;
  bool published_resident = false, published_misses = false;  // of the job in progress
  bool warned_lossy_host_routed = false;  // host_routed.cpp: lossy options do not apply there (said once)
  bool delayed_publish = false;  // StreamerOptions::test_publish_delay_us was waited (service thread)

  // The cache state: residency, host tier, fills, pins, statistics. The service thread holds
  // it while it works; the model thread only between barriers (the grouped path).
  mutable std::mutex mu;
  std::vector<int32_t> pins;  // device slots the latest step's computation reads
  RoutingObserver observer;
};

}  // namespace sluice
