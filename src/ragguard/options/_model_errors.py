"""One pydantic validation error told as ragguard's loaders tell it (policies, chaos scenarios):
what is wrong, the value given (bounded by :func:`ragguard._validate.shown`), and for an unknown
field the nearest known name (``open_fro_s``: "did you mean open_for_s?").

The known names are those of the model that holds the field: :func:`field_names_at` follows the
error's location from the root model through the fields' annotations (containers such as
``dict[str, StagePolicy]`` and ``list[Phase]`` are looked through: their keys and indexes are
skipped; a discriminated union's tag narrows it to the member whose ``Literal`` field has it); a
model may name more keys it takes in a ``also_spelt`` class variable.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from .. import _validate

__all__ = ["describe", "field_names_at"]


def describe(err: Mapping[str, Any], model: type[BaseModel]) -> str:
    """The message of pydantic error ``err`` (an item of ``ValidationError.errors()``) raised
    while validating ``model``: pydantic's words, ``(got <value>)`` unless the value is a mapping,
    and ``; did you mean <name>?`` for an unknown field close to a known one."""
    got = err.get("input")
    text = str(err["msg"]) + ("" if isinstance(got, Mapping) else f" (got {_validate.shown(got)})")
    loc = tuple(err.get("loc", ()))
    if err.get("type") == "extra_forbidden" and loc:
        near = difflib.get_close_matches(str(loc[-1]), sorted(field_names_at(model, loc)), n=1, cutoff=0.6)
        if near:
            text += f"; did you mean {near[0]}?"
    return text


def field_names_at(model: type[BaseModel], loc: Sequence[Any]) -> set[str]:
    """The field names of the model(s) that hold the last element of ``loc``."""
    candidates: list[type[BaseModel]] = [model]
    for part in loc[:-1]:
        named = isinstance(part, str)
        fields = [m.model_fields[part] for m in candidates if named and part in m.model_fields]
        if fields:
            inner = [m for f in fields for m in _models_in(f.annotation)]
            if not inner:
                return set()
            candidates = inner
        elif isinstance(part, str):  # a dict key, or a discriminated union's tag
            tagged = [m for m in candidates if part in _literals(m)]
            candidates = tagged or candidates
    return {name for m in candidates for name in (*m.model_fields, *getattr(m, "also_spelt", ()))}


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _literals(model: type[BaseModel]) -> set[Any]:
    out: set[Any] = set()
    for f in model.model_fields.values():
        if typing.get_origin(f.annotation) is typing.Literal:
            out.update(typing.get_args(f.annotation))
    return out
