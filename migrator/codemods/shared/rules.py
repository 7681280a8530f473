"""Every rule id a codemod's finding carries, in one place.

A finding's rule is what a reader filters the report by and what the tests assert on, so each id
is spelled once, here, and the codemods name the constant. Grouped by the port that reports it.
"""

from __future__ import annotations

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
