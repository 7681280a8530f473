"""The scripts benchmarks/realcode.py runs in fresh processes, one per file and interpreter:
kept apart from the harness so each stays one job (the harness ports and tabulates, these
import and train a ported file where it runs)."""

# Shared by both probes: import the ported file as its project runs it. With a project root (a
# row of extras.tsv) the root goes first on sys.path and the file is imported by its module name,
# so its real sibling modules and relative imports resolve; alone, its own folder goes first. The
# harness's single-worker stubs come last on sys.path, so a real install would win, and
# stubs_used() names every stub the import loaded.
LOAD = r"""
import importlib, importlib.util, json, os, sys, traceback
sys.argv = [config["path"]]
sys.path.insert(0, config["root"] or os.path.dirname(config["path"]))
sys.path.extend(config["stubs"])

def load():
    if config["module"]:
        module = importlib.import_module(config["module"])
        if os.path.realpath(module.__file__) != os.path.realpath(config["path"]):
            raise ImportError(f"{config['module']} resolved to {module.__file__}")
        return module
    spec = importlib.util.spec_from_file_location("ported_module", config["path"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def where(error):  # the innermost frame of the failure in the project's files, not TF's
    root = config["root"] or os.path.dirname(config["path"])
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith((sys.prefix, sys.base_prefix, "<"))]
    return f"{os.path.relpath(frames[-1].filename, root)}:{frames[-1].lineno}" if frames else ""

def first_line(error):  # the tree's path as "<tree>" before the cut, so two trees compare equal
    text = (str(error).splitlines() or [""])[0]
    return text.replace(config["tree"], "<tree>")[:160] if config.get("tree") else text[:160]

def stubs_used():
    names = sorted({name.split(".")[0] for name, m in list(sys.modules.items())
                    if (getattr(m, "__file__", None) or "").startswith(tuple(config["stubs"]))})
    return f" (stub: {', '.join(names)})" if names else ""
"""

# Runs in a fresh process: import the ported file as it runs on this interpreter's TensorFlow,
# then train its create_optimizer on a toy variable if it has one. The file's style decides how:
# the reference run (TF 2.x, config["style"] None) decides it from the file and this TF's API and
# reports it; a run on another stack is given that decision, since TF 1.15's API cannot tell
# (every TF 1 name is also at its top level).
PROBE = (
    r"""
import importlib.util, inspect, json, math, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
config = json.loads(sys.argv[1])
path, style, scaled_source = config["path"], config["style"], config["scaled"]
import ast
import tensorflow
# On TF 1.x (TF 1.15, reference variables by default) a TF 1 file runs as written: no alias
# (tf.contrib is not under tf.compat.v1), no disable_v2_behavior: the variables are TF 1's kind.
native = tensorflow.__version__.startswith("1.")
source = open(path, "rb").read()
keras_port = b"npu_lossscale.keras" in source
try:
    import npu_lossscale  # the library's own TF 2 imports, before the TF 1 alias below
    import npu_lossscale.tf
    if keras_port:
        import npu_lossscale.keras
except Exception as error:  # the library itself does not import on this stack
    first = (str(error).splitlines() or [""])[0][:160]
    front = "keras" if keras_port else "tf"
    print(json.dumps({"import": f"FAIL npu_lossscale.{front} does not import here: "
                      f"{type(error).__name__}: {first}", "train": "-", "style": style}))
    sys.exit(0)
tree = ast.parse(source)
names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
         for a in n.names if a.name == "tensorflow"}

def chain(node):  # tf.a.b.c -> ["a", "b", "c"] where tf is a name bound to tensorflow
    parts = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    return parts if isinstance(node, ast.Name) and node.id in names else []

used = {tuple(chain(n)[:2]) for n in ast.walk(tree) if isinstance(n, ast.Attribute)} - {()}
# A file that imports tensorflow.compat.v1 itself needs no alias but is TF 1 code all the same:
# its create_optimizer is trained too.
v1_import = any(a.name == "tensorflow.compat.v1" for n in ast.walk(tree)
                if isinstance(n, ast.Import) for a in n.names) or any(
    n.module == "tensorflow.compat" and any(a.name == "v1" for a in n.names)
    for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
if style is None:
    # A file that names a symbol only TF 1's API has (tf.contrib, tf.get_variable, tf.Session,
    # tf.train.Optimizer...) is TF 1 code even where it also spells some calls tf.compat.v1.*,
    # as TF 1.15 scripts often do. Otherwise one that uses Keras, tf.function or GradientTape is
    # TF 2 code (Keras 2 on the stacks that have it), and the rest (plain graph code) is TF 1.
    v1 = tensorflow.compat.v1

    def only_v1(parts):
        if parts[0] == "contrib":
            return True
        if parts[0] in ("keras", "compat") or not hasattr(v1, parts[0]):
            return False
        if not hasattr(tensorflow, parts[0]):
            return True
        return len(parts) > 1 and hasattr(getattr(v1, parts[0]), parts[1]) and not hasattr(
            getattr(tensorflow, parts[0]), parts[1])

    tf2_marks = {("keras",), ("function",), ("GradientTape",)}
    keras = any(p[:1] in tf2_marks for p in used) or any(
        (a.name.split(".")[0] in ("keras", "tf_keras")) for n in ast.walk(tree)
        if isinstance(n, ast.Import) for a in n.names) or any(
        (n.module or "").split(".")[0] in ("keras", "tf_keras") or (
            n.module == "tensorflow" and any(a.name == "keras" for a in n.names)) or (
            (n.module or "").startswith("tensorflow.keras"))
        for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    contrib = any((n.module or "").startswith("tensorflow.contrib") for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom))
    style = "tf1" if v1_import or contrib or any(only_v1(p) for p in used) or not keras else "tf2"
tf1 = style == "tf1"
# Aliased where the file binds tensorflow itself (one that only imports tensorflow.compat.v1
# gets its TF 1 API from that import).
if tf1 and not native and names:
    v1 = tensorflow.compat.v1
    v1.disable_v2_behavior()
    sys.modules["tensorflow"] = v1
"""
    + LOAD
    + r"""
result = {"import": "ok", "train": "n/a", "style": style,
          "library": os.path.dirname(npu_lossscale.__file__)}
try:
    module = load()
except ModuleNotFoundError as error:
    missing = (error.name or "").split(".")[0]
    if missing in ("tensorflow", "npu_lossscale"):
        result["import"] = f"FAIL ModuleNotFoundError: {error}" + stubs_used()
        result["where"] = where(error)
    else:
        result["import"] = f"n/a (needs {error.name})" + stubs_used()
    print(json.dumps(result)); sys.exit(0)
except Exception as error:
    result["import"] = f"FAIL {type(error).__name__}: {first_line(error)}"
    result["import"] += stubs_used()
    result["where"] = where(error)
    print(json.dumps(result)); sys.exit(0)
result["import"] = "ok" + stubs_used()
factory = getattr(module, "create_optimizer", None)

def train(hvd):
    tf = tensorflow.compat.v1
    values = {"init_lr": 0.01, "learning_rate": 0.01, "num_train_steps": 100,
              "num_warmup_steps": 1, "warmup_steps": 1, "use_tpu": False, "hvd": hvd,
              "use_fp16": True, "fp16": True, "auto_mixed_precision": True, "manual_fp16": False}
    graph = tf.Graph()
    with graph.as_default():
        w = tf.get_variable("w", initializer=tf.constant([1.0, 2.0, 3.0]))
        k = tf.placeholder(tf.float32, [])
        loss = k * tf.reduce_sum(w * w)
        params = inspect.signature(factory).parameters
        flags = ("use_fp16", "fp16", "auto_mixed_precision")  # the factory's mixed-precision switch
        scaled = any(f in params for f in flags) or scaled_source
        kwargs = {n: values[n] for n in params if n in values and n != "loss"}
        bridge = sys.modules.get("npu_bridge.npu_init")
        before = len(bridge.CALLS) if bridge else 0
        train_op = factory(loss, **kwargs)
        if isinstance(train_op, tuple):
            train_op = train_op[0]
        step = tf.train.get_global_step()
        # What the step ran on: TF 1.15's default is reference variables, for w and global_step.
        kinds = {"RefVariable": "reference", "ResourceVariable": "resource"}
        kind = "/".join(sorted({kinds.get(type(v).__name__, type(v).__name__) for v in (w, step)}))
        # On the npu-bridge target the optimizer must be the adapter's (here the stub's) class.
        called = sorted({c[0] for c in (bridge.CALLS[before:] if bridge else [])})
        with tf.Session(graph=graph) as sess:
            sess.run(tf.global_variables_initializer())
            states = []
            for value in (1.0, math.inf if scaled else 1.0, 1.0):
                sess.run(train_op, {k: value})
                states.append((sess.run(w).tolist(), int(sess.run(step))))
    if scaled:
        ok = states[1] == states[0] and states[2][1] == states[0][1] + 1
        what = "overflow skipped, step advanced on clean steps only"
    else:
        ok = states[2][1] == states[0][1] + 2
        what = "three clean steps"
    if config["bridge"] and scaled and "NPULossScaleOptimizer" not in called:
        return f"FAIL the port did not build npu_bridge's NPULossScaleOptimizer (called: {called})"
    what += f"; {kind} variables" + (f"; npu_bridge: {', '.join(called)}" if called else "")
    return ("ok (" + what + ")") if ok else f"FAIL {states}"

# A factory that takes horovod as an argument is trained without it (hvd=None, as the harness
# always did) and, where the file loaded the single-worker stub, once more with it, so the
# port's code on the horovod branch is built and run too (as one worker: no evidence beyond).
if tf1 and callable(factory) and not config["import_only"]:
    variants = [None]
    stub = sys.modules.get("horovod.tensorflow")
    if "hvd" in inspect.signature(factory).parameters and stub is not None and (
            getattr(stub, "__file__", "") or "").startswith(tuple(config["stubs"])):
        variants.append(stub)
    outcomes = []
    for hvd in variants:
        try:
            if hvd is not None:
                hvd.init()  # as a script does before it hands Horovod on
            outcome = train(hvd)
        except Exception as error:
            outcome = f"FAIL {type(error).__name__}: {first_line(error)}"
        outcomes.append(outcome + (" (hvd=stub)" if hvd and outcome.startswith("FAIL") else ""))
    failed = [o for o in outcomes if o.startswith("FAIL")]
    result["train"] = failed[0] if failed else outcomes[0]
    if len(variants) > 1 and not failed:
        result["train"] += " (also with hvd=stub)"
print(json.dumps(result))
"""
)


# The PyTorch path: compile, import the library, bind every ported GradScaler call to the
# library's signature (placeholder values), then import the file itself.
TORCH_PROBE = (
    r"""
import ast, inspect, json, sys
config = json.loads(sys.argv[1])
path = config["path"]
result = {"import": "ok", "train": "n/a"}
source = open(path, "rb").read()
try:
    tree = ast.parse(source)
    compile(tree, path, "exec")
except SyntaxError as error:
    result["import"] = f"FAIL SyntaxError: {error}"
    print(json.dumps(result)); sys.exit(0)
import torch
import npu_lossscale.torch
ported = npu_lossscale.torch.GradScaler
assert issubclass(ported, torch.amp.GradScaler)
local = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
         and n.module == "npu_lossscale.torch" for a in n.names if a.name == "GradScaler"}
def name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return name(node.value) + "." + node.attr
    return ""
calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
         and (name(n.func) == "npu_lossscale.torch.GradScaler" or name(n.func) in local)]
signature = inspect.signature(ported)
for call in calls:
    try:
        signature.bind(*[None] * len(call.args), **{k.arg: None for k in call.keywords if k.arg})
    except TypeError as error:
        result["import"] = f"FAIL GradScaler call at line {call.lineno} does not bind: {error}"
        print(json.dumps(result)); sys.exit(0)
bound = f"{len(calls)} GradScaler call(s) bind"
"""
    + LOAD
    + r"""
try:
    load()
    result["import"] = f"ok{stubs_used()}; {bound}"
except ModuleNotFoundError as error:
    missing = (error.name or "").split(".")[0]
    if missing in ("torch", "npu_lossscale"):
        result["import"] = f"FAIL ModuleNotFoundError: {error}{stubs_used()}"
        result["where"] = where(error)
    else:
        result["import"] = f"n/a (needs {error.name}){stubs_used()}; {bound}"
except ImportError as error:
    if "no known parent package" in str(error):  # `from . import x`: the file came alone
        result["import"] = f"n/a (needs its package); {bound}"
    else:
        first = first_line(error)
        result["import"] = f"FAIL ImportError: {first}{stubs_used()}"
        result["where"] = where(error)
except Exception as error:
    first = first_line(error)
    result["import"] = f"FAIL {type(error).__name__}: {first}{stubs_used()}"
    result["where"] = where(error)
print(json.dumps(result))
"""
)
