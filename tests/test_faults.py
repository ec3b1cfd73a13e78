"""Faults during training and untrusted files: nothing is lost, nothing runs, every failure is one clear line.

Faults come from the AMPYOLO_FAULTS test hook (utils/engine/faults.py), from monkeypatched writes, from deleted
images and from signals; bench/kill_campaign.py's short form runs in bench/tests/test_kill_campaign.py.
"""
from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import test as test_cli
import time
from pathlib import Path

import pytest
import torch
from helpers import cli_in_process, one_error, read_curves

import detect
import train
from utils.data.datasets import create_dataloader, loader_failure
from utils.engine import checkpoint as ck
from utils.engine.faults import FaultPlan, parse_faults
from utils.errors import UserError
from utils.options import to_argv
from utils.report.results import read_rows

REPO = Path(__file__).resolve().parents[1]

ARGS = dict(imgsz=64, batch_size=8, workers=0, noplots=True, amp="bf16", seed=3)
EPOCHS = 2


def _finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in model.state_dict().values() if v.is_floating_point())



pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference(micro, tmp_path_factory):
    """The uninterrupted run the fault runs below are compared with."""
    return train.run(data=str(micro), project=str(tmp_path_factory.mktemp("ref")), epochs=EPOCHS, **ARGS)


# ----------------------------------------------------------------------------------------- the hook


def test_fault_spec_is_parsed_once_and_typos_are_refused():
    plan = parse_faults("nan_loss@1,4; nan_weights@0x2;slow_save@0.25;disk_full@3;worker_exit@5;kill@2")
    assert plan.nan_loss == {1, 4} and plan.nan_weights == {0: 2} and plan.slow_save == 0.25
    assert plan.disk_full == 3 and plan.worker_exit == 5 and plan.kill == 2 and plan.active
    assert parse_faults("kill@0").active and parse_faults("kill@0").kill == 0
    assert not parse_faults(None).active and not parse_faults("").active
    for bad in ("nan_loss@x", "explode@1", "nan_weights@", "kill@"):
        with pytest.raises(UserError, match="AMPYOLO_FAULTS"):
            parse_faults(bad)


def test_disk_full_hook_fails_the_nth_write_and_keeps_the_previous_file(tmp_path):
    plan, path = FaultPlan(disk_full=2), tmp_path / "last.pt"
    ck.atomic_save({"n": 1}, path, plan.before_replace)
    with pytest.raises(UserError, match="No space left on device.*previous file is kept"):
        ck.atomic_save({"n": 2}, path, plan.before_replace)
    assert torch.load(path, weights_only=True) == {"n": 1} and os.listdir(tmp_path) == ["last.pt"]


# ----------------------------------------------------------------------------------------- non-finite values


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # the skipped first step
def test_nan_losses_are_skipped_and_counted_and_weights_stay_finite(micro, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPYOLO_FAULTS", "nan_loss@0")  # epoch 0's only batch; epoch 1 trains normally
    out = train.run(data=str(micro), project=str(tmp_path), epochs=EPOCHS, noval=True, **ARGS)
    rows = list(csv.DictReader(open(out.save_dir / "results.csv")))
    assert [r["skipped_steps"] for r in rows] == ["1", "1"]  # cumulative
    assert rows[0]["train/box_loss"] == "0" and float(rows[1]["train/box_loss"]) > 0  # NaN batches left out
    assert _finite(out.ema)
    last = ck.load_checkpoint(out.save_dir / "weights" / "last.pt")
    assert all(bool(torch.isfinite(v.float()).all()) for v in last["model"].values())


def test_nan_weights_reload_last_pt_and_the_replayed_run_matches(reference, micro, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("AMPYOLO_FAULTS", f"nan_weights@{EPOCHS - 1}")
    out = train.run(data=str(micro), project=str(tmp_path), epochs=EPOCHS, **ARGS)
    assert "non-finite" in caplog.text and "reload 1 of at most 3" in caplog.text
    a, b = reference.ema.state_dict(), out.ema.state_dict()
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-6
    assert read_rows(reference.save_dir / "results.csv", clock=False) == \
        read_rows(out.save_dir / "results.csv", clock=False)
    want, got = read_curves(reference.save_dir), read_curves(out.save_dir)  # the replayed steps logged once
    assert [s for s, _ in got["step/box_loss"]] == [s for s, _ in want["step/box_loss"]] == list(range(EPOCHS))
    assert [s for s, _ in got["train/box_loss"]] == list(range(EPOCHS))
    assert [v for _, v in got["step/box_loss"]] == pytest.approx([v for _, v in want["step/box_loss"]], rel=1e-5)


def test_weights_that_stay_non_finite_stop_after_three_reloads(micro, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPYOLO_FAULTS", "nan_weights@0x4")
    with pytest.raises(UserError, match=r"non-finite .* in epoch 0 again after 3 reloads") as e:
        train.run(data=str(micro), project=str(tmp_path), epochs=1, noval=True, **ARGS)
    assert "\n" not in str(e.value)
    last = ck.load_checkpoint(tmp_path / "exp" / "weights" / "last.pt")
    assert last["train"]["completed_epoch"] == -1  # the initial state, never overwritten by NaN weights
    assert all(bool(torch.isfinite(v).all()) for v in last["train"]["model"].values() if v.is_floating_point())


# ----------------------------------------------------------------------------------------- disk


def test_failing_write_during_a_save_keeps_last_and_best_and_exits_2(micro, tmp_path, capsys, monkeypatch):
    """os.replace fails (full disk) for every write after epoch 0's: the files of epoch 0 stay as they were."""
    real, seen, before = os.replace, [], {}
    weights = tmp_path / "exp" / "weights"

    def failing_replace(src, dst):
        if seen.count("last.pt") >= 2:  # the initial last.pt and epoch 0's went through
            before.setdefault("files", {f: (weights / f).read_bytes() for f in ("last.pt", "best.pt")})
            raise OSError(28, "No space left on device")
        seen.append(Path(dst).name)
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    argv = ["--data", str(micro), "--project", str(tmp_path), "--epochs", "2", "--noval",
            *to_argv({k: v for k, v in ARGS.items()})]
    code, lines = cli_in_process(train.main, argv, capsys, monkeypatch)
    one_error((code, lines), "could not write", "previous file is kept")
    assert {f: (weights / f).read_bytes() for f in ("last.pt", "best.pt")} == before["files"]
    assert sorted(p.name for p in weights.iterdir()) == ["best.pt", "last.pt"]  # no temp file left
    assert ck.load_checkpoint(weights / "last.pt")["train"]["completed_epoch"] == 0  # resumable


def test_output_folder_that_cannot_be_created_is_one_error(tiny_data, tmp_path, capsys, monkeypatch):
    """As root nothing is read-only, so the project path runs through a regular file instead."""
    (tmp_path / "file").write_text("not a folder")
    code, lines = cli_in_process(train.main, ["--data", str(tiny_data), "--project", str(tmp_path / "file" / "runs")],
                       capsys, monkeypatch)
    one_error((code, lines), "cannot create output folder")


# ----------------------------------------------------------------------------------------- data


def test_image_gone_after_verification_is_replaced_by_the_next_sample(tiny_data, tmp_path, caplog):
    src = tiny_data.parent / "shapes"
    for sub in ("images/train", "labels/train"):
        shutil.copytree(src / sub, tmp_path / sub)
    loader, ds = create_dataloader(tmp_path / "images" / "train", 64, 8, 32, augment=True, workers=0, shuffle=True)
    loader2, _ = create_dataloader(tmp_path / "images" / "train", 64, 8, 32, augment=True, workers=2)
    gone, cut = Path(ds.im_files[3]), Path(ds.im_files[10])
    gone.unlink()
    cut.write_bytes(b"")  # zero bytes: as if a copy was interrupted
    paths = [p for _, _, batch_paths, _ in loader for p in batch_paths]
    assert len(paths) == len(ds) and str(gone) not in paths and str(cut) not in paths
    warnings = [r.getMessage() for r in caplog.records if "another sample takes its place" in r.getMessage()]
    assert len(warnings) == 2 and str(gone) in warnings[0] + warnings[1] and str(cut) in warnings[0] + warnings[1]
    assert sum(len(p) for _, _, p, _ in loader2) == len(ds)  # the same in worker processes, and no hang


def test_crashed_loader_worker_stops_cleanly_and_last_pt_resumes(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPYOLO_FAULTS", "worker_exit@3")  # worker 0: batches 0 and 2 of epoch 0, dies in epoch 1
    with pytest.raises(UserError, match="data loader failed.*--resume") as e:
        train.run(data=str(tiny_data), project=str(tmp_path), epochs=EPOCHS, noval=True, **{**ARGS, "workers": 2})
    assert "\n" not in str(e.value)
    last = tmp_path / "exp" / "weights" / "last.pt"
    assert ck.load_checkpoint(last)["train"]["completed_epoch"] == 0
    monkeypatch.delenv("AMPYOLO_FAULTS")
    out = train.run(resume=str(last), workers=0)
    assert [r[0] for r in read_rows(out.save_dir / "results.csv")[1:]] == ["0", "1"]


def _stall(batch):
    time.sleep(60)


def test_a_stuck_loader_worker_times_out_instead_of_hanging(tiny_data, monkeypatch):
    import utils.data.datasets as datasets

    monkeypatch.setattr(datasets, "LOADER_TIMEOUT_S", 2)
    loader, _ = create_dataloader(tiny_data.parent / "shapes" / "images" / "val", 64, 4, 32, workers=1)
    loader.collate_fn = _stall  # the worker never delivers (a dead network mount, say)
    t0 = time.time()
    with pytest.raises(RuntimeError) as e:
        next(iter(loader))
    assert time.time() - t0 < 30
    failure = loader_failure(e.value, Path("runs/train/exp/weights/last.pt"))
    assert failure is not None and "timed out after 2 seconds" in str(failure) and "--resume" in str(failure)


# ----------------------------------------------------------------------------------------- untrusted files


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, tiny_data) -> dict[str, Path]:
    """Every kind of untrusted file, each made to run `touch PWNED` if it were ever executed."""
    d = tmp_path_factory.mktemp("untrusted")
    from models.yolo import Model

    model = Model("yolov5n.yaml", nc=5)
    good = d / "good.pt"
    ck.atomic_save(ck.make_checkpoint(model, model.yaml, [f"c{i}" for i in range(5)], 0), good)
    files = {"truncated.pt": good.read_bytes()[: good.stat().st_size // 2]}
    (d / "truncated.pt").write_bytes(files["truncated.pt"])
    torch.save({"state_dict": model.state_dict(), "epoch": 3}, d / "foreign.pt")  # another program's checkpoint
    torch.save({"format": "ampyolo", "model": _Evil(d), "yaml": {}}, d / "evil.pt")
    tag = f"!!python/object/apply:os.system ['touch {d}/PWNED']"
    data = tiny_data.read_text()
    (d / "evil_data.yaml").write_text(data.replace("train: images/train", f"train: {tag}"))
    (d / "evil_model.yaml").write_text(f"nc: {tag}\n")
    (d / "unknown_module.yaml").write_text(
        (REPO / "models" / "yolov5n.yaml").read_text().replace(", SPPF,", ", os.system,"))
    (d / "outside.yaml").write_text(data.replace("train: images/train", "train: /root/nonexistent/images"))
    (d / "not_a_folder.yaml").write_text(data.replace("train: images/train", f"train: {d / 'good.pt'}"))
    return {p.name: p for p in d.iterdir()}


class _Evil:
    def __init__(self, d: Path):
        self.d = d

    def __reduce__(self):
        return (os.system, (f"touch {self.d}/PWNED",))


TRAIN_CASES = {  # argv tail -> words the one error line must hold
    "--weights foreign.pt": ("foreign.pt", "not a checkpoint of this project"),
    "--weights truncated.pt": ("truncated.pt", "truncated or corrupt"),
    "--weights evil.pt": ("evil.pt", "refused to load"),
    "--data evil_data.yaml": ("evil_data.yaml", "python tags"),
    "--cfg evil_model.yaml": ("evil_model.yaml",),
    "--cfg unknown_module.yaml": ("unknown_module.yaml", "unknown module 'os.system'"),
    "--data outside.yaml": ("outside.yaml", "/root/nonexistent/images"),
    "--data not_a_folder.yaml": ("good.pt",),
}


@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_train_refuses_untrusted_files(case, bad_files, tiny_data, tmp_path, capsys, monkeypatch):
    flag, name = case.split()
    argv = ["--data", str(tiny_data), "--epochs", "1", "--project", str(tmp_path), flag, str(bad_files[name]),
            *to_argv(ARGS)]
    one_error(cli_in_process(train.main, argv, capsys, monkeypatch), *TRAIN_CASES[case])
    assert not (bad_files[name].parent / "PWNED").exists()


@pytest.mark.parametrize("name", ["foreign.pt", "truncated.pt", "evil.pt", "evil_data.yaml", "outside.yaml"])
def test_test_and_detect_refuse_untrusted_files(name, bad_files, tiny_data, tmp_path, capsys, monkeypatch):
    weights = bad_files[name] if name.endswith(".pt") else bad_files["good.pt"]
    data = bad_files[name] if name.endswith(".yaml") else tiny_data
    argv = ["--weights", str(weights), "--data", str(data), "--img", "64", "--workers", "0", "--project", str(tmp_path)]
    one_error(cli_in_process(test_cli.main, argv, capsys, monkeypatch), name)
    if name.endswith(".pt"):
        image = next((tiny_data.parent / "shapes" / "images" / "val").iterdir())
        argv = ["--weights", str(weights), "--source", str(image), "--img", "64", "--project", str(tmp_path)]
        one_error(cli_in_process(detect.main, argv, capsys, monkeypatch), name)
    assert not (weights.parent / "PWNED").exists()


@pytest.mark.parametrize("script,args", [
    ("train.py", ["--cfg", "evil_model.yaml"]),
    ("test.py", ["--weights", "evil.pt"]),
    ("detect.py", ["--weights", "truncated.pt"]),
])
def test_cli_exit_code_2_and_one_line_in_a_real_process(script, args, bad_files, tiny_data, tmp_path):
    argv = [bad_files[a].as_posix() if a in bad_files else a for a in args]
    image = next((tiny_data.parent / "shapes" / "images" / "val").iterdir())
    extra = ["--data", str(tiny_data)] if script != "detect.py" else ["--source", str(image)]
    r = subprocess.run([sys.executable, script, *argv, *extra, "--project", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and Path(argv[1]).name in lines[0], lines
    assert not (bad_files["good.pt"].parent / "PWNED").exists()


@pytest.mark.parametrize("args", ["--batch-size 0", "--epochs 0", "--imgsz -64", "--workers -1", "--freeze 99",
                                  "--label-smoothing 5", "--patience -1"])
def test_train_refuses_bad_numbers_with_one_line(args, micro, tmp_path, capsys, monkeypatch):
    argv = ["--data", str(micro), "--project", str(tmp_path), *to_argv({**ARGS, "epochs": 1}), *args.split()]
    one_error(cli_in_process(train.main, argv, capsys, monkeypatch), args.split()[0])


@pytest.mark.parametrize("args", ["--batch-size 0", "--imgsz 0", "--conf-thres 2", "--iou-thres -1", "--max-det 0"])
def test_test_refuses_bad_numbers_with_one_line(args, bad_files, micro, tmp_path, capsys, monkeypatch):
    argv = ["--weights", str(bad_files["good.pt"]), "--data", str(micro), "--workers", "0", "--project", str(tmp_path),
            *args.split()]
    one_error(cli_in_process(test_cli.main, argv, capsys, monkeypatch), args.split()[0])


# ----------------------------------------------------------------------------------------- where files go


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", "/tmp/escape_abs", "nested/name"])
def test_name_never_leaves_the_project_folder(name, bad_files, tiny_data, tmp_path, capsys, monkeypatch):
    project = tmp_path / "project"
    image = next((tiny_data.parent / "shapes" / "images" / "val").iterdir())
    common = ["--project", str(project), "--name", name]
    for main, argv in ((train.main, ["--data", str(tiny_data), "--epochs", "1"]),
                       (test_cli.main, ["--weights", str(bad_files["good.pt"]), "--data", str(tiny_data), "--img", "64"]),
                       (detect.main, ["--weights", str(bad_files["good.pt"]), "--source", str(image), "--img", "64"])):
        one_error(cli_in_process(main, argv + common, capsys, monkeypatch), "--name")
    assert not Path("/tmp/escape_abs").exists() and not (tmp_path / "escape").exists()
    assert not project.exists() or all(p.is_dir() and not any(p.iterdir()) for p in project.iterdir())


def test_stale_temp_cleanup_touches_only_atomic_save_temps(tmp_path):
    names = [".last.pt.k2j3.tmp", ".best.pt.x.tmp", "last.pt", "notes.tmp", ".hidden.tmp", "my.pt.tmp"]
    for n in names:
        (tmp_path / n).write_text("x")
    removed = ck.remove_stale_temps(tmp_path)
    assert sorted(p.name for p in removed) == [".best.pt.x.tmp", ".last.pt.k2j3.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])


def test_shapes_generator_never_deletes_a_folder_it_did_not_make(tmp_path):
    from utils.data.synthetic import ensure_shapes_dataset

    mine = tmp_path / "shapes"
    (mine / "images").mkdir(parents=True)
    (mine / "images" / "holiday.jpg").write_bytes(b"precious")
    with pytest.raises(UserError, match="not a generated shapes dataset"):
        ensure_shapes_dataset(mine, n_train=2, n_val=1)
    assert (mine / "images" / "holiday.jpg").read_bytes() == b"precious"


AUDITED_DELETIONS = {  # every call that deletes, and why it is confined
    # atomic_write's own temp file (every atomic write: checkpoints, YAMLs, results.csv, the label cache);
    # remove_stale_temps: .<target>.<random>.tmp of named targets in one folder; RunLock: its own lock file;
    # remove_empty_tree (2): empty folders only, in the results folder detect.py made and wrote nothing to;
    # replace_folder: the previous export folder it has just renamed aside (.<name>.<pid>.old), once the new one is in
    "utils/files.py": 6,
    "detect.py": 2,  # VideoFile: its own mkstemp file (.<stem>.<random>.mp4), when no writer opens and after the rename
    "utils/data/synthetic.py": 2,  # its own temp folder; an outdated copy it generated itself (VERSION stamp checked)
    "utils/engine/evolve.py": 2,  # genNNN/ of its own search folder (a rerun must match its opt.yaml): a generation
    # cut short is redone from scratch, and the weights of all but the fittest generation go
    "utils/report/tblog.py": 1,  # cut_history: TensorBoard event files (events.out.tfevents.*) in the run folder it logs to
}


def test_every_deletion_in_the_code_is_audited():
    pattern = re.compile(r"rmtree\(|\.unlink\(|os\.remove\(|os\.unlink\(|\.rmdir\(|os\.rmdir\(")
    found = {}
    for f in sorted(REPO.rglob("*.py")):
        rel = f.relative_to(REPO).as_posix()
        if rel.startswith(("tests/", "bench/", ".")):
            continue
        n = len(pattern.findall(f.read_text()))
        if n:
            found[rel] = n
    assert found == AUDITED_DELETIONS, "a new deletion: confine it to files the code made itself, then list it here"
