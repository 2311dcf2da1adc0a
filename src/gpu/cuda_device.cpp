#include "gpu/cuda_device.h"

#include <cstdio>
#include <cstring>

#include "gpu/cuda_kernels.h"

namespace strata::gpu {

Result<std::unique_ptr<CudaDevice>> CudaDevice::create(uint64_t vram_bytes) {
  if (!cuda_usable()) return Error{"no usable CUDA device (or a build without the CUDA library)"};
  size_t free_bytes = 0, total = 0;
  STRATA_TRY(device_memory(&free_bytes, &total));
  constexpr uint64_t kRuntime = uint64_t(256) << 20;
  uint64_t capacity = vram_bytes;
  std::string note;
  if (free_bytes < kRuntime + capacity) {
    capacity = free_bytes > kRuntime ? free_bytes - kRuntime : 0;
    note = strfmt("budgets.vram %s is more than device 0 has free (%s of %s); using %s",
                  format_size(vram_bytes).c_str(), format_size(free_bytes).c_str(), format_size(total).c_str(),
                  format_size(capacity).c_str());
  }
  std::unique_ptr<CudaDevice> d(new CudaDevice(capacity));
  d->note_ = std::move(note);
  for (int i = 0; i < kStages; ++i) {
    auto p = pinned_alloc(kStageBytes);
    if (!p) return p.error();
    d->stage_[i] = *p;
    d->stage_event_[i] = d->new_event();
  }
  if (!d->error_.empty()) return Error{d->error_.message()};
  return d;
}

CudaDevice::~CudaDevice() {
  for (void* p : memory_) device_free(p);
  for (void* p : stage_) pinned_free(p);
  for (void* e : events_) event_destroy(e);
  for (size_t i = 1; i < streams_.size(); ++i) stream_destroy(streams_[i]);
}

bool CudaDevice::check(const Status& s) const { return error_.keep(s); }

Result<Device::Buffer> CudaDevice::alloc(uint64_t bytes, bool backed) {
  if (bytes == 0 || bytes > capacity_ - used_)
    return Error{strfmt("VRAM: %s asked for, %s of %s in use", format_size(bytes).c_str(), format_size(used_).c_str(),
                        format_size(capacity_).c_str())};
  void* p = nullptr;
  if (backed) {
    auto m = device_alloc(bytes);
    if (!m) return m.error();  // out of device memory: not an error of the device
    p = *m;
  }
  Buffer b;
  b.id = int(memory_.size());
  memory_.push_back(p);
  sizes_.push_back(bytes);
  live_.push_back(true);
  b.data = static_cast<uint8_t*>(p);
  b.bytes = bytes;
  used_ += bytes;
  return b;
}

void CudaDevice::free(Buffer& b) {
  STRATA_CHECK(b.id >= 0 && size_t(b.id) < memory_.size() && live_[size_t(b.id)], "CudaDevice: bad free");
  // cudaFree waits for the device: kernels reading the buffer, and a copy into it, are done first
  device_free(memory_[size_t(b.id)]);
  memory_[size_t(b.id)] = nullptr;
  live_[size_t(b.id)] = false;
  used_ -= sizes_[size_t(b.id)];
  b = Buffer{};
}

int CudaDevice::new_stream() {
  auto s = stream_create();
  streams_.push_back(check(s.ok() ? Status{} : Status(s.error())) ? *s : nullptr);
  return int(streams_.size()) - 1;
}

int CudaDevice::new_event() {
  auto e = event_create();
  events_.push_back(check(e.ok() ? Status{} : Status(e.error())) ? *e : nullptr);
  return int(events_.size()) - 1;
}

void CudaDevice::free_event(int event) {
  event_destroy(events_[size_t(event)]);
  events_[size_t(event)] = nullptr;
}

void CudaDevice::record_event(int event, int stream) {
  if (error_.empty()) check(event_record(events_[size_t(event)], streams_[size_t(stream)]));
}

void CudaDevice::wait_event(int stream, int event) {
  if (error_.empty()) check(stream_wait_event(streams_[size_t(stream)], events_[size_t(event)]));
}

bool CudaDevice::event_done(int event, int) const {
  if (!error_.empty()) return true;
  const Result<bool> d = gpu::event_done(events_[size_t(event)]);
  return check(d.ok() ? Status{} : Status(d.error())) ? *d : true;
}

void CudaDevice::copy_h2d(int stream, Buffer& b, uint64_t offset, const void* src, uint64_t bytes) {
  STRATA_CHECK(b.id >= 0 && b.data != nullptr && offset + bytes <= b.bytes, "CudaDevice: copy outside the buffer");
  const auto* from = static_cast<const uint8_t*>(src);
  for (uint64_t done = 0; done < bytes && error_.empty();) {
    // the next staging buffer, once its previous copy has left it
    const int i = next_stage_;
    next_stage_ = (next_stage_ + 1) % kStages;
    if (!check(event_synchronize(events_[size_t(stage_event_[i])]))) return;
    const uint64_t n = std::min<uint64_t>(kStageBytes, bytes - done);
    std::memcpy(stage_[i], from + done, n);
    if (!check(copy_to_device_async(b.data + offset + done, stage_[i], n, streams_[size_t(stream)]))) return;
    record_event(stage_event_[i], stream);
    done += n;
    bytes_copied_ += n;
  }
}

bool CudaDevice::synchronize(int event) {
  return error_.empty() && check(event_synchronize(events_[size_t(event)]));
}

void CudaDevice::launch(int, std::span<const int>, double, const std::function<void()>& run) {
  if (error_.empty() && run) run();
}

}  // namespace strata::gpu
