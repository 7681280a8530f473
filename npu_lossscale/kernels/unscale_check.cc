// NpuUnscaleAndCheck: divide float32 gradients by the loss scale and decide overflow in one pass.
//
// Why a kernel: TensorFlow's CPU ops cannot fuse the unscaling multiply with a reduction, so the
// pure-TF path reads every gradient element twice (multiply, then check). Here each element is
// read once, multiplied by 1/scale, written (in place when the input buffer can be forwarded) and
// folded into two per-lane accumulators while still in a register.
//
// The rule is the one npu_lossscale.overflow.overflow_status applies to the *unscaled* values
// u = g * (1/scale), so both paths agree bit for bit:
//   overflow iff some u is inf or NaN, or (saturation) float32(max|u| * scale) >= 65504.
// Rounding is monotonic, so max|u| * scale reaches the threshold iff some |u| * scale does.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace npu_lossscale {

using tensorflow::DEVICE_CPU;
using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

constexpr float kFp16Max = 65504.0f;
// GCC/Clang vector extensions: portable SIMD (SSE2 on any x86-64, NEON on aarch64) without
// -march flags, which a shared build cache must not assume.
typedef float Vec __attribute__((vector_size(16)));
typedef int32_t IVec __attribute__((vector_size(16)));
constexpr int kWidth = sizeof(Vec) / sizeof(float);
// Below this many elements in total the work runs on the calling thread: a parallel dispatch
// costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 15;

REGISTER_OP("NpuUnscaleAndCheck")
    .Input("grads: N * float")
    .Input("loss_scale: float")
    .Output("unscaled: N * float")
    .Output("status: float")
    .Attr("N: int >= 1")
    .Attr("saturation: bool")
    .SetShapeFn([](InferenceContext* c) {
      int n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      ShapeHandle scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(n), 0, &scalar));
      for (int i = 0; i < n; ++i) c->set_output(i, c->input(i));
      c->set_output(n, c->Scalar());
      return Status();
    });

struct Accumulator {
  float nan_sum = 0.0f;  // sum of u - u: NaN iff some u was inf or NaN
  float max_abs = 0.0f;  // max |u| over finite and infinite u (NaN compares false, never kept)

  void Merge(const Accumulator& other) {
    nan_sum += other.nan_sum;
    max_abs = std::max(max_abs, other.max_abs);
  }
};

// Unscales one vector; u - u is NaN exactly for inf and NaN, and the sign bit is masked off for |u|.
// Loading (memcpy) before storing keeps the forwarded case (src == dst) correct.
inline void Step(const float* src, float* dst, Vec reciprocal, Vec& nan_acc, Vec& max_acc) {
  Vec u;
  std::memcpy(&u, src, sizeof(Vec));
  u *= reciprocal;
  std::memcpy(dst, &u, sizeof(Vec));
  nan_acc += u - u;
  const Vec a = reinterpret_cast<Vec>(reinterpret_cast<IVec>(u) & 0x7fffffff);
  max_acc = max_acc < a ? a : max_acc;
}

// Unscales src[0, n) into dst and returns what it saw; branch-free so it stays vectorised.
Accumulator UnscaleRange(const float* src, float* dst, int64_t n, float reciprocal) {
  const Vec r = Vec{} + reciprocal;
  Vec nan0 = {}, nan1 = {}, max0 = {}, max1 = {};
  int64_t i = 0;
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
    Step(src + i, dst + i, r, nan0, max0);
    Step(src + i + kWidth, dst + i + kWidth, r, nan1, max1);
  }
  Accumulator acc;
  for (; i < n; ++i) {
    const float u = src[i] * reciprocal;
    dst[i] = u;
    acc.nan_sum += u - u;
    acc.max_abs = std::max(acc.max_abs, std::fabs(u));
  }
  for (int k = 0; k < kWidth; ++k) {
    acc.nan_sum += nan0[k] + nan1[k];
    acc.max_abs = std::max(acc.max_abs, std::max(max0[k], max1[k]));
  }
  return acc;
}

class NpuUnscaleAndCheckOp : public OpKernel {
 public:
  explicit NpuUnscaleAndCheckOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("saturation", &saturation_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = num_inputs() - 1;
    const Tensor& scale_tensor = ctx->input(n);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(scale_tensor.shape()),
                tensorflow::errors::InvalidArgument("loss_scale must be a scalar, got shape ",
                                                    scale_tensor.shape().DebugString()));
    const float scale = scale_tensor.scalar<float>()();
    const float reciprocal = 1.0f / scale;

    std::vector<const float*> src(n);
    std::vector<float*> dst(n);
    std::vector<int64_t> start(n + 1, 0);
    for (int i = 0; i < n; ++i) {
      const Tensor& in = ctx->input(i);
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({i}, i, in.shape(), &out));
      src[i] = in.flat<float>().data();
      dst[i] = out->flat<float>().data();
      start[i + 1] = start[i] + in.NumElements();
    }
    const int64_t total = start[n];

    // Unscales the global element range [begin, end), which may span several tensors.
    auto work = [&](int64_t begin, int64_t end) {
      Accumulator acc;
      int t = static_cast<int>(std::upper_bound(start.begin(), start.end(), begin) -
                               start.begin()) - 1;
      while (begin < end && t < n) {
        const int64_t stop = std::min(end, start[t + 1]);
        if (stop > begin) {
          const int64_t off = begin - start[t];
          acc.Merge(UnscaleRange(src[t] + off, dst[t] + off, stop - begin, reciprocal));
        }
        begin = stop;
        ++t;
      }
      return acc;
    };

    Accumulator result;
    if (total < kParallelThreshold) {
      result = work(0, total);
    } else {
      std::mutex mu;
      auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
      // Cost per element in "cycles": one load, one multiply, one store, two vector updates.
      tensorflow::Shard(pool->num_threads, pool->workers, total, 4,
                        [&](int64_t begin, int64_t end) {
                          const Accumulator part = work(begin, end);
                          std::lock_guard<std::mutex> lock(mu);
                          result.Merge(part);
                        });
    }

    bool overflowed = !std::isfinite(result.nan_sum) || std::isinf(result.max_abs);
    if (saturation_) overflowed = overflowed || result.max_abs * scale >= kFp16Max;
    Tensor* status = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(n, TensorShape({}), &status));
    status->scalar<float>()() = overflowed ? 1.0f : 0.0f;
  }

 private:
  using TensorShapeUtils = tensorflow::TensorShapeUtils;
  bool saturation_ = false;
};

REGISTER_KERNEL_BUILDER(Name("NpuUnscaleAndCheck").Device(DEVICE_CPU), NpuUnscaleAndCheckOp);

}  // namespace npu_lossscale
