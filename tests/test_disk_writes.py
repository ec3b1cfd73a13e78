"""What the commands write and delete on disk: a write that fails (a real or simulated full disk, any error inside a
writer) keeps the previous file and is one line; temporary names are unique; a run folder is locked while a run
uses it, made once per run, never left empty after a start-up error and never outside --project; only files the
code made itself are ever deleted."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import test as test_cli
from pathlib import Path

import pytest
import torch
from helpers import cli_in_process, one_error

import detect
import train
from utils.engine import checkpoint as ck
from utils.errors import UserError
from utils.options import to_argv

REPO = Path(__file__).resolve().parents[1]
TINY_RUN = dict(epochs=1, imgsz=64, batch_size=8, workers=0, noplots=True, amp="off", noval=True, seed=1)
ARGS = dict(imgsz=64, batch_size=8, workers=0, noplots=True, amp="bf16", seed=3)
TINY = dict(imgsz=64, batch_size=4, workers=0, noplots=True, amp="off", seed=0)


# ----------------------------------------------------------------------------------------- a full disk

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
    from helpers import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "disk", "size=12m") as d:
        yield d


def test_a_real_full_disk_keeps_the_previous_checkpoint(small_disk):
    path = small_disk / "last.pt"
    ck.atomic_save({"n": torch.ones(3)}, path)
    before = path.read_bytes()
    with pytest.raises(UserError, match="could not write .*previous file is kept") as e:
        ck.atomic_save({"big": torch.zeros(4_000_000)}, path)  # 16 MB on a 12 MB disk
    assert "\n" not in str(e.value)
    assert path.read_bytes() == before and os.listdir(small_disk) == ["last.pt"]


@pytest.mark.slow
def test_training_onto_a_real_full_disk_exits_2_with_one_line(small_disk, tiny_data, capsys, monkeypatch):
    """yolov5n's training last.pt (~27 MB) does not fit on 12 MB: the first checkpoint write fails."""
    argv = ["--data", str(tiny_data), "--project", str(small_disk), "--epochs", "1", "--imgsz", "64",
            "--batch-size", "8", "--workers", "0", "--noplots", "--amp", "off"]
    code, lines = cli_in_process(train.main, argv, capsys, monkeypatch)
    one_error((code, lines), "could not write", "previous file is kept")
    weights = small_disk / "exp" / "weights"
    assert not any(p.name.endswith(".tmp") for p in weights.iterdir())


# ----------------------------------------------------------------------------------------- unique temp names


def test_opt_hyp_and_results_use_unique_temp_names_through_one_writer(tmp_path, monkeypatch):
    from utils.files import save_yaml
    from utils.report.results import truncate_after

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
    truncate_after(tmp_path / "results.csv", 0)
    assert other.read_text() == "in flight"  # never touched
    assert len(set(temps)) == 3 and all(t.startswith((".opt.yaml.", ".results.csv.")) for t in temps), temps
    assert (tmp_path / "results.csv").read_text().splitlines() == ["epoch,x", "0,1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".opt.yaml.tmp", "opt.yaml", "results.csv"]


# ----------------------------------------------------------------------------------------- two runs, one folder

@pytest.mark.slow
def test_a_second_run_in_a_locked_run_folder_is_one_line_and_a_stale_lock_is_taken_over(tiny_data, tmp_path, capsys,
                                                                                        monkeypatch):
    from utils.files import LOCK_NAME, lock_record

    folder = tmp_path / "exp"
    folder.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # stands for a live train.py
    try:
        (folder / LOCK_NAME).write_text(lock_record(other.pid))
        argv = ["--data", str(tiny_data), "--project", str(tmp_path), "--exist-ok", *_flags(TINY_RUN)]
        code, lines = cli_in_process(train.main, argv, capsys, monkeypatch)
        one_error((code, lines), f"run folder {folder} is in use by another train.py (pid {other.pid})")
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # nothing written into its folder
    finally:
        other.kill()
        other.wait()
    # the holder died without removing its lock (SIGKILL): the next run takes the folder over
    out = train.run(data=str(tiny_data), project=str(tmp_path), exist_ok=True, **TINY_RUN)
    assert out.save_dir == folder and (folder / "weights" / "best.pt").is_file()
    assert not (folder / LOCK_NAME).exists()  # released when the run ended


def test_the_lock_is_released_when_a_run_fails_and_the_same_process_may_run_again(tiny_data, tmp_path):
    from utils.files import LOCK_NAME

    with pytest.raises(UserError, match="--freeze"):
        train.run(data=str(tiny_data), project=str(tmp_path), freeze=[100], **TINY_RUN)
    assert not (tmp_path / "exp" / LOCK_NAME).exists()


def test_runs_started_at_once_without_exist_ok_get_their_own_folders(tmp_path, monkeypatch):
    from utils import files

    real, made = Path.mkdir, []

    def racing(self, *a, **k):  # another process creates exp2 between our check and our mkdir
        if self.name == "exp2" and not made:
            made.append(self)
            real(self, parents=True)
        return real(self, *a, **k)

    (tmp_path / "exp").mkdir()
    monkeypatch.setattr(Path, "mkdir", racing)
    assert files.increment_path(tmp_path, "exp") == tmp_path / "exp3"


def _flags(opts: dict) -> list[str]:
    out = []
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else [] if v is False else [flag, str(v)]
    return out


# ----------------------------------------------------------------------------------------- a write failing during training
# (one CPU thread from here on; module-scoped, so every test below does too)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
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


# ----------------------------------------------------------------------------------------- where files go


@pytest.mark.usefixtures("one_thread")
def test_output_folder_that_cannot_be_created_is_one_error(tiny_data, tmp_path, capsys, monkeypatch):
    """As root nothing is read-only, so the project path runs through a regular file instead."""
    (tmp_path / "file").write_text("not a folder")
    code, lines = cli_in_process(train.main, ["--data", str(tiny_data), "--project", str(tmp_path / "file" / "runs")],
                       capsys, monkeypatch)
    one_error((code, lines), "cannot create output folder")


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("weights", ["/nonexistent.pt", "text.pt"])
def test_a_start_up_error_leaves_no_empty_run_folder(weights, micro, tmp_path):
    (tmp_path / "text.pt").write_text("hello text\n")
    project = tmp_path / "runs"
    with pytest.raises(UserError):
        train.run(data=str(micro), project=str(project), name="lo", weights=str(tmp_path / weights) if
                  weights == "text.pt" else weights, epochs=1, **TINY)
    assert not (project / "lo").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
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


# ----------------------------------------------------------------------------------------- what is deleted


@pytest.mark.usefixtures("one_thread")
def test_stale_temp_cleanup_touches_only_atomic_save_temps(tmp_path):
    names = [".last.pt.k2j3.tmp", ".best.pt.x.tmp", "last.pt", "notes.tmp", ".hidden.tmp", "my.pt.tmp"]
    for n in names:
        (tmp_path / n).write_text("x")
    removed = ck.remove_stale_temps(tmp_path)
    assert sorted(p.name for p in removed) == [".best.pt.x.tmp", ".last.pt.k2j3.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])


@pytest.mark.usefixtures("one_thread")
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


@pytest.mark.usefixtures("one_thread")
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
