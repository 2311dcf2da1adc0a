// Builds without the CUDA library (STRATA_CUDA=OFF or no nvcc): the CUDA kernels say so.
#include "gpu/cuda_kernels.h"

namespace strata::gpu {

namespace {
Error not_built() { return Error{"this strata was built without the CUDA library (STRATA_CUDA=OFF or no nvcc)"}; }
}  // namespace

bool cuda_usable() { return false; }
Result<void*> device_alloc(size_t) { return not_built(); }
void device_free(void*) {}
Status copy_to_device(void*, const void*, size_t) { return not_built(); }
Status copy_to_host(void*, const void*, size_t) { return not_built(); }
bool cuda_has_matmul(GgmlType) { return false; }
Status cuda_matmul(GgmlType, const uint8_t*, int64_t, int64_t, size_t, const float*, int64_t, float*) {
  return not_built();
}
Status cuda_rms_norm(const float*, const float*, int64_t, int64_t, float, float*) { return not_built(); }
Status cuda_rope(float*, int64_t, int, int, int64_t, const RopeArgs&) { return not_built(); }
Status cuda_attention(const AttentionArgs&, const float*, const void*, const void*, int64_t, int64_t, float*) {
  return not_built();
}
Status cuda_attention_mla(int, int, int, float, const float*, const float*, int64_t, int64_t, float*) {
  return not_built();
}
Status cuda_glu(int, float, float, float*, const float*, int64_t) { return not_built(); }
Status cuda_add_rows(float*, const float*, int64_t, int64_t) { return not_built(); }

}  // namespace strata::gpu
