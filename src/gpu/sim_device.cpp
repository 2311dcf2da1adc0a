#include "gpu/sim_device.h"

#include <algorithm>
#include <cstring>

namespace strata::gpu {

SimDevice::SimDevice(uint64_t vram_bytes, double pcie_gbps) : capacity_(vram_bytes), pcie_gbps_(pcie_gbps) {
  STRATA_CHECK(pcie_gbps > 0, "SimDevice: the PCIe rate must be positive");
}

Result<SimDevice::Buffer> SimDevice::alloc(uint64_t bytes, bool backed) {
  if (bytes == 0 || bytes > capacity_ - used_)
    return Error{strfmt("VRAM: %s asked for, %s of %s in use", format_size(bytes).c_str(), format_size(used_).c_str(),
                        format_size(capacity_).c_str())};
  Buffer b;
  b.id = int(memory_.size());
  // committed now, as a device's memory is: first-touch page faults would otherwise land in the
  // first promotions into each slot (on a VM, most of the tier step's time)
  memory_.emplace_back(backed ? new uint8_t[bytes]() : nullptr);
  live_.push_back(true);
  sizes_.push_back(bytes);
  b.data = memory_.back().get();
  b.bytes = bytes;
  used_ += bytes;
  return b;
}

void SimDevice::free(Buffer& b) {
  STRATA_CHECK(b.id >= 0 && size_t(b.id) < memory_.size() && live_[size_t(b.id)], "SimDevice: bad free");
  memory_[size_t(b.id)].reset();
  live_[size_t(b.id)] = false;
  used_ -= sizes_[size_t(b.id)];
  b = Buffer{};
}

int SimDevice::new_stream() {
  streams_.push_back(host_);
  return int(streams_.size()) - 1;
}

int SimDevice::compute_stream() {
  if (compute_ < 0) compute_ = new_stream();
  return compute_;
}

int SimDevice::new_event() {
  events_.push_back(0.0);
  return int(events_.size()) - 1;
}

bool SimDevice::event_done(int event, int stream) const {
  return events_[size_t(event)] <= std::max(record(stream), host_);
}

void SimDevice::wait(int stream, Event e) {
  double& t = streams_[size_t(stream)];
  t = std::max(t, e);
}

void SimDevice::copy_h2d(int stream, Buffer& b, uint64_t offset, const void* src, uint64_t bytes) {
  STRATA_CHECK(b.id >= 0 && b.data != nullptr && offset + bytes <= b.bytes, "SimDevice: copy outside the buffer");
  std::memcpy(b.data + offset, src, bytes);
  double& t = streams_[size_t(stream)];
  const double start = std::max(t, host_), seconds = double(bytes) / (pcie_gbps_ * 1e9);
  t = start + seconds;
  log_.push_back({b.id, start, t, true});
  pcie_seconds_ += seconds;
  bytes_copied_ += bytes;
}

Event SimDevice::transfer_h2d(int stream, uint64_t bytes) {
  double& t = streams_[size_t(stream)];
  const double seconds = double(bytes) / (pcie_gbps_ * 1e9);
  t = std::max(t, host_) + seconds;
  pcie_seconds_ += seconds;
  bytes_copied_ += bytes;
  return t;
}

void SimDevice::launch(int stream, std::span<const int> reads, double seconds, const std::function<void()>& run) {
  double& t = streams_[size_t(stream)];
  const double start = std::max(t, host_);
  t = start + seconds;
  for (int id : reads) log_.push_back({id, start, t, false});
  if (run) run();
}

std::vector<std::string> SimDevice::overlaps() const {
  std::vector<std::string> out;
  std::vector<const Span*> by_buffer(log_.size());
  for (size_t i = 0; i < log_.size(); ++i) by_buffer[i] = &log_[i];
  std::stable_sort(by_buffer.begin(), by_buffer.end(), [](const Span* a, const Span* b) { return a->buffer < b->buffer; });
  for (size_t i = 0; i < by_buffer.size();) {
    size_t j = i;
    while (j < by_buffer.size() && by_buffer[j]->buffer == by_buffer[i]->buffer) ++j;
    for (size_t w = i; w < j; ++w) {
      if (!by_buffer[w]->write) continue;
      for (size_t r = i; r < j; ++r) {
        const Span& a = *by_buffer[w];
        const Span& b = *by_buffer[r];
        if (b.write || b.end <= a.start || a.end <= b.start) continue;
        out.push_back(strfmt("copy into buffer %d at [%.6f, %.6f) overlaps a kernel reading it at [%.6f, %.6f)",
                             a.buffer, a.start, a.end, b.start, b.end));
      }
    }
    i = j;
  }
  return out;
}

}  // namespace strata::gpu
