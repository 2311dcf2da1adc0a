// gpu::Device on CUDA device 0 (issue #7, docs/gpu.md): the VRAM expert cache's slots in device
// memory, its copy stream a CUDA stream that does not wait for the compute stream (the default
// stream, where gpu/cuda_kernels.h's kernels run), events as CUDA events. A copy goes through a
// ring of pinned staging buffers, so it is asynchronous: the host only waits when the ring is
// full of copies still in flight. Plain C++ over gpu/cuda_kernels.h, so every build has it;
// without CUDA or a device, create() says why.
//
// The first CUDA error is kept (error()) and turns the device off: every event is done, and
// copies and kernels are no longer issued, so the caller (GpuTier) computes everything on the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/device.h"

namespace strata::gpu {

class CudaDevice final : public Device {
 public:
  // vram_bytes: the budget (budgets.vram). Errors: no CUDA, no device. A budget above the
  // device's free memory is lowered to it (less 256 MiB for the runtime), with a note in note().
  static Result<std::unique_ptr<CudaDevice>> create(uint64_t vram_bytes);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  Result<Buffer> alloc(uint64_t bytes, bool backed = true) override;
  void free(Buffer& b) override;
  uint64_t used() const override { return used_; }
  uint64_t capacity() const override { return capacity_; }
  int compute_stream() override { return 0; }
  int new_stream() override;
  int new_event() override;
  void free_event(int event) override;
  void record_event(int event, int stream) override;
  void wait_event(int stream, int event) override;
  bool event_done(int event, int stream) const override;
  void copy_h2d(int stream, Buffer& b, uint64_t offset, const void* src, uint64_t bytes) override;
  void launch(int stream, std::span<const int> reads, double seconds, const std::function<void()>& run) override;
  std::string error() const override { return error_.message(); }

  // Waits on the host for the event's work; false: a CUDA error.
  bool synchronize(int event);
  // Records a CUDA error (the first one stays); false when s is an error.
  bool check(const Status& s) const;
  // The stream's handle for gpu/cuda_kernels.h calls (0: the default stream, null).
  void* stream_handle(int stream) const { return streams_[size_t(stream)]; }
  const std::string& note() const { return note_; }
  uint64_t bytes_copied() const { return bytes_copied_; }

 private:
  CudaDevice(uint64_t capacity) : capacity_(capacity) {}
  static constexpr size_t kStageBytes = size_t(4) << 20;
  static constexpr int kStages = 4;

  uint64_t capacity_, used_ = 0;
  std::vector<void*> streams_{nullptr};  // [0]: the default stream
  std::vector<void*> events_;
  std::vector<void*> memory_;  // [buffer id]: device address (null: booked only, or freed)
  std::vector<uint64_t> sizes_;
  std::vector<bool> live_;
  void* stage_[kStages] = {};
  int stage_event_[kStages] = {};  // the copy out of each staging buffer
  int next_stage_ = 0;
  uint64_t bytes_copied_ = 0;
  std::string note_;
  mutable StickyError error_{"GPU tier", "every routed expert runs on the CPU from now on"};
};

}  // namespace strata::gpu
