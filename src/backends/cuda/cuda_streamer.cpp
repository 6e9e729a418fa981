// CudaStreamer: device slots, fills (read into pinned memory -> copy into the slot -> event),
// the service thread answering the handshake, the synchronous grouped path for large
// batches, and the statistics.
#include "backends/cuda/cuda_streamer.h"

#include <sys/mman.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/expert_copy.h"
#include "backends/cuda/handshake.h"
#include "backends/cuda/moe_kernels.h"
#include "core/bits.h"
#include "core/log.h"
#include "core/units.h"
#include "experts/io_engine.h"
#include "experts/plan.h"

namespace sluice {

using Clock = std::chrono::steady_clock;

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Host memory the device reads: cudaHostAlloc'ed and mapped into the device's address space.
// For the handshake tables only: direct reads cannot land in it (its pages belong to the
// driver's device file, and O_DIRECT answers EFAULT).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(size_t bytes, const char* what) {
    cudaError_t err = cudaHostAlloc(&p_, std::max<size_t>(bytes, 1), cudaHostAllocPortable | cudaHostAllocMapped);
    SLUICE_CHECK(err == cudaSuccess, Status::out_of_memory, "cuda: cannot pin ", byte_size_text(bytes),
                 " of host memory for ", what, ": ", cudaGetErrorString(err));
    std::memset(p_, 0, std::max<size_t>(bytes, 1));
    CUDA_CHECK(cudaHostGetDevicePointer(&dev_, p_, 0));
  }
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), dev_(o.dev_) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(dev_, o.dev_);
    return *this;
  }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }
  // The device's address of host address `h` inside this buffer.
  template <typename T>
  T* dev(T* h) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(dev_) + (reinterpret_cast<uint8_t*>(h) - data()));
  }

 private:
  void* p_ = nullptr;
  void* dev_ = nullptr;
};

// Page-aligned anonymous host memory, page-locked and mapped for the device
// (cudaHostRegister): direct reads land in it, and the copy kernel reads it over PCIe.
class HostMem {
 public:
  HostMem() = default;
  HostMem(size_t bytes, const char* what) : bytes_(std::max<size_t>(io_align_up(bytes), kIoAlign)) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    SLUICE_CHECK(p != MAP_FAILED, Status::out_of_memory, "cannot allocate ", byte_size_text(bytes_),
                 " of host memory for ", what);
    p_ = p;
    cudaError_t err = cudaHostRegister(p_, bytes_, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (err != cudaSuccess) {
      ::munmap(p_, bytes_);
      p_ = nullptr;
      fail(Status::out_of_memory, "cuda: cannot page-lock ", byte_size_text(bytes_), " of host memory for ", what, ": ",
           cudaGetErrorString(err), " (a smaller --host-cache or --expert-cache needs less)");
    }
    CUDA_CHECK(cudaHostGetDevicePointer(&dev_, p_, 0));
  }
  ~HostMem() {
    if (!p_) return;
    cudaHostUnregister(p_);
    ::munmap(p_, bytes_);
  }
  HostMem(HostMem&& o) noexcept : p_(std::exchange(o.p_, nullptr)), dev_(o.dev_), bytes_(o.bytes_) {}
  HostMem& operator=(HostMem&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(dev_, o.dev_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }
  const void* dev(const uint8_t* h) const { return static_cast<uint8_t*>(dev_) + (h - data()); }
  void leak() { p_ = nullptr; }  // reads may still write into it: never unmap

 private:
  void* p_ = nullptr;
  void* dev_ = nullptr;
  size_t bytes_ = 0;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const char* what) {
    cudaError_t err = cudaMalloc(&p_, std::max<size_t>(bytes, 1));
    SLUICE_CHECK(err == cudaSuccess, Status::out_of_memory, "cuda: cannot allocate ", byte_size_text(bytes),
                 " of device memory for ", what, ": ", cudaGetErrorString(err));
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  template <typename T = uint8_t>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

int32_t expert_wtype(ExpertKind k) {
  switch (k) {
    case ExpertKind::bf16: return cuda::expert_bf16;
    case ExpertKind::int8: return cuda::expert_q8;
    case ExpertKind::q4: return cuda::expert_q4;
    case ExpertKind::q2: return cuda::expert_q2;
  }
  fail(Status::internal, "cuda streamer: unknown expert kind");
}

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

struct CudaStreamer::Impl {
  // One record on its way into a device slot: read into page-locked host memory (reading),
  // landed there (landed), then listed for a copy kernel the device runs later (retiring:
  // the slot counts as resident from then on, since every reader of the slot runs after the
  // copy on the same stream; the host memory is reused once the device passed the copy).
  struct Fill {
    int32_t slot = -1;      // device slot (state loading until its copy is listed)
    int64_t record = -1;
    ExpertKind kind = ExpertKind::bf16;
    IoPriority priority = IoPriority::demand;
    int32_t staging = -1;   // the host source: a staging buffer, or
    int32_t host_slot = -1; // a host-tier record (pinned in the tier until retired)
  };
  // One distinct expert of a step and what the step did with it.
  struct Want : StepExpert {
    AcquireStatus status = AcquireStatus::no_slot;
    int32_t slot = -1, low_slot = -1;
    bool candidate = false;  // a late miss the deadline may cut
    bool done = false;       // in a published table, substituted or dropped
    bool dropped = false, low = false;
  };
  struct Job {
    enum class Kind { layer, barrier, stop } kind = Kind::layer;
    int64_t layer = 0;
    uint64_t value = 0;  // the handshake value of this call (layer jobs), or the barrier's id
    int64_t n = 0;
    bool lookahead = false;
  };
  // The host-mapped per-layer handshake memory: ids, weights, predicted ids and weights
  // [cap * k], table 1 and table 2 [n_expert], the copy lists of both phases [n_slots] and
  // their lengths.
  struct LayerView {
    int32_t* ids;
    float* weights;
    int32_t* pred_ids;
    float* pred_weights;
    cuda::ExpertRef* table1;
    cuda::ExpertRef* table2;
    cuda::CopyDesc* copies1;
    cuda::CopyDesc* copies2;
    uint32_t* count1;
    uint32_t* count2;
  };

  Impl(std::shared_ptr<const Pack> p, ExpertKind k, int64_t topk, CudaBackend& b, const StreamerOptions& o);
  ~Impl();

  // ---- fills (callers hold mu) ----
  uint8_t* slot_ptr(int32_t slot) const { return slots.as() + static_cast<uint64_t>(slot) * slot_bytes; }
  uint8_t* host_ptr(int32_t h) const { return host_mem.data() + static_cast<uint64_t>(h) * slot_bytes; }
  uint8_t* staging_ptr(int32_t s) const { return staging_mem.data() + static_cast<uint64_t>(s) * slot_bytes; }
  bool resident(int32_t slot, int64_t record, ExpertKind k) const {
    return slot >= 0 && residency->state(slot) == SlotState::resident && residency->record(slot) == record &&
           residency->kind(slot) == k;
  }
  cuda::ExpertRef ref(int32_t slot, ExpertKind k) const;
  std::string describe(int64_t record, ExpertKind k) const {
    return str("expert record ", record, " (", pack->describe_record(k, record), ")");
  }
  bool start_fill(const AcquireResult& a, int64_t record, ExpertKind k, IoPriority priority);
  void submit_read(Fill f, void* dest);
  void fail_fill(const Fill& f);
  void on_read(const ReadCompletion& c);
  size_t pump();  // lands read completions; no CUDA call
  const uint8_t* source(const Fill& f) const { return f.host_slot >= 0 ? host_ptr(f.host_slot) : staging_ptr(f.staging); }
  // Lists every landed fill in a copy list (descs[*count ...]) and counts its slot resident.
  // Fills waiting for a staging buffer get the free ones and their reads go out.
  void submit_waiting();
  size_t list_landed(cuda::CopyDesc* descs, uint32_t& count);
  // Bytes of one phase's copy list: a descriptor per slot.
  size_t copy_list_bytes() const { return static_cast<size_t>(residency->n_slots()) * sizeof(cuda::CopyDesc); }
  // Model thread: enqueues, behind the signal that publishes it, the copy of a phase's list
  // (host-mapped) to the device and the copy kernel that reads it there.
  void enqueue_copies(const cuda::CopyDesc* descs, const uint32_t* count) {
    auto* d_descs = d_copies.as<cuda::CopyDesc>();
    auto* d_count = reinterpret_cast<uint32_t*>(d_copies.as() + copy_list_bytes());
    CUDA_CHECK(cudaMemcpyAsync(d_count, count, sizeof(uint32_t), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(d_descs, descs, copy_list_bytes(), cudaMemcpyHostToDevice, stream));
    cuda::launch_expert_copies(d_descs, d_count, stream);
  }
  // The model thread's variant: copies landed fills on the stream itself.
  void copy_landed_on_stream();
  // The device passed the first n listed copies (all of them by default): their host memory
  // is free again, and fills waiting for a staging buffer get it.
  void retire(size_t n = SIZE_MAX);
  size_t in_flight() const { return reading.size() + waiting.size() + landed.size(); }
  void release_pins();
  void preload_host_tier();

  // ---- the service thread ----
  void service_loop();
  void run_layer(const Job& j);
  void release_device(const Job& j);
  void wait_signal(int64_t layer, cuda::Signal sig, uint64_t value);
  // land: lists (or copies) the landed fills, so their slots stop loading; returns how many.
  void plan_step(std::vector<Want>& wants, int64_t L, LayerStats& ls, bool deadline,
                 const std::function<size_t()>& land);
  void lookahead(const Job& j, const LayerView& lv);
  void set_error(const Error& e);
  int64_t model_layer(int64_t L) const { return pack->manifest().moe_layers[static_cast<size_t>(L)]; }

  // ---- the model thread ----
  void throw_if_failed();
  void barrier();
  void ensure_capacity(int64_t n);
  LayerView layer_view(int64_t L) const;
  void grouped(const MoeLayerCall& c, const cuda::MoeShape& shape);

  std::shared_ptr<const Pack> pack;
  ExpertKind kind;
  int64_t top_k;
  StreamerOptions opt;
  CudaBackend& be;
  cudaStream_t stream;
  cuda::HostWait wait_mode;
  int64_t n_expert = 0, n_layers = 0, n_embd = 0, n_ff = 0;
  uint64_t slot_bytes = 0;

  // The cache: device slots and their residency; the pinned host tier (inclusive: every
  // record read from the pack), staging buffers for reads when there is no tier.
  DeviceBuffer slots;
  std::unique_ptr<Residency> residency;
  HostMem host_mem;
  std::unique_ptr<Residency> host;
  HostMem staging_mem;
  std::vector<int32_t> staging_free;

  std::unique_ptr<IoEngine> io;
  std::map<ExpertKind, int32_t> files;
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
  Clock::time_point last_enqueue{};  // model thread: when the previous moe() returned (debug timing)
  int64_t cap_rows = 0;
  size_t layer_stride = 0;
  PinnedBuffer layer_mem;  // [n_layers * layer_stride]
  DeviceBuffer d_ids, d_w, d_pids, d_pw, d_done, d_act, d_pair, d_plog, d_table;
  DeviceBuffer d_copies;  // [n_slots] CopyDesc then the count: a phase's copy list on the device

  // The service thread and its queue.
  std::mutex q_mu;
  std::condition_variable q_cv, done_cv;
  std::deque<Job> jobs;
  uint64_t barriers_asked = 0, barriers_done = 0;
  std::optional<Error> error;  // under q_mu
  std::atomic<bool> failed{false};
  std::thread service;
  bool published_resident = false, published_misses = false;  // of the job in progress

  // The cache state: residency, host tier, fills, pins, statistics. The service thread holds
  // it while it works; the model thread only between barriers (the grouped path).
  mutable std::mutex mu;
  std::vector<int32_t> pins;  // device slots the latest step's computation reads
  std::vector<LayerStats> layers;
  IoCounters io_base;
  RoutingObserver observer;
};

CudaStreamer::Impl::Impl(std::shared_ptr<const Pack> p, ExpertKind k, int64_t topk, CudaBackend& b,
                         const StreamerOptions& o)
    : pack(std::move(p)), kind(k), top_k(topk), opt(o), be(b), stream(b.stream()),
      wait_mode(o.wait_mode == WaitMode::spin ? cuda::HostWait::spin : cuda::HostWait::block) {
  SLUICE_CHECK(pack, Status::internal, "cuda expert streamer without a pack");
  const PackManifest& m = pack->manifest();
  check_streaming_options(*pack, kind, top_k, opt);
  n_expert = m.n_expert;
  n_layers = static_cast<int64_t>(m.moe_layers.size());
  n_embd = m.n_embd;
  n_ff = m.n_ff;
  slot_bytes = streaming_slot_bytes(*pack, kind, opt.miss_kind);
  const CacheLayout layout = plan_cache_layout(*pack, top_k, slot_bytes, opt);
  CUDA_CHECK(cudaSetDevice(be.device()));

  ResidencyOptions ro;
  ro.n_slots = layout.n_slots;
  ro.n_records = m.n_records();
  ro.speculative_slots = layout.speculative_slots;
  ro.policy = opt.policy;
  residency = std::make_unique<Residency>(ro);
  slots = DeviceBuffer(static_cast<size_t>(layout.n_slots) * slot_bytes,
                       str("the expert cache (", layout.n_slots, " slots of ", byte_size_text(slot_bytes),
                           "; ask for a smaller --expert-cache)")
                           .c_str());
  if (layout.host_slots > 0) {
    ResidencyOptions ho;
    ho.n_slots = layout.host_slots;
    ho.n_records = m.n_records();
    ho.policy = PolicyKind::lru;
    host = std::make_unique<Residency>(ho);
    host_mem = HostMem(static_cast<size_t>(layout.host_slots) * slot_bytes, "the host-RAM expert tier");
  }
  // Staging: a buffer per device slot (a slot's record waits in it until the device copied
  // it), fewer with a host tier, where reads land in the tier.
  const int32_t n_staging = host ? std::max(4, 2 * opt.io_depth) : layout.n_slots;
  staging_mem = HostMem(static_cast<size_t>(n_staging) * slot_bytes, "expert read staging");
  for (int32_t i = n_staging - 1; i >= 0; --i) staging_free.push_back(i);

  IoEngineOptions io_opt;
  io_opt.mode = opt.io_mode;
  io_opt.queue_depth = opt.io_depth;
  io_opt.request_timeout = opt.io_timeout;
  if (opt.io_fault_injection)
    io_opt.fault_injection = [f = opt.io_fault_injection](const ReadRequest& q, int64_t res) { return f(q.record, res); };
  io = std::make_unique<IoEngine>(io_opt);
  files[kind] = io->add_file(pack->expert_file(kind));
  if (opt.miss_kind) files[*opt.miss_kind] = io->add_file(pack->expert_file(*opt.miss_kind));
  io_base = io->counters();

  if (host && opt.host_cache_preload) preload_host_tier();
  hs = std::make_unique<cuda::Handshake>(n_layers);
  calls.assign(static_cast<size_t>(n_layers), 0);
  layers.assign(static_cast<size_t>(n_layers), LayerStats{});
  d_table = DeviceBuffer(static_cast<size_t>(n_expert) * sizeof(cuda::ExpertRef), "the expert table");
  d_copies = DeviceBuffer(copy_list_bytes() + sizeof(uint32_t), "the copy list");
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
        *layer_view(L).count1 = 0;
        std::fill(layer_view(L).table1, layer_view(L).table1 + n_expert, cuda::ExpertRef{});
        hs->store(L, cuda::Signal::resident_ready, v);
      }
      if (hs->load(L, cuda::Signal::misses_ready) < v) {
        *layer_view(L).count2 = 0;
        std::fill(layer_view(L).table2, layer_view(L).table2 + n_expert, cuda::ExpertRef{});
        hs->store(L, cuda::Signal::misses_ready, v);
      }
    }
  }
  cudaStreamSynchronize(stream);
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

// Reads the first records of the pack into the host tier (as many as it holds), then measures
// host-to-device bandwidth from it: the copy engine and the copy kernel, each over up to 1 GiB.
void CudaStreamer::Impl::preload_host_tier() {
  const int64_t n = std::min<int64_t>(host->n_slots(), pack->manifest().n_records());
  const uint64_t stride = pack->kind(kind).record_stride;
  std::unordered_map<uint64_t, int32_t> slot_of_tag;
  std::vector<ReadCompletion> done;
  int64_t next = 0, landed_n = 0;
  const auto t0 = Clock::now();
  auto since = t0;
  while (landed_n < n) {
    while (next < n && static_cast<int64_t>(slot_of_tag.size()) < 4 * opt.io_depth) {
      const AcquireResult a = host->acquire(next, kind);
      SLUICE_ASSERT(a.status == AcquireStatus::miss);
      ReadRequest q;
      q.file = files.at(kind);
      q.offset = pack->record_offset(kind, next);
      q.bytes = stride;
      q.dest = host_ptr(a.slot);
      q.record = next;
      q.tag = next_tag++;
      slot_of_tag[q.tag] = a.slot;
      io->submit(q);
      ++next;
    }
    done.clear();
    io->poll(done, std::chrono::milliseconds(50));
    for (const ReadCompletion& c : done) {
      const int32_t hs_slot = slot_of_tag.at(c.tag);
      slot_of_tag.erase(c.tag);
      SLUICE_CHECK(c.status == Status::ok, c.status, "--host-cache-preload: ", describe(c.record, kind), ": ", c.error);
      host->complete_load(hs_slot);
      host->release(hs_slot);
      ++landed_n;
      since = Clock::now();
    }
    SLUICE_CHECK(Clock::now() - since < opt.io_timeout, Status::timeout, "--host-cache-preload: no read landed for ",
                 std::chrono::duration<double>(opt.io_timeout).count(), " s");
  }
  const double s_read = seconds_between(t0, Clock::now());
  const double gb = static_cast<double>(n) * static_cast<double>(stride) / 1e9;
  // H2D peaks from the tier into the slots (nothing is resident yet).
  const size_t bytes = std::min<size_t>({size_t{1} << 30, static_cast<size_t>(n) * stride,
                                         static_cast<size_t>(residency->n_slots()) * slot_bytes}) / 4096 * 4096;
  PinnedBuffer probe(sizeof(cuda::CopyDesc) + 64, "the H2D probe");
  auto* desc = reinterpret_cast<cuda::CopyDesc*>(probe.data());
  auto* count = reinterpret_cast<uint32_t*>(probe.data() + sizeof(cuda::CopyDesc));
  *desc = cuda::CopyDesc{host_mem.dev(host_mem.data()), slots.as(), bytes};
  *count = 1;
  double best_ce = 0, best_kernel = 0;
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int rep = 0; rep < 3; ++rep) {
    for (int kernel = 0; kernel < 2; ++kernel) {
      CUDA_CHECK(cudaEventRecord(e0, stream));
      if (kernel) cuda::launch_expert_copies(probe.dev(desc), probe.dev(count), stream);
      else CUDA_CHECK(cudaMemcpyAsync(slots.as(), host_mem.data(), bytes, cudaMemcpyHostToDevice, stream));
      CUDA_CHECK(cudaEventRecord(e1, stream));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      const double gbs = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
      (kernel ? best_kernel : best_ce) = std::max(kernel ? best_kernel : best_ce, gbs);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  io_base = io->counters();
  LOG_WARN("host tier preloaded: ", n, " records, ", gb, " GB in ", s_read, " s = ", gb / s_read,
           " GB/s read; H2D from the tier over ", bytes / 1048576, " MiB: copy engine ", best_ce,
           " GB/s, copy kernel ", best_kernel, " GB/s");
}

cuda::ExpertRef CudaStreamer::Impl::ref(int32_t slot, ExpertKind k) const {
  const PackKindInfo& info = pack->kind(k);
  const uint8_t* base = slot_ptr(slot);
  cuda::ExpertRef r;
  const PackBlock* blocks[3] = {&info.gate, &info.up, &info.down};
  for (int i = 0; i < 3; ++i) {
    r.data[i] = base + blocks[i]->offset;
    r.scales[i] = blocks[i]->scale_bytes ? base + blocks[i]->scale_offset : nullptr;
  }
  r.wtype = expert_wtype(k);
  return r;
}

// ---- fills ----

bool CudaStreamer::Impl::start_fill(const AcquireResult& a, int64_t record, ExpertKind k, IoPriority priority) {
  if (opt.fake_experts) {  // the slot keeps whatever it holds (--fake-experts)
    residency->complete_load(a.slot);
    return false;
  }
  Fill f;
  f.slot = a.slot;
  f.record = record;
  f.kind = k;
  f.priority = priority;
  if (host) {
    const int32_t h = host->find(record, k);
    if (h >= 0 && host->state(h) == SlotState::resident) {
      const AcquireResult ha = host->acquire(record, k);  // a hit: pinned until retired
      f.host_slot = ha.slot;
      landed.push_back(f);
      return true;
    }
    if (h < 0) {
      const AcquireResult ha = host->acquire(record, k);
      if (ha.status == AcquireStatus::miss) {
        f.host_slot = ha.slot;
        submit_read(f, host_ptr(ha.slot));
        return false;
      }
      if (ha.slot >= 0) host->release(ha.slot);
    }
  }
  if (staging_free.empty()) {
    waiting.push_back(f);
    return false;
  }
  f.staging = staging_free.back();
  staging_free.pop_back();
  submit_read(f, staging_ptr(f.staging));
  return false;
}

void CudaStreamer::Impl::submit_read(Fill f, void* dest) {
  ReadRequest q;
  q.file = files.at(f.kind);
  q.offset = pack->record_offset(f.kind, f.record);
  q.bytes = pack->kind(f.kind).record_stride;
  q.dest = dest;
  q.record = f.record;
  q.tag = next_tag++;
  q.priority = f.priority;
  reading[q.tag] = f;
  try {
    io->submit(q);
  } catch (...) {
    reading.erase(q.tag);
    fail_fill(f);
    throw;
  }
}

void CudaStreamer::Impl::fail_fill(const Fill& f) {
  if (residency->state(f.slot) == SlotState::loading) residency->fail_load(f.slot);
  if (f.host_slot >= 0 && host->state(f.host_slot) == SlotState::loading) host->fail_load(f.host_slot);
  if (f.staging >= 0) staging_free.push_back(f.staging);
}

void CudaStreamer::Impl::on_read(const ReadCompletion& c) {
  auto it = reading.find(c.tag);
  if (it == reading.end()) return;
  const Fill f = it->second;
  reading.erase(it);
  if (c.status != Status::ok) {
    fail_fill(f);
    throw Error(c.status, str(describe(f.record, f.kind), ": ", c.error));
  }
  const uint8_t* src = f.host_slot >= 0 ? host_ptr(f.host_slot) : staging_ptr(f.staging);
  if (opt.verify_reads) {
    const PackKindInfo& info = pack->kind(f.kind);
    const uint64_t got = XXH3_64bits(src, info.record_bytes);
    const uint64_t want = info.checksums[static_cast<size_t>(f.record)];
    if (got != want) {
      fail_fill(f);
      fail(Status::corrupt, describe(f.record, f.kind), " read from ", pack->expert_file(f.kind).string(), " at offset ",
           pack->record_offset(f.kind, f.record), ": checksum mismatch (manifest ", hex16(want), ", data ", hex16(got),
           "); the pack is corrupt (sluice verify lists every bad record)");
    }
  }
  if (f.host_slot >= 0) host->complete_load(f.host_slot);
  landed.push_back(f);
}

void CudaStreamer::Impl::submit_waiting() {
  while (!waiting.empty() && !staging_free.empty()) {
    Fill f = waiting.front();
    waiting.pop_front();
    f.staging = staging_free.back();
    staging_free.pop_back();
    submit_read(f, staging_ptr(f.staging));
  }
}

size_t CudaStreamer::Impl::pump() {
  size_t progress = 0;
  std::optional<Error> first;
  completions.clear();
  if (io->has_completions()) io->poll(completions, std::chrono::milliseconds(0));
  for (const ReadCompletion& c : completions) {
    try {
      on_read(c);
      ++progress;
    } catch (const Error& e) {
      if (!first) first = e;
    }
  }
  submit_waiting();
  if (first) throw *first;
  return progress;
}

size_t CudaStreamer::Impl::list_landed(cuda::CopyDesc* descs, uint32_t& count) {
  const size_t n = landed.size();
  SLUICE_ASSERT(count + n <= static_cast<size_t>(residency->n_slots()));
  for (const Fill& f : landed) {
    const uint64_t bytes = (pack->kind(f.kind).record_bytes + 15) / 16 * 16;  // within the stride
    const uint8_t* src = source(f);
    descs[count++] = cuda::CopyDesc{f.host_slot >= 0 ? host_mem.dev(src) : staging_mem.dev(src), slot_ptr(f.slot), bytes};
    residency->complete_load(f.slot);
    h2d_bytes += bytes;
    retiring.push_back(f);
  }
  landed.clear();
  return n;
}

void CudaStreamer::Impl::copy_landed_on_stream() {
  for (const Fill& f : landed) {
    const uint64_t bytes = pack->kind(f.kind).record_bytes;
    CUDA_CHECK(cudaMemcpyAsync(slot_ptr(f.slot), source(f), bytes, cudaMemcpyHostToDevice, stream));
    residency->complete_load(f.slot);
    h2d_bytes += bytes;
    retiring.push_back(f);
  }
  landed.clear();
}

void CudaStreamer::Impl::retire(size_t n) {
  n = std::min(n, retiring.size());
  for (size_t i = 0; i < n; ++i) {
    const Fill& f = retiring[i];
    if (f.host_slot >= 0 && host->state(f.host_slot) != SlotState::free && host->pins(f.host_slot) > 0)
      host->release(f.host_slot);
    if (f.staging >= 0) staging_free.push_back(f.staging);
  }
  retiring.erase(retiring.begin(), retiring.begin() + static_cast<std::ptrdiff_t>(n));
  submit_waiting();
}

void CudaStreamer::Impl::release_pins() {
  for (int32_t s : pins)
    if (residency->state(s) != SlotState::free && residency->pins(s) > 0) residency->release(s);
  pins.clear();
}

// ---- the service thread ----

void CudaStreamer::Impl::set_error(const Error& e) {
  {
    std::lock_guard<std::mutex> lk(q_mu);
    if (!error) error = e;
  }
  failed = true;
  done_cv.notify_all();
}

void CudaStreamer::Impl::service_loop() {
  for (;;) {
    Job j;
    {
      std::unique_lock<std::mutex> lk(q_mu);
      while (jobs.empty()) {
        // Idle: land background reads (cut experts, prefetches) so their slots free up.
        lk.unlock();
        bool busy = false;
        {
          std::lock_guard<std::mutex> g(mu);
          if (!failed) {
            try {
              pump();
            } catch (const Error& e) {
              set_error(e);
            }
          }
          busy = in_flight() > 0;
        }
        lk.lock();
        if (jobs.empty()) q_cv.wait_for(lk, busy ? std::chrono::microseconds(200) : std::chrono::microseconds(5000));
      }
      j = jobs.front();
      jobs.pop_front();
    }
    if (j.kind == Job::Kind::stop) return;
    if (j.kind == Job::Kind::barrier) {
      {
        std::lock_guard<std::mutex> g(mu);
        release_pins();
      }
      {
        std::lock_guard<std::mutex> lk(q_mu);
        barriers_done = j.value;
      }
      done_cv.notify_all();
      continue;
    }
    published_resident = published_misses = false;
    if (failed) {
      release_device(j);
      continue;
    }
    try {
      std::lock_guard<std::mutex> g(mu);
      run_layer(j);
    } catch (const Error& e) {
      set_error(e);
      release_device(j);
    } catch (const std::exception& e) {
      set_error(Error(Status::internal, str("cuda expert streamer: ", e.what())));
      release_device(j);
    }
  }
}

// After a failure: answers the call's host-to-device signals with empty tables (no expert is
// computed), so the stream runs to its end and the model thread sees the error.
void CudaStreamer::Impl::release_device(const Job& j) {
  const LayerView lv = layer_view(j.layer);
  if (!published_resident) {
    *lv.count1 = 0;
    std::fill(lv.table1, lv.table1 + n_expert, cuda::ExpertRef{});
    hs->store(j.layer, cuda::Signal::resident_ready, j.value);
  }
  if (!published_misses) {
    *lv.count2 = 0;
    std::fill(lv.table2, lv.table2 + n_expert, cuda::ExpertRef{});
    hs->store(j.layer, cuda::Signal::misses_ready, j.value);
  }
  published_resident = published_misses = true;
}

void CudaStreamer::Impl::wait_signal(int64_t L, cuda::Signal sig, uint64_t value) {
  const auto t0 = Clock::now();
  while (hs->load(L, sig) < value) {
    if (pump() == 0) cuda::host_idle(wait_mode);
    if (Clock::now() - t0 > opt.wait_timeout)
      fail(Status::timeout, "MoE layer ", L, " (model layer ", model_layer(L), "): no ", cuda::signal_name(sig),
           " signal from the device within ", std::chrono::duration<double>(opt.wait_timeout).count(),
           " s (waiting for value ", value, ", last seen ", hs->load(L, sig), ")");
  }
}

// Acquire (hits pinned first, misses reserve slots strongest first; no slot: wait for fills
// in flight) and issue the reads: misses strongest first, then the low-bit copies of the
// candidates a deadline may cut, then the candidates themselves.
void CudaStreamer::Impl::plan_step(std::vector<Want>& wants, int64_t L, LayerStats& ls, bool deadline,
                                   const std::function<size_t()>& land) {
  const uint64_t stride = pack->kind(kind).record_stride;
  std::vector<int64_t> records(wants.size());
  for (size_t i = 0; i < wants.size(); ++i) records[i] = wants[i].record;
  std::vector<AcquireResult> acq(wants.size());
  residency->acquire_step(records, kind, acq);
  for (const AcquireResult& a : acq)
    if (a.status != AcquireStatus::no_slot) pins.push_back(a.slot);
  auto since = Clock::now();
  for (;;) {
    bool missing = false;
    for (size_t i = 0; i < wants.size(); ++i) {
      if (acq[i].status != AcquireStatus::no_slot) continue;
      acq[i] = residency->acquire(records[i], kind);
      if (acq[i].status == AcquireStatus::no_slot) missing = true;
      else pins.push_back(acq[i].slot);
    }
    if (!missing) break;
    const size_t progress = pump() + land();
    if (progress) {
      since = Clock::now();
      continue;
    }
    SLUICE_CHECK(in_flight() > 0, Status::internal, "expert cache: no slot for MoE layer ", L,
                 " and nothing loading (", residency->n_slots(), " slots, ", wants.size(), " experts in the step)");
    cuda::host_idle(wait_mode);
    SLUICE_CHECK(Clock::now() - since < opt.wait_timeout, Status::timeout, "expert cache: MoE layer ", L,
                 " waited ", std::chrono::duration<double>(opt.wait_timeout).count(), " s for a free slot");
  }
  std::vector<size_t> later;
  for (size_t i = 0; i < wants.size(); ++i) {
    Want& w = wants[i];
    const AcquireResult& a = acq[i];
    w.status = a.status;
    w.slot = a.slot;
    count_demand_acquire(ls, a, stride);
    if (deadline && a.status != AcquireStatus::hit) w.candidate = opt.cut > 0 ? w.best < opt.cut : true;
    if (a.status != AcquireStatus::miss) continue;
    if (w.candidate) {
      later.push_back(i);
      continue;
    }
    if (start_fill(a, w.record, kind, IoPriority::demand)) ++ls.host_hits;
  }
  if (opt.miss_kind && deadline) {
    const ExpertKind lk = *opt.miss_kind;
    const uint64_t low_stride = pack->kind(lk).record_stride;
    for (Want& w : wants) {
      if (!w.candidate) continue;
      const AcquireResult a = residency->acquire(w.record, lk);
      if (a.status == AcquireStatus::no_slot) continue;  // best effort: the main copy is coming
      pins.push_back(a.slot);
      w.low_slot = a.slot;
      if (a.status == AcquireStatus::miss) {
        ++ls.low_bit_reads;
        ls.bytes_demand += low_stride;
        start_fill(a, w.record, lk, IoPriority::demand);
      }
    }
  }
  for (size_t i : later)
    if (start_fill(acq[i], wants[i].record, kind, IoPriority::demand)) ++ls.host_hits;
}

void CudaStreamer::Impl::lookahead(const Job& j, const LayerView& lv) {
  const int64_t L = j.layer;
  if (!j.lookahead || L + 1 >= n_layers || residency->speculative_capacity() == 0) return;
  const size_t nk = static_cast<size_t>(j.n * top_k);
  const auto order = predicted_union(std::span<const int32_t>(lv.pred_ids, nk),
                                     std::span<const float>(lv.pred_weights, nk), n_expert);
  LayerStats& next = layers[static_cast<size_t>(L + 1)];
  const uint64_t stride = pack->kind(kind).record_stride;
  for (const auto& [weight, e] : order) {
    const int64_t record = (L + 1) * n_expert + e;
    const AcquireResult a = residency->acquire(record, kind, AccessKind::prefetch);
    if (a.status == AcquireStatus::no_slot) break;  // the speculative share is full of fills in flight
    if (a.status != AcquireStatus::miss) {
      ++next.prefetch_already;
      continue;
    }
    ++next.prefetch_requests;
    next.bytes_prefetch += stride;
    if (start_fill(a, record, kind, IoPriority::prefetch)) ++next.host_hits;
  }
}

void CudaStreamer::Impl::run_layer(const Job& j) {
  const int64_t L = j.layer, n = j.n, k = top_k;
  const uint64_t v = j.value;
  LayerStats& ls = layers[static_cast<size_t>(L)];
  const auto ready0 = Clock::now();
  wait_signal(L, cuda::Signal::router_ready, v);
  const auto wall0 = Clock::now();
  const double cpu0 = thread_cpu_seconds();
  // The device reached this layer: the previous steps' copies and experts are done.
  retire();
  release_pins();
  const LayerView lv = layer_view(L);
  const size_t nk = static_cast<size_t>(n * k);
  const std::span<const int32_t> ids(lv.ids, nk);
  const std::span<const float> weights(lv.weights, nk);
  if (observer) {
    Routing r{n, k, std::vector<int32_t>(ids.begin(), ids.end()), std::vector<float>(weights.begin(), weights.end())};
    observer({model_layer(L), -1, &r});
  }
  ++ls.steps;
  ls.routed += nk;
  std::vector<Want> wants;
  for (StepExpert& se : step_union(ids, weights, k, 0, n, L, n_expert)) {
    Want w;
    static_cast<StepExpert&>(w) = std::move(se);
    wants.push_back(std::move(w));
  }
  ls.unique += wants.size();
  const bool deadline = opt.cut > 0 || opt.miss_kind.has_value();
  uint32_t n1 = 0, n2 = 0;
  plan_step(wants, L, ls, deadline, [&] { return list_landed(lv.copies1, n1); });
  lookahead(j, lv);
  pump();

  // Phase 1: the experts resident now, with the records that landed copied first.
  list_landed(lv.copies1, n1);
  *lv.count1 = n1;
  std::fill(lv.table1, lv.table1 + n_expert, cuda::ExpertRef{});
  for (Want& w : wants) {
    if (!resident(w.slot, w.record, kind) || (w.candidate && opt.deadline_worst_case)) continue;
    lv.table1[w.expert] = ref(w.slot, kind);
    w.done = true;
  }
  hs->store(L, cuda::Signal::resident_ready, v);
  published_resident = true;
  // Every copy listed so far runs before phase 1 on the stream: at resident_done their host
  // memory is free. Phase 2 may need those staging buffers for its own misses (a lookahead
  // fill listed and evicted within the step holds a second one), so it must not wait for the
  // next layer's router_ready to get them back.
  const size_t listed_for_phase1 = retiring.size();
  ls.service_wall_seconds += seconds_between(wall0, Clock::now());
  ls.service_cpu_seconds += thread_cpu_seconds() - cpu0;

  // Phase 2: the misses as they land; with a deadline, late weak ones are cut (or take their
  // landed low-bit copy) once the device finished phase 1.
  std::optional<Clock::time_point> phase1_done;
  bool decided = !deadline;
  auto since = Clock::now();
  for (;;) {
    size_t progress = pump();
    list_landed(lv.copies2, n2);
    if (!phase1_done && hs->load(L, cuda::Signal::resident_done) >= v) {
      phase1_done = Clock::now();
      retire(listed_for_phase1);
    }
    if (!decided && phase1_done) {
      for (auto it = wants.rbegin(); it != wants.rend(); ++it) {  // weakest first
        Want& w = *it;
        if (w.done || !w.candidate) continue;
        if (!opt.deadline_worst_case && resident(w.slot, w.record, kind)) continue;  // landed in time
        if (w.low_slot >= 0 && opt.deadline_worst_case) {
          const auto t0 = Clock::now();
          while (!resident(w.low_slot, w.record, *opt.miss_kind)) {
            if (pump() == 0) cuda::host_idle(wait_mode);
            list_landed(lv.copies2, n2);
            SLUICE_CHECK(Clock::now() - t0 < opt.wait_timeout, Status::timeout, "MoE layer ", L,
                         ": the low-bit copy of ", describe(w.record, *opt.miss_kind), " did not land");
          }
        }
        if (w.low_slot >= 0 && resident(w.low_slot, w.record, *opt.miss_kind)) {
          w.low = w.done = true;
          ++ls.cut;
          ++ls.low_bit;
        } else if (opt.cut > 0) {
          w.dropped = w.done = true;
          ++ls.cut;
        }
      }
      decided = true;
    }
    bool all = true;
    for (Want& w : wants) {
      if (w.done) continue;
      if (w.candidate && !decided && opt.deadline_worst_case) {  // late by definition until the deadline
        all = false;
        continue;
      }
      if (resident(w.slot, w.record, kind)) {
        w.done = true;
        ++progress;
      } else if (decided && w.candidate && w.low_slot >= 0 && resident(w.low_slot, w.record, *opt.miss_kind)) {
        w.low = w.done = true;
        ++ls.cut;
        ++ls.low_bit;
        ++progress;
      } else {
        all = false;
      }
    }
    if (all) break;  // nothing left to cut
    if (progress) since = Clock::now();
    else cuda::host_idle(wait_mode);
    if (Clock::now() - since > opt.wait_timeout) {
      size_t late = 0;
      for (const Want& w : wants) late += w.done ? 0 : 1;
      fail(Status::timeout, "MoE layer ", L, " (model layer ", model_layer(L), "): ", late, " expert",
           late == 1 ? "" : "s", " did not land within ", std::chrono::duration<double>(opt.wait_timeout).count(),
           " s (", reading.size(), " reads in flight, ", waiting.size(), " waiting for staging; misses_ready not sent)");
    }
  }
  list_landed(lv.copies2, n2);
  *lv.count2 = n2;
  std::copy(lv.table1, lv.table1 + n_expert, lv.table2);
  for (const Want& w : wants) {
    if (w.dropped) continue;
    if (w.low) lv.table2[w.expert] = ref(w.low_slot, *opt.miss_kind);
    else lv.table2[w.expert] = ref(w.slot, kind);
  }
  hs->store(L, cuda::Signal::misses_ready, v);
  published_misses = true;
  LOG_DEBUG("cuda streamer: MoE layer ", L, " call ", v, ": ", wants.size(), " experts, ", n1, " + ", n2,
            " copies, router_ready after ", seconds_between(ready0, wall0) * 1e3, " ms, misses_ready after ",
            seconds_between(wall0, Clock::now()) * 1e3, " ms");
  // The device waited from the end of phase 1 until now.
  if (phase1_done) ls.demand_wait_seconds += seconds_between(*phase1_done, Clock::now());
}

// ---- the model thread ----

void CudaStreamer::Impl::throw_if_failed() {
  if (!failed) return;
  std::lock_guard<std::mutex> lk(q_mu);
  throw *error;
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

CudaStreamer::Impl::LayerView CudaStreamer::Impl::layer_view(int64_t L) const {
  uint8_t* base = layer_mem.data() + static_cast<size_t>(L) * layer_stride;
  const size_t nk = align64(static_cast<size_t>(cap_rows * top_k) * 4);
  LayerView v;
  v.ids = reinterpret_cast<int32_t*>(base);
  v.weights = reinterpret_cast<float*>(base + nk);
  v.pred_ids = reinterpret_cast<int32_t*>(base + 2 * nk);
  v.pred_weights = reinterpret_cast<float*>(base + 3 * nk);
  v.table1 = reinterpret_cast<cuda::ExpertRef*>(base + 4 * nk);
  v.table2 = v.table1 + n_expert;
  const size_t copies = static_cast<size_t>(residency->n_slots()) * sizeof(cuda::CopyDesc);
  uint8_t* c = base + 4 * nk + align64(2 * static_cast<size_t>(n_expert) * sizeof(cuda::ExpertRef));
  v.copies1 = reinterpret_cast<cuda::CopyDesc*>(c);
  v.copies2 = reinterpret_cast<cuda::CopyDesc*>(c + align64(copies));
  v.count1 = reinterpret_cast<uint32_t*>(c + 2 * align64(copies));
  v.count2 = v.count1 + 16;
  return v;
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
  const size_t nk = align64(pairs * 4);
  layer_stride = 4 * nk + align64(2 * static_cast<size_t>(n_expert) * sizeof(cuda::ExpertRef)) +
                 2 * align64(static_cast<size_t>(residency->n_slots()) * sizeof(cuda::CopyDesc)) + 128;
  layer_mem = PinnedBuffer(static_cast<size_t>(n_layers) * layer_stride, "the expert handshake tables");
  d_ids = DeviceBuffer(pairs * 4, "routing ids");
  d_w = DeviceBuffer(pairs * 4, "routing weights");
  d_pids = DeviceBuffer(pairs * 4, "predicted ids");
  d_pw = DeviceBuffer(pairs * 4, "predicted weights");
  d_done = DeviceBuffer(pairs, "expert pair flags");
  d_act = DeviceBuffer(pairs * static_cast<size_t>(n_ff) * 4, "expert activations");
  d_pair = DeviceBuffer(pairs * static_cast<size_t>(n_embd) * 4, "expert outputs");
  d_plog = DeviceBuffer(static_cast<size_t>(cap * n_expert) * 4, "lookahead logits");
  cap_rows = cap;
}

// A batch whose union may exceed the cache: rows grouped so each group's union fits; each
// group is planned, loaded and computed before the next (no handshake, no deadline).
void CudaStreamer::Impl::grouped(const MoeLayerCall& c, const cuda::MoeShape& shape) {
  const int64_t L = c.moe_layer, n = shape.n_rows, k = shape.k;
  barrier();
  throw_if_failed();
  const LayerView lv = layer_view(L);
  const size_t nk = static_cast<size_t>(n * k);
  CUDA_CHECK(cudaMemcpyAsync(lv.ids, d_ids.as(), nk * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemcpyAsync(lv.weights, d_w.as(), nk * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemsetAsync(d_done.as(), 0, nk, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::lock_guard<std::mutex> g(mu);
  retire();  // the device is idle
  const std::span<const int32_t> ids(lv.ids, nk);
  const std::span<const float> weights(lv.weights, nk);
  if (observer) {
    Routing r{n, k, std::vector<int32_t>(ids.begin(), ids.end()), std::vector<float>(weights.begin(), weights.end())};
    observer({model_layer(L), -1, &r});
  }
  LayerStats& ls = layers[static_cast<size_t>(L)];
  for (int64_t row0 = 0; row0 < n;) {
    const int64_t row1 = row_group_end(ids, k, row0, n, residency->n_slots(), n_expert);
    ++ls.steps;
    ls.routed += static_cast<uint64_t>((row1 - row0) * k);
    std::vector<Want> wants;
    for (StepExpert& se : step_union(ids, weights, k, row0, row1, L, n_expert)) {
      Want w;
      static_cast<StepExpert&>(w) = std::move(se);
      wants.push_back(std::move(w));
    }
    ls.unique += wants.size();
    // Landed records are copied on the stream; their staging buffers come back once it
    // passed the copies. A fill that waits for a staging buffer (a background fill landed,
    // was copied and its slot evicted by this group, so its record is staged twice) gets one
    // by a synchronisation here: nothing else would return it before the group ends.
    auto land = [&] {
      const size_t n_landed = landed.size();
      copy_landed_on_stream();
      if (!waiting.empty() && staging_free.empty() && !retiring.empty()) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        retire();
        return n_landed + 1;
      }
      return n_landed;
    };
    plan_step(wants, L, ls, false, land);
    const auto t0 = Clock::now();
    auto since = t0;
    for (;;) {
      size_t progress = land();
      bool all = true;
      for (const Want& w : wants) all &= resident(w.slot, w.record, kind);
      if (all) break;
      progress += pump();
      if (progress) since = Clock::now();
      else cuda::host_idle(wait_mode);
      SLUICE_CHECK(Clock::now() - since < opt.wait_timeout, Status::timeout, "MoE layer ", L, " (model layer ",
                   model_layer(L), "): expert reads did not land within ",
                   std::chrono::duration<double>(opt.wait_timeout).count(), " s (", reading.size(), " reads in flight, ",
                   waiting.size(), " waiting for a staging buffer)");
    }
    ls.demand_wait_seconds += seconds_between(t0, Clock::now());
    std::fill(lv.table1, lv.table1 + n_expert, cuda::ExpertRef{});
    for (const Want& w : wants) lv.table1[w.expert] = ref(w.slot, kind);
    CUDA_CHECK(cudaMemcpyAsync(d_table.as(), lv.table1, static_cast<size_t>(n_expert) * sizeof(cuda::ExpertRef),
                               cudaMemcpyHostToDevice, stream));
    cuda::launch_moe_experts(c.h.ptr<float>(), d_ids.as<int32_t>(), d_table.as<cuda::ExpertRef>(), d_done.as(),
                             d_act.as<float>(), d_pair.as<float>(), shape, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));  // the group's slots may be reused by the next
    retire();
    release_pins();
    row0 = row1;
  }
  cuda::launch_moe_combine_done(d_pair.as<float>(), d_w.as<float>(), d_done.as(), c.out.ptr<float>(), shape, stream);
}

// ---- CudaStreamer ----

CudaStreamer::CudaStreamer(std::shared_ptr<const Pack> pack, ExpertKind kind, int64_t top_k, CudaBackend& backend,
                           const StreamerOptions& opt)
    : impl_(std::make_unique<Impl>(std::move(pack), kind, top_k, backend, opt)) {}

CudaStreamer::~CudaStreamer() = default;

void CudaStreamer::moe(Backend& be, const MoeLayerCall& c) {
  Impl& m = *impl_;
  const auto enqueue0 = Clock::now();
  m.throw_if_failed();
  SLUICE_CHECK(&be == &m.be, Status::internal, "cuda expert streamer: called with another backend (", be.name(), ")");
  SLUICE_CHECK(c.router, Status::internal, "cuda expert streamer: a MoE call without its router");
  const int64_t L = c.moe_layer, n = c.h.rows(), k = m.top_k, E = m.n_expert;
  SLUICE_CHECK(L >= 0 && L < m.n_layers, Status::internal, "cuda expert streamer: MoE layer ", L, " outside the pack's ",
               m.n_layers);
  SLUICE_CHECK(c.router_logits.rows() == n && c.router_logits.cols() == E && c.router_logits.dtype == DType::f32,
               Status::internal, "cuda expert streamer: router logits ", c.router_logits.shape_str(), " for ", n,
               " rows of ", E, " experts");
  SLUICE_CHECK(c.router->n_expert_used == k && c.h.cols() == m.n_embd && c.out.rows() == n,
               Status::internal, "cuda expert streamer: the call does not match the pack (top-k ", c.router->n_expert_used,
               ", width ", c.h.cols(), ")");
  if (n == 0) return;
  m.ensure_capacity(n);
  // Without a low-bit miss kind every slot holds the one kind: the kernels are compiled for it.
  const cuda::MoeShape shape{n, k, m.n_embd, m.n_ff, E, m.opt.miss_kind ? cuda::expert_unavailable : expert_wtype(m.kind)};
  cudaStream_t s = m.stream;
  const bool norm = c.router->norm_topk_prob;
  cuda::launch_router_topk(c.router_logits.ptr<float>(), n, E, k, norm, m.d_ids.as<int32_t>(), m.d_w.as<float>(), s);
  // The union of n rows fits the cache when n * k slots (or every expert) do; else group.
  const int64_t slots = m.residency->n_slots();
  if (n * k > slots && E > slots) {
    m.grouped(c, shape);
    return;
  }
  const Impl::LayerView lv = m.layer_view(L);
  const size_t nk = static_cast<size_t>(n * k);
  const bool look = m.opt.lookahead && !c.next_router.empty() && L + 1 < m.n_layers &&
                    m.residency->speculative_capacity() > 0;
  if (look) {
    Tensor plog(DType::f32, {n, E}, m.d_plog.as());
    be.matmul(c.h, c.next_router, plog);
    cuda::launch_router_topk(plog.ptr<float>(), n, E, k, norm, m.d_pids.as<int32_t>(), m.d_pw.as<float>(), s);
    CUDA_CHECK(cudaMemcpyAsync(lv.pred_ids, m.d_pids.as(), nk * 4, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync(lv.pred_weights, m.d_pw.as(), nk * 4, cudaMemcpyDeviceToHost, s));
  }
  CUDA_CHECK(cudaMemcpyAsync(lv.ids, m.d_ids.as(), nk * 4, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaMemcpyAsync(lv.weights, m.d_w.as(), nk * 4, cudaMemcpyDeviceToHost, s));
  const uint64_t v = ++m.calls[static_cast<size_t>(L)];
  const size_t table_bytes = static_cast<size_t>(E) * sizeof(cuda::ExpertRef);
  // The job goes first: whatever of this call reaches the device gets its signals answered,
  // also when enqueueing the rest fails (the service thread then times out on router_ready).
  Impl::Job j;
  j.layer = L;
  j.value = v;
  j.n = n;
  j.lookahead = look;
  {
    std::lock_guard<std::mutex> lk(m.q_mu);
    m.jobs.push_back(j);
  }
  m.q_cv.notify_all();
  m.hs->device_write(s, L, cuda::Signal::router_ready, v);
  m.hs->device_wait(s, L, cuda::Signal::resident_ready, v);
  // Everything below reads what the host published before the signal: the landed records'
  // copies, then the table (copied to the device when the stream gets there).
  m.enqueue_copies(lv.copies1, lv.count1);
  CUDA_CHECK(cudaMemcpyAsync(m.d_table.as(), lv.table1, table_bytes, cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemsetAsync(m.d_done.as(), 0, nk, s));
  cuda::launch_moe_experts(c.h.ptr<float>(), m.d_ids.as<int32_t>(), m.d_table.as<cuda::ExpertRef>(), m.d_done.as(),
                           m.d_act.as<float>(), m.d_pair.as<float>(), shape, s);
  m.hs->device_write(s, L, cuda::Signal::resident_done, v);
  m.hs->device_wait(s, L, cuda::Signal::misses_ready, v);
  m.enqueue_copies(lv.copies2, lv.count2);
  CUDA_CHECK(cudaMemcpyAsync(m.d_table.as(), lv.table2, table_bytes, cudaMemcpyHostToDevice, s));
  cuda::launch_moe_experts(c.h.ptr<float>(), m.d_ids.as<int32_t>(), m.d_table.as<cuda::ExpertRef>(), m.d_done.as(),
                           m.d_act.as<float>(), m.d_pair.as<float>(), shape, s);
  cuda::launch_moe_combine_done(m.d_pair.as<float>(), m.d_w.as<float>(), m.d_done.as(), c.out.ptr<float>(), shape, s);
  const auto enqueue1 = Clock::now();
  LOG_DEBUG("cuda streamer: MoE layer ", L, " call ", v, " enqueued in ", seconds_between(enqueue0, enqueue1) * 1e3,
            " ms, ", seconds_between(m.last_enqueue, enqueue0) * 1e3, " ms after the previous layer's");
  m.last_enqueue = enqueue1;
}

void CudaStreamer::forward_done() {
  impl_->barrier();
  impl_->throw_if_failed();
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->retire();  // the logits reached the host: the device is idle
}

RunStats CudaStreamer::stats() const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> g(m.mu);
  RunStats s;
  s.layers = m.layers;
  s.slots = m.residency->n_slots();
  s.slot_bytes = m.slot_bytes;
  s.cache_bytes = static_cast<uint64_t>(s.slots) * m.slot_bytes;
  s.speculative_slots = m.residency->speculative_capacity();
  s.host_cache_bytes = m.host ? static_cast<uint64_t>(m.host->n_slots()) * m.slot_bytes : 0;
  s.policy = std::string(policy_name(m.opt.policy));
  s.kind = std::string(expert_kind_name(m.kind));
  if (m.opt.miss_kind) s.miss_kind = std::string(expert_kind_name(*m.opt.miss_kind));
  s.lookahead = m.opt.lookahead;
  s.cut = m.opt.cut;
  const IoCounters io = m.io->counters();
  s.io_mode = m.io->file_is_direct(m.files.at(m.kind)) ? "direct" : "buffered";
  s.io_uring = m.io->uses_io_uring();
  s.io_depth = m.io->queue_depth();
  s.io_reads = io.reads - m.io_base.reads;
  s.io_bytes = io.bytes - m.io_base.bytes;
  s.io_busy_seconds = io.busy_seconds - m.io_base.busy_seconds;
  s.h2d_bytes = m.h2d_bytes - m.h2d_base;
  return s;
}

bool CudaStreamer::drain(std::chrono::milliseconds wait) {
  Impl& m = *impl_;
  m.barrier();
  const auto until = Clock::now() + wait;
  std::lock_guard<std::mutex> g(m.mu);
  // Background reads (cut experts, prefetches) land and are copied here, on this thread.
  while (m.in_flight() > 0 || !m.retiring.empty()) {
    if (Clock::now() >= until) return false;
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
  m.layers.assign(m.layers.size(), LayerStats{});
  m.io_base = m.io->counters();
  m.h2d_base = m.h2d_bytes;
}

int32_t CudaStreamer::n_slots() const { return impl_->residency->n_slots(); }
uint64_t CudaStreamer::slot_bytes() const { return impl_->slot_bytes; }
ExpertKind CudaStreamer::kind() const { return impl_->kind; }
const StreamerOptions& CudaStreamer::options() const { return impl_->opt; }
const Residency& CudaStreamer::residency() const { return *impl_->residency; }

void CudaStreamer::set_routing_observer(RoutingObserver observer) {
  impl_->barrier();
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->observer = std::move(observer);
}

std::shared_ptr<StreamingProvider> make_cuda_streamer(std::shared_ptr<const Pack> pack, ExpertKind kind, int64_t top_k,
                                                      Backend& backend, const StreamerOptions& opt) {
  auto* cb = dynamic_cast<CudaBackend*>(&backend);
  SLUICE_CHECK(cb, Status::invalid_argument, "expert streaming on CUDA needs the CUDA backend, not ", backend.name());
  return std::make_shared<CudaStreamer>(std::move(pack), kind, top_k, *cb, opt);
}

}  // namespace sluice
