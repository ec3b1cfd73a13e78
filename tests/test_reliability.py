"""Reliability, round 2 (issue 17): a real full disk, decompression bombs, YAML alias bombs, oversized models,
malformed checkpoints, overwritten detect outputs, odd sources, resume paths, temp names and run-folder locks.

Every failure here is one UserError line (exit 2 through run_cli), nothing is lost and nothing hangs.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from utils import checkpoint as ck
from utils import errors
from utils.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def _cli(main, argv: list[str], capsys, monkeypatch) -> tuple[int, list[str]]:
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


def _one_error(code: int, lines: list[str], *words: str) -> str:
    errs = [ln for ln in lines if ln.startswith("error: ")]
    assert code == 2 and len(errs) == 1, (code, lines)
    for w in words:
        assert w in errs[0], errs[0]
    return errs[0]


# ----------------------------------------------------------------------------------------- 1. a full disk

ZIP_WRITER_ENOSPC = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


def test_zip_writer_runtime_error_is_one_line_and_keeps_the_previous_file(tmp_path, monkeypatch):
    """What torch.save raises at close when the disk fills (it hides the OSError behind a RuntimeError)."""
    path = tmp_path / "last.pt"
    ck.atomic_save({"n": 1}, path)

    def full(obj, f):
        f.write(b"PK\x03\x04 partial")
        raise RuntimeError(ZIP_WRITER_ENOSPC)

    monkeypatch.setattr(ck.torch, "save", full)
    with pytest.raises(UserError, match="could not write .*disk is full.*previous file is kept") as e:
        ck.atomic_save({"n": 2}, path)
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"n": 1} and os.listdir(tmp_path) == ["last.pt"]


def test_any_error_inside_a_write_is_one_line(tmp_path):
    from utils.files import atomic_write

    def broken(f):
        raise ValueError("something odd\nover two lines")

    with pytest.raises(UserError, match="could not write .*something odd over two lines") as e:
        atomic_write(tmp_path / "x.txt", broken)
    assert "\n" not in str(e.value) and os.listdir(tmp_path) == []


@pytest.fixture
def small_disk(tmp_path):
    """A real 12 MB filesystem (tmpfs); skipped where mounting is not allowed (not root, no CAP_SYS_ADMIN)."""
    d = tmp_path / "disk"
    d.mkdir()
    if shutil.which("mount") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_a_real_full_disk_keeps_the_previous_checkpoint(small_disk):
    path = small_disk / "last.pt"
    ck.atomic_save({"n": torch.ones(3)}, path)
    before = path.read_bytes()
    with pytest.raises(UserError, match="could not write .*previous file is kept") as e:
        ck.atomic_save({"big": torch.zeros(4_000_000)}, path)  # 16 MB on a 12 MB disk
    assert "\n" not in str(e.value)
    assert path.read_bytes() == before and os.listdir(small_disk) == ["last.pt"]


def test_training_onto_a_real_full_disk_exits_2_with_one_line(small_disk, tiny_data, capsys, monkeypatch):
    """yolov5n's training last.pt (~27 MB) does not fit on 12 MB: the first checkpoint write fails."""
    argv = ["--data", str(tiny_data), "--project", str(small_disk), "--epochs", "1", "--imgsz", "64",
            "--batch-size", "8", "--workers", "0", "--noplots", "--amp", "off"]
    code, lines = _cli(train.main, argv, capsys, monkeypatch)
    _one_error(code, lines, "could not write", "previous file is kept")
    weights = small_disk / "exp" / "weights"
    assert not any(p.name.endswith(".tmp") for p in weights.iterdir())


# ----------------------------------------------------------------------------------------- unique temp names


def test_opt_hyp_and_results_use_unique_temp_names_through_one_writer(tmp_path, monkeypatch):
    from utils.files import save_yaml

    other = tmp_path / ".opt.yaml.tmp"  # the fixed name an older or a concurrent writer may be using
    other.write_text("in flight")
    real, temps = os.replace, []

    def spy(src, dst):
        temps.append(Path(src).name)
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    save_yaml({"a": 1}, tmp_path / "opt.yaml")
    save_yaml({"a": 2}, tmp_path / "opt.yaml")
    (tmp_path / "results.csv").write_text("epoch,x\n0,1\n1,2\n2,3\n")
    train.truncate_results(tmp_path / "results.csv", 0)
    assert other.read_text() == "in flight"  # never touched
    assert len(set(temps)) == 3 and all(t.startswith((".opt.yaml.", ".results.csv.")) for t in temps), temps
    assert (tmp_path / "results.csv").read_text().splitlines() == ["epoch,x", "0,1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".opt.yaml.tmp", "opt.yaml", "results.csv"]
