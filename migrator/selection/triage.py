"""Which files the libcst codemods must see at all, decided from the standard library's `ast`.

The byte pre-filter (migrator.selection.prefilter) admits every file that *spells* a trigger
anywhere, in a comment, a docstring or a flag name (`FLAGS.loss_scale`), and each admitted file then
pays for a libcst parse plus scope metadata (~0.2 s on real files). `ast.parse` reads a file ten
times faster, so this second gate looks at the identifiers the code really uses and clears the files
the codemods cannot change or warn about. It is conservative: a file that does not parse, or uses
any registered name, goes to the full pass, which stays the only judge of what changes.

Extending it (other rewrites): add the API's spelling to migrator.registry; the names below are
derived from it (a part *containing* a marker or the spelling's last part, in an import of a
`FRAMEWORKS` module or an attribute chain read from a name such an import binds; a part *equal* to
an API module part; an API class imported from a module of the user's own). An option that widens
what is ported must be wired the way `verdict(..., add_loss_scale=True)` admits every file the
byte gate admits for --add-loss-scale.
Chains rooted at no import (`FLAGS.loss_scale`, `hparams.mixed_precision`) never count: the
codemods resolve names through imports, so such a chain cannot mean an API.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from typing import Literal

from migrator import registry
from migrator.selection import framework_fp16, hand_loss_scale, torch_hand_loss_scale
from migrator.selection.prefilter import might_need_loss_scale_added
from migrator.sources import pytree
from migrator.sources.module_paths import Paths, module_files, norm

_SPELLINGS = (*registry.tf_spellings(), *registry.torch_spellings())

# In what an import of TensorFlow, Keras, torch or Horovod reaches, a part *equal* to one of these
# is an API (`torch.cuda.amp`, `apex.fp16_utils`, `npu_bridge`)...
FRAMEWORK_PARTS: frozenset[str] = frozenset(registry.API_MODULE_PARTS)
# ...and so is a part *containing* one of these: derived from the registry's spellings, so every
# spelling the codemods recognise holds one or has such a part.
NAME_FRAGMENTS: frozenset[str] = frozenset(
    registry.triggers(
        _SPELLINGS, (*registry.TF_MARKERS, registry.TORCH_SCALER), registry.API_MODULE_PARTS
    )
)
# In what any other import reaches (a module of the user's own: `from utils import X`, read to the
# first attribute), a part *equal* to one of these: an API name re-exported under its own name.
REEXPORTED_NAMES: frozenset[str] = frozenset(
    {
        *registry.TF_CONTRIB_CLASSES,
        *registry.TF_CORE_NAMES,
        registry.TORCH_SCALER,
        *registry.REEXPORT_EXTRAS,
    }
)
# The global-step plan never looks for these packages among the user's files (a class it reaches
# through them is TensorFlow's own), so their imports tie no two files together.
PLAN_BUILTINS: frozenset[str] = frozenset({"tensorflow", "keras"})
# The global-step move: a file that names the step and calls an assign-like op.
STEP_NAMES: tuple[str, ...] = registry.STEP_NAMES
STEP_CALL_PREFIXES: tuple[str, ...] = registry.STEP_CALL_PREFIXES

# Top-level modules whose attribute chains are read whole (`tf.contrib.mixed_precision.X`); a chain
# rooted at any other import is read to its first attribute only (`utils.LossScaleOptimizer`, a
# re-export), and a chain rooted at no import (`FLAGS.loss_scale`, `hparams.mixed_precision`) not at
# all: the codemods resolve names through imports, so such a chain can never mean an API.
FRAMEWORKS: frozenset[str] = registry.top_packages(_SPELLINGS) | set(registry.OTHER_FRAMEWORKS)


class _Names:
    """The identifiers through which a module can reach an API, found the way imports bind them."""

    def __init__(self) -> None:
        self.modules: set[str] = set()  # modules a class reference may name (plan resolution)
        self.framework: set[str] = set()  # parts reached from framework imports
        self.other: set[str] = set()  # parts reached from other imports
        self.code: set[str] = set()  # every name and attribute (for star imports)
        self.bound: dict[str, str] = {}  # name bound by an import -> the dotted module it means
        self.star = False
        self.dynamic = False  # getattr() on something under a `contrib` module

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            self._parts(alias.name.split(".") + [alias.asname or top], top in FRAMEWORKS)
            self._bind(alias.asname or top, alias.name if alias.asname else top)
            self._module(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        framework = not node.level and module.split(".")[0] in FRAMEWORKS
        self._parts(module.split("."), framework)
        for alias in node.names:
            if alias.name == "*":
                self.star = True
                continue
            parts = [alias.name, alias.asname or alias.name]
            self._parts([module.split(".")[0], *parts] if module else parts, framework)
            dots = "." * node.level
            full = f"{dots}{module}.{alias.name}" if module else f"{dots}{alias.name}"
            self._bind(alias.asname or alias.name, full)
            self._module(f"{dots}{module}" if module else dots)
            self._module(full)

    def _bind(self, name: str, module: str) -> None:
        """A name imported twice (`try: import tensorflow as tf` / `except ImportError: import
        mytf as tf`) keeps a framework's binding: the codemods see both, and warn."""
        old = self.bound.get(name)
        if old is None or old.split(".")[0] not in FRAMEWORKS:
            self.bound[name] = module

    def alias(self, assignments: list[ast.Assign]) -> None:
        """`name = dotted.chain` rooted at an import binds `name` to what the chain names (an
        alias of an alias too); the import's own binding wins where a name has both."""
        grown = True
        while grown:
            grown = False
            for node in assignments:
                target = node.targets[0]
                assert isinstance(target, ast.Name)
                if isinstance(node.value, ast.Attribute):
                    chain, root = _chain(node.value)
                else:
                    chain, root = [], getattr(node.value, "id", None)
                module = self.bound.get(root or "")
                if module is not None and target.id not in self.bound:
                    self.bound[target.id] = ".".join([module, *chain])
                    grown = True

    def _parts(self, parts: list[str], framework: bool) -> None:
        (self.framework if framework else self.other).update(parts)

    def _module(self, dotted: str) -> None:
        if dotted.strip(".") and dotted.split(".")[0] not in PLAN_BUILTINS:
            self.modules.add(dotted)

    def visit_Name(self, node: ast.Name) -> None:
        self.code.add(node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain, root = _chain(node)
        self.code.update(chain)
        if root is None:
            return  # a call's or subscript's own names are walked on their own
        self.code.add(root)
        module = self.bound.get(root)
        if module is None:
            return
        if module.split(".")[0] in FRAMEWORKS:
            self.framework.update(chain)
        else:
            self.other.add(chain[0])
        for end in range(len(chain)):  # `pkg.mod.Class`: the class's module is any prefix
            self._module(".".join([module, *chain[:end]]))

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args:
            target = node.args[0]
            if isinstance(target, (ast.Name, ast.Attribute)):
                chain, root = _chain(target) if isinstance(target, ast.Attribute) else ([], None)
                if isinstance(target, ast.Name):
                    root = target.id
                dotted = [*self.bound.get(root or "", root or "").split("."), *chain]
                self.dynamic |= "contrib" in dotted


def _chain(node: ast.Attribute) -> tuple[list[str], str | None]:
    """The attributes of `a.b.c` from the first (`b`), and its root name (None: not a name)."""
    chain = []
    value: ast.expr = node
    while isinstance(value, ast.Attribute):
        chain.append(value.attr)
        value = value.value
    chain.reverse()
    return chain, value.id if isinstance(value, ast.Name) else None


def _walk(tree: ast.AST) -> list[ast.AST]:
    """`list(ast.walk(tree))`, in the same order, a third faster: no generators per node."""
    found = [tree]
    for node in found:  # grows while it is read
        for field in node._fields:
            value = getattr(node, field, None)
            if value.__class__ is list:
                found.extend([v for v in value if isinstance(v, ast.AST)])
            elif isinstance(value, ast.AST):
                found.append(value)
    return found


def _names(tree: ast.AST) -> _Names:
    """One flat walk (a NodeVisitor's recursive dispatch costs twice as much on long files);
    an attribute inside a longer chain repeats a prefix of what the chain adds, so visiting
    every node gives the same sets."""
    found = _Names()
    nodes = _walk(tree)
    # Imports first, wherever they are (function-local ones too), so every chain sees its root;
    # then the module aliases made of them (`keras = tf.keras`), which the codemods follow too.
    aliases = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found.visit_Import(node)
        elif isinstance(node, ast.ImportFrom):
            found.visit_ImportFrom(node)
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, (ast.Name, ast.Attribute))
        ):
            aliases.append(node)
    found.alias(aliases)
    # `a.b` adds the same names wherever it is read: real code reads `tf.float32` or `self.x`
    # hundreds of times, generated code tens of thousands.
    read: set[tuple[str, str]] = set()
    for node in nodes:
        kind = node.__class__
        if kind is ast.Name:
            found.visit_Name(node)
        elif kind is ast.Attribute:
            value = node.value
            if value.__class__ is ast.Name:
                pair = (value.id, node.attr)
                if pair in read:
                    continue
                read.add(pair)
            found.visit_Attribute(node)
        elif kind is ast.Call:
            found.visit_Call(node)
    return found


Verdict = Literal["full", "step", "clear"]


def verdict(source: bytes, *, add_loss_scale: bool = False) -> Verdict:
    """ "full": the codemods must see the file; "clear": they cannot change or report it on its own;
    "step": it updates global_step by hand, which matters only beside the files they see.

    Call it on files the byte pre-filter admitted; `widen` then puts back the cleared files the
    global-step plan needs because of the others.
    """
    if add_loss_scale and might_need_loss_scale_added(source):
        return "full"
    found = _read(source)
    if found is None or uses_loss_scale(found) or hand_loss_scale.sites(source):
        return "full"
    if torch_hand_loss_scale.site(source) is not None or framework_fp16.sites(source):
        return "full"
    return "step" if _uses_step(found) else "clear"


# verdict() then imports() read each admitted file, one right after the other.
@functools.lru_cache(maxsize=8)
def _read(source: bytes) -> _Names | None:
    try:
        # ast.parse takes undecodable bytes that libcst refuses: check the decoding as it will.
        source.decode(tokenize.detect_encoding(io.BytesIO(source).readline)[0])
        tree = pytree.parse(source)
    except (SyntaxError, ValueError, UnicodeDecodeError, LookupError, RecursionError, MemoryError):
        return None  # the full pass reports the failure in its own words
    return _names(tree)


def parses(source: bytes) -> bool:
    """Whether the file decodes and parses: a cheap check for files nothing else would read."""
    return _read(source) is not None


def _has(names: set[str], fragments: frozenset[str]) -> bool:
    return any(f in name for name in names for f in fragments)


def uses_loss_scale(found: _Names) -> bool:
    """Whether an import, or an attribute read from an imported name, names a loss-scale API."""
    if found.dynamic:
        return True
    if found.star and _has(found.code, NAME_FRAGMENTS):
        return True  # the names a star import binds are unknown here
    if found.framework & FRAMEWORK_PARTS or found.other & REEXPORTED_NAMES:
        return True
    return _has(found.framework, NAME_FRAGMENTS)


def _uses_step(found: _Names) -> bool:
    names = found.code
    return any(s in name for name in names for s in STEP_NAMES) and any(
        name.startswith(STEP_CALL_PREFIXES) for name in names
    )


def imports(source: bytes) -> frozenset[str]:
    """The modules the file imports that the global-step plan may look up among the run's files
    (`widen` takes them; none for a file that does not parse)."""
    found = _read(source)
    return frozenset(found.modules) if found is not None else frozenset()


def _targets(modules: frozenset[str], importer: str, paths: Paths) -> set[str]:
    out: set[str] = set()
    for module in modules:
        out.update(module_files(module, importer, paths))
    return out


def widen(
    candidates: dict[str, tuple[frozenset[str], bool]], full: dict[str, frozenset[str]]
) -> set[str]:
    """Which cleared or step-only files the global-step plan must see beside the `full` ones,
    each given with its `imports`.

    The plan resolves a function's optimizer class through the importing file's imports, so a
    file a seen file may import is put back (with its class facts, and the fact that it was
    processed); and a hand-made step update blocks the move of every class it shares, so a
    `candidates` file flagged True (a step update) that may import a seen file is put back too.
    Repeated until nothing changes. Paths are compared as the plan compares them.
    """
    left = {norm(p): (p, *v) for p, v in candidates.items()}
    seen = {norm(p): m for p, m in full.items()}
    paths = Paths(left.keys() | seen.keys())
    back: set[str] = set()
    new = dict(seen)
    while left and new:
        reached: set[str] = set()
        for path, modules in new.items():
            reached |= _targets(modules, path, paths)
        found = {p for p in left if p in reached}
        found |= {
            p
            for p, (_, modules, step) in left.items()
            if step and _targets(modules, p, paths) & seen.keys()
        }
        popped = {p: left.pop(p) for p in found}
        new = {p: modules for p, (_, modules, _) in popped.items()}
        seen.update(new)
        back.update(original for original, _, _ in popped.values())
    return back
