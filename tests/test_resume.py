"""--resume: a run killed at any moment (SIGKILL included) continues to the weights, results and curves of the run
that was never stopped; a changed training set or thread count is said in one line and recorded; flags given with
--resume are named as ignored; a stopped run's folder (opt.yaml, hyp.yaml, --exist-ok over it)."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import cli_in_process, interrupt_at as _interrupt_at, log_lines as _lines, read_curves

import train
from utils.engine import checkpoint as ck
from utils.engine.train_options import TrainOptions
from utils.options import to_argv
from utils.report.results import read_rows

pytestmark = pytest.mark.slow  # every test here trains a run

REPO = Path(__file__).resolve().parents[1]
ARGS = dict(epochs=4, imgsz=64, batch_size=8, workers=0, noplots=True, amp="bf16", seed=3)
TINY = dict(imgsz=64, batch_size=4, workers=0, noplots=True, amp="off", seed=0)


# ----------------------------------------------------------------------------------------- exact resume after SIGKILL

@pytest.mark.parametrize("multi_scale", [False, True], ids=["fixed-size", "multi-scale"])
def test_sigkill_during_epoch_3_then_resume_matches_an_uninterrupted_run(multi_scale, tiny_data, bf16_hyp, tmp_path):
    # bf16 arithmetic from the first step; multi-scale: each batch's size comes back the same after a resume
    args = {**ARGS, "multi_scale": multi_scale, "hyp": str(bf16_hyp)}
    ref = train.run(data=str(tiny_data), project=str(tmp_path / "ref"), **args)

    # the same run in a child process, killed hard as soon as epoch 2 is logged: in its checkpoint
    # write or at the start of epoch 3 (index 2); a tiny epoch lasts well under a second here
    last = kill_after(tiny_data, tmp_path / "killed", args, epochs_logged=2)
    # 0 or 1; 2 if the parent was descheduled for the length of an epoch before its signal went out
    assert torch.load(last, weights_only=True)["train"]["completed_epoch"] in (0, 1, 2)
    resumed = train.run(resume=str(last), workers=0)
    assert resumed.save_dir == last.parent.parent  # the same run folder continues

    a, b = ref.ema.state_dict(), resumed.ema.state_dict()
    diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    assert diff <= 1e-6, diff
    assert read_rows(ref.save_dir / "results.csv", clock=False) == \
        read_rows(resumed.save_dir / "results.csv", clock=False)
    # the diagnostics (gradient norms, head biases) of the redone epochs are the same numbers, once each
    assert read_rows(ref.save_dir / "diagnostics.csv") == read_rows(resumed.save_dir / "diagnostics.csv")
    # TensorBoard: the resumed run's curves are the uninterrupted run's, each step once (none lost, none twice)
    want, got = read_curves(ref.save_dir), read_curves(resumed.save_dir)
    assert set(got) == set(want) and [s for s, _ in want["step/box_loss"]] == list(range(4 * 3))  # 24 images / 8
    for tag in want:
        assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
        if tag != "time":
            assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want[tag]], rel=1e-5, abs=1e-7), tag


def kill_after(data: Path, project: Path, args: dict, epochs_logged: int, env: dict | None = None) -> Path:
    """Start train.py in a child process, SIGKILL it once `epochs_logged` epochs are in results.csv; its last.pt."""
    cmd = [sys.executable, "train.py", "--data", str(data), "--project", str(project), *to_argv(args, TrainOptions)]
    child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    results = project / "exp" / "results.csv"
    deadline = time.time() + 600
    while time.time() < deadline and child.poll() is None:
        if results.exists() and len(read_rows(results)) >= 1 + epochs_logged:  # the header, then an epoch a row
            break
        time.sleep(0.02)
    assert child.poll() is None, "the run ended before it could be killed"
    child.send_signal(signal.SIGKILL)
    child.wait()
    return project / "exp" / "weights" / "last.pt"


def test_sigkill_then_resume_is_bit_exact_with_several_threads(coco_subset, several_threads, tmp_path):
    """Real images (many positives per batch, so the threads share the loss's sums) at the default precision:
    the resumed run's weights and results are the uninterrupted run's, bit for bit."""
    args = dict(cfg="yolov5n.yaml", epochs=4, imgsz=128, batch_size=16, workers=2, seed=0, noplots=True)
    ref = train.run(data=str(coco_subset), project=str(tmp_path / "ref"), **args)
    env = {**os.environ, "OMP_NUM_THREADS": str(several_threads)}  # the child uses as many threads as this process
    last = kill_after(coco_subset, tmp_path / "killed", args, epochs_logged=2, env=env)
    assert torch.load(last, weights_only=True)["train"]["completed_epoch"] in (0, 1, 2)  # in its save, or after
    resumed = train.run(resume=str(last), workers=2)
    a, b = ref.ema.state_dict(), resumed.ema.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    assert read_rows(ref.save_dir / "results.csv", clock=False) == \
        read_rows(resumed.save_dir / "results.csv", clock=False)


# ----------------------------------------------------------------------------------------- what changed since the run started


def test_resume_after_the_training_set_changed_says_so_and_keeps_its_schedule(tiny_data, tmp_path, caplog):
    """--resume after pictures were added: one line (how many then and now), and the warmup keeps counting the
    run's own batches an epoch (it was recomputed from the new size, so the run was no longer the run it continues)."""
    from utils.engine.callbacks import Callbacks

    pictures = sorted((tiny_data.parent / "shapes" / "images" / "train").iterdir())
    listing = tmp_path / "train.txt"
    listing.write_text("".join(f"{p}\n" for p in pictures[:8]))
    data = tmp_path / "data.yaml"
    data.write_text(tiny_data.read_text().replace("train: images/train", f"train: {listing}"))
    stop, seen = Callbacks(), Callbacks()

    def interrupt(t, epoch):
        if epoch == 1:
            raise KeyboardInterrupt

    stop.register("on_epoch_start", interrupt)
    cut = train.run(data=str(data), epochs=2, imgsz=64, batch_size=4, workers=0, noplots=True, noval=True,
                    project=str(tmp_path), callbacks=stop)
    assert cut.interrupted
    listing.write_text("".join(f"{p}\n" for p in pictures[:12]))  # 2 batches an epoch then, 3 now
    steps: list[int] = []
    seen.register("on_train_batch", lambda t, ni, *rest: steps.append(ni))
    with caplog.at_level(logging.WARNING):
        train.run(resume=str(cut.save_dir / "weights" / "last.pt"), callbacks=seen)
    said = [r.getMessage() for r in caplog.records if "pictures now" in r.getMessage()]
    assert len(said) == 1 and "has 12 pictures now, 8 when the run started" in said[0], said
    assert steps == [2, 3, 4]  # epoch 1 of a run of 2 batches an epoch: its warmup counts from batch 2


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


# ----------------------------------------------------------------------------------------- a stopped run
# (one CPU thread from here on: the stopped run records it; module-scoped, so every test below does too)

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


@pytest.mark.usefixtures("one_thread")
def test_opt_yaml_and_last_pt_record_the_thread_count(stopped_run):
    saved = yaml.safe_load((stopped_run.parent.parent / "opt.yaml").read_text())
    assert saved["cpu_threads"] == torch.get_num_threads() == 1 and saved["torch"] == str(torch.__version__)
    assert ck.load_checkpoint(stopped_run)["train"]["opt"]["cpu_threads"] == 1


@pytest.mark.usefixtures("one_thread")
def test_resume_with_another_thread_count_warns_in_one_line(stopped_run, tmp_path, caplog):
    last = _copy_run(stopped_run, tmp_path)
    ckpt = torch.load(last, weights_only=True)
    ckpt["train"]["opt"]["cpu_threads"] = 3
    torch.save(ckpt, last)
    with caplog.at_level(logging.INFO):
        train.run(resume=str(last))
    assert _lines(caplog, "warning: ") == [
        f"warning: {last} trained with 3 CPU threads and continues with 1: the rest of the run rounds differently "
        f"from the run it continues (set OMP_NUM_THREADS=3 to continue it exactly)"]


@pytest.mark.usefixtures("one_thread")
def test_flags_given_with_resume_are_named_as_ignored(stopped_run, tmp_path, caplog, capsys, monkeypatch):
    last = _copy_run(stopped_run, tmp_path)
    with caplog.at_level(logging.INFO):
        code, _ = cli_in_process(train.main, ["--resume", str(last), "--epochs", "5", "--batch-size", "8",
                                              "--workers", "0"], capsys, monkeypatch)
    warnings = _lines(caplog, "warning: ")
    assert code == 0 and len(warnings) == 1, warnings
    assert "ignored: --epochs 5 (the run's: 3), --batch-size 8 (the run's: 4)." in warnings[0]
    assert "--workers" not in warnings[0] and f"--weights {last}" in warnings[0]
    assert [r[0] for r in read_rows(last.parent.parent / "results.csv")[1:]] == ["0", "1", "2"]  # the run's 3 epochs


@pytest.mark.usefixtures("one_thread")
def test_the_shipped_hyps_and_a_runs_resolved_hyp_have_no_unknown_keys(stopped_run):
    from utils.hyp import KNOWN_HYP_KEYS
    from utils.files import load_yaml

    files = [*sorted((REPO / "data" / "hyps").glob("*.yaml")), stopped_run.parent.parent / "hyp.yaml"]
    assert len(files) > 1 and all(set(load_yaml(f)) <= KNOWN_HYP_KEYS for f in files)


@pytest.mark.usefixtures("one_thread")
def test_exist_ok_over_an_earlier_run_says_its_weights_are_replaced(stopped_run, micro, tmp_path, caplog):
    run = _copy_run(stopped_run, tmp_path).parent.parent
    with caplog.at_level(logging.INFO):
        train.run(data=str(micro), project=str(tmp_path), name="run", exist_ok=True, epochs=1, **TINY)
    warnings = _lines(caplog, "warning: --exist-ok")
    assert len(warnings) == 1 and warnings[0].startswith(
        f"warning: --exist-ok: replacing the weights of an earlier run in {run} (best.pt, last.pt)")
