"""Helpers shared by test modules (tests never import bench/)."""
from __future__ import annotations

from utils import errors


def cli_in_process(main, argv: list[str], capsys, monkeypatch) -> tuple[int, list[str]]:
    """A CLI's main through run_cli in this process: (exit code, non-empty stderr lines), never a traceback."""
    monkeypatch.setattr(errors, "setup_logging", lambda *a, **k: None)  # keep pytest's logging handlers
    capsys.readouterr()
    try:
        errors.run_cli(lambda: main(argv))
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, [ln for ln in err.splitlines() if ln.strip()]
