"""The checks of an untrusted checkpoint's fields: each failure a SchemaError that names the field."""
from __future__ import annotations

from typing import Any

import torch


class SchemaError(ValueError):
    """A checkpoint field missing or of the wrong type; the message names the field."""


MISSING = object()  # what field_of gives for a field the file does not have


def require(ok: bool, field: str, expected: str, value: Any = None) -> None:
    if not ok:
        got = "missing" if value is MISSING else f"got {type(value).__name__}"
        raise SchemaError(f"'{field}' must be {expected}, {got}")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def field_of(d: dict, key: str) -> Any:
    return d.get(key, MISSING)


def state_dict_of(v: Any, field: str, like: dict[str, torch.Tensor] | None = None) -> None:
    """A dict of named tensors; with `like`, the same names and shapes (model, EMA and FP16 copy agree)."""
    require(isinstance(v, dict) and len(v) > 0, field, "a non-empty dict of tensors", v)
    bad = next((k for k, t in v.items() if not isinstance(k, str) or not isinstance(t, torch.Tensor)), None)
    if bad is not None:
        raise SchemaError(f"'{field}' must map names to tensors, entry {str(bad)[:40]!r} does not")
    if like is not None and (v.keys() != like.keys() or any(v[k].shape != like[k].shape for k in v)):
        raise SchemaError(f"'{field}' does not hold the same tensors as 'model'")


def plain(v: Any, field: str) -> None:
    """Only what a YAML file can hold (mappings, lists, text, numbers, booleans, None): a config read
    from a checkpoint is then handled exactly like one read from a file."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(k for k in x)
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif x is not None and not isinstance(x, (str, int, float, bool)):
            raise SchemaError(f"'{field}' must hold only plain values (text, numbers, lists, mappings), "
                              f"found {type(x).__name__}")
