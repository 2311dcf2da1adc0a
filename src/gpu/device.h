// What the VRAM expert cache and the GPU tier need of a GPU (issue #7, docs/gpu.md): memory under
// the VRAM budget, streams, events, host-to-device copies and kernels. Two implementations:
// SimDevice (sim_device.h: host memory and a modelled timeline; every test) and CudaDevice
// (cuda_device.h: device 0's memory, CUDA streams and events, copies from pinned host memory).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "base/error.h"

namespace strata::gpu {

class Device {
 public:
  virtual ~Device() = default;

  // Device memory: `bytes` of the budget. backed = false: the budget is only booked (a part of
  // the arena whose memory lives elsewhere: the dense weights the backend holds, the host's KV
  // cache and the backend's mirror of it); data stays null on a real device. Errors: the budget cannot hold it
  // (what is in use and what was asked are in the message), or the device is out of memory.
  struct Buffer {
    int id = -1;
    uint8_t* data = nullptr;  // host memory (simulated) or a device address (CUDA)
    uint64_t bytes = 0;
  };
  virtual Result<Buffer> alloc(uint64_t bytes, bool backed = true) = 0;
  virtual void free(Buffer& b) = 0;
  virtual uint64_t used() const = 0;
  virtual uint64_t capacity() const = 0;

  // Streams run their work in order. compute_stream() is the one kernels run on; new_stream()
  // makes another (the cache's copy stream), which does not wait for the compute stream unless
  // told to by an event.
  virtual int compute_stream() = 0;
  virtual int new_stream() = 0;
  // Events mark a point of a stream's work: record_event sets the event to everything issued
  // on the stream so far, wait_event makes the stream's later work wait for it, and event_done
  // says whether that work has completed by the time the stream's next work would start
  // (simulated) or now (CUDA). An event never recorded is done.
  virtual int new_event() = 0;
  virtual void free_event(int event) = 0;
  virtual void record_event(int event, int stream) = 0;
  virtual void wait_event(int stream, int event) = 0;
  virtual bool event_done(int event, int stream) const = 0;

  // Copies `bytes` of host memory into b at `offset`, on `stream`; `src` may be reused as soon as
  // the call returns.
  virtual void copy_h2d(int stream, Buffer& b, uint64_t offset, const void* src, uint64_t bytes) = 0;
  // Work on `stream` that reads the buffers `reads` and lasts about `seconds`: `run` issues it
  // (CUDA: launches kernels on the compute stream) or, simulated, computes it at once.
  virtual void launch(int stream, std::span<const int> reads, double seconds, const std::function<void()>& run) = 0;

  // A CUDA error that turned the device off (empty: none); from then on nothing is to be read
  // from its buffers.
  virtual std::string error() const { return {}; }
};

}  // namespace strata::gpu
