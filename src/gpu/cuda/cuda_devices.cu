// Device enumeration through the CUDA runtime.
#include <cuda_runtime.h>

#include "gpu/gpu_devices.h"

namespace strata {

GpuDevices list_gpu_devices() {
  GpuDevices d;
  d.built_with_cuda = true;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    d.error = std::string("CUDA: ") + cudaGetErrorString(err);
    return d;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    d.devices.push_back({i, prop.name, static_cast<uint64_t>(prop.totalGlobalMem), prop.major,
                         prop.minor});
  }
  if (n == 0) d.error = "CUDA: no device found";
  return d;
}

}  // namespace strata
