// npu_lossscale::check_and_unscale_: the overflow check of either mode and the unscale, over a
// list of CPU gradients, in one pass.
//
// Why a kernel: in saturation mode an element counts as overflowed when its *scaled* magnitude
// reaches 65504 (the chip clamps there) or it is inf/NaN. Torch has no fused op for that, so the
// pure-torch path reads every gradient three times (amax, amin, then the multiply). Here each
// element is read once, tested while still scaled, multiplied by inv_scale and written back.
// In inf_nan mode torch has one (torch._amp_foreach_non_finite_check_and_unscale_, what stock
// GradScaler runs); on gradients already in cache it takes twice as long as this loop, which
// answers the same question with inf's bit pattern as the limit.
//
// The test is !(|g| < limit), true for |g| >= limit, +-inf and NaN, taken as an integer maximum:
// the bit patterns of non-negative floats sort as their values, and inf (0x7f800000) and every
// NaN sort above all finite ones, so one running maximum of the bits of |g| (sign cleared) answers
// every question the other paths ask: overflow iff that maximum >= the bits of the limit (65504.0f
// in saturation mode, inf in inf_nan mode). That is one integer max per vector of elements where
// a compare-and-or takes three instructions.
//
// The unscaled values are bitwise those of torch's own multiply (torch._foreach_mul_ by the
// float32 scalar tensor, and torch's inf/NaN kernel): float32 gradients are multiplied in float32;
// float16 and bfloat16 ones are widened to float32, multiplied by the float32 inv_scale and
// rounded back to nearest even, which is what torch's reduced-float multiply by a CPU scalar does.
// (NaN stays NaN; its payload is not specified, and torch's own scalar and vector loops disagree
// on it.)
//
// Multi-threading: large tensors are split into chunks with at::parallel_for, on torch's own
// intra-op threads (built with -fopenmp; see kernels/__init__.py). Every element is written by
// exactly one chunk, and the chunks' flags are or-ed, so the results do not depend on the number
// of threads or on their order.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

namespace {

constexpr uint32_t kSaturationBits = 0x477FE000u;  // 65504.0f
constexpr uint32_t kInfBits = 0x7F800000u;  // inf; every NaN sorts above it
// Below this many elements a chunk is not worth handing to another thread.
constexpr int64_t kGrain = 1 << 16;

#if defined(__x86_64__) && !defined(__clang__)
#define NPU_LOSSSCALE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define NPU_LOSSSCALE_CLONES
#endif

template <typename T>
__attribute__((always_inline)) inline bool scan(T* data, int64_t n, float inv, uint32_t limit) {
  uint32_t top = 0;  // the largest bit pattern of |g| so far
#pragma GCC unroll 4
  for (int64_t i = 0; i < n; ++i) {
    const float g = static_cast<float>(data[i]);
    uint32_t bits;
    std::memcpy(&bits, &g, sizeof bits);
    top = std::max(top, bits & 0x7fffffffu);
    data[i] = static_cast<T>(g * inv);
  }
  return top >= limit;
}

// One instance per dtype, each compiled for several instruction sets and picked at load time
// (the library is built portable, so it may be shared between machines).
NPU_LOSSSCALE_CLONES bool scan_float(float* data, int64_t n, float inv, uint32_t limit) {
  return scan(data, n, inv, limit);
}
NPU_LOSSSCALE_CLONES bool scan_half(c10::Half* data, int64_t n, float inv, uint32_t limit) {
  return scan(data, n, inv, limit);
}
NPU_LOSSSCALE_CLONES bool scan_bfloat16(c10::BFloat16* data, int64_t n, float inv,
                                           uint32_t limit) {
  return scan(data, n, inv, limit);
}

bool scan_chunk(const at::Tensor& grad, int64_t begin, int64_t end, float inv, uint32_t limit) {
  const int64_t n = end - begin;
  switch (grad.scalar_type()) {
    case at::kFloat:
      return scan_float(static_cast<float*>(grad.data_ptr()) + begin, n, inv, limit);
    case at::kHalf:
      return scan_half(static_cast<c10::Half*>(grad.data_ptr()) + begin, n, inv, limit);
    default:
      return scan_bfloat16(static_cast<c10::BFloat16*>(grad.data_ptr()) + begin, n, inv, limit);
  }
}

bool is_float_scalar(const at::Tensor& tensor) {
  return tensor.device().is_cpu() && tensor.layout() == at::kStrided &&
         tensor.scalar_type() == at::kFloat && tensor.numel() == 1;
}

// Whether the op can take every tensor: CPU, strided, one of the three dtypes, and laid out as
// one dense block (contiguous in some dimension order), so its elements are data_ptr()[0, numel).
bool takes(const std::vector<at::Tensor>& grads, const at::Tensor& found_inf,
           const at::Tensor& inv_scale) {
  if (!is_float_scalar(found_inf) || !is_float_scalar(inv_scale)) return false;
  for (const at::Tensor& grad : grads) {
    const at::ScalarType dtype = grad.scalar_type();
    if (!grad.device().is_cpu() || grad.layout() != at::kStrided ||
        (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) ||
        !grad.unsafeGetTensorImpl()->is_non_overlapping_and_dense()) {
      return false;
    }
  }
  return true;
}

// Returns false, touching nothing, when some tensor is not one the op takes; the caller then
// uses the pure-torch path for the whole list. Otherwise sets found_inf to 1 if any element
// overflowed (leaves it as it was if none did, as torch's found_inf kernels do) and unscales.
bool check_and_unscale(std::vector<at::Tensor> grads, at::Tensor found_inf,
                       const at::Tensor& inv_scale, bool saturation) {
  if (!takes(grads, found_inf, inv_scale)) return false;
  // As torch's own in-place ops do (this raises, before anything is written, for an inference
  // tensor outside inference mode, as they would).
  for (const at::Tensor& grad : grads) grad.unsafeGetTensorImpl()->bump_version();
  found_inf.unsafeGetTensorImpl()->bump_version();
  const float inv = *static_cast<const float*>(inv_scale.data_ptr());
  const uint32_t limit = saturation ? kSaturationBits : kInfBits;
  std::atomic<int> bad{0};
  for (const at::Tensor& grad : grads) {
    at::parallel_for(0, grad.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if (scan_chunk(grad, begin, end, inv, limit)) bad.store(1, std::memory_order_relaxed);
    });
  }
  if (bad.load()) *static_cast<float*>(found_inf.data_ptr()) = 1.0f;
  return true;
}

}  // namespace

TORCH_LIBRARY(npu_lossscale, m) {
  m.def(
      "check_and_unscale_(Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale, "
      "bool saturation) -> bool");
}

TORCH_LIBRARY_IMPL(npu_lossscale, CPU, m) {
  m.impl("check_and_unscale_", &check_and_unscale);
}
