// Which GPUs this build can use. The CUDA library implements it when built (STRATA_CUDA);
// otherwise gpu_devices_none.cpp says the build has no GPU backend. No CUDA type appears here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

struct GpuDeviceInfo {
  int index = 0;
  std::string name;
  uint64_t total_bytes = 0;  // device memory
  int compute_major = 0, compute_minor = 0;
};

struct GpuDevices {
  bool built_with_cuda = false;
  std::string error;  // why no device is listed (no driver, no device), empty when fine
  std::vector<GpuDeviceInfo> devices;
};

GpuDevices list_gpu_devices();

}  // namespace strata
