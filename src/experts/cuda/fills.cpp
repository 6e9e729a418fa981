// CudaStreamer fills: a reserved device slot gets its record from the host tier or by a
// direct read into page-locked memory, then by a copy the device runs (a copy kernel over a
// published list, or a cudaMemcpyAsync on the model thread); the tier's preload.
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "core/bits.h"
#include "core/log.h"
#include "core/units.h"
#include "experts/cuda/streamer_impl.h"

namespace sluice {

size_t CudaStreamer::Impl::Fills::make_progress() {
  const size_t progress = m.pump() + land();
  if (progress == 0) cuda::host_idle(m.wait_mode);
  return progress;
}

cuda::ExpertRef CudaStreamer::Impl::ref(int32_t slot, DType k) const {
  const PackKindInfo& info = pack->kind(k);
  const uint8_t* base = slot_ptr(slot);
  cuda::ExpertRef r;
  const PackBlock* blocks[3] = {&info.gate, &info.up, &info.down};
  const PackBias* biases[3] = {&info.gate_bias, &info.up_bias, &info.down_bias};  // f32 in the record, or none
  for (int i = 0; i < 3; ++i) {
    r.data[i] = base + blocks[i]->offset;
    r.scales[i] = blocks[i]->scale_bytes ? base + blocks[i]->scale_offset : nullptr;
    if (biases[i]->bytes) r.bias[i] = reinterpret_cast<const float*>(base + biases[i]->offset);
  }
  r.wtype = cuda::matmul_wtype_of(k, "the expert cache");
  r.act = cuda::expert_act_of(math);
  r.alpha = math.alpha;
  r.limit = math.limit;
  return r;
}

bool CudaStreamer::Impl::start_fill(const AcquireResult& a, int64_t record, DType k, IoPriority priority) {
  if (opt.fake_experts) {  // the slot keeps whatever it holds (--fake-experts)
    residency->complete_load(a.slot);
    map_slot(a.slot);
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
  const ReadRequest q = read_request(f.record, f.kind, dest, next_tag++, f.priority);
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
  const std::optional<Fill> fill = take_in_flight(reading, c.tag);
  if (!fill) return;
  const Fill& f = *fill;
  if (std::optional<Error> bad = landed_error(c, f.record, f.kind, source(f))) {
    fail_fill(f);
    throw *bad;
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
    const uint64_t bytes = round_up(pack->kind(f.kind).record_bytes, 16);  // within the stride
    const uint8_t* src = source(f);
    descs[count++] = cuda::CopyDesc{f.host_slot >= 0 ? host_mem.dev(src) : staging_mem.dev(src), slot_ptr(f.slot), bytes};
    residency->complete_load(f.slot);
    map_slot(f.slot);  // the device reads the map after this list's copies, in stream order
    h2d_bytes += bytes;
    retiring.push_back(f);
  }
  landed.clear();
  return n;
}

CudaStreamer::Impl::PhaseList CudaStreamer::Impl::phase_list_at(uint8_t* base) const {
  return {reinterpret_cast<uint32_t*>(base), reinterpret_cast<uint32_t*>(base) + 1,
          reinterpret_cast<cuda::ExpertRef*>(base + phase_table_offset()),
          reinterpret_cast<cuda::CopyDesc*>(base + phase_copies_offset())};
}

void CudaStreamer::Impl::clear_phase(const PhaseList& p) const {
  *p.count = *p.settled = 0;
  std::fill(p.table, p.table + n_expert, cuda::ExpertRef{});
}

void CudaStreamer::Impl::map_slot(int32_t slot) {
  if (residency->kind(slot) == kind) hit_slots()[residency->record(slot)] = slot;
}

void CudaStreamer::Impl::unmap_slot(int32_t slot, int64_t record, DType k) {
  if (k == kind && hit_slot_mem.data() && hit_slots()[record] == slot) hit_slots()[record] = -1;
}

const cuda::ExpertRef* CudaStreamer::Impl::enqueue_phase(int64_t L, uint64_t v, const PhaseList& host,
                                                          cuda::Signal out, cuda::Signal in, size_t nk,
                                                          uint8_t* clear, bool from_map) {
  const PhaseList dev = device_phase();
  cuda::PhaseHandshake h;
  h.signals = hs->device_signals(L);
  h.signal_out = static_cast<int>(out);
  h.signal_in = static_cast<int>(in);
  h.calls = d_calls.as<uint64_t>() + L;
  h.next_call = out == cuda::Signal::router_ready;  // the phase that starts a call
  h.host_list = layer_mem.dev(reinterpret_cast<uint8_t*>(host.count));
  h.dev_list = d_phase.as();
  h.table_offset = static_cast<uint32_t>(phase_table_offset());
  h.copies_offset = static_cast<uint32_t>(phase_copies_offset());
  h.max_copies = static_cast<uint32_t>(residency->n_slots());
  h.ids = d_ids.as<int32_t>();
  h.pairs = static_cast<int32_t>(nk);
  h.failed = device_failed.dev(reinterpret_cast<uint32_t*>(device_failed.data()));
  h.layer = L;
  h.timeout_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(opt.wait_timeout).count());
  h.times = d_times.as<uint64_t>();
  if (!h.next_call) h.mark_done = d_done.as();  // phase 2 marks phase 1's pairs
  h.next_list_offset = static_cast<uint32_t>(phase_list_bytes());  // LayerView: phase 2's list follows
  h.settled_table_offset = static_cast<uint32_t>(settled_table_offset());
  if (from_map && h.next_call && nk <= static_cast<size_t>(cuda::kMaxMapPairs)) {
    h.hit_slots = hit_slot_mem.dev(hit_slots());
    h.first_record = L * n_expert;
    h.slot_ref = d_slot_ref.as<cuda::ExpertRef>();
    h.slot_bytes = slot_bytes;
    h.signal_hits = static_cast<int>(cuda::Signal::hits_taken);
  }
  if (h.next_call) {  // no copy kernel: the handshake zeroes the flags, phase 1's gate/up copies
    h.clear = clear;
    h.clear_bytes = clear ? static_cast<uint32_t>(nk) : 0;
    cuda::launch_phase_handshake(h, stream);
    return dev.table;
  }
  cuda::launch_phase_handshake(h, stream);
  cuda::launch_expert_copies(dev.copies, dev.count, stream, clear, clear ? static_cast<uint32_t>(nk) : 0);
  return dev.table;
}

void CudaStreamer::Impl::copy_fill(const Fill& f, cudaStream_t on) {
  const uint64_t bytes = pack->kind(f.kind).record_bytes;
  CUDA_CHECK(cudaMemcpyAsync(slot_ptr(f.slot), source(f), bytes, cudaMemcpyHostToDevice, on));
  residency->complete_load(f.slot);
  map_slot(f.slot);
  h2d_bytes += bytes;
  retiring.push_back(f);
}

void CudaStreamer::Impl::copy_landed_on_stream() {
  for (const Fill& f : landed) copy_fill(f, stream);
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

// Reads the first records of the pack into the host tier (as many as it holds), then measures
// host-to-device bandwidth from it: the copy engine and the copy kernel, each over up to 1 GiB.
void CudaStreamer::Impl::preload_host_tier() {
  const int64_t n = std::min<int64_t>(host->n_slots(), pack->manifest().n_records());
  const uint64_t stride = pack->kind(kind).record_stride;
  std::unordered_map<uint64_t, int32_t> slot_of_tag;
  std::vector<ReadCompletion> done;
  int64_t next = 0, landed_n = 0;
  const auto t0 = StreamerClock::now();
  auto since = t0;
  while (landed_n < n) {
    while (next < n && static_cast<int64_t>(slot_of_tag.size()) < 4 * opt.io_depth) {
      const AcquireResult a = host->acquire(next, kind);
      SLUICE_ASSERT(a.status == AcquireStatus::miss);
      const ReadRequest q = read_request(next, kind, host_ptr(a.slot), next_tag++, IoPriority::demand);
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
      since = StreamerClock::now();
    }
    SLUICE_CHECK(StreamerClock::now() - since < opt.io_timeout, Status::timeout,
                 "--host-cache-preload: no read landed for ", std::chrono::duration<double>(opt.io_timeout).count(),
                 " s");
  }
  const double s_read = seconds_between(t0, StreamerClock::now());
  const double gb = static_cast<double>(n) * static_cast<double>(stride) / 1e9;
  // H2D peaks from the tier into the slots (nothing is resident yet).
  const size_t bytes = std::min<size_t>({size_t{1} << 30, static_cast<size_t>(n) * stride,
                                         static_cast<size_t>(residency->n_slots()) * slot_bytes}) / 4096 * 4096;
  cuda::MappedHostBuffer probe(sizeof(cuda::CopyDesc) + 64, "the H2D probe");
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

}  // namespace sluice
