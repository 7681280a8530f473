"""The migrator's registry: every API spelling a stage looks for, and every rule id it reports.

Adding an API means adding its spelling here, once: the byte pre-filter's triggers
(migrator.selection.prefilter) and the `ast` triage's names (migrator.selection.triage) are derived
from these tables, and the codemods' name tables (codemods/shared/api.py, codemods/torch/names.py)
are built from them, so a spelling the codemods recognise cannot be skipped by the earlier stages.
tests/migrator/test_registry.py runs the real gates on a small source per spelling.

A finding's rule id is what a reader filters the report by and what the tests assert on, so each
id is spelled once, at the end of this module, and the stages name the constant.

Plain data and two small functions, no imports: the pre-filter must stay free of libcst.
"""

from __future__ import annotations

from collections.abc import Iterable

# ============================================================= API spellings: TF1 and Keras ports
# The contrib mixed-precision package and the classes the port rewrites there.
TF_CONTRIB = "tensorflow.contrib.mixed_precision"
TF_CONTRIB_MODULES = (
    TF_CONTRIB,
    TF_CONTRIB + ".python.loss_scale_manager",
    TF_CONTRIB + ".python.loss_scale_optimizer",
)
TF_FIXED_MANAGER = "FixedLossScaleManager"
TF_DYNAMIC_MANAGER = "ExponentialUpdateLossScaleManager"
LOSS_SCALE_OPTIMIZER = "LossScaleOptimizer"  # contrib's and Keras's class name
TF_CONTRIB_CLASSES = (TF_FIXED_MANAGER, TF_DYNAMIC_MANAGER, LOSS_SCALE_OPTIMIZER)
# TensorFlow's own (non-contrib) homes of the v1 loss-scale API, after dropping `compat.v1`, and
# the names the port rewrites there.
TF_CORE_MODULES = (
    "tensorflow.train.experimental",
    "tensorflow.mixed_precision",
    "tensorflow.mixed_precision.experimental",
    "tensorflow.python.training.experimental.loss_scale",
    "tensorflow.python.training.experimental.loss_scale_optimizer",
    "tensorflow.python.training.experimental.mixed_precision",
)
TF_DYNAMIC_LOSS_SCALE_CLASS = "DynamicLossScale"
TF_FIXED_LOSS_SCALE_CLASS = "FixedLossScale"
TF_MIXED_PRECISION_OPTIMIZER = "MixedPrecisionLossScaleOptimizer"
TF_GRAPH_REWRITE = "enable_mixed_precision_graph_rewrite"
TF_CORE_NAMES = (
    TF_DYNAMIC_LOSS_SCALE_CLASS,
    TF_FIXED_LOSS_SCALE_CLASS,
    TF_MIXED_PRECISION_OPTIMIZER,
    TF_GRAPH_REWRITE,
)
# Keras mixed-precision modules (any `...LossScale...` there is reported as unported).
KERAS_MODULES = (
    "tensorflow.keras.mixed_precision",
    "tensorflow.keras.mixed_precision.experimental",
    "tensorflow.mixed_precision",
    "tensorflow.mixed_precision.experimental",
    "keras.mixed_precision",
)
# Homes of Keras's LossScaleOptimizer, by the order of its positional parameters after the inner
# optimizer: tf_keras (Keras 2) takes `dynamic` second, Keras 3 `initial_scale`; `tf.keras` and
# `keras` were either, depending on the installed version.
KERAS_EITHER_HOMES = ("tensorflow.keras.mixed_precision", "keras.mixed_precision")
KERAS_2_HOMES = (
    "tf_keras.mixed_precision",
    "tensorflow.python.keras.mixed_precision.loss_scale_optimizer",
)
KERAS_3_HOMES = ("keras.optimizers", "tensorflow.keras.optimizers")
# TF 2.1-2.3's `LossScaleOptimizer(optimizer, loss_scale)`.
KERAS_EXPERIMENTAL_HOMES = (
    "tensorflow.keras.mixed_precision.experimental",
    "keras.mixed_precision.experimental",
    "tf_keras.mixed_precision.experimental",
    "tensorflow.python.keras.mixed_precision.experimental.loss_scale_optimizer",
)
# Where Keras sets its global dtype policy (a mixed_float16 policy brings Keras's own scaling):
# the mixed-precision modules' setters, and keras.config's.
POLICY_MIXED_PRECISION_HOMES = (
    "tensorflow.keras.mixed_precision",
    "tensorflow.keras.mixed_precision.experimental",
    "keras.mixed_precision",
    "keras.mixed_precision.experimental",
    "tf_keras.mixed_precision",
    "tf_keras.mixed_precision.experimental",
)
POLICY_CONFIG_HOMES = ("keras.config", "tensorflow.keras.config")
POLICY_SETTERS = ("set_global_policy", "set_policy", "set_dtype_policy")
# The one keras.config has. (codemods/shared/api.py's is_policy_setter also takes the others
# under keras.config, which no Keras defines: they are no spelling here, so they add no trigger.)
POLICY_CONFIG_SETTER = "set_dtype_policy"
POLICY_CLASSES = ("Policy", "DTypePolicy")
# The vendor's adapter: a file importing it was ported already.
VENDOR_PREFIXES = ("npu_bridge",)
NPU_OPTIMIZER = "NPULossScaleOptimizer"  # the vendor's and our class name

# ============================================================= API spellings: PyTorch port
TORCH_SCALER = "GradScaler"
# Modules whose GradScaler the port knows -> which scaler it is (codemods/torch/names.py's Kind).
TORCH_SCALER_HOMES = {
    "torch.cuda.amp": "cuda",
    "torch.cuda.amp.grad_scaler": "cuda",
    "torch.cpu.amp": "cpu",
    "torch.cpu.amp.grad_scaler": "cpu",
    "torch": "amp",  # torch.GradScaler, the same class as torch.amp's (torch 2.3 and later)
    "torch.amp": "amp",
    "torch.amp.grad_scaler": "amp",
    # torch-npu registers itself as `torch.npu` once imported
    "torch.npu.amp": "npu",
    "torch.npu.amp.grad_scaler": "npu",
    "torch_npu.npu.amp": "npu",
    "torch_npu.npu.amp.grad_scaler": "npu",
}
# Scalers the port leaves, each with what it is (every use is reported).
TORCH_SHARDED_SCALERS = {
    "torch.distributed.fsdp.ShardedGradScaler": "FSDP's sharded scaler",
    "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler": "FSDP's sharded scaler",
    # fairscale's, torch.cuda.amp.GradScaler subclasses for its sharded optimizers and FSDP
    "fairscale.optim.grad_scaler.ShardedGradScaler": "fairscale's sharded scaler",
    "fairscale.optim.ShardedGradScaler": "fairscale's sharded scaler",
    "fairscale.optim.grad_scaler.GradScaler": "fairscale's scaler for its FSDP",
    "fairscale.optim.GradScaler": "fairscale's scaler for its FSDP",
}
# Other libraries' loss scaling for torch, which the port leaves: each checks inf/NaN only.
TORCH_FOREIGN_LOSS_SCALING = {
    "apex.amp.scale_loss": "apex's amp.scale_loss",
    "apex.amp.initialize": "apex's amp.initialize",
    "apex.amp.handle.scale_loss": "apex's amp.scale_loss",
    "apex.fp16_utils.FP16_Optimizer": "apex's FP16_Optimizer",
    "apex.fp16_utils.fp16_optimizer.FP16_Optimizer": "apex's FP16_Optimizer",
    # The fused-kernel FP16_Optimizer: apex.optimizers in 2019, apex.contrib.optimizers since.
    "apex.contrib.optimizers.FP16_Optimizer": "apex's FP16_Optimizer",
    "apex.contrib.optimizers.fp16_optimizer.FP16_Optimizer": "apex's FP16_Optimizer",
    "apex.optimizers.FP16_Optimizer": "apex's FP16_Optimizer",
    "apex.optimizers.fp16_optimizer.FP16_Optimizer": "apex's FP16_Optimizer",
    "apex.fp16_utils.DynamicLossScaler": "apex's DynamicLossScaler",
    "apex.fp16_utils.loss_scaler.DynamicLossScaler": "apex's DynamicLossScaler",
    "timm.utils.ApexScaler": "timm's ApexScaler, apex's amp inside timm",
    "timm.utils.cuda.ApexScaler": "timm's ApexScaler, apex's amp inside timm",
}
# Another library's wrapper around torch's own GradScaler (DeiT, BEiT and their descendants import
# timm's): the port does not reach into the library, so the loop keeps torch's scaler.
TORCH_WRAPPED_SCALERS = {
    "timm.utils.NativeScaler": "timm's NativeScaler",
    "timm.utils.cuda.NativeScaler": "timm's NativeScaler",
}

# Training frameworks that scale the loss themselves once asked for fp16 (the port does not reach
# into them; migrator.selection.framework_fp16 warns): the call that asks, by qualified name, with
# the framework's name in the warning.
_LIGHTNING_HOMES = (
    "pytorch_lightning",
    "pytorch_lightning.trainer",
    "pytorch_lightning.trainer.trainer",
    "lightning",
    "lightning.pytorch",
    "lightning.pytorch.trainer",
    "lightning.pytorch.trainer.trainer",
)
_FABRIC_HOMES = ("lightning", "lightning.fabric", "lightning.fabric.fabric", "lightning_fabric")
# Fabric's first name (Lightning 1.5-1.9), always subclassed: `class Lite(LightningLite)`
_LITE = ("pytorch_lightning.lite.LightningLite", "pytorch_lightning.lite.lite.LightningLite")
_HF_ARGUMENTS = (
    "transformers.TrainingArguments",
    "transformers.training_args.TrainingArguments",
    "transformers.Seq2SeqTrainingArguments",
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
    # TRL's trainer configs are TrainingArguments subclasses, with its `fp16`
    *(
        f"trl.{kind}Config"
        for kind in ("SFT", "DPO", "Reward", "ORPO", "KTO", "CPO", "GRPO", "PPO", "RLOO", "GKD")
    ),
)
TORCH_FRAMEWORK_FP16 = {
    "deepspeed.initialize": "DeepSpeed",
    **{f"{m}.Trainer": "Lightning" for m in _LIGHTNING_HOMES},
    **{f"{m}.Fabric": "Lightning" for m in _FABRIC_HOMES},
    **{name: "Lightning" for name in _LITE},
    "accelerate.Accelerator": "accelerate",
    "accelerate.accelerator.Accelerator": "accelerate",
    **{name: "Hugging Face's Trainer" for name in _HF_ARGUMENTS},
}
# Lightning's command-line tool: it builds the Trainer (`--trainer.precision`, a config file, or
# its `trainer_defaults`) and fits, so the script itself shows no training.
TORCH_FRAMEWORK_CLIS = {
    f"{m}.LightningCLI": "Lightning"
    for m in ("lightning.pytorch.cli", "pytorch_lightning.cli", "pytorch_lightning.utilities.cli")
}
# Parsers that build those arguments from the command line (`--fp16`), given their classes.
TORCH_FRAMEWORK_PARSERS = {
    "transformers.HfArgumentParser": "Hugging Face's Trainer",
    "transformers.hf_argparser.HfArgumentParser": "Hugging Face's Trainer",
    "trl.TrlParser": "Hugging Face's Trainer",
}
TORCH_FRAMEWORK_PACKAGES = frozenset(n.split(".")[0] for n in TORCH_FRAMEWORK_FP16)

# The keyword that hands the framework's loop to DeepSpeed, whose scaler then scales the loss.
TORCH_FRAMEWORK_DEEPSPEED_KEYWORDS = {
    "Lightning": "strategy",  # "deepspeed_stage_2" or DeepSpeedStrategy(...)
    "accelerate": "deepspeed_plugin",
    "Hugging Face's Trainer": "deepspeed",  # a JSON path or dict
}
# The keywords that ask each for fp16 (DeepSpeed's config is read apart), and the literal values
# that do: Lightning's 16 and "16" are the old spellings of "16-mixed"; accelerate's `fp16=True`
# is its first spelling of mixed_precision="fp16".
TORCH_FRAMEWORK_FP16_KEYWORDS = {
    "Lightning": (("precision", (16, "16", "16-mixed")),),
    "accelerate": (("mixed_precision", ("fp16",)), ("fp16", (True,))),
    "Hugging Face's Trainer": (("fp16", (True,)),),
}

# ============================================================= API spellings: cross-cutting moves
# The global-step move: a hand-made update names the step and calls an assign-like op; an
# optimizer class defines the method the increment moves into.
STEP_NAMES = ("global_step",)
STEP_CALL_PREFIXES = ("assign",)
STEP_METHOD = "apply_gradients"
# --add-loss-scale wraps an optimizer: a file that spells none has nothing to wrap.
OPTIMIZER_WORDS = ("Optimizer", "optimizer")


def tf_spellings() -> tuple[str, ...]:
    """Every qualified name (canonical, `compat.v1` dropped) the TF1 and Keras ports rewrite or
    report on its own: a file naming one must reach them."""
    return (
        *TF_CONTRIB_MODULES,
        *(f"{m}.{c}" for m in TF_CONTRIB_MODULES for c in TF_CONTRIB_CLASSES),
        *(f"{m}.{n}" for m in TF_CORE_MODULES for n in TF_CORE_NAMES),
        *(
            f"{m}.{LOSS_SCALE_OPTIMIZER}"
            for m in (*KERAS_EITHER_HOMES, *KERAS_2_HOMES, *KERAS_3_HOMES)
        ),
        *(f"{m}.{LOSS_SCALE_OPTIMIZER}" for m in KERAS_EXPERIMENTAL_HOMES),
        *(f"{m}.{s}" for m in POLICY_MIXED_PRECISION_HOMES for s in POLICY_SETTERS),
        *(f"{m}.{POLICY_CONFIG_SETTER}" for m in POLICY_CONFIG_HOMES),
    )


def torch_spellings() -> tuple[str, ...]:
    """Every qualified name the torch port rewrites or reports."""
    return (
        *(f"{m}.{TORCH_SCALER}" for m in TORCH_SCALER_HOMES),
        *TORCH_SHARDED_SCALERS,
        *TORCH_FOREIGN_LOSS_SCALING,
        *TORCH_WRAPPED_SCALERS,
    )


# ============================================================= what the gates look for
# Substrings that cover most spellings at once (`mixed_precision` is in every contrib and Keras
# module). A spelling none of whose parts holds one adds its last part (derived, below).
TF_MARKERS = ("mixed_precision", "LossScale", "loss_scale")
TORCH_MARKERS = (TORCH_SCALER, "apex")  # apex: its own loss scaling
# Module parts (whole) that mean an API wherever a framework import reaches them.
API_MODULE_PARTS = ("amp", "npu_bridge", "fp16_utils")
# Names the triage counts when imported from a user's own module (a re-export under its own
# name) besides the API classes: the base classes and modules behind them, and our own class.
REEXPORT_EXTRAS = ("LossScaleManager", "LossScale", NPU_OPTIMIZER, "mixed_precision")
# Top-level packages the triage reads attribute chains of whole, besides the spellings' own:
# Horovod (its wrappers), the vendor's adapter, and ours (a file an earlier run ported still
# gets the torch port's transfer_to_npu reminder).
OTHER_FRAMEWORKS = ("horovod", "npu_bridge", "npu_lossscale")


def triggers(
    spellings: Iterable[str], markers: Iterable[str], whole_parts: Iterable[str] = ()
) -> tuple[str, ...]:
    """The markers, then the last part of every spelling that no marker (a substring of a part)
    and no whole part covers: every spelling then holds one of the returned words."""
    markers, whole = tuple(markers), set(whole_parts)
    found = list(markers)
    for spelling in spellings:
        parts = spelling.split(".")
        if any(m in part for part in parts for m in markers) or whole & set(parts):
            continue
        if parts[-1] not in found:
            found.append(parts[-1])
    return tuple(found)


def top_packages(spellings: Iterable[str]) -> frozenset[str]:
    return frozenset(s.split(".")[0] for s in spellings)


# ============================================================= rule ids
# A finding's rule, grouped by the port that reports it.
# ----------------------------------------------------------------- TF1 (tf.contrib, tf.train)
CONTRIB_MANAGER = "contrib-manager"
CONTRIB_OPTIMIZER = "contrib-optimizer"
CONTRIB_IMPORT = "contrib-import"
TF_DYNAMIC_LOSS_SCALE = "tf-dynamic-loss-scale"
TF_FIXED_LOSS_SCALE = "tf-fixed-loss-scale"
TF_LOSS_SCALE_OPTIMIZER = "tf-loss-scale-optimizer"
GRAPH_REWRITE = "graph-rewrite"
MANAGER_IN_CONTROL_DEPS = "manager-in-control-deps"
SUBCLASS_OVERRIDE = "subclass-override"
NPU_BRIDGE = "npu-bridge"
TF_FOREIGN_LOSS_SCALE = "tf-foreign-loss-scale"
TF_HAND_LOSS_SCALE = "tf-hand-loss-scale"  # loss scaled by hand: migrator.selection.hand_loss_scale
TF_UNSCALED_GRADIENTS = "tf-unscaled-gradients"  # migrator.selection.unscaled_gradients
TF_AUTO_MIXED_PRECISION = "tf-auto-mixed-precision"  # migrator.selection.auto_mixed_precision

# ----------------------------------------------------------------- Keras
KERAS_LOSS_SCALE_OPTIMIZER = "keras-loss-scale-optimizer"
KERAS_IMPORT = "keras-import"
KERAS_IMPLICIT_LOSS_SCALE = "keras-implicit-loss-scale"
KERAS_VERSION = "keras-version"  # which Keras a file's port assumed, and why

# ----------------------------------------------------------------- both TF ports
UNPORTED_API = "unported-api"
UNRESOLVED_ACCESS = "unresolved-access"
OPTIMIZER_KIND_UNKNOWN = "optimizer-kind-unknown"
DISTRIBUTED_UNVERIFIED = "distributed-unverified"
DISTRIBUTED_ENGINE_UNSUPPORTED = "distributed-engine-unsupported"  # BytePS: no engine of ours
DISTRIBUTED_ELSEWHERE = "distributed-elsewhere"  # Horovod initialised by a module it imports
SYMLINK_OUTSIDE = "symlink-outside"
STAR_IMPORT = "star-import"
NPU_IMPORT = "npu-import"
REEXPORT = "reexport"
NAME_CONFLICT = "name-conflict"

# ----------------------------------------------------------------- PyTorch
TORCH_GRAD_SCALER = "torch-grad-scaler"
TORCH_NPU = "torch-npu"
TORCH_DEVICE = "torch-device"
TORCH_IMPORT = "torch-import"
TORCH_SCALE_BELOW_ONE = "torch-scale-below-one"
TORCH_FOREIGN_LOSS_SCALE = "torch-foreign-loss-scale"
TORCH_HAND_LOSS_SCALE = "torch-hand-loss-scale"  # migrator.selection.torch_hand_loss_scale
TORCH_FRAMEWORK_LOSS_SCALE = "torch-framework-loss-scale"  # migrator.selection.framework_fp16

# ----------------------------------------------------------------- cross-cutting rewrites
GLOBAL_STEP_MOVE = "global-step-move"
GLOBAL_STEP_MANUAL = "global-step-manual"
ADD_LOSS_SCALE = "add-loss-scale"
ADD_LOSS_SCALE_MANUAL = "add-loss-scale-manual"
ADD_LOSS_SCALE_UNSCALED = "add-loss-scale-unscaled"

# ----------------------------------------------------------------- output targets
TARGET_NPU_BRIDGE = "target-npu-bridge"
TARGET_NPU_BRIDGE_LOST = "target-npu-bridge-lost"
TARGET_NPU_BRIDGE_UNSUPPORTED = "target-npu-bridge-unsupported"
TARGET_NPU_BRIDGE_DISTRIBUTED = "target-npu-bridge-distributed"
TARGET_NPU_BRIDGE_KERAS_2 = "target-npu-bridge-keras-2"
