#include "gpu/gpu_devices.h"

namespace strata {

GpuDevices list_gpu_devices() {
  GpuDevices d;
  d.error = "this build has no GPU backend (configure with -DSTRATA_CUDA=ON where nvcc exists)";
  return d;
}

}  // namespace strata
