// Builds without the CUDA library (STRATA_CUDA=OFF or no nvcc): the CUDA kernels say so.
#include "gpu/cuda_kernels.h"

namespace strata::gpu {

bool cuda_usable() { return false; }

Status cuda_matvec(GgmlType, const uint8_t*, int64_t, int64_t, size_t, const float*, float*) {
  return Error{"this strata was built without the CUDA library (STRATA_CUDA=OFF or no nvcc)"};
}

}  // namespace strata::gpu
