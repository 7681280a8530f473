"""Which scaler attributes the files of one run assign something other than torch's scaler.

`self.grad_scaler: Optional[torch.cuda.amp.GradScaler] = ...` in a training engine, and a
subclass in another file storing fairscale's `ShardedGradScaler()` in the same attribute
(allenai/tango): the annotation describes fairscale's scaler too, which the port leaves, so it
stays as written. The file with the annotation cannot see the subclass, so every file read is
scanned here for `self.<attr> = <call>(` where the call is not one of torch's scaler spellings
(which the port rewrites) and names a scaler (`ShardedGradScaler()`, `init_grad_scaler()`).
"""

from __future__ import annotations

import re

_ASSIGN = re.compile(rb"^[ \t]*self\.(\w+)[ \t]*(?::[^=\n]*)?=[ \t]*([\w.]+)\(", re.M)
# torch's own spellings of the scaler class, which the port rewrites where it sees them
_TORCH = re.compile(r"(?:(?:torch\.)?(?:cuda\.|cpu\.)?amp\.|torch\.)?GradScaler")


def other_scaler_attrs(data: bytes) -> set[str]:
    """The `self.<attr>` names one file assigns a scaler the port does not build."""
    if b"caler" not in data:
        return set()
    found = set()
    for match in _ASSIGN.finditer(data):
        callee = match.group(2).decode("ascii", "replace")
        if "scaler" in callee.lower() and not _TORCH.fullmatch(callee):
            found.add(match.group(1).decode("ascii", "replace"))
    return found
