"""Stopping a run or a command: Ctrl-C (SIGINT), SIGTERM to the process or its whole group (once or twice, as a job
script's `timeout` sends it), SIGHUP (a closed terminal), a second stop while the first unwinds, a stop while pictures
are decoded in threads. Each ends as Ctrl-C does: exit status 130, one line on how to continue, never a traceback,
and last.pt resumes."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from helpers import cli_in_process, interrupt_at as _interrupt_at, log_lines as _lines

import train
from utils.engine import checkpoint as ck
from utils.engine.callbacks import Callbacks
from utils.errors import UserError
from utils.files import REPO_ROOT
from utils.options import to_argv
from utils.report.results import read_rows

REPO = Path(__file__).resolve().parents[1]
TINY = dict(imgsz=64, batch_size=4, workers=0, noplots=True, amp="off", seed=0)
TINY_WITH_WORKERS = dict(imgsz=64, batch_size=4, workers=2, noplots=True, amp="off", seed=0)
TINY_BF16 = dict(imgsz=64, batch_size=8, workers=0, amp="bf16", seed=3)
pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")


# ----------------------------------------------------------------------------------------- a stop while pictures are decoded

def _pictures(folder: Path, n: int) -> Path:
    """n small JPEGs under folder/images/train."""
    images = folder / "images" / "train"
    images.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        cv2.imwrite(str(images / f"{i}.jpg"), rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    return images


# every picture read in the stopped phase first spends a while inside OpenCV (a blur): when the stop
# arrives, from the reading of picture 4, the other thread is almost surely in there
STOPPED_WHILE_DECODING = """
import os, signal, sys
from pathlib import Path
import cv2, numpy as np
from utils.data import datasets, labels
from utils.errors import run_cli

def slow_and_stopping(read):
    def read_and_stop(path, **kw):
        cv2.GaussianBlur(np.zeros((1000, 1000, 3), np.uint8), (0, 0), 25)
        if str(path).endswith("/4.jpg"):
            os.kill(os.getpid(), signal.SIGTERM)
        return read(path, **kw)
    return read_and_stop

def main():
    files = labels.list_image_files([sys.argv[1]])
    if sys.argv[2] == "scan":
        labels.load_image_file = slow_and_stopping(labels.load_image_file)
    labels.verify_dataset(files, labels.img2label_paths(files), None, Path(sys.argv[1]).parent / "x.cache.npz")
    datasets.load_image_file = slow_and_stopping(datasets.load_image_file)
    datasets.YoloDataset([sys.argv[1]], imgsz=64, cache="ram")
run_cli(main)
"""


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: the pictures are read in one thread")
@pytest.mark.parametrize("where", ["scan", "cache"])
def test_a_stop_while_threads_decode_ends_with_130(tmp_path, where):
    """A stop in the label scan, or in --cache ram's decoding. Before: the interpreter shut down while the pool's
    daemon threads were still inside OpenCV, which ended them by unwinding through C++ ('terminate called without
    an active exception' or 'FATAL: exception not rethrown'), SIGABRT, exit 134."""
    images = _pictures(tmp_path, 48)
    p = subprocess.run([sys.executable, "-c", STOPPED_WHILE_DECODING, str(images), where], cwd=REPO,
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert p.returncode == 130, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert [ln for ln in p.stderr.splitlines() if ln.strip()] == ["interrupted"], p.stderr[-2000:]


def _stop_during_scan(data: Path, project: Path, sig: int, delay: float) -> subprocess.CompletedProcess:
    """train.py on `data` in a process group of its own; `sig` to the group `delay` s after its precision line
    (the label scan follows it)."""
    cmd = [sys.executable, "train.py", "--data", str(data), "--project", str(project), "--epochs", "1", "--imgsz",
           "64", "--batch-size", "4", "--workers", "0", "--noplots", "--amp", "off"]
    p = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    for line in p.stdout:
        if line.startswith("precision:"):
            time.sleep(delay)
            os.killpg(p.pid, sig)
            break
    out, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("sig, delay", [(signal.SIGTERM, 0.2), (signal.SIGINT, 0.3)])
def test_a_stop_during_the_label_scan_of_coco128(coco128_dir, tmp_path, sig, delay):
    """The report's case: the 128 pictures' label cache deleted, the group stopped during the scan."""
    data = tmp_path / "coco128"
    shutil.copytree(coco128_dir, data)
    for d in (data, *(d for d in data.rglob("*") if d.is_dir())):  # the shared copy is read-only
        d.chmod(0o755)
    for f in data.rglob("*.cache.npz"):
        f.unlink()
    p = _stop_during_scan(data / "coco128.yaml", tmp_path / "runs", sig, delay)
    assert p.returncode == 130, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted"), p.stderr[-2000:]


# ----------------------------------------------------------------------------------------- stop signals to the group, twice

def _stop_after_first_epoch(data: Path, project: Path, signals: list[tuple[int, float]],
                            *more: str) -> tuple[int, str, Path]:
    """train.py in a process group of its own (as under a job scheduler); once epoch 0 is done, each (signal, pause
    before it) goes to the whole group. (exit status, all output, last.pt)"""
    cmd = [sys.executable, "train.py", "--data", str(data), "--project", str(project), "--epochs", "3",
           *to_argv(TINY_WITH_WORKERS), *more]
    p = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith("epoch 0 done"):
            for sig, pause in signals:
                time.sleep(pause)
                os.killpg(p.pid, sig)
            break
    out, err = p.communicate(timeout=600)
    return p.returncode, "".join(seen) + out + err, project / "exp" / "weights" / "last.pt"


def _check_stopped(rc: int, text: str, last: Path) -> None:
    assert rc == 130, (rc, text[-3000:])  # a subprocess ended by a signal reports -15 or -1, never 143 or 129
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    assert "data loader" not in text and "DataLoader" not in text, text[-3000:]
    lines = [ln for ln in text.splitlines() if ln.startswith("interrupted")]
    assert len(lines) == 1 and f"python train.py --resume {last}" in lines[0], lines
    assert last.is_file()


@pytest.mark.slow
@pytest.mark.parametrize("augment_on, gap", [("host", 0.0), ("host", 0.05), ("host", 0.5), ("device", 0.02)])
def test_sigterm_twice_to_the_group_stops_like_ctrl_c(micro, tmp_path, augment_on, gap):
    """`timeout 3600 python train.py ...` under a scheduler that signals the group: the loader's workers and
    train.py each get SIGTERM twice. Before: a worker on its way out died of the second (status 1, a traceback from
    the loader inside the stop, exit 1), or the second landed after the stop and ended the process (-15)."""
    rc, text, last = _stop_after_first_epoch(micro, tmp_path, [(signal.SIGTERM, 0.3), (signal.SIGTERM, gap)],
                                             "--augment-on", augment_on)
    _check_stopped(rc, text, last)


@pytest.mark.slow
def test_sighup_stops_like_ctrl_c(micro, tmp_path):
    """A closed terminal or ssh session: before, the run died with nothing said (-1)."""
    rc, text, last = _stop_after_first_epoch(micro, tmp_path, [(signal.SIGHUP, 0.3), (signal.SIGHUP, 0.05)])
    _check_stopped(rc, text, last)


def test_the_command_lets_later_signals_go_once_it_ends():
    """After run_cli: a stop signal during the interpreter's shut-down (the second of `timeout`'s pair) neither kills
    the process nor raises; the exit status is the command's."""
    script = textwrap.dedent(f"""
        import atexit, os, signal, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from utils.errors import run_cli
        atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), os.kill(os.getpid(), signal.SIGHUP),
                                 time.sleep(0.2)))
        def main():
            raise KeyboardInterrupt  # a stopped command
        run_cli(main)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 130 and p.stderr.strip() == "interrupted" and "Traceback" not in p.stderr, p.stderr


@pytest.mark.slow
def test_a_signal_after_the_stop_line_is_let_go(micro, tmp_path, monkeypatch, caplog):
    """`timeout`'s second SIGTERM landing after the stop's line was written (in the clean-up that follows it) once
    ended the run a second time: a second 'interrupted' line, from run_cli (CI, the group test at gap 0). Here both
    signals come at set points: the first as epoch 1 starts, the second inside that clean-up."""
    import logging

    import train
    from utils.engine.callbacks import Callbacks

    def first(t, epoch):
        if epoch == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    real = train.destroy

    def destroy_with_a_second_signal():
        os.kill(os.getpid(), signal.SIGTERM)
        real()

    monkeypatch.setattr(train, "destroy", destroy_with_a_second_signal)
    cb = Callbacks()
    cb.register("on_epoch_start", first)
    try:
        with caplog.at_level(logging.INFO):
            out = train.run(cb, data=str(micro), epochs=3, imgsz=64, batch_size=4, workers=0, noplots=True,
                            noval=True, project=str(tmp_path))
    except KeyboardInterrupt as e:  # (before: the second stopped the stop, and run_cli said it again)
        pytest.fail(f"the second signal escaped: {e}")
    assert out.interrupted
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("interrupted")]
    assert len(lines) == 1 and "--resume" in lines[0], lines


class _SignalsInDel:
    """An object whose finaliser sends SIGTERM: a second signal landing in a finaliser that the first one's
    unwinding runs, as a tqdm bar's close did (CI, the group test at gap 0: "Exception ignored in ... tqdm")."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)


def _stop_then_unwind_through_a_finaliser():
    f = _SignalsInDel()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)  # the handler raises here
    finally:
        del f


@pytest.mark.parametrize("where", ["run", "command"])
def test_a_second_signal_while_the_first_unwinds_is_only_noted(where, monkeypatch):
    """Inside a run (its StopSignals) and in a command outside one (run_cli's handler: detect.py, test.py): the
    first stop signal raises, one on its heels is noted and never raised inside a finaliser."""
    from utils import errors

    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: ignored.append(u.exc_type))
    monkeypatch.setattr(errors, "setup_logging", lambda *a, **k: None)
    if where == "run":
        with pytest.raises(KeyboardInterrupt), errors.StopSignals():
            _stop_then_unwind_through_a_finaliser()
    else:
        with pytest.raises(SystemExit) as e:
            errors.run_cli(_stop_then_unwind_through_a_finaliser, restore_signals=True)
        assert e.value.code == 130
    assert ignored == []  # before: [KeyboardInterrupt], printed as "Exception ignored in ... Traceback"


def test_a_stop_signal_waits_for_the_checkpoint_write(tmp_path, monkeypatch):
    """A signal that lands inside torch.save is raised once the file is written and renamed: a KeyboardInterrupt in
    the writer's callback, with the second of `timeout`'s pair in its clean-up, once aborted the process (-6)."""
    import torch

    from utils.engine.checkpoint import atomic_save
    from utils.errors import StopSignals

    real = torch.save

    def save(obj, f):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, before the write
        os.kill(os.getpid(), signal.SIGTERM)
        real(obj, f)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(KeyboardInterrupt), StopSignals() as stops:
        atomic_save({"x": torch.ones(3)}, tmp_path / "last.pt")
    assert torch.load(tmp_path / "last.pt", weights_only=True)["x"].sum() == 3
    assert not stops.deferring


# ----------------------------------------------------------------------------------------- Ctrl-C


@pytest.mark.slow
def test_a_stop_signal_whose_interrupt_was_swallowed_still_stops_the_run(micro, tmp_path):
    """Python drops a KeyboardInterrupt raised inside a finaliser; the signal handler's flag must still stop
    the run, at the next batch or after the epoch's checkpoints, with last.pt resumable."""
    from utils.errors import StopSignals

    runs = []

    def swallowed(t, *args):
        assert t.stops is StopSignals.active()  # the run's own, handed to its Trainer
        runs.append(t.stops)
        t.stops.requested = True  # what the handler sets before its raise goes missing

    for event, done in (("on_step_end", -1), ("on_epoch_end", 0)):
        cb = Callbacks()
        cb.register(event, swallowed)
        out = train.run(data=str(micro), project=str(tmp_path), epochs=3, noplots=True, callbacks=cb, **TINY_BF16)
        assert out.interrupted and StopSignals.active() is None  # the run's handlers are gone with it
        last = out.save_dir / "weights" / "last.pt"
        completed = torch.load(last, weights_only=True)["train"]["completed_epoch"] if last.exists() else -1
        assert completed == done
    assert len(runs) == 2 and runs[0] is not runs[1]  # a run's own object: the first run's stop never reaches the next


@pytest.mark.slow
def test_ctrl_c_exits_130_and_still_plots_the_finished_epochs(micro, tmp_path):
    """SIGINT (what Ctrl-C sends) in the middle of a run: the one helpful line, exit status 130 as shells report an
    interrupted program, and results.png for the epochs that finished."""
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "train.py", "--data", str(micro), "--project", str(tmp_path), "--epochs", "200",
           "--imgsz", "64", "--batch-size", "4", "--workers", "0", "--amp", "off"]
    child = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = tmp_path / "exp" / "results.csv"
    deadline = time.time() + 300
    while time.time() < deadline and child.poll() is None and not (results.exists() and len(read_rows(results)) >= 3):
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=300)
    assert child.returncode == 130, out[-2000:]
    assert "interrupted:" in out and "--resume" in out and "Traceback" not in out
    assert (tmp_path / "exp" / "results.png").is_file()
    assert len(read_rows(results)) >= 3  # header and the finished epochs, kept


def test_ctrl_c_inside_a_checkpoint_write_is_an_interrupt_not_a_full_disk(tmp_path):
    """torch.save's writer turns the KeyboardInterrupt of a Ctrl-C into its own RuntimeError ('unexpected pos'),
    which reads like a full disk; with the signal's flag set it is the interrupt it was, and the old file stays."""
    from utils.errors import StopSignals
    from utils.files import atomic_write

    target = tmp_path / "last.pt"
    target.write_bytes(b"previous")

    def cut(f):
        f.write(b"partial")
        StopSignals.active().requested = True  # what the SIGINT handler sets as it raises
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 772032 vs 771928")

    with pytest.raises(KeyboardInterrupt), StopSignals():
        atomic_write(target, cut)
    assert target.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["last.pt"]


# ----------------------------------------------------------------------------------------- SIGTERM to the group
# (these run with one CPU thread: module-scoped, so every test below them does too)

# where the process group gets its SIGTERM (utils/engine/faults.py term@): as the run starts, from a loader worker in
# the middle of an epoch, from a validation worker, and in the middle of a checkpoint write (the second: best.pt of
# epoch 0, the first being the fresh run's last.pt)
SIGTERM_AT = {"start": "term@epoch:0", "mid-epoch": "term@train:2", "validation": "term@val:1", "save": "term@save:2"}


def _train_cmd(data: Path, project: Path) -> list[str]:
    return [sys.executable, "train.py", "--data", str(data), "--project", str(project), "--epochs", "2",
            *to_argv({**TINY, "workers": 2})]


def _check_stopped_like_ctrl_c(rc: int, out: str, err: str, last: Path) -> None:
    text = out + err
    assert rc == 130, (rc, text[-3000:])  # a subprocess ended by the signal itself would report -15, never 143
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    assert "data loader" not in text and "DataLoader" not in text, text[-3000:]  # never blamed for a signal
    lines = [ln for ln in text.splitlines() if ln.startswith("interrupted")]
    assert len(lines) == 1 and f"python train.py --resume {last}" in lines[0], lines
    out = train.run(resume=str(last), workers=0)  # last.pt resumes and the run ends
    assert not out.interrupted and [r[0] for r in read_rows(out.save_dir / "results.csv")[1:]] == ["0", "1"]


@pytest.fixture(scope="module")
def sigterm_runs(micro, tmp_path_factory) -> dict[str, tuple[int, str, str, Path]]:
    """The runs of SIGTERM_AT, side by side (each in a process group of its own, as under a job scheduler):
    {where: (exit status, stdout, stderr, last.pt)}."""
    started = {}
    for where, spec in SIGTERM_AT.items():
        d = tmp_path_factory.mktemp(f"term_{where}")
        env = {**os.environ, "AMPYOLO_FAULTS": spec, "OMP_NUM_THREADS": "1"}
        with open(d / "out.txt", "w") as out, open(d / "err.txt", "w") as err:
            started[where] = d, subprocess.Popen(_train_cmd(micro, d), cwd=REPO, env=env, stdout=out, stderr=err,
                                                 start_new_session=True)
    results = {}
    for where, (d, p) in started.items():
        rc = p.wait(timeout=600)
        results[where] = rc, (d / "out.txt").read_text(), (d / "err.txt").read_text(), d / "exp" / "weights" / "last.pt"
    return results


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("where", list(SIGTERM_AT))
def test_sigterm_to_the_process_group_stops_like_ctrl_c(where, sigterm_runs):
    """Workers get the group's SIGTERM too: they end as on Ctrl-C, and the loader is never blamed."""
    _check_stopped_like_ctrl_c(*sigterm_runs[where])


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
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


@pytest.mark.usefixtures("one_thread")
def test_a_worker_ended_by_sigterm_is_part_of_the_stop():
    from utils.data.datasets import stopped_by_signal

    assert stopped_by_signal(RuntimeError("DataLoader worker (pid 4616) is killed by signal: Terminated. "))
    assert not stopped_by_signal(RuntimeError("DataLoader worker (pid 4616) is killed by signal: Killed. "))
    assert not stopped_by_signal(RuntimeError("DataLoader worker (pid(s) 4616) exited unexpectedly"))


@pytest.mark.usefixtures("one_thread")
def test_the_term_fault_refuses_a_process_that_does_not_lead_its_group():
    from utils.engine.faults import parse_faults, terminate_group

    assert parse_faults("term@val:1").term == ("val", 1)
    with pytest.raises(UserError, match="term@where"):
        parse_faults("term@where:1")
    if os.getpgrp() != os.getpid():  # pytest under a shell: the group is the shell's, which must never get it
        with pytest.raises(UserError, match="setsid"):
            terminate_group()


# ----------------------------------------------------------------------------------------- interrupts while stopping, setting up, finishing


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_second_ctrl_c_while_stopping_still_names_the_resume_command(micro, tmp_path, monkeypatch, caplog):
    def second(t):
        raise KeyboardInterrupt  # pressed again while the pictures of the finished epochs are drawn

    monkeypatch.setattr(train, "plot_run", second)
    with caplog.at_level(logging.INFO):
        out = train.run(data=str(micro), project=str(tmp_path), epochs=2, callbacks=_interrupt_at(1), **TINY)
    last = out.save_dir / "weights" / "last.pt"
    assert out.interrupted and _lines(caplog, "interrupted") == [
        f"interrupted: {last} holds the last finished epoch; continue with: python train.py --resume {last}"]


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_second_ctrl_c_after_the_stop_is_one_line_with_the_resume_command(micro, tmp_path, capsys, monkeypatch):
    """One that lands while the run lets go of its folder (on_train_exit) reaches run_cli: it prints the line too."""
    cb = _interrupt_at(1)
    cb.register("on_train_exit", lambda t: (_ for _ in ()).throw(KeyboardInterrupt))
    code, lines = cli_in_process(lambda argv: train.run(data=str(micro), project=str(tmp_path), epochs=2,
                                                        callbacks=cb, **TINY), [], capsys, monkeypatch)
    last = tmp_path / "exp" / "weights" / "last.pt"
    assert code == 130 and [ln for ln in lines if "interrupted" in ln] == [
        f"interrupted: {last} holds the last finished epoch; continue with: python train.py --resume {last}"]


@pytest.mark.usefixtures("one_thread")
def test_an_interrupt_during_set_up_says_so_and_leaves_no_folder(micro, tmp_path, capsys, monkeypatch):
    def interrupted(*_):  # build_trainer(setup, model, resume_ckpt, stops)
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "build_trainer", interrupted)
    code, lines = cli_in_process(train.main, ["--data", str(micro), "--project", str(tmp_path)], capsys, monkeypatch)
    assert code == 130 and lines == ["interrupted: the run had not started training, nothing was kept: start it again"]
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("stripped", [0, 1])
def test_an_interrupt_during_the_final_strip_says_what_is_left(stripped, micro, tmp_path, monkeypatch, caplog):
    """Before last.pt is stripped, --resume finishes the run; after, training is complete."""
    real, calls = train.strip_checkpoint, []

    def strip(path):
        calls.append(path)
        if len(calls) > stripped:
            raise KeyboardInterrupt
        real(path)

    monkeypatch.setattr(train, "strip_checkpoint", strip)
    with caplog.at_level(logging.INFO):
        out = train.run(data=str(micro), project=str(tmp_path), epochs=1, **TINY)
    lines = _lines(caplog, "interrupted")
    assert out.interrupted and len(lines) == 1
    last = out.save_dir / "weights" / "last.pt"
    if stripped:
        assert "training had finished" in lines[0] and "--resume" not in lines[0]
        return
    assert f"python train.py --resume {last}" in lines[0]
    monkeypatch.undo()
    assert not train.run(resume=str(last)).interrupted and "train" not in ck.load_checkpoint(last)


# ----------------------------------------------------------------------------------------- one object per run


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)  # delivered at once; the handler raises here at the latest


def test_a_run_that_stopped_lets_the_commands_later_signals_go():
    """A run's StopSignals inside a command's: the run's raises the first signal; once it has stopped, the command's
    (back in place) only notes the next one, as `timeout` sends a second SIGTERM after the stop line."""
    from utils.errors import StopSignals

    with StopSignals() as command:
        with pytest.raises(KeyboardInterrupt), StopSignals() as run:
            assert StopSignals.active() is run
            _sigterm()
        assert StopSignals.active() is command and run.stopped and command.stopped
        _sigterm()  # let go: noted, never raised
        assert command.requested


def test_a_run_that_ended_leaves_the_command_raising_on_the_next_signal():
    from utils.errors import StopSignals

    with StopSignals() as command:
        with StopSignals():
            pass
        assert not command.stopped
        with pytest.raises(KeyboardInterrupt):
            _sigterm()


def test_a_loader_worker_starts_with_its_own_stop_signals():
    """The worker's object is fresh (the one a fork copies holds the parent's state) and keeps the same rule: the
    first signal raises (torch's worker loop then exits cleanly), the next is only noted."""
    import cv2

    from utils.data import datasets
    from utils.errors import StopSignals

    threads = cv2.getNumThreads()
    try:
        with StopSignals() as run:
            run.requested = run.stopped = True  # what a fork of a stopping run would copy
            datasets._worker_init(0)
            worker = StopSignals.active()
            assert worker is not run and not (worker.requested or worker.stopped)
            with pytest.raises(KeyboardInterrupt):
                _sigterm()
            _sigterm()  # noted only
            assert worker.requested
    finally:
        cv2.setNumThreads(threads)
    assert not isinstance(StopSignals.active(), StopSignals)  # the test's own handlers are back

