"""Bad input to train.py: one clear error line, exit code 2, no traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import one_error

pytestmark = pytest.mark.slow  # every test here starts train.py in a process of its own

REPO = Path(__file__).resolve().parents[1]


def _train(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture
def bad_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("train: [unclosed\n")
    return p


def test_missing_files(tmp_path):
    one_error(_train("--data", str(tmp_path / "nope.yaml")), "nope.yaml")
    one_error(_train("--cfg", "yolov9z.yaml", "--epochs", "1"), "yolov9z")
    one_error(_train("--weights", str(tmp_path / "w.pt")), "w.pt")
    one_error(_train("--hyp", str(tmp_path / "hyp.yaml")), "hyp.yaml")


def test_malformed_yaml(bad_yaml):
    one_error(_train("--data", str(bad_yaml)), "bad.yaml")
    one_error(_train("--hyp", str(bad_yaml)), "bad.yaml")


def test_python_tags_are_refused(tmp_path):
    p = tmp_path / "evil.yaml"
    p.write_text("lr0: !!python/object/apply:os.system ['touch PWNED']\n")
    one_error(_train("--hyp", str(p), cwd=tmp_path), "evil.yaml")
    assert not (tmp_path / "PWNED").exists()


def test_resume_with_nothing_to_resume(tmp_path):
    one_error(_train("--resume", "--project", str(tmp_path / "empty")), "--resume")
    one_error(_train("--resume", str(tmp_path / "last.pt")), "last.pt")


def test_unknown_device_and_bad_name(tmp_path):
    one_error(_train("--device", "tpu"), "--device")
    one_error(_train("--device", "0"), "--device")  # no GPU here (and on CI)
    one_error(_train("--name", "../escape", "--project", str(tmp_path)), "--name")
    assert not (tmp_path.parent / "escape").exists()
