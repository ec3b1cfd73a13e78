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
from typing import Any, NoReturn, Sequence, TypeVar

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


class _DefaultsFormatter(argparse.HelpFormatter):
    """--help lists each option's default, unless its help text already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, "", argparse.SUPPRESS, False) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a wrong command line as one UserError line (exit 2 through run_cli), not a usage
    block; `unsupported` maps flags of YOLOv5's scripts this project lacks to a word on what to do instead."""

    def __init__(self, *args: Any, unsupported: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, formatter_class=_DefaultsFormatter, **kwargs)
        self.unsupported = unsupported or {}

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        import sys

        for a in (sys.argv[1:] if args is None else args):
            flag = a.split("=", 1)[0]
            if flag in self.unsupported:
                self.error(f"{flag} is a YOLOv5 option this project does not have; {self.unsupported[flag]}")
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        from utils.errors import UserError

        raise UserError(f"{message} (python {self.prog} --help lists the options)")


def build_parser(cls: type, description: str, unsupported: dict[str, str] | None = None) -> argparse.ArgumentParser:
    p = _Parser(description=description, unsupported=unsupported)
    defaults = cls()
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", False):
            continue
        default = getattr(defaults, f.name)
        flags = f.metadata.get("flags") or (f"--{f.name.replace('_', '-')}",)
        p.add_argument(*flags, dest=f.name, default=default, help=f.metadata.get("help", ""),
                       **_argparse_kwargs(f, default))
    return p


def parse_options(cls: type[T], argv: Sequence[str] | None, description: str,
                  unsupported: dict[str, str] | None = None) -> T:
    """The dataclass `cls` from a command line (sys.argv[1:] when argv is None); a wrong command line is one
    UserError line."""
    return cls(**vars(build_parser(cls, description, unsupported).parse_args(argv)))


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
        elif isinstance(v, (list, tuple)):
            out += [flag, *map(str, v)]
        elif v is not False and v is not None:
            out += [flag] if v is True else [flag, str(v)]
    return out


def command_line(script: str, options: Any) -> str:
    """`python <script> ...` with the options that differ from the dataclass's defaults: the command that gives
    them, for a line that tells the user what to run (quoted for a POSIX shell)."""
    import shlex

    defaults = as_dict(type(options)())
    changed = {k: v for k, v in as_dict(options).items() if v != defaults[k]}
    return shlex.join(["python", script, *to_argv(changed, type(options))])


def as_dict(opts: Any) -> dict:
    """The options as a plain {name: value} mapping (for opt.yaml and checkpoints)."""
    return {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
