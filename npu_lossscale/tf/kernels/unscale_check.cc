// NpuUnscaleAndCheck: divide a float32 gradient by the loss scale and decide overflow in one pass.
//
// Why a kernel: TensorFlow's CPU ops cannot fuse the unscaling multiply with a reduction, so the
// pure-TF path reads every gradient element twice (multiply, then check). Here each element is
// read once, multiplied by 1/scale, written (in place when the input buffer can be forwarded) and
// folded into one running maximum while still in a register.
//
// The rule is the one npu_lossscale.overflow.unscale_with_status applies on its pure-TF path, to
// the *scaled* gradient g as the backward pass produced it, so both paths agree bit for bit:
//   overflow iff some g is inf or NaN, or (saturation) max|g| >= 65504.
// (That path asks the inf/NaN question of u in INF_NAN mode: the same answer, see below.)
// Testing g rather than u = g * (1/scale) matters: a value the chip clamped to 65504 comes back
// from u * scale as 65503.996 for many scales (100, 0.8**k * 2**15), and would pass. The scale is
// at least 1, so u is inf or NaN exactly when g is.
//
// The maximum is taken over the bit patterns of |g| as integers: for non-negative floats integer
// order is magnitude order, and inf (0x7f800000) and every NaN sort above all finite values, so
// one integer max per element answers both questions -- "any inf/NaN?" and "largest |g|?".

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace npu_lossscale {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

constexpr float kFp16Max = 65504.0f;
// GCC/Clang vector extensions: 16 lanes, one AVX-512 register, or several narrower ones where
// the CPU has less (the compiler splits the operations).
typedef float Vec __attribute__((vector_size(64)));
typedef int32_t IVec __attribute__((vector_size(64)));
constexpr int kWidth = sizeof(Vec) / sizeof(float);
#if defined(__x86_64__)
#define NPU_LOSSSCALE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define NPU_LOSSSCALE_CLONES
#endif
// Below this many elements the work runs on the calling thread: a parallel dispatch
// costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 15;

// One gradient per op, not a list: each op starts as soon as its gradient exists, so unscaling
// overlaps the rest of the backward pass.
REGISTER_OP("NpuUnscaleAndCheck")
    .Input("grad: float")
    .Input("loss_scale: float")
    .Output("unscaled: float")
    .Output("status: float")
    .Attr("saturation: bool")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &scalar));
      c->set_output(0, c->input(0));
      c->set_output(1, c->Scalar());
      return Status();
    });

// |g| as bits is below 2**31, so a signed compare orders it too (and is one instruction on SSE2).
constexpr int32_t kAbsMask = 0x7fffffff;
constexpr int32_t kInfBits = 0x7f800000;

// Bits of the largest |g| seen; >= kInfBits iff some g was inf or NaN.
struct Accumulator {
  int32_t max_abs_bits = 0;

  void Merge(const Accumulator& other) { max_abs_bits = std::max(max_abs_bits, other.max_abs_bits); }
};

// Unscales src[0, n) into dst and returns what it saw; branch-free so it stays vectorised.
// On x86-64 it is compiled for AVX-512, AVX2 and the baseline, and the loader picks the one the
// CPU runs (target clones): the cache directory may be shared between machines, so no -march.
// Loading (memcpy) before storing keeps the forwarded case (src == dst) correct.
NPU_LOSSSCALE_CLONES
Accumulator UnscaleRange(const float* src, float* dst, int64_t n, float reciprocal) {
  const Vec r = Vec{} + reciprocal;
  IVec max_bits = {};
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    Vec g;
    std::memcpy(&g, src + i, sizeof(Vec));
    const IVec a = reinterpret_cast<IVec>(g) & kAbsMask;
    max_bits = max_bits < a ? a : max_bits;
    const Vec u = g * r;
    std::memcpy(dst + i, &u, sizeof(Vec));
  }
  Accumulator acc;
  for (int k = 0; k < kWidth; ++k) acc.max_abs_bits = std::max(acc.max_abs_bits, max_bits[k]);
  for (; i < n; ++i) {
    const float g = src[i];
    int32_t bits;
    std::memcpy(&bits, &g, sizeof(bits));
    acc.max_abs_bits = std::max(acc.max_abs_bits, bits & kAbsMask);
    dst[i] = g * reciprocal;
  }
  return acc;
}

class NpuUnscaleAndCheckOp : public OpKernel {
 public:
  explicit NpuUnscaleAndCheckOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("saturation", &saturation_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& scale_tensor = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(scale_tensor.shape()),
                tensorflow::errors::InvalidArgument("loss_scale must be a scalar, got shape ",
                                                    scale_tensor.shape().DebugString()));
    const float scale = scale_tensor.scalar<float>()();
    const float reciprocal = 1.0f / scale;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, grad.shape(), &out));
    const float* src = grad.flat<float>().data();
    float* dst = out->flat<float>().data();
    const int64_t total = grad.NumElements();

    Accumulator result;
    if (total < kParallelThreshold) {
      result = UnscaleRange(src, dst, total, reciprocal);
    } else {
      std::mutex mu;
      auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
      // Cost per element in "cycles": one load, one multiply, one store, one running max.
      tensorflow::Shard(pool->num_threads, pool->workers, total, 4,
                        [&](int64_t begin, int64_t end) {
                          const Accumulator part =
                              UnscaleRange(src + begin, dst + begin, end - begin, reciprocal);
                          std::lock_guard<std::mutex> lock(mu);
                          result.Merge(part);
                        });
    }

    bool overflowed = result.max_abs_bits >= kInfBits;
    if (saturation_ && !overflowed) {
      float max_abs;
      std::memcpy(&max_abs, &result.max_abs_bits, sizeof(max_abs));
      overflowed = max_abs >= kFp16Max;
    }
    Tensor* status = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &status));
    status->scalar<float>()() = overflowed ? 1.0f : 0.0f;
  }

 private:
  using TensorShapeUtils = tensorflow::TensorShapeUtils;
  bool saturation_ = false;
};

REGISTER_KERNEL_BUILDER(Name("NpuUnscaleAndCheck").Device(DEVICE_CPU), NpuUnscaleAndCheckOp);

}  // namespace npu_lossscale
