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
Status device_memory(size_t*, size_t*) { return not_built(); }
Result<void*> stream_create() { return not_built(); }
void stream_destroy(void*) {}
Result<void*> event_create() { return not_built(); }
void event_destroy(void*) {}
Status event_record(void*, void*) { return not_built(); }
Status stream_wait_event(void*, void*) { return not_built(); }
Result<bool> event_done(void*) { return not_built(); }
Status event_synchronize(void*) { return not_built(); }
Result<void*> pinned_alloc(size_t) { return not_built(); }
void pinned_free(void*) {}
Status copy_to_device_async(void*, const void*, size_t, void*) { return not_built(); }
Status copy_to_host_async(void*, const void*, size_t, void*) { return not_built(); }
Status memset_async(void*, int, size_t, void*) { return not_built(); }
Status cuda_gather_rows(const float*, const int32_t*, int64_t, int64_t, float*) { return not_built(); }
Status cuda_scatter_add_rows(float*, const int32_t*, const float*, int64_t, int64_t, const float*) {
  return not_built();
}
std::string cuda_gemm_library() { return "none (built without CUDA)"; }
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
bool cuda_route_supported(const RouteArgs&) { return false; }
Status cuda_route(const RouteArgs&, float*, const float*, int64_t, int32_t*, float*) { return not_built(); }
Status cuda_glu(int, float, float, float*, const float*, int64_t) { return not_built(); }
Status cuda_add_rows(float*, const float*, int64_t, int64_t) { return not_built(); }

}  // namespace strata::gpu
