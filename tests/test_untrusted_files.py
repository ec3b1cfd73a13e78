"""Files from elsewhere cannot run code or exhaust the machine: YAML alias bombs, model YAMLs that ask for too much,
pickled payloads, checkpoints that are malformed, tampered or from another program, given to train.py, test.py,
detect.py or --resume. Each is refused in one line (exit 2 through run_cli) before anything is built or run."""
from __future__ import annotations

import os
import subprocess
import sys
import test as test_cli
from pathlib import Path

import cv2
import numpy as np
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


# ----------------------------------------------------------------------------------------- YAML alias bombs

def _alias_bomb(key: str, levels: int = 12, fan: int = 9, merge: bool = False) -> str:
    """Nine-way aliases twelve levels deep: a few hundred bytes that stand for 9**12 values."""
    lines = ["b0: &b0 [x]" if not merge else "b0: &b0 {k: 1}"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*b{i - 1}"] * fan)
        lines.append(f"b{i}: &b{i} " + ("{<<: [" + refs + "]}" if merge else f"[{refs}]"))
    return "\n".join(lines) + f"\n{key}: *b{levels}\n"


@pytest.mark.parametrize("where", ["names", "train", "merge"])
def test_alias_bomb_in_a_data_yaml_is_refused_in_one_line_at_once(where, tiny_data, tmp_path, capsys, monkeypatch):
    import time

    base = tiny_data.read_text()
    text = (base.replace("names:", "old_names:") + _alias_bomb("names")) if where == "names" else \
        (base.replace("train:", "old_train:") + _alias_bomb("train")) if where == "train" else \
        (base + _alias_bomb("extra", merge=True))
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(text)
    t0 = time.time()
    code, lines = cli_in_process(train.main, ["--data", str(bomb), "--project", str(tmp_path / "runs")], capsys, monkeypatch)
    one_error((code, lines), str(bomb), "expands to more than")
    assert time.time() - t0 < 10


def test_alias_bomb_in_hyp_and_model_yaml_and_a_recursive_alias(tiny_data, tmp_path, capsys, monkeypatch):
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text((REPO / "data" / "hyps" / "hyp.scratch.yaml").read_text() + _alias_bomb("extra"))
    cfg = tmp_path / "model.yaml"
    cfg.write_text((REPO / "models" / "yolov5n.yaml").read_text() + _alias_bomb("extra"))
    loop = tmp_path / "loop.yaml"
    loop.write_text((REPO / "data" / "hyps" / "hyp.scratch.yaml").read_text() + "x: &a [1, *a]\n")
    common = ["--data", str(tiny_data), "--project", str(tmp_path / "runs")]
    for flag, path, words in (("--hyp", hyp, "expands to more than"), ("--cfg", cfg, "expands to more than"),
                              ("--hyp", loop, "contains itself")):
        code, lines = cli_in_process(train.main, [*common, flag, str(path)], capsys, monkeypatch)
        one_error((code, lines), str(path), words)


def test_plain_aliases_and_merge_keys_still_load(tmp_path):
    from utils.files import load_yaml

    f = tmp_path / "ok.yaml"
    f.write_text("base: &b {lr0: 0.01, lrf: 0.1}\nrun: {<<: *b, lrf: 0.2}\nlist: &l [1, 2]\nagain: *l\n")
    assert load_yaml(f) == {"base": {"lr0": 0.01, "lrf": 0.1}, "run": {"lr0": 0.01, "lrf": 0.2},
                            "list": [1, 2], "again": [1, 2]}


# ----------------------------------------------------------------------------------------- model size limits

def _nano_dict() -> dict:
    import yaml

    return yaml.safe_load((REPO / "models" / "yolov5n.yaml").read_text())


def _edit_row(d: dict, i: int, row: list) -> dict:
    d["backbone"][i] = row
    return d


OVERSIZED = {
    "depth": (lambda d: {**d, "depth_multiple": 1e7}, "depth_multiple must be a number above 0 and at most 10"),
    "depth_inf": (lambda d: {**d, "depth_multiple": float("inf")}, "depth_multiple"),
    "width": (lambda d: {**d, "width_multiple": 1e4}, "width_multiple"),
    "width_nan": (lambda d: {**d, "width_multiple": float("nan")}, "width_multiple"),
    "nc": (lambda d: {**d, "nc": 10**9}, "nc must be a whole number from 1 to"),
    "ch": (lambda d: {**d, "ch": 10**6}, r"ch \(input channels\)"),
    "channels": (lambda d: _edit_row(d, 1, [-1, 1, "Conv", [10**7, 3, 2]]), "output channels x width_multiple"),
    "repeats": (lambda d: _edit_row(d, 2, [-1, 10**6, "C3", [128]]), "repeats"),
    "layers": (lambda d: {**d, "backbone": d["backbone"] + [[-1, 1, "Conv", [64, 1, 1]]] * 5000}, "layers; at most"),
    "blocks": (lambda d: {**d, "backbone": d["backbone"][:8] + [[-1, 90, "Bottleneck", [16]]] * 100 + d["backbone"][8:]},
               "blocks in all"),
    "upsample": (lambda d: _edit_row(d, 1, [-1, 1, "nn.Upsample", ["None", 10000, "nearest"]]), "grow too large"),
    "padding": (lambda d: _edit_row(d, 1, [-1, 1, "Conv", [32, 3, 2, 100000]]), "grow too large"),
    "kernel": (lambda d: _edit_row(d, 1, [-1, 1, "Conv", [4096, 1023, 2]]), "parameters; at most"),  # maps as with k=3
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(OVERSIZED))
def test_oversized_model_yaml_is_refused_before_anything_is_built(case, tmp_path, monkeypatch):
    import time

    import yaml

    from models.yolo import Model

    edit, words = OVERSIZED[case]
    cfg = tmp_path / "big.yaml"
    cfg.write_text(yaml.safe_dump(edit(_nano_dict())))
    built = []
    monkeypatch.setattr(torch.nn.Conv2d, "reset_parameters", lambda self: built.append(self))  # real init = built
    t0 = time.time()
    with pytest.raises(UserError, match=words) as e:
        Model(cfg)
    assert "\n" not in str(e.value) and time.time() - t0 < 60  # no hang; "nothing built" is the check below
    assert not [c for c in built if c.weight.device.type != "meta"]  # no real layer was made


def test_oversized_model_inside_a_checkpoint_is_one_line(tmp_path, capsys, monkeypatch):
    import detect
    from models.yolo import Model

    model = Model("yolov5n.yaml", nc=2)
    ckpt = ck.make_checkpoint(model, {**model.yaml, "depth_multiple": 1e7}, ["a", "b"], 0)
    path = tmp_path / "big.pt"
    ck.atomic_save(ckpt, path)
    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    code, lines = cli_in_process(detect.main, ["--weights", str(path), "--source", str(image)], capsys, monkeypatch)
    one_error((code, lines), "depth_multiple")


# ----------------------------------------------------------------------------------------- malformed checkpoints

@pytest.fixture(scope="module")
def training_last(tiny_data, tmp_path_factory) -> dict:
    """A last.pt as a run leaves it mid-training (with its 'train' part): one epoch, finish() skipped."""
    project = tmp_path_factory.mktemp("runs")
    real = train.finish
    train.finish = lambda t: None
    try:
        out = train.run(data=str(tiny_data), project=str(project), **TINY_RUN)
    finally:
        train.finish = real
    return torch.load(out.save_dir / "weights" / "last.pt", map_location="cpu", weights_only=True)


def _write_last(ckpt: dict, folder: Path) -> Path:
    path = folder / "run" / "weights" / "last.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, path)
    return path


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


MALFORMED = {
    "nc missing": (lambda c: _without(c, "nc"), "'nc' must be"),
    "model as a list": (lambda c: {**c, "model": list(c["model"].values())}, "'model' must be a non-empty dict"),
    "train as a string": (lambda c: {**c, "train": "resume me"}, "'train' must be a mapping"),
    "names too short": (lambda c: {**c, "names": c["names"][:1]}, "'names' has 1 entries"),
    "names of numbers": (lambda c: {**c, "names": list(range(c["nc"]))}, "'names' must be"),
    "metrics of text": (lambda c: {**c, "metrics": {"mAP": "high"}}, "'metrics' must be"),
    "newer version": (lambda c: {**c, "version": 99}, "newer than this code"),
    "ema of another model": (lambda c: {**c, "train": {**c["train"], "ema": {**c["train"]["ema"], "ema": {
        k: torch.zeros(1) for k in c["model"]}}}}, "'train.ema.ema' does not hold the same tensors"),
    "optimizer as a list": (lambda c: {**c, "train": {**c["train"], "optimizer": []}}, "'train.optimizer' must be"),
    "rng cut": (lambda c: {**c, "train": {**c["train"], "rng": {**c["train"]["rng"], "python": [1, 2]}}}, "'train.rng'"),
    "train.opt as text": (lambda c: {**c, "train": {**c["train"], "opt": "fast"}}, "'train.opt' must be a mapping"),
    "epoch as text": (lambda c: {**c, "train": {**c["train"], "completed_epoch": "3"}}, "'train.completed_epoch'"),
    "shared-list bomb": (lambda c: {**c, "metrics": {}, "yaml": {**c["yaml"], "x": _shared_bomb()}}, "expands to more than"),
}


def _shared_bomb() -> list:
    x: list = ["x"]
    for _ in range(20):
        x = [x, x, x]  # pickle's memo keeps these shared: 3**20 values once expanded
    return x


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_checkpoint_with_the_marker_is_one_line(case, training_last, tmp_path, capsys, monkeypatch):
    import detect

    edit, words = MALFORMED[case]
    path = _write_last(edit(training_last), tmp_path)
    with pytest.raises(UserError, match=words) as e:
        ck.load_checkpoint(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    for main, argv in ((train.main, ["--resume", str(path)]), (detect.main, ["--weights", str(path), "--source", str(image)])):
        one_error(cli_in_process(main, argv, capsys, monkeypatch), words.strip("'").split("'")[0])


@pytest.mark.slow
@pytest.mark.parametrize("opt, words", [({}, "lack data"),
                                        ({"epochs": "ten"}, "epochs='ten'"), ({"amp": "fp64"}, "amp='fp64'"),
                                        ({"freeze": "all"}, "freeze='all'")])
def test_resume_refuses_saved_options_it_cannot_use(opt, words, training_last, tmp_path, capsys, monkeypatch):
    saved = training_last["train"]["opt"]
    opt = {**saved, **opt} if opt else opt
    path = _write_last({**training_last, "train": {**training_last["train"], "opt": opt}}, tmp_path)
    ck.load_checkpoint(path)  # the schema allows any mapping; the resume rules are train.py's
    one_error(cli_in_process(train.main, ["--resume", str(path)], capsys, monkeypatch), "--resume", words)


@pytest.mark.slow
def test_resume_writes_into_the_folder_holding_last_pt_not_a_saved_save_dir(training_last, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    opt = {**training_last["train"]["opt"], "save_dir": str(elsewhere), "project": str(elsewhere), "name": "x"}
    path = _write_last({**training_last, "train": {**training_last["train"], "opt": opt}}, tmp_path)
    out = train.run(resume=str(path), workers=0)  # its one epoch is done: the resume only finishes the run
    assert out.save_dir == path.parent.parent and not elsewhere.exists()
    assert (path.parent.parent / "opt.yaml").is_file() and "train" not in ck.load_checkpoint(path)


@pytest.mark.slow
def test_resume_of_a_last_pt_outside_a_weights_folder_is_one_line(training_last, tmp_path, capsys, monkeypatch):
    path = tmp_path / "last.pt"
    torch.save(training_last, path)
    one_error(cli_in_process(train.main, ["--resume", str(path)], capsys, monkeypatch), "<run folder>/weights/")


# ----------------------------------------------------------------------------------------- untrusted files on every command line
# (one CPU thread from here on; module-scoped, so every test below does too; bad_files: tests/conftest.py)


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


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_train_refuses_untrusted_files(case, bad_files, tiny_data, tmp_path, capsys, monkeypatch):
    flag, name = case.split()
    argv = ["--data", str(tiny_data), "--epochs", "1", "--project", str(tmp_path), flag, str(bad_files[name]),
            *to_argv(ARGS)]
    one_error(cli_in_process(train.main, argv, capsys, monkeypatch), *TRAIN_CASES[case])
    assert not (bad_files[name].parent / "PWNED").exists()


@pytest.mark.usefixtures("one_thread")
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


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
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


# ----------------------------------------------------------------------------------------- a pickled payload


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.usefixtures("one_thread")
def test_a_payload_in_this_projects_format_is_called_a_tampered_checkpoint(tmp_path):
    path, marker = tmp_path / "last.pt", tmp_path / "PWNED"
    torch.save({"format": "ampyolo", "version": 1, "model": _Payload(marker), "yaml": {}}, path)
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(path)
    assert str(e.value).startswith(f"refused to load {path}: it is marked as a checkpoint of this project")
    assert "YOLOv5" not in str(e.value) and "system" in str(e.value) and not marker.exists()
