"""Reliability, round 4 (issue 53): stop signals delivered twice (a job script's `timeout`, which passes the group's
SIGTERM on to the group), SIGHUP (a closed terminal), and a stop between two generations of --evolve. Each ends
like Ctrl-C: exit status 130, one line on how to continue, never a traceback."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from utils.options import to_argv

REPO = Path(__file__).resolve().parents[1]
TINY = dict(imgsz=64, batch_size=4, workers=2, noplots=True, amp="off", seed=0)
pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")


def _stop_after_first_epoch(data: Path, project: Path, signals: list[tuple[int, float]],
                            *more: str) -> tuple[int, str, Path]:
    """train.py in a process group of its own (as under a job scheduler); once epoch 0 is done, each (signal, pause
    before it) goes to the whole group. (exit status, all output, last.pt)"""
    cmd = [sys.executable, "train.py", "--data", str(data), "--project", str(project), "--epochs", "3",
           *to_argv(TINY), *more]
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


@pytest.mark.parametrize("augment_on, gap", [("host", 0.0), ("host", 0.05), ("host", 0.5), ("device", 0.02)])
def test_sigterm_twice_to_the_group_stops_like_ctrl_c(micro, tmp_path, augment_on, gap):
    """`timeout 3600 python train.py ...` under a scheduler that signals the group: the loader's workers and
    train.py each get SIGTERM twice. Before: a worker on its way out died of the second (status 1, a traceback from
    the loader inside the stop, exit 1), or the second landed after the stop and ended the process (-15)."""
    rc, text, last = _stop_after_first_epoch(micro, tmp_path, [(signal.SIGTERM, 0.3), (signal.SIGTERM, gap)],
                                             "--augment-on", augment_on)
    _check_stopped(rc, text, last)


def test_sighup_stops_like_ctrl_c(micro, tmp_path):
    """A closed terminal or ssh session: before, the run died with nothing said (-1)."""
    rc, text, last = _stop_after_first_epoch(micro, tmp_path, [(signal.SIGHUP, 0.3), (signal.SIGHUP, 0.05)])
    _check_stopped(rc, text, last)


def test_a_stop_between_evolve_generations_gives_the_search_command(tmp_path):
    """SIGTERM right after generation 0 was written (outside any run): before, exit -15 and no line. Now the search
    ends as it does when a generation is stopped: the continue line, exit 130, generation 0 kept."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / "tests")!r}]
        import train
        from test_evolve import landscape_train
        from utils.engine import evolve as ev
        from utils.engine.train_options import parse_opt
        from utils.errors import run_cli

        calls = []
        ev.SearchFolder.plot = lambda self: None
        write = ev.SearchFolder.write
        def write_then_stop(self, genes, rows):
            write(self, genes, rows)
            os.kill(os.getpid(), signal.SIGTERM)
        ev.SearchFolder.write = write_then_stop
        def main():
            out = ev.evolve(parse_opt(["--evolve", "3", "--project", {str(tmp_path)!r}]), landscape_train(calls))
            if out.interrupted:
                raise SystemExit(130)
        run_cli(main)
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    text = p.stdout + p.stderr
    assert p.returncode == 130, (p.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    assert "interrupted after 1 of 3 generations (continue with: python train.py --evolve 3" in text, text[-3000:]
    assert (tmp_path / "exp" / "evolve.csv").read_text().count("\n") == 2  # the header and generation 0


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


# ----------------------------------------------------------------------------------------- --freeze
def test_freeze_refuses_modules_the_model_does_not_have(micro, tmp_path):
    import train
    from utils.errors import UserError

    common = dict(data=str(micro), epochs=1, imgsz=64, batch_size=4, workers=0, noplots=True, project=str(tmp_path))
    with pytest.raises(UserError, match=r"--freeze -1: modules are numbered from 0"):
        train.run(freeze=[-1], **common)
    with pytest.raises(UserError, match=r"--freeze 30 40: yolov5n has modules 0-24, not 30, 40"):
        train.run(freeze=[30, 40], **common)
    assert not (tmp_path / "exp").exists()  # refused before a run folder was made


def test_freezing_layers_that_start_from_scratch_is_said(micro, tmp_path, caplog):
    """--freeze 10 without --weights freezes a random backbone: it trains, and the log says those layers never
    learn. From a checkpoint of the same model, nothing to say."""
    import logging

    import train
    from models.yolo import Model
    from utils.data.data_config import load_data_config
    from utils.engine.checkpoint import atomic_save, make_checkpoint

    common = dict(data=str(micro), epochs=1, imgsz=64, batch_size=4, workers=0, noplots=True, noval=True,
                  project=str(tmp_path), freeze=[10])
    with caplog.at_level(logging.WARNING):
        train.run(name="scratch", **common)
    assert "warning: --freeze 10 holds 99 of its 99 tensors at their random start (no --weights)" in caplog.text
    names = load_data_config(micro)["names"]
    model = Model("yolov5n.yaml", nc=len(names))
    atomic_save(make_checkpoint(model, model.yaml, list(names), epoch=-1), tmp_path / "w.pt")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train.run(name="ft", weights=str(tmp_path / "w.pt"), **common)
    assert "--freeze" not in caplog.text


# ----------------------------------------------------------------------------------------- messages
@pytest.mark.parametrize("rank, shown", [("0", True), ("1", False), (None, True)])
def test_under_torchrun_only_rank_0_says_the_set_up_lines(rank, shown, monkeypatch):
    import logging

    from utils.errors import setup_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    try:
        setup_logging()
        assert logging.getLogger("train").isEnabledFor(logging.INFO) is shown
        assert logging.getLogger("train").isEnabledFor(logging.WARNING)  # every rank still warns
    finally:
        root.handlers[:], root.level = handlers, level


def test_a_resume_at_another_thread_count_records_both(micro, tmp_path):
    import torch
    import yaml

    import train
    from utils.engine.callbacks import Callbacks

    def stop(t, epoch):
        if epoch == 1:
            raise KeyboardInterrupt

    cb = Callbacks()
    cb.register("on_epoch_start", stop)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        out = train.run(cb, data=str(micro), epochs=2, imgsz=64, batch_size=4, workers=0, noplots=True, noval=True,
                        project=str(tmp_path))
        assert out.interrupted
        torch.set_num_threads(2)
        train.run(resume=str(out.save_dir / "weights" / "last.pt"), workers=0)
    finally:
        torch.set_num_threads(n)
    saved = yaml.safe_load((out.save_dir / "opt.yaml").read_text())
    assert saved["cpu_threads"] == 2 and saved["cpu_threads_before"] == [1]


def test_autobatch_is_told_where_augmentation_runs(monkeypatch):
    """--batch-size -1 with --augment-on device: AutoBatch hears of the device path (and of mixup), whose warp
    holds memory its profile of the model alone does not see (utils/data/device_augment.device_augment_bytes)."""
    import torch
    from types import SimpleNamespace

    from utils.engine import run_setup
    from utils.engine.train_options import TrainOptions
    from utils.hyp import load_hyp

    seen = {}
    monkeypatch.setattr(run_setup, "resolve_batch_size", lambda *a, **k: seen.update(k) or 8)
    r = run_setup.decide_batch(TrainOptions(batch_size=-1), load_hyp().updated(mixup=0.1), torch.device("cpu"),
                               SimpleNamespace(world_size=1), torch.nn.Identity(), SimpleNamespace(autocast=None), None,
                               n_images=100, epochs=300, imgsz=64, augment_on="device", nc=5)
    assert r.batch_size == 8 and seen["augment_on"] == "device" and seen["mixup"] is True


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
    """Inside a run (stop_on_signals) and in a command outside one (run_cli's handler: detect.py, test.py): the
    first stop signal raises, one on its heels is noted and never raised inside a finaliser."""
    from utils import errors

    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: ignored.append(u.exc_type))
    monkeypatch.setattr(errors, "setup_logging", lambda *a, **k: None)
    if where == "run":
        with pytest.raises(KeyboardInterrupt), errors.stop_on_signals():
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
    from utils.errors import stop_on_signals

    real = torch.save

    def save(obj, f):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, before the write
        os.kill(os.getpid(), signal.SIGTERM)
        real(obj, f)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(KeyboardInterrupt), stop_on_signals():
        atomic_save({"x": torch.ones(3)}, tmp_path / "last.pt")
    assert torch.load(tmp_path / "last.pt", weights_only=True)["x"].sum() == 3
    assert not stop_on_signals.deferring


@pytest.mark.parametrize("args, says", [([None, 2, 0], "Upsample mode '0' is not one of"),
                                        ([None, 2, "nearest", True], "align_corners applies to")])
def test_an_upsample_that_could_not_run_is_refused_at_build(tmp_path, args, says):
    """The model-YAML fuzz test (tests/test_hostile.py) found mode 0 built and failing at the first forward."""
    import yaml

    from models.yolo import Model
    from utils.errors import UserError

    d = yaml.safe_load((REPO / "models" / "yolov5n.yaml").read_text())
    row = next(r for r in d["head"] if "Upsample" in str(r[2]))
    row[3] = args
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(UserError, match=says):
        Model(tmp_path / "m.yaml")
