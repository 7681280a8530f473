"""Other libraries' loss scaling for torch (apex's, timm's wrappers of torch's scaler), which the
port leaves: what a script using one is told, once per library and file."""

from __future__ import annotations

import libcst as cst

from migrator.codemods.torch import messages, names


class ForeignScaling:
    """The libraries a file has been warned about so far."""

    def __init__(self) -> None:
        self._warned: set[str] = set()

    def message(self, name: str, spelled: str, call: cst.Call | None) -> str | None:
        """The warning for a reference to `name` (spelled `spelled`, and `call` where it is
        called), or None: no other library's loss scaling, its library warned already, or a
        call that scales no loss (apex's `amp.initialize(model)` in a validation script)."""
        what, wrapper = names.foreign(name), names.wrapped(name)
        library = name.split(".")[0]
        if (what is None and wrapper is None) or library in self._warned:
            return None
        if name in names.INITIALISERS and call is not None and _models_only(call):
            return None
        self._warned.add(library)
        if wrapper is not None:
            template, what = messages.WRAPPED_SCALER, wrapper
        else:
            template = messages.FOREIGN_SCALING
        return template.format(code=spelled, what=what, library=library, ported=names.PORTED)


def _models_only(call: cst.Call) -> bool:
    """Whether the call gives models alone, no optimizer: amp.initialize then casts the models
    and scales no loss."""
    if any(a.star for a in call.args):
        return False  # `*args` or `**kwargs` may carry the optimizers
    positional = [a for a in call.args if a.keyword is None]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    return len(positional) <= 1 and "optimizers" not in keywords
