"""Training frameworks that scale the loss themselves once a script asks them for fp16, and where
to say so.

A script that hands its loop to DeepSpeed (`deepspeed.initialize` with `"fp16"` in its config),
Lightning (`Trainer(precision=16)`), accelerate (`Accelerator(mixed_precision="fp16")`) or
Hugging Face's Trainer (`TrainingArguments(fp16=True)`, or `--fp16` read by `HfArgumentParser`)
names no GradScaler: the framework builds its scaler inside the library, which the port does not
reach, so the file passed with no word. DeepSpeed's own scaler looks for inf/NaN only and misses
overflows an NPU in saturation mode clamps to 65504; the others build torch's GradScaler,
torch-npu's on Ascend at best, never ours, unless they hand the loop to DeepSpeed. The finding is
the only thing done here; the file is left.

Decided from the call's own keyword, read with `ast` (no libcst pass), through a local name the
file binds once (migrator.selection.bindings): a literal that asks for fp16 warns, any other
literal does not, and a value the file computes (`precision=args.precision`) or takes from the
command line warns with the condition spelled out. DeepSpeed's config is read where it is a dict
literal; given no optimizer it scales nothing (an inference script). A file that never trains
(spells no optimizer, backward, fit or train) scales no loss through the others either.
"""

from __future__ import annotations

import ast
import functools
from typing import NamedTuple

from migrator import registry
from migrator.findings import Finding
from migrator.selection import bindings
from migrator.selection.bindings import Lookup
from migrator.sources import pytree

_DEEPSPEED = "DeepSpeed"
_HF = "Hugging Face's Trainer"
# The bytes a framework's import and its asking call spell (a byte test before any parse).
_GATES = {
    b"deepspeed": (b"initialize",),
    b"lightning": (
        b"precision",
        b"from_argparse_args",
        b"LightningCLI",
        b"Trainer(**",
        b"Fabric(**",
    ),
    b"accelerate": (b"Accelerator",),
    b"transformers": (b"fp16", b"ArgumentParser", b"Arguments(**"),
    b"trl": (b"fp16", b"TrlParser", b"Config(**"),
}
# What a file that trains spells: one that spells none of these scales no loss.
_TRAINING = (b"optim", b"backward", b".fit(", b".train(")
_CONFIG_KEYWORDS = ("config", "config_params")


class Asks(NamedTuple):
    """One framework's call that turns on 16-bit mixed precision (or may)."""

    line: int
    framework: str  # its name in the message, a registry.TORCH_FRAMEWORK_FP16 value
    code: str  # the call as the message quotes it
    condition: str | None  # None: it asks for fp16 outright; else when it does (a clause)
    deepspeed: bool = False  # the framework hands the loop to DeepSpeed, whose scaler it is
    launches: bool = False  # a command-line tool that trains, in a file that shows no training


def might_use(source: bytes) -> bool:
    """False => `sites` finds nothing (a byte test, before any parse)."""
    return any(
        package in source and any(word in source for word in words)
        for package, words in _GATES.items()
    )


def findings(source: bytes, path: str) -> list[Finding]:
    """One warning per framework the file asks for fp16, at its first such call."""
    rule = registry.TORCH_FRAMEWORK_LOSS_SCALE
    return [Finding(path, s.line, rule, _message(s), "warning") for s in sites(source)]


def sites(source: bytes) -> list[Asks]:
    """The first call of each framework in the file that asks for fp16 or may."""
    return list(_sites(source)) if might_use(source) else []


# The triage asks, then the file's finish: one reading for both.
@functools.lru_cache(maxsize=8)
def _sites(source: bytes) -> tuple[Asks, ...]:
    tree = pytree.tree_or_none(source)
    if tree is None:
        return ()
    imported = _imported(tree)
    named = {
        id(node): name
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and (name := _qualified(node.func, imported)) is not None
    }
    if not named:
        return ()  # the scopes below cost more than this walk
    trains = any(word in source for word in _TRAINING)
    first: dict[str, Asks] = {}
    for call, lookup in bindings.calls(tree):
        name = named.get(id(call))
        asks = _reading(call, name, lookup, imported) if name else None
        if asks is None or not (trains or asks.framework == _DEEPSPEED or asks.launches):
            continue
        unsaid = asks.condition is not None and asks.condition == _UNSAID.get(asks.framework)
        if unsaid and not _trains_with(call, tree, source):
            continue  # `Accelerator().process_index` beside a Trainer: it scales no loss
        if asks.framework not in first or asks < first[asks.framework]:
            first[asks.framework] = asks
    return tuple(sorted(first.values()))


def _reading(call: ast.Call, name: str, lookup: Lookup, imported: dict[str, str]) -> Asks | None:
    """What a call of `name` asks for, or None: not a framework's, or not fp16."""
    framework = registry.TORCH_FRAMEWORK_FP16.get(name)
    if framework == _DEEPSPEED:
        return _deepspeed(call, lookup)
    if framework is not None:
        return _keyword(call, framework, lookup)
    if name in registry.TORCH_FRAMEWORK_CLIS:
        clause = "the command line's `--trainer.precision` (or its config file) asks for it"
        asks = _cli(call, lookup, clause)
        return asks._replace(launches=True) if asks is not None else None
    parser = registry.TORCH_FRAMEWORK_PARSERS.get(name)
    if parser is not None:
        return _parser(call, parser, imported)
    owner, _, method = name.rpartition(".")
    if method == "from_argparse_args" and registry.TORCH_FRAMEWORK_FP16.get(owner) == "Lightning":
        # Lightning 1.x's `Trainer.from_argparse_args(args)`: the command line gives precision
        # unless a keyword overrides it
        return _keyword(call, "Lightning", lookup, "the command line's `--precision` asks for it")
    return None


def _message(asks: Asks) -> str:
    when = f" when {asks.condition}" if asks.condition else ""
    if asks.deepspeed or asks.framework == _DEEPSPEED:
        through = "" if asks.framework == _DEEPSPEED else f" (under {asks.framework})"
        return (
            f"`{asks.code}` trains in fp16{when}, and DeepSpeed{through} then scales the loss "
            "itself, which the port does not reach: its overflow check looks for inf/NaN only, so "
            "on an Ascend NPU in saturation mode, where an overflow is clamped to the fp16 maximum "
            "(65504), an overflowed step is applied; import Ascend's DeepSpeed adapter "
            "(`deepspeed_npu`), which reads the chip's overflow flag, run in INF/NAN mode, or "
            "train in bf16"
        )
    return (
        f"`{asks.code}` trains in 16-bit mixed precision{when}, and {asks.framework} then scales "
        "the loss with a torch GradScaler it builds itself, which the port does not reach: on "
        "Ascend that is torch-npu's scaler only where `transfer_to_npu` (or the framework's own "
        "NPU support) maps it, never npu_lossscale.torch.GradScaler with its overflow modes and "
        f"all-reduced overflow decision; {_ADVICE[asks.framework]}"
    )


_ADVICE = {
    "Lightning": (
        "to use that, pass Lightning a precision plugin instead of `precision=`: "
        "`plugins=[MixedPrecision('16-mixed', 'cuda', scaler=npu_lossscale.torch.GradScaler())]`"
    ),
    "accelerate": (
        "accelerate takes no scaler object, so keep torch-npu's there, or scale the loss in the "
        "loop yourself (mixed precision off, autocast, npu_lossscale.torch.GradScaler); where "
        "its launcher configures DeepSpeed, DeepSpeed's scaler is used, which looks for inf/NaN "
        "only (Ascend's `deepspeed_npu` adapter reads the chip's overflow flag)"
    ),
    _HF: (
        "the Trainer takes no scaler object (it goes through accelerate), so keep torch-npu's "
        "there, or train with a loop of your own around npu_lossscale.torch.GradScaler"
    ),
}


def _keyword(
    call: ast.Call, framework: str, lookup: Lookup, otherwise: str | None = None
) -> Asks | None:
    """The call's keyword that asks for fp16, read (also from a dict literal it unpacks); where it
    has none, `otherwise` (the condition it asks under) or the `**` mapping it is given."""
    keywords, opaque = _keywords(call, lookup)
    deepspeed = _hands_to_deepspeed(keywords, framework, lookup)
    for keyword, asking in registry.TORCH_FRAMEWORK_FP16_KEYWORDS[framework]:
        value = keywords.get(keyword)
        if value is None:
            continue
        condition = _choice(value, asking, lookup)
        if condition == "":
            return None
        spelled = ast.unparse(value) if not isinstance(value, ast.Constant) else repr(value.value)
        return _asks(call, framework, condition, f"{keyword}={spelled}", deepspeed)
    if otherwise is None and opaque:
        otherwise = f"`**{ast.unparse(opaque[0])}` asks for it"
    if otherwise is None:
        otherwise = _UNSAID.get(framework)
    if otherwise is None:
        return None
    shown = "..." if call.args or len(keywords) + len(opaque) else ""
    return _asks(call, framework, otherwise, shown, deepspeed)


# Where a framework's precision comes from when the script says nothing: accelerate's from its
# launcher (`ACCELERATE_MIXED_PRECISION`); the others default to fp32.
_UNSAID = {
    "accelerate": (
        "`accelerate launch --mixed_precision fp16` or `accelerate config` asks for it (the "
        "script sets no mixed_precision)"
    ),
}


def _trains_with(call: ast.Call, tree: ast.Module, source: bytes) -> bool:
    """Whether the object the call builds is kept (`accelerator = Accelerator()`) and trained
    with: the file calls its `backward` or `prepare`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and node.value is call and len(node.targets) == 1:
            kept = ast.unparse(node.targets[0]).encode()
            return any(kept + method in source for method in (b".backward(", b".prepare("))
    return False


def _keywords(call: ast.Call, lookup: Lookup) -> tuple[dict[str, ast.expr], list[ast.expr]]:
    """The call's keywords, with those of the dict literals it unpacks (`**kwargs` where the
    file binds `kwargs = {...}` once), and the mappings it unpacks that the file does not show."""
    keywords: dict[str, ast.expr] = {}
    opaque: list[ast.expr] = []
    for keyword in call.keywords:
        if keyword.arg is not None:
            keywords[keyword.arg] = keyword.value
            continue
        mapping = _resolved(keyword.value, lookup)
        pairs = (
            [(k.value, v) for k, v in zip(mapping.keys, mapping.values) if _is_text(k)]
            if isinstance(mapping, ast.Dict)
            else []
        )
        if not isinstance(mapping, ast.Dict) or len(pairs) != len(mapping.keys):
            opaque.append(keyword.value)  # not a literal, or `{**other}` / computed keys in it
            continue
        for key, value in pairs:
            keywords.setdefault(key, value)
    return keywords, opaque


def _is_text(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _choice(value: ast.expr, asking: tuple[object, ...], lookup: Lookup) -> str | None:
    """When a value asks for fp16: a clause, None for always, "" for never. A value chosen by a
    test (`16 if torch.cuda.is_available() else 32`, `kind if amp else "no"`) asks as its
    branches do; a name the file binds once asks as its value does."""
    value = _resolved(value, lookup)
    if isinstance(value, ast.Constant):
        return None if value.value in asking else ""
    if not isinstance(value, ast.IfExp):
        return f"`{ast.unparse(value)}` asks for it"
    body, orelse = (_choice(b, asking, lookup) for b in (value.body, value.orelse))
    test = f"`{ast.unparse(value.test)}`"
    if body is None and orelse is None:
        return None
    if body == "" and orelse == "":
        return ""
    if body == "":  # the other branch decides, when the test fails
        return f"{test} does not hold" + (f" and {orelse}" if orelse else "")
    if orelse == "":
        return f"{test} holds" + (f" and {body}" if body else "")
    return f"`{ast.unparse(value)}` asks for it"


def _resolved(value: ast.expr, lookup: Lookup) -> ast.expr:
    for _ in range(4):  # `a = b`, `b = "fp16"`: a short chain, never a cycle
        if not isinstance(value, ast.Name):
            break
        bound = lookup.value(value.id)
        if bound is None:
            break
        value = bound
    return value


def _hands_to_deepspeed(keywords: dict[str, ast.expr], framework: str, lookup: Lookup) -> bool:
    """Whether the framework's loop runs under DeepSpeed (Lightning's `strategy="deepspeed"` or
    `DeepSpeedStrategy(...)`, Hugging Face's `deepspeed=` config, accelerate's plugin)."""
    keyword = registry.TORCH_FRAMEWORK_DEEPSPEED_KEYWORDS.get(framework)
    value = keywords.get(keyword) if keyword else None
    if value is None:
        return False
    value = _resolved(value, lookup)
    if isinstance(value, ast.Constant):
        if framework == "Lightning":
            return isinstance(value.value, str) and value.value.startswith("deepspeed")
        return value.value is not None
    if framework == "Lightning":
        return isinstance(value, ast.Call) and "DeepSpeed" in ast.unparse(value.func)
    return True


def _cli(call: ast.Call, lookup: Lookup, clause: str) -> Asks | None:
    """LightningCLI: the precision its `trainer_defaults` give, read as a Trainer's keyword
    (where they give none, or the dict is not plain, the command line's)."""
    defaults = _keyword_value(call, "trainer_defaults")
    defaults = _resolved(defaults, lookup) if defaults is not None else None
    given = _item(defaults, "precision") if isinstance(defaults, ast.Dict) else None
    if given is None:
        return _asks(call, "Lightning", clause)
    asking = dict(registry.TORCH_FRAMEWORK_FP16_KEYWORDS["Lightning"])["precision"]
    condition = _choice(given, asking, lookup)
    if condition == "":
        return None  # the defaults pin bf16 or fp32; a flag could still say 16, unseen here
    spelled = ast.unparse(given)
    return _asks(call, "Lightning", condition, f"trainer_defaults={{'precision': {spelled}}}")


def _parser(call: ast.Call, framework: str, imported: dict[str, str]) -> Asks | None:
    """`HfArgumentParser((ModelArguments, TrainingArguments))`: the command line's `--fp16`."""
    given = call.args[0] if call.args else _keyword_value(call, "dataclass_types")
    if given is None:
        return None
    classes = given.elts if isinstance(given, (ast.Tuple, ast.List)) else [given]
    names = (_qualified(c, imported) for c in classes)
    if not any(registry.TORCH_FRAMEWORK_FP16.get(n or "") == framework for n in names):
        return None
    return _asks(call, framework, "the command line's `--fp16` asks for it")


def _deepspeed(call: ast.Call, lookup: Lookup) -> Asks | None:
    """DeepSpeed scales the loss of the optimizer it wraps in fp16: one passed to it, or one its
    config names (or its ZeRO stages build). Given neither, as in an inference script, it scales
    nothing."""
    config = next((v for k in _CONFIG_KEYWORDS if (v := _keyword_value(call, k)) is not None), None)
    config = _resolved(config, lookup) if config is not None else None
    passed = _argument(call, "optimizer", 2) is not None
    if not isinstance(config, ast.Dict):
        if passed or _argument(call, "model_parameters", 3) is not None:
            return _asks(
                call, _DEEPSPEED, "its config (a file or a value built elsewhere) enables it"
            )
        return _asks(call, _DEEPSPEED, "its config enables it and names an optimizer")
    if (
        not passed
        and _item(config, "optimizer") is None
        and _item(config, "zero_optimization") is None
    ):
        return None
    enabled = _fp16_enabled(config)
    if enabled is False:
        return None
    return _asks(call, _DEEPSPEED, None if enabled else "its config's `fp16.enabled` holds")


def _fp16_enabled(config: ast.Dict) -> bool | None:
    """True or False where the literal says, None where it says something the file computes."""
    section = _item(config, "fp16")
    if section is None:
        return False
    if not isinstance(section, ast.Dict):
        return None
    enabled = _item(section, "enabled")
    if enabled is None:
        return True  # DeepSpeed turns fp16 on for a section without the key
    if isinstance(enabled, ast.Constant) and isinstance(enabled.value, bool):
        return enabled.value
    return None


def _item(mapping: ast.Dict, key: str) -> ast.expr | None:
    for k, v in zip(mapping.keys, mapping.values):
        if isinstance(k, ast.Constant) and k.value == key:
            return v
    return None


def _asks(
    call: ast.Call,
    framework: str,
    condition: str | None,
    argument: str = "...",
    deepspeed: bool = False,
) -> Asks:
    spelled = ast.unparse(call.func)
    return Asks(call.lineno, framework, f"{spelled}({argument})", condition, deepspeed)


def _argument(call: ast.Call, keyword: str, position: int) -> ast.expr | None:
    if len(call.args) > position and not any(isinstance(a, ast.Starred) for a in call.args):
        return call.args[position]
    return _keyword_value(call, keyword)


def _keyword_value(call: ast.Call, keyword: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _imported(tree: ast.Module) -> dict[str, str]:
    """Local name -> the qualified name it imports, for the frameworks' packages; a class of the
    file deriving from a framework's (`class TrainingArguments(transformers.TrainingArguments)`)
    stands for its base."""
    tops = registry.TORCH_FRAMEWORK_PACKAGES
    names: dict[str, str] = {}
    classes: list[ast.ClassDef] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in tops:
                    local = alias.asname or alias.name.split(".")[0]
                    names[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in tops:
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.ClassDef):
            classes.append(node)
    for node in classes:
        bases = (_qualified(b, names) for b in node.bases)
        known = [b for b in bases if b in registry.TORCH_FRAMEWORK_FP16]
        if known:
            names[node.name] = known[0]
    return names


def _qualified(node: ast.expr, imported: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imported:
        return None
    return ".".join([imported[node.id], *reversed(parts)])
