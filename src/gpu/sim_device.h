// The simulated GPU (issue #7, ../shared/DESIGN.md "Testing without a GPU"): host memory under a
// VRAM budget, streams ordered by events on a modelled timeline, copies costed at a configured
// PCIe bandwidth, kernels executed at once by the caller's CPU code and costed as it says. Every
// test runs the VRAM cache and its scheduling on it; CudaDevice implements the same calls
// (device.h). It also keeps the log that proves the cache's central rule: no copy into a buffer
// overlaps, on the timeline, a kernel that reads that buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "gpu/device.h"

namespace strata::gpu {

// A stream's position on the simulated timeline, in seconds; an event is such a position.
using Event = double;

class SimDevice final : public Device {
 public:
  // vram_bytes: the memory the device lends (budgets.vram); pcie_gbps: host-to-device copy rate.
  SimDevice(uint64_t vram_bytes, double pcie_gbps);

  // Device memory: `bytes` of host memory standing in for VRAM. Errors when the budget cannot
  // hold it (what is in use and what was asked are in the message).
  // (backed = false: booked only, no memory behind it).
  using Buffer = Device::Buffer;
  Result<Buffer> alloc(uint64_t bytes, bool backed = true) override;
  void free(Buffer& b) override;
  uint64_t used() const override { return used_; }
  uint64_t capacity() const override { return capacity_; }

  // Streams run their work in order; a new one starts at the current host time. The compute
  // stream is made on first use.
  int new_stream() override;
  int compute_stream() override;
  // Events (device.h) are times on the timeline.
  int new_event() override;
  void free_event(int) override {}  // a time: nothing to free
  void record_event(int event, int stream) override { events_[size_t(event)] = record(stream); }
  void wait_event(int stream, int event) override { wait(stream, events_[size_t(event)]); }
  // Done when it ends by the time the stream's next work starts (not before the host's time).
  bool event_done(int event, int stream) const override;
  // The time the stream's last work ends.
  Event record(int stream) const { return streams_[size_t(stream)]; }
  // The stream's next work starts no earlier than `e`.
  void wait(int stream, Event e);
  // Host time moves on (the CPU's share of a layer ran): work issued later starts after it.
  void host_advance(double seconds) { host_ += seconds; }
  double host_time() const { return host_; }

  // Copies `bytes` from host memory into b at `offset`, on `stream`: the bytes land now (the
  // simulation has no asynchrony), the copy occupies [start, start + bytes / pcie) of the stream.
  void copy_h2d(int stream, Buffer& b, uint64_t offset, const void* src, uint64_t bytes) override;
  // A copy of `bytes` costed on `stream` like copy_h2d, into the scratch part of the arena that
  // this simulation does not allocate: a shipped expert (GpuTier), whose kernel the simulation
  // runs from host memory. Returns the event of its end.
  Event transfer_h2d(int stream, uint64_t bytes);
  // A kernel reading `reads` on `stream`, lasting `seconds`: `run` executes now on the CPU.
  void launch(int stream, std::span<const int> reads, double seconds, const std::function<void()>& run) override;

  // The copies and kernels issued so far, by buffer; violations of the rule above are listed
  // ("copy into buffer 3 at [0.010, 0.012) overlaps a kernel reading it at [0.011, 0.013)").
  std::vector<std::string> overlaps() const;
  double pcie_seconds() const { return pcie_seconds_; }
  uint64_t bytes_copied() const { return bytes_copied_; }

 private:
  struct Span {
    int buffer;
    double start, end;
    bool write;
  };
  uint64_t capacity_, used_ = 0;
  double pcie_gbps_;
  double host_ = 0;
  std::vector<double> streams_;
  int compute_ = -1;
  std::vector<double> events_;
  std::vector<std::unique_ptr<uint8_t[]>> memory_;  // [buffer id]
  std::vector<uint64_t> sizes_;
  std::vector<bool> live_;  // [buffer id]: not freed
  std::vector<Span> log_;
  double pcie_seconds_ = 0;
  uint64_t bytes_copied_ = 0;
};

}  // namespace strata::gpu
