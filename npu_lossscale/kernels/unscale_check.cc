// NpuUnscaleAndCheck: divide float32 gradients by the loss scale and decide overflow in one pass.
//
// Why a kernel: TensorFlow's CPU ops cannot fuse the unscaling multiply with a reduction, so the
// pure-TF path reads every gradient element twice (multiply, then check). Here each element is
// read once, multiplied by 1/scale, written (in place when the input buffer can be forwarded) and
// folded into one running maximum while still in a register.
//
// The rule is the one npu_lossscale.overflow.overflow_status applies to the *unscaled* values
// u = g * (1/scale), so both paths agree bit for bit:
//   overflow iff some u is inf or NaN, or (saturation) float32(max|u| * scale) >= 65504.
// Rounding is monotonic, so max|u| * scale reaches the threshold iff some |u| * scale does.
//
// The maximum is taken over the bit patterns of |u| as integers: for non-negative floats integer
// order is magnitude order, and inf (0x7f800000) and every NaN sort above all finite values, so
// one integer max per element answers both questions -- "any inf/NaN?" and "largest |u|?".

#include <algorithm>
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

// |u| as bits is below 2**31, so a signed compare orders it too (and is one instruction on SSE2).
constexpr int32_t kAbsMask = 0x7fffffff;
constexpr int32_t kInfBits = 0x7f800000;

// Bits of the largest |u| seen; >= kInfBits iff some u was inf or NaN.
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
    Vec u;
    std::memcpy(&u, src + i, sizeof(Vec));
    u *= r;
    std::memcpy(dst + i, &u, sizeof(Vec));
    const IVec a = reinterpret_cast<IVec>(u) & kAbsMask;
    max_bits = max_bits < a ? a : max_bits;
  }
  Accumulator acc;
  for (int k = 0; k < kWidth; ++k) acc.max_abs_bits = std::max(acc.max_abs_bits, max_bits[k]);
  for (; i < n; ++i) {
    const float u = src[i] * reciprocal;
    dst[i] = u;
    int32_t bits;
    std::memcpy(&bits, &u, sizeof(bits));
    acc.max_abs_bits = std::max(acc.max_abs_bits, bits & kAbsMask);
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
      // Cost per element in "cycles": one load, one multiply, one store, one running max.
      tensorflow::Shard(pool->num_threads, pool->workers, total, 4,
                        [&](int64_t begin, int64_t end) {
                          const Accumulator part = work(begin, end);
                          std::lock_guard<std::mutex> lock(mu);
                          result.Merge(part);
                        });
    }

    bool overflowed = result.max_abs_bits >= kInfBits;
    if (saturation_ && !overflowed) {
      float max_abs;
      std::memcpy(&max_abs, &result.max_abs_bits, sizeof(max_abs));
      overflowed = max_abs * scale >= kFp16Max;
    }
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
