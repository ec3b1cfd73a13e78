"""Reliability, round 3 (issue 46): SIGTERM to the process group ends a run as Ctrl-C does; what a seeded run
repeats (and what it needs to: the thread count is recorded); evolve from Python; ensembles' image size; flags given
with --resume; the step-floor line; one class name as a string; misspelt hyp keys; no empty run folder after a
start-up error; --exist-ok over an earlier run; and the texts of a dozen mistakes.

Every failure here is one line (exit 2 through run_cli, or 130 for a stop), never a traceback.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import cli_in_process, hyp_file

import train
from models.yolo import Model, load_for_inference
from utils import errors
from utils.engine import checkpoint as ck
from utils.engine.callbacks import Callbacks
from utils.engine.train_options import parse_opt
from utils.errors import UserError
from utils.options import to_argv
from utils.report.results import read_rows

REPO = Path(__file__).resolve().parents[1]
TINY = dict(imgsz=64, batch_size=4, workers=0, noplots=True, amp="off", seed=0)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from a second thread, and the machine is shared."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _lines(caplog, start: str = "") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(start)]


def _interrupt_at(epoch: int) -> Callbacks:
    """A Ctrl-C as `epoch` starts (a KeyboardInterrupt is what the signal handler raises)."""
    def stop(t, e):
        if e == epoch:
            raise KeyboardInterrupt

    cb = Callbacks()
    cb.register("on_epoch_start", stop)
    return cb


@pytest.fixture(scope="module")
def stopped_run(micro, tmp_path_factory) -> Path:
    """last.pt of a run of 3 epochs stopped as epoch 1 starts (it holds epoch 0)."""
    project = tmp_path_factory.mktemp("stopped")
    out = train.run(data=str(micro), project=str(project), epochs=3, callbacks=_interrupt_at(1), **TINY)
    assert out.interrupted
    return out.save_dir / "weights" / "last.pt"


def _copy_run(last: Path, tmp_path: Path) -> Path:
    shutil.copytree(last.parent.parent, tmp_path / "run")
    return tmp_path / "run" / "weights" / "last.pt"


# ----------------------------------------------------------------------------------------- 1. SIGTERM to the group

# where the process group gets its SIGTERM (utils/engine/faults.py term@): as the run starts, from a loader worker in
# the middle of an epoch, from a validation worker, and in the middle of a checkpoint write (the second: best.pt of
# epoch 0, the first being the fresh run's last.pt)
SIGTERM_AT = {"start": "term@epoch:0", "mid-epoch": "term@train:2", "validation": "term@val:1", "save": "term@save:2"}


def _train_cmd(data: Path, project: Path) -> list[str]:
    return [sys.executable, "train.py", "--data", str(data), "--project", str(project), "--epochs", "2",
            *to_argv({**TINY, "workers": 2})]


def _check_stopped_like_ctrl_c(rc: int, out: str, err: str, last: Path) -> None:
    text = out + err
    assert rc in (130, 143), (rc, text[-3000:])
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    assert "data loader" not in text and "DataLoader" not in text, text[-3000:]  # never blamed for a signal
    lines = [ln for ln in text.splitlines() if ln.startswith("interrupted")]
    assert len(lines) == 1 and f"python train.py --resume {last}" in lines[0], lines
    out = train.run(resume=str(last), workers=0)  # last.pt resumes and the run ends
    assert not out.interrupted and [r[0] for r in read_rows(out.save_dir / "results.csv")[1:]] == ["0", "1"]


@pytest.mark.parametrize("where", list(SIGTERM_AT))
def test_sigterm_to_the_process_group_stops_like_ctrl_c(where, micro, tmp_path):
    """Workers get the group's SIGTERM too: they end as on Ctrl-C, and the loader is never blamed."""
    env = {**os.environ, "AMPYOLO_FAULTS": SIGTERM_AT[where], "OMP_NUM_THREADS": "1"}
    r = subprocess.run(_train_cmd(micro, tmp_path), cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                       start_new_session=True)  # a group of its own, as under a job scheduler
    _check_stopped_like_ctrl_c(r.returncode, r.stdout, r.stderr, tmp_path / "exp" / "weights" / "last.pt")


def test_sigterm_from_outside_to_the_process_group(micro, tmp_path):
    """The issue's repro: `kill -TERM -- -PGID` from another process, once the first epoch has ended (the workers
    of both loaders are up)."""
    p = subprocess.Popen(_train_cmd(micro, tmp_path), cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith("epoch 0 done"):
            os.killpg(p.pid, signal.SIGTERM)
            break
    out, err = p.communicate(timeout=600)
    _check_stopped_like_ctrl_c(p.returncode, "".join(seen) + out, err, tmp_path / "exp" / "weights" / "last.pt")


def test_a_worker_ended_by_sigterm_is_part_of_the_stop():
    from utils.data.datasets import stopped_by_signal

    assert stopped_by_signal(RuntimeError("DataLoader worker (pid 4616) is killed by signal: Terminated. "))
    assert not stopped_by_signal(RuntimeError("DataLoader worker (pid 4616) is killed by signal: Killed. "))
    assert not stopped_by_signal(RuntimeError("DataLoader worker (pid(s) 4616) exited unexpectedly"))


def test_the_term_fault_refuses_a_process_that_does_not_lead_its_group():
    from utils.engine.faults import parse_faults, terminate_group

    assert parse_faults("term@val:1").term == ("val", 1)
    with pytest.raises(UserError, match="term@where"):
        parse_faults("term@where:1")
    if os.getpgrp() != os.getpid():  # pytest under a shell: the group is the shell's, which must never get it
        with pytest.raises(UserError, match="setsid"):
            terminate_group()
