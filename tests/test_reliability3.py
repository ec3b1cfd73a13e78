"""Reliability, round 3 (issue 46): SIGTERM to the process group ends a run as Ctrl-C does; what a seeded run
repeats (and what it needs to: the thread count is recorded); evolve from Python; ensembles' image size; flags given
with --resume; one class name as a string; misspelt hyp keys; no empty run folder after a
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

import numpy as np
import pytest
import torch
import yaml
from helpers import cli_in_process, hyp_file

import train
from models.yolo import Model, load_for_inference
from utils.engine import checkpoint as ck
from utils.engine.callbacks import Callbacks
from utils.engine.train_options import parse_opt
from utils.errors import UserError
from utils.options import to_argv
from utils.report.results import read_rows

REPO = Path(__file__).resolve().parents[1]
TINY = dict(imgsz=64, batch_size=4, workers=0, noplots=True, amp="off", seed=0)


pytestmark = pytest.mark.usefixtures("one_thread")


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


@pytest.mark.parametrize("where", list(SIGTERM_AT))
def test_sigterm_to_the_process_group_stops_like_ctrl_c(where, sigterm_runs):
    """Workers get the group's SIGTERM too: they end as on Ctrl-C, and the loader is never blamed."""
    _check_stopped_like_ctrl_c(*sigterm_runs[where])


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


# ----------------------------------------------------------------------------------------- 13. interrupts, stopping


def test_a_second_ctrl_c_while_stopping_still_names_the_resume_command(micro, tmp_path, monkeypatch, caplog):
    def second(t):
        raise KeyboardInterrupt  # pressed again while the pictures of the finished epochs are drawn

    monkeypatch.setattr(train, "plot_run", second)
    with caplog.at_level(logging.INFO):
        out = train.run(data=str(micro), project=str(tmp_path), epochs=2, callbacks=_interrupt_at(1), **TINY)
    last = out.save_dir / "weights" / "last.pt"
    assert out.interrupted and _lines(caplog, "interrupted") == [
        f"interrupted: {last} holds the last finished epoch; continue with: python train.py --resume {last}"]


def test_a_second_ctrl_c_after_the_stop_is_one_line_with_the_resume_command(micro, tmp_path, capsys, monkeypatch):
    """One that lands while the run lets go of its folder (on_train_exit) reaches run_cli: it prints the line too."""
    cb = _interrupt_at(1)
    cb.register("on_train_exit", lambda t: (_ for _ in ()).throw(KeyboardInterrupt))
    code, lines = cli_in_process(lambda argv: train.run(data=str(micro), project=str(tmp_path), epochs=2,
                                                        callbacks=cb, **TINY), [], capsys, monkeypatch)
    last = tmp_path / "exp" / "weights" / "last.pt"
    assert code == 130 and [ln for ln in lines if "interrupted" in ln] == [
        f"interrupted: {last} holds the last finished epoch; continue with: python train.py --resume {last}"]


def test_an_interrupt_during_set_up_says_so_and_leaves_no_folder(micro, tmp_path, capsys, monkeypatch):
    def interrupted(s, model, resume_ckpt):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "build_trainer", interrupted)
    code, lines = cli_in_process(train.main, ["--data", str(micro), "--project", str(tmp_path)], capsys, monkeypatch)
    assert code == 130 and lines == ["interrupted: the run had not started training, nothing was kept: start it again"]
    assert not any(tmp_path.iterdir())


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


# ----------------------------------------------------------------------------------------- 2. thread count


def test_opt_yaml_and_last_pt_record_the_thread_count(stopped_run):
    saved = yaml.safe_load((stopped_run.parent.parent / "opt.yaml").read_text())
    assert saved["cpu_threads"] == torch.get_num_threads() == 1 and saved["torch"] == str(torch.__version__)
    assert ck.load_checkpoint(stopped_run)["train"]["opt"]["cpu_threads"] == 1


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


# ----------------------------------------------------------------------------------------- 6. flags given with --resume


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


# ----------------------------------------------------------------------------------------- 3 and 7. evolve from Python


def test_run_with_evolve_runs_the_search_and_its_interrupt_line_is_the_search_command(micro, tmp_path, caplog):
    """train.run(evolve=2) searches as --evolve does; stopped in generation 1, it says to run the search's command
    again (--resume of the generation's last.pt would train that generation alone), and that command, parsed,
    is the search's own options."""
    options = dict(data=str(micro), project=str(tmp_path), epochs=1, evolve=2, **TINY)
    starts = []

    def stop_in_generation_1(t, epoch):
        starts.append(t.s.save_dir.name)
        if t.s.save_dir.name == "gen001":
            raise KeyboardInterrupt

    cb = Callbacks()
    cb.register("on_epoch_start", stop_in_generation_1)
    with caplog.at_level(logging.INFO):
        out = train.run(callbacks=cb, **options)
    assert out.interrupted and starts == ["gen000", "gen001"]
    assert len(read_rows(out.save_dir / "evolve.csv")) == 2  # the header and generation 0
    lines = [ln for ln in _lines(caplog) if "interrupted" in ln]
    assert lines and not any("--resume" in ln for ln in lines), lines
    cmd = lines[0].split("continue the search with: ", 1)[1]
    assert parse_opt(shlex.split(cmd)[2:]) == parse_opt(to_argv(options))
    out = train.run(**options)  # that command continues: generation 1 again, then done
    assert not out.interrupted and len(read_rows(out.save_dir / "evolve.csv")) == 3


# ----------------------------------------------------------------------------------------- 4. ensembles' image size


def _weights(path: Path, imgsz: int | None, cfg: str = "yolov5n.yaml") -> Path:
    model = Model(cfg, nc=3)
    ck.atomic_save(ck.make_checkpoint(model, model.yaml, ["a", "b", "c"], 0, imgsz=imgsz), path)
    return path


def test_an_ensemble_runs_at_its_members_largest_training_size(tmp_path):
    """A member that records no size (a converted YOLOv5 checkpoint) counts as the default, 640: the COCO model
    of `--weights yolov5n.pt small.pt` is not run at the small one's 64 px."""
    from utils.inference import default_imgsz

    small, big = _weights(tmp_path / "small.pt", 64), _weights(tmp_path / "big.pt", 128)
    none = _weights(tmp_path / "v5.pt", None)
    cpu = torch.device("cpu")
    size, why = default_imgsz(None, load_for_inference([small, big], cpu), 640)
    assert size == 128 and why == ("the largest training size of the ensemble's members: small.pt 64, big.pt 128; "
                                   "--imgsz to change")
    size, why = default_imgsz(None, load_for_inference([none, small], cpu), 640)
    assert size == 640 and "v5.pt 640 (the default: it records none), small.pt 64" in why
    assert default_imgsz(320, load_for_inference([none, small], cpu), 640) == (320, "--imgsz")


def test_detect_header_says_trained_at_for_a_checkpoint(tmp_path, caplog):
    import cv2

    import detect

    picture = tmp_path / "p.jpg"
    cv2.imwrite(str(picture), np.full((64, 80, 3), 90, np.uint8))
    with caplog.at_level(logging.INFO):
        detect.run(_weights(tmp_path / "small.pt", 64), picture, device="cpu", project=str(tmp_path / "d"))
        detect.run([str(tmp_path / "small.pt"), _weights(tmp_path / "v5.pt", None)], picture, device="cpu",
                   project=str(tmp_path / "d"))
    headers = _lines(caplog, "detect: ")
    assert "(the size small.pt was trained at; --imgsz to change)" in headers[0], headers
    assert " at 640x640 px (the largest training size of the ensemble's members" in headers[1], headers
    assert not any("exported" in h for h in headers)


# ----------------------------------------------------------------------------------------- 9. one class name


def test_one_class_name_as_a_string_is_one_class():
    import hubconf

    assert hubconf.yolov5n(classes="cat", device="cpu").names == ["cat"]
    assert hubconf.yolov5n(classes=["cat", "dog"], device="cpu").names == ["cat", "dog"]


# ----------------------------------------------------------------------------------------- 10. misspelt hyp keys


def test_unknown_hyp_keys_are_named_once_with_the_nearest_known_key(tmp_path, caplog):
    from utils.hyp import load_hyp

    path = hyp_file(tmp_path, lr_0=0.01, bogus_key=1)
    with caplog.at_level(logging.WARNING):
        load_hyp(path)
        load_hyp(path)  # read again (the loader, each generation of a search): no second warning
    warnings = _lines(caplog, "warning: ")
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: hyperparameter file {path}: unknown key(s) "
                                                         f"ignored: 'bogus_key' (nearest known key: ")
    assert "'lr_0' (nearest known key: lr0)" in warnings[0]


def test_the_shipped_hyps_and_a_runs_resolved_hyp_have_no_unknown_keys(stopped_run):
    from utils.hyp import KNOWN_HYP_KEYS
    from utils.files import load_yaml

    files = [*sorted((REPO / "data" / "hyps").glob("*.yaml")), stopped_run.parent.parent / "hyp.yaml"]
    assert len(files) > 1 and all(set(load_yaml(f)) <= KNOWN_HYP_KEYS for f in files)


def test_hyperparameters_are_read_only_through_the_table():
    """utils/hyp.Hyp is the one table (a key the code reads and the table lacks fails as an AttributeError, not as a
    silent default): no module reads a hyp as a mapping with a default of its own, and every key in the table is
    read somewhere (or says it is unused)."""
    from dataclasses import fields

    from utils.hyp import Hyp

    code = {f.relative_to(REPO).as_posix(): f.read_text() for f in REPO.rglob("*.py")
            if not f.relative_to(REPO).as_posix().startswith(("tests/", "bench/", ".", "ci_clone"))}
    mapping_reads = [(name, m.group(0)) for name, text in code.items() if name != "utils/hyp.py"
                     for m in re.finditer(r"hyp(?:\.get\(|\[)", text)]
    assert not mapping_reads, mapping_reads
    every = "\n".join(code.values())
    for f in fields(Hyp):
        assert f.name == "given" or "unused" in f.metadata["meaning"] or re.search(rf"\.{f.name}\b", every), f.name


# ----------------------------------------------------------------------------------------- 11 and 12. the run folder


@pytest.mark.parametrize("weights", ["/nonexistent.pt", "text.pt"])
def test_a_start_up_error_leaves_no_empty_run_folder(weights, micro, tmp_path):
    (tmp_path / "text.pt").write_text("hello text\n")
    project = tmp_path / "runs"
    with pytest.raises(UserError):
        train.run(data=str(micro), project=str(project), name="lo", weights=str(tmp_path / weights) if
                  weights == "text.pt" else weights, epochs=1, **TINY)
    assert not (project / "lo").exists()


def test_exist_ok_over_an_earlier_run_says_its_weights_are_replaced(stopped_run, micro, tmp_path, caplog):
    run = _copy_run(stopped_run, tmp_path).parent.parent
    with caplog.at_level(logging.INFO):
        train.run(data=str(micro), project=str(tmp_path), name="run", exist_ok=True, epochs=1, **TINY)
    warnings = _lines(caplog, "warning: --exist-ok")
    assert len(warnings) == 1 and warnings[0].startswith(
        f"warning: --exist-ok: replacing the weights of an earlier run in {run} (best.pt, last.pt)")


# ----------------------------------------------------------------------------------------- 13. the texts of mistakes


@pytest.mark.parametrize("options, text", [
    (dict(batch_size=4.5), "batch_size='4.5' must be a whole number (the command line's --batch-size)"),
    (dict(epochs="three"), "epochs='three' must be a whole number (the command line's --epochs)"),
    (dict(imgsz=[64, 64]), "imgsz=[64, 64]: training takes one size, the side of its square batches, e.g. imgsz=64"),
    (dict(freeze=10), "freeze='10' must be a list of whole numbers (the command line's --freeze)"),
], ids=["batch_size", "epochs", "imgsz", "freeze"])
def test_options_of_the_wrong_type_from_python_are_one_line(options, text, micro, tmp_path, capsys, monkeypatch):
    """(A pathlib.Path or a NumPy number is taken as the command line's text or number.)"""
    code, lines = cli_in_process(lambda argv: train.run(data=micro, project=tmp_path, seed=np.int64(0), **options), [],
                                 capsys, monkeypatch)
    assert code == 2 and lines == [f"error: {text}"]
    assert not any(tmp_path.iterdir())


def test_a_size_given_as_text_is_one_line():
    from models.api import create

    detector = create("yolov5n.yaml", 2, "cpu")
    with pytest.raises(UserError, match=r"^size='320' must be a number of pixels or \(height, width\)"):
        detector(torch.zeros(3, 64, 64), size="320")


def test_data_given_as_a_folder_says_so(micro, tmp_path, capsys, monkeypatch):
    code, lines = cli_in_process(train.main, ["--data", str(micro.parent)], capsys, monkeypatch)
    assert code == 2 and lines == [f"error: --data {micro.parent} is a folder, not a dataset YAML; pass the YAML that "
                                   f"describes it, e.g. {micro}"]


def test_a_text_file_named_jpg_is_not_called_a_truncated_jpeg(tmp_path):
    from utils.data.labels import _check_image

    fake = tmp_path / "fake.jpg"
    fake.write_text("hello\n")
    with pytest.raises(ValueError) as e:
        _check_image(str(fake))
    assert "truncated" not in str(e.value) and "not a decodable image" in str(e.value)


def test_a_text_file_given_as_a_checkpoint_says_what_it_is(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("hello text\n")
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(path)
    assert str(e.value) == (f"checkpoint {path} is not a PyTorch file (it begins b'hello text\\n', where torch.save "
                            f"writes a zip archive); pass a .pt written by train.py")


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_payload_in_this_projects_format_is_called_a_tampered_checkpoint(tmp_path):
    path, marker = tmp_path / "last.pt", tmp_path / "PWNED"
    torch.save({"format": "ampyolo", "version": 1, "model": _Payload(marker), "yaml": {}}, path)
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(path)
    assert str(e.value).startswith(f"refused to load {path}: it is marked as a checkpoint of this project")
    assert "YOLOv5" not in str(e.value) and "system" in str(e.value) and not marker.exists()


def test_a_batch_larger_than_the_dataset_is_cut_to_it(micro, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        out = train.run(data=str(micro), project=str(tmp_path), epochs=1, **{**TINY, "batch_size": 100_000})
    assert "--batch-size 100000 is more than the 8 training images; training at batch 8, the whole set in each step" \
        in _lines(caplog)
    assert yaml.safe_load((out.save_dir / "opt.yaml").read_text())["batch_size"] == 8
