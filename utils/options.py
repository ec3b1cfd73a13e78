"""One way for train.py, test.py and detect.py to take options: a frozen dataclass per script.

Each field is declared once with `option(default, help, ...)`; the command line is built from the
dataclass (`parse_options`), the programmatic `run(**kwargs)` builds the same dataclass (an unknown
keyword is a TypeError), so the CLI's and the function's defaults cannot drift apart.

    @dataclass(frozen=True)
    class DetectOptions:
        conf_thres: float = option(0.25, "confidence threshold")
        half: bool | None = option(None, "FP16 inference", action=argparse.BooleanOptionalAction)
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Sequence, TypeVar

T = TypeVar("T")


def option(default: Any, help: str = "", *flags: str, cli: bool = True, **argparse_kwargs: Any) -> Any:
    """A dataclass field with its command-line form. `flags` default to --field-name; argparse_kwargs
    (type, nargs, choices, action, const) override what is inferred from the default: a False bool is a
    switch, a list takes one or more values of its items' type, a number takes its type.
    cli=False: a programmatic option only (objects no command line can give)."""
    meta = {"help": help, "flags": flags, "cli": cli, "argparse": argparse_kwargs}
    if isinstance(default, list):
        items = tuple(default)
        return dataclasses.field(default_factory=lambda: list(items), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _argparse_kwargs(f: dataclasses.Field, default: Any) -> dict:
    kw = dict(f.metadata.get("argparse", {}))
    if "action" not in kw and "nargs" not in kw:
        if isinstance(default, bool):
            kw["action"] = "store_true"
        elif isinstance(default, list):
            kw.setdefault("nargs", "+")
            kw.setdefault("type", type(default[0]) if default else str)
        elif isinstance(default, (int, float)):
            kw.setdefault("type", type(default))
    return kw


def build_parser(cls: type, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    defaults = cls()
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", False):
            continue
        default = getattr(defaults, f.name)
        flags = f.metadata.get("flags") or (f"--{f.name.replace('_', '-')}",)
        p.add_argument(*flags, dest=f.name, default=default, help=f.metadata.get("help", ""),
                       **_argparse_kwargs(f, default))
    return p


def parse_options(cls: type[T], argv: Sequence[str] | None, description: str) -> T:
    """The dataclass `cls` from a command line (sys.argv[1:] when argv is None)."""
    return cls(**vars(build_parser(cls, description).parse_args(argv)))


def to_argv(options: dict[str, Any], cls: type | None = None) -> list[str]:
    """Command-line flags for {option: value} (True: a bare switch; False: left out, as a store_true switch is off
    by default, or --no-<flag> for a field of `cls` that takes one), e.g. to start train.py as a child process."""
    negatable = {f.name for f in dataclasses.fields(cls) if f.metadata.get("argparse", {}).get("action")
                 is argparse.BooleanOptionalAction} if cls is not None else set()
    out: list[str] = []
    for k, v in options.items():
        flag = "--" + k.replace("_", "-")
        if v is False and k in negatable:
            out.append("--no-" + k.replace("_", "-"))
        elif v is not False:
            out += [flag] if v is True else [flag, str(v)]
    return out


def as_dict(opts: Any) -> dict:
    """The options as a plain {name: value} mapping (for opt.yaml and checkpoints)."""
    return {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
