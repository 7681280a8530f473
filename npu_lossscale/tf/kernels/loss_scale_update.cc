// NpuLossScaleUpdate: ExponentialUpdateLossScaleManager's per-step update as one op.
//
// Why a kernel: the rule is a handful of scalar comparisons, but written with TensorFlow ops it
// is about forty tiny graph nodes (reads, selects, assigns) that the executor schedules one by
// one on every training step, between the overflow decision and the optimizer update. Here it is
// one node. The arithmetic is the float32/int arithmetic of the pure-TF update in
// npu_lossscale/tf/rule_ops.py (next_rule_state, which npu_lossscale/tf/managers.py runs), so
// both give bit-identical state (tested).
//
// Each variable gets a fresh buffer rather than an in-place write: a value read earlier in the
// same step (the scale the loss was multiplied by) may still alias the old one.

#include <cmath>
#include <cstdint>
#include <limits>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace npu_lossscale {

using tensorflow::DataType;
using tensorflow::DataTypeString;
using tensorflow::DT_FLOAT;
using tensorflow::DT_INT32;
using tensorflow::DT_INT64;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;
// TensorFlow's own 64-bit integer: `long long` up to TF 2.6 (1.15's headers take no int64_t* in
// GetAttr), std::int64_t (`long`) in later releases. Named through the type TensorFlow maps
// DT_INT64 to, so one source compiles against either.
using TfInt64 = tensorflow::EnumToDataType<DT_INT64>::Type;

REGISTER_OP("NpuLossScaleUpdate")
    .Input("finite: bool")
    .Input("loss_scale: resource")
    .Input("good_steps: resource")
    .Input("bad_steps: resource")
    .Input("skipped_steps: resource")
    .Input("skips_at_floor: resource")
    .Output("new_skips_at_floor: int64")
    .Attr("incr_every_n_steps: int >= 1")
    .Attr("decr_every_n_nan_or_inf: int >= 1")
    .Attr("incr_ratio: float")
    .Attr("decr_ratio: float")
    .Attr("min_loss_scale: float")
    .Attr("max_loss_scale: float")  // +inf: no cap (an increase past float32 keeps the scale)
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return Status();
    });

class NpuLossScaleUpdateOp : public OpKernel {
 public:
  explicit NpuLossScaleUpdateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("incr_every_n_steps", &incr_every_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("decr_every_n_nan_or_inf", &decr_every_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("incr_ratio", &incr_ratio_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("decr_ratio", &decr_ratio_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_loss_scale", &min_scale_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_loss_scale", &max_scale_));
  }

  void Compute(OpKernelContext* ctx) override {
    const bool finite = ctx->input(0).scalar<bool>()();
    tensorflow::core::RefCountPtr<Var> vars[5];
    const DataType types[5] = {DT_FLOAT, DT_INT32, DT_INT32, DT_INT64, DT_INT64};
    for (int i = 0; i < 5; ++i) {
      OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, i + 1), &vars[i]));
    }
    // Always the same order, and nothing else takes two of these locks at once.
    tensorflow::mutex_lock l0(*vars[0]->mu()), l1(*vars[1]->mu()), l2(*vars[2]->mu()),
        l3(*vars[3]->mu()), l4(*vars[4]->mu());
    for (int i = 0; i < 5; ++i) {
      const Tensor& t = *vars[i]->tensor();
      OP_REQUIRES(ctx, vars[i]->is_initialized && t.dtype() == types[i] && t.NumElements() == 1,
                  tensorflow::errors::FailedPrecondition(
                      "NpuLossScaleUpdate: variable ", i, " must be an initialized scalar of type ",
                      DataTypeString(types[i])));
    }
    // A scale restored below the floor (0, 1e-40, NaN from a checkpoint) counts as the floor,
    // as in the pure-TF update (npu_lossscale/tf/managers.py, _scale_read).
    const float stored = vars[0]->tensor()->flat<float>()(0);
    const float scale = stored >= min_scale_ ? stored : min_scale_;
    const int32_t good = vars[1]->tensor()->flat<int32_t>()(0);
    const int32_t bad = vars[2]->tensor()->flat<int32_t>()(0);
    const TfInt64 skipped = vars[3]->tensor()->flat<TfInt64>()(0);
    const TfInt64 at_floor = vars[4]->tensor()->flat<TfInt64>()(0);

    const bool grow = good + 1 >= incr_every_;
    float grown = scale * incr_ratio_;
    if (std::isinf(max_scale_)) {
      if (!std::isfinite(grown)) grown = scale;
    } else {
      grown = std::min(grown, max_scale_);
    }
    const bool shrink = bad + 1 >= decr_every_;
    const float shrunk = std::max(min_scale_, scale * decr_ratio_);

    const float new_scale = finite ? (grow ? grown : scale) : (shrink ? shrunk : scale);
    const int32_t new_good = (finite && !grow) ? good + 1 : 0;
    const int32_t new_bad = finite ? (grow ? 0 : bad) : (shrink ? 0 : bad + 1);
    const TfInt64 new_at_floor = (!finite && scale <= min_scale_) ? at_floor + 1 : 0;
    const TfInt64 new_skipped = skipped + (finite ? 0 : 1);

    Store<float>(ctx, vars[0].get(), new_scale);
    Store<int32_t>(ctx, vars[1].get(), new_good);
    Store<int32_t>(ctx, vars[2].get(), new_bad);
    Store<TfInt64>(ctx, vars[3].get(), new_skipped);
    Store<TfInt64>(ctx, vars[4].get(), new_at_floor);

    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<TfInt64>()() = new_at_floor;
  }

 private:
  template <typename T>
  static void Store(OpKernelContext* ctx, Var* var, T value) {
    Tensor fresh;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(var->tensor()->dtype(), var->tensor()->shape(), &fresh));
    fresh.flat<T>()(0) = value;
    *var->tensor() = fresh;
  }

  TfInt64 incr_every_ = 1;
  TfInt64 decr_every_ = 1;
  float incr_ratio_ = 2.0f;
  float decr_ratio_ = 0.5f;
  float min_scale_ = 1.0f;
  float max_scale_ = std::numeric_limits<float>::infinity();
};

REGISTER_KERNEL_BUILDER(Name("NpuLossScaleUpdate").Device(tensorflow::DEVICE_CPU),
                        NpuLossScaleUpdateOp);

}  // namespace npu_lossscale
