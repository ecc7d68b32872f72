"""The base of every options model (:class:`Options`: frozen, unknown fields refused, validated
once at construction) and how a pydantic error becomes one bounded :class:`~ragguard.ConfigError`.

Each layer's options model subclasses :class:`Options` (``options/_retry.py``...); the policy holds
it by the layer's name (see :mod:`ragguard.options._layers`).
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from .. import _validate
from .._errors import ConfigError
from . import _model_errors

__all__ = ["MAX_ERRORS_SHOWN", "LayerModels", "Options", "config_error", "nested"]

MAX_ERRORS_SHOWN = 20
"""The most invalid values one ConfigError lists (then ``... and N more``)."""

_nesting = threading.local()


class LayerModels(Protocol):
    """Where a model holding the layers' options by name (``StagePolicy.layers``) finds each
    layer's options model (:mod:`ragguard.options._layers`), to say what is wrong in them."""

    STAGE_FIELDS: tuple[str, ...]
    """The layers whose options are spelt at a stage's top level (``breaker: {...}``)."""

    def model(self, name: str) -> type[Any] | None: ...


class Options(BaseModel):
    """A frozen options model; built from Python, a bad value raises the same ConfigError (naming
    the field and the allowed range) as a bad value in a policy file or the environment."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
    _layer_models: ClassVar[LayerModels | None] = None
    """Set by the models that hold layers' options (a stage's, the policy's)."""

    def __init__(self, **data: Any) -> None:
        # Only the outermost construction converts: a nested one re-raises pydantic's error so
        # its path is kept.
        depth = getattr(_nesting, "depth", 0)
        _nesting.depth = depth + 1
        try:
            super().__init__(**data)
        except ValidationError as exc:
            if depth:
                raise
            raise config_error(exc, type(self).__name__, type(self), self._layer_models) from None
        finally:
            _nesting.depth = depth


class nested:
    """Validate inside: models built within re-raise pydantic's errors (their paths kept)."""

    def __enter__(self) -> None:
        self._depth = getattr(_nesting, "depth", 0)
        _nesting.depth = self._depth + 1

    def __exit__(self, *exc: object) -> None:
        _nesting.depth = self._depth


def config_error(
    exc: ValidationError, source: str, root: type[BaseModel], layers: LayerModels | None = None
) -> ConfigError:
    """One ConfigError for every error of ``exc`` (raised validating ``root``, whose layers'
    options are described by their ``layers`` models): a line per error (at most
    :data:`MAX_ERRORS_SHOWN`), each bounded; ``field`` is the first one's path."""
    errors = exc.errors(include_url=False)
    lines = [f"{_validate.bounded(source, 200)}: {len(errors)} invalid value(s)"]
    first: str | None = None
    for err in errors[:MAX_ERRORS_SHOWN]:
        path, text = _describe_one(err, root, layers)
        first = first if first is not None else path
        lines.append(_validate.bounded(f"  {path}: {text}", 400))
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"  ... and {len(errors) - MAX_ERRORS_SHOWN} more")
    return ConfigError("\n".join(lines), field=first)


def _describe_one(err: Any, root: type[BaseModel], layers: LayerModels | None) -> tuple[str, str]:
    """The field path of one pydantic error and what is wrong there, both bounded."""
    loc = [_validate.bounded(str(part), 40) for part in err["loc"]]
    raw = list(err["loc"])
    model: type[BaseModel] = root
    if "layers" in raw and layers is not None:
        # a layer's options, held by name: its own model tells what is wrong; a built-in layer's
        # path is written as it is spelt, at the stage's top level (``stages.x.breaker.y``)
        at = raw.index("layers")
        name = raw[at + 1] if at + 1 < len(raw) else None
        held = layers.model(name) if isinstance(name, str) else None
        if isinstance(held, type) and issubclass(held, BaseModel):
            model, err = held, {**err, "loc": tuple(raw[at + 2 :])}
        if name in layers.STAGE_FIELDS:
            del loc[at]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError) and cause.field:
        # Our own rule (a breaker option): its message starts with the option's name.
        parts = cause.field.split(".")
        if not loc or loc[-1] != parts[-1]:
            loc += parts
        text, head = str(cause), parts[-1] + " "
        return ".".join(loc) or "(top level)", text[len(head) :] if text.startswith(head) else text
    return ".".join(loc) or "(top level)", _model_errors.describe(err, model)
