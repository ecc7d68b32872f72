"""torch's out-of-memory errors (``torch.OutOfMemoryError``, ``torch.cuda.OutOfMemoryError``, a
``RuntimeError`` or ``torch.AcceleratorError`` saying "out of memory"), by class name and
message: torch is never imported here."""

from __future__ import annotations

from ._builtin import OUT_OF_MEMORY, is_oom_message
from ._kinds import Outcome

__all__ = ["classify"]


def classify(exc: BaseException) -> Outcome | None:
    if any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__):
        return OUT_OF_MEMORY
    if is_oom_message(exc):
        return OUT_OF_MEMORY
    return None
