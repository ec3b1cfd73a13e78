"""test.py: live and standalone evaluation, box mapping back to original pixels, COCO JSON and
pycocotools agreement through the whole pipeline, and the CLI's handling of bad input."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import test as test_cli
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch import nn

import validator as evaluator
from utils.errors import UserError
from helpers import one_error

REPO = Path(__file__).resolve().parents[1]
NAMES = ["a", "b", "c"]


def test_imports_our_test_module():
    assert Path(test_cli.__file__).resolve() == REPO / "test.py"  # not the standard library's `test` package


@pytest.mark.slow
def test_training_does_not_depend_on_the_name_test(tmp_path):
    """With the repository last on sys.path, `import test` finds the standard library's package; train.py
    and the evaluation library must import all the same (they never `import test`)."""
    import subprocess
    import sys

    code = (f"import sys; sys.path.append({str(REPO)!r}); import train, validator; "
            f"print(validator.__file__, 'test' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path, imported_test = out.stdout.split()
    assert Path(path).resolve() == REPO / "validator.py" and imported_test == "False"


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """6 images of mixed sizes and aspect ratios (numeric COCO-like names), 1-3 boxes each, 3 classes."""
    root = tmp_path_factory.mktemp("tiny")
    (root / "images" / "val").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(60, 80), (96, 64), (64, 64), (50, 120), (100, 70), (72, 90)]):
        cv2.imwrite(str(root / "images" / "val" / f"{i + 1:012d}.jpg"), rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        n = 1 + i % 3
        xy = rng.uniform(0.25, 0.75, (n, 2))
        wh = rng.uniform(0.1, 0.4, (n, 2))
        cls = [i % 3] + [k % 3 for k in range(1, n)]
        rows = [f"{c} {x:.6f} {y:.6f} {bw:.6f} {bh:.6f}" for c, (x, y), (bw, bh) in zip(cls, xy, wh)]
        (root / "labels" / "val" / f"{i + 1:012d}.txt").write_text("\n".join(rows) + "\n")
    yaml_file = root / "tiny.yaml"
    yaml_file.write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {NAMES}\n")
    return yaml_file


def _loader(data: dict, imgsz: int = 64, batch_size: int = 4):
    from utils.data.datasets import create_dataloader

    return create_dataloader(data["val"], imgsz, batch_size, 32, rect=True, pad=0.5, workers=0)[0]


class Oracle(nn.Module):
    """Stands in for a detector: for the k-th batch it 'predicts' that batch's labels (in letterboxed
    pixels), optionally jittered, with dropped objects, false alarms and random scores."""

    def __init__(self, batches: list[torch.Tensor], nc: int, jitter: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.nc, self.batches, self.k, self.jitter = nc, batches, 0, jitter
        self.register_buffer("stride", torch.tensor([8.0, 16.0, 32.0]))
        self.rng = np.random.default_rng(seed)
        self.eval()

    def forward(self, x: torch.Tensor, augment: bool = False):
        targets = self.batches[self.k].numpy()
        self.k += 1
        bs, _, h, w = x.shape
        rows = [[] for _ in range(bs)]
        for i, c, cx, cy, bw, bh in targets:
            box = np.array([cx * w, cy * h, bw * w, bh * h])
            if self.jitter:
                if self.rng.random() < 0.15:
                    continue
                box[:2] += self.rng.normal(0, self.jitter, 2) * box[2:]
                box[2:] *= np.exp(self.rng.normal(0, self.jitter, 2))
            rows[int(i)].append((box, int(c), self.rng.uniform(0.3, 1.0) if self.jitter else 0.9))
        for r in rows:
            for _ in range(int(self.rng.integers(0, 4)) if self.jitter else 0):
                box = self.rng.uniform([0, 0, 5, 5], [w, h, w / 3, h / 3])
                r.append((box, int(self.rng.integers(self.nc)), self.rng.uniform(0, 0.6)))
        pred = torch.zeros(bs, max(max(len(r) for r in rows), 1), 5 + self.nc)
        for i, r in enumerate(rows):
            for j, (box, c, s) in enumerate(r):
                pred[i, j, :5] = torch.tensor([*box, 1.0])
                pred[i, j, 5 + c] = s
        return pred, None


def _oracle_for(loader, nc: int, **kw) -> Oracle:
    return Oracle([t.clone() for _, t, _, _ in loader], nc, **kw)


def test_perfect_predictions_give_map_1(tiny_data, tmp_path):
    """Labels go through letterbox, rect batching and back: exact predictions must score 1.0."""
    from utils.data.data_config import load_data_config

    data = load_data_config(tiny_data)
    loader = _loader(data)
    res = evaluator.run(data, model=_oracle_for(loader, 3), dataloader=loader, save_dir=tmp_path, plots=False,
                        save_json=True, save_txt=True, save_conf=True)
    assert res.map50 == pytest.approx(1.0) and res.map == pytest.approx(1.0)
    assert res.mp == pytest.approx(1.0) and res.mr == pytest.approx(1.0)
    assert res.nt.tolist() == [2, 6, 4] and res.maps.shape == (3,) and res.fitness == pytest.approx(1.0)
    assert set(res.speed) == {"pre", "inference", "nms"}
    preds = json.loads((tmp_path / "model_predictions.json").read_text())
    assert len(preds) == 12 and {p["image_id"] for p in preds} == set(range(1, 7))
    assert {p["category_id"] for p in preds} == {0, 1, 2}  # not a COCO dataset: class indices
    # saved labels are the input labels again (normalised to the original image)
    for f in (tiny_data.parent / "labels" / "val").glob("*.txt"):
        ours = np.loadtxt(tmp_path / "labels" / f.name, ndmin=2)
        theirs = np.loadtxt(f, ndmin=2)
        assert ours.shape[1] == 6 and np.allclose(ours[:, 5], 0.9)
        key = lambda a: a[np.lexsort(a[:, :5].T[::-1])][:, :5]  # noqa: E731
        np.testing.assert_allclose(key(ours), key(theirs), atol=2e-3)


def test_pictures_that_give_one_image_id_keep_their_predictions_apart(tiny_data, tmp_path, caplog):
    """Before: 000000000001.jpg and 1.jpg both became image_id 1 in --save-json, their predictions merged, no word.
    The second keeps its own predictions under its path, with one warning naming both."""
    import shutil

    from utils.data.data_config import load_data_config

    root = tmp_path / "set"
    shutil.copytree(tiny_data.parent / "images", root / "images")
    shutil.copytree(tiny_data.parent / "labels", root / "labels")
    for kind, ext in (("images", ".jpg"), ("labels", ".txt")):
        shutil.copy(root / kind / "val" / f"{1:012d}{ext}", root / kind / "val" / f"1{ext}")
    (root / "d.yaml").write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {NAMES}\n")
    data = load_data_config(root / "d.yaml")
    loader = _loader(data)
    with caplog.at_level(logging.WARNING):
        evaluator.run(data, model=_oracle_for(loader, 3), dataloader=loader, save_dir=tmp_path / "out", plots=False,
                      save_json=True)
    preds = json.loads((tmp_path / "out" / "model_predictions.json").read_text())
    by_id = {}
    for p in preds:
        by_id.setdefault(p["image_id"], []).append(p)
    assert len(preds) == 13 and len(by_id) == 7  # 7 pictures, each its own id
    second = [k for k in by_id if isinstance(k, str)]
    assert len(second) == 1 and second[0].endswith(".jpg") and len(by_id[second[0]]) == len(by_id[1]) == 1
    warnings = [r.getMessage() for r in caplog.records if "image_id" in r.getMessage()]
    assert len(warnings) == 1 and f"{1:012d}.jpg" in warnings[0] and "1.jpg" in warnings[0]


@pytest.mark.slow
def test_live_model_is_bit_identical_and_loss_gets_fp32(tiny_data):
    from models.yolo import Model
    from utils.data.data_config import load_data_config

    data = load_data_config(tiny_data)
    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=3)  # left in training mode, as train.py holds it
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seen = []

    def compute_loss(raw, targets):
        seen.append({x.dtype for x in raw})
        return torch.zeros(1), torch.tensor([1.0, 2.0, 3.0])

    # one batch of 6: one input shape, so the untrained model's first-call set-up is paid once
    res = evaluator.run(data, model=model, dataloader=_loader(data, batch_size=6), compute_loss=compute_loss, plots=False)
    assert model.training
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) and before[k].dtype == after[k].dtype for k in before)
    assert seen and all(s == {torch.float32} for s in seen)
    assert res.loss.tolist() == [1.0, 2.0, 3.0]

    model.eval()  # already in inference form: used as is, still untouched
    evaluator.run(data, model=model, dataloader=_loader(data, batch_size=6), plots=False)
    assert not model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from models.yolo import Model
    from utils.engine.checkpoint import atomic_save, make_checkpoint

    torch.manual_seed(0)
    m = Model("yolov5n.yaml", nc=3)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.pt"
    atomic_save(make_checkpoint(m, m.yaml, NAMES, epoch=0), path)
    return path


@pytest.mark.slow
def test_standalone_checkpoint_and_speed_task(tiny_data, checkpoint, tmp_path):
    res = evaluator.run(tiny_data, weights=checkpoint, imgsz=64, batch_size=4, workers=0, project=tmp_path, verbose=True,
                        save_json=True)
    assert 0.0 <= res.map <= res.map50 <= 1.0 and res.nt.sum() == 12
    assert (res.save_dir / "tiny_predictions.json").is_file() and (res.save_dir / "PR_curve.png").is_file()
    speed = evaluator.run(tiny_data, weights=checkpoint, imgsz=64, task="speed", workers=0, project=tmp_path)
    assert speed.map == 0.0 and speed.speed["inference"] > 0


@pytest.mark.slow
def test_class_count_mismatch_is_one_user_error(tiny_data, checkpoint, tmp_path):
    from utils.data.data_config import load_data_config

    data = dict(load_data_config(tiny_data), nc=4, names=NAMES + ["d"])
    with pytest.raises(UserError, match="predicts 3 classes but .* has 4"):
        evaluator.run(data, weights=checkpoint, imgsz=64, workers=0, project=tmp_path)


def test_missing_split_and_bad_task(tiny_data, checkpoint, tmp_path):
    with pytest.raises(UserError, match="no 'test' split"):
        evaluator.run(tiny_data, weights=checkpoint, task="test", imgsz=64, workers=0, project=tmp_path)
    with pytest.raises(UserError, match="--task"):
        evaluator.run(tiny_data, weights=checkpoint, task="train")


@pytest.mark.slow
def test_pipeline_agrees_with_pycocotools_on_coco128(coco128_dir, tmp_path):
    """Jittered labels as predictions through run(): our mAP vs pycocotools on the saved JSON."""
    pytest.importorskip("pycocotools")
    from utils.data.data_config import load_data_config

    data = load_data_config(coco128_dir / "coco128.yaml")
    assert data["coco91"] and data["annotations"]
    loader = _loader(data, imgsz=320, batch_size=16)
    model = _oracle_for(loader, 80, jitter=0.08, seed=1)
    res = evaluator.run(data, model=model, dataloader=loader, save_json=True, plots=False, save_dir=tmp_path)
    assert res.coco is not None and 0.2 < res.coco["map"] < 0.95
    assert abs(res.map - res.coco["map"]) < 0.005, (res.map, res.coco)
    assert abs(res.map50 - res.coco["map50"]) < 0.005, (res.map50, res.coco)
    preds = json.loads((tmp_path / "model_predictions.json").read_text())
    assert {p["category_id"] for p in preds} <= set(range(1, 91)) and 90 in {p["category_id"] for p in preds} | {90}


# ------------------------------------------------------------------------------------------------
# command line


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "test.py"), *args], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.slow
def test_cli_corrupt_weights_exit_2_without_traceback(tiny_data, tmp_path):
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(b"\x80\x02not a checkpoint at all")
    one_error(_cli("--weights", str(bad), "--data", str(tiny_data)), alone=False)


@pytest.mark.parametrize("case", ["missing_weights", "not_ours", "missing_yaml", "empty_split"])
def test_cli_bad_input_raises_user_error(case, tiny_data, checkpoint, tmp_path):
    """main() raises one single-line UserError; run_cli turns that into `error: ...` and exit 2 (above)."""
    weights, data = str(checkpoint), str(tiny_data)
    if case == "missing_weights":
        weights = str(tmp_path / "missing.pt")
    elif case == "not_ours":
        torch.save({"a": torch.zeros(1)}, tmp_path / "other.pt")
        weights = str(tmp_path / "other.pt")
    elif case == "missing_yaml":
        data = str(tmp_path / "nope.yaml")
    else:
        (tmp_path / "images" / "val").mkdir(parents=True)
        (tmp_path / "empty.yaml").write_text(f"path: {tmp_path}\ntrain: images/val\nval: images/val\nnames: {NAMES}\n")
        data = str(tmp_path / "empty.yaml")
    with pytest.raises(UserError) as e:
        test_cli.main(["--weights", weights, "--data", data, "--img", "64", "--workers", "0", "--project", str(tmp_path)])
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_draws_val_batch_pictures_and_no_plots_draws_none(tiny_data, checkpoint, tmp_path):
    argv = ["--weights", str(checkpoint), "--data", str(tiny_data), "--img", "64", "--batch-size", "2", "--workers", "0",
            "--project", str(tmp_path)]
    test_cli.main(argv)
    d = tmp_path / "exp"
    drawn = sorted(p.name for p in d.glob("val_batch*.jpg"))
    assert drawn == [f"val_batch{k}_{kind}.jpg" for k in range(3) for kind in ("labels", "pred")], drawn  # first 3
    labels = cv2.imread(str(d / "val_batch0_labels.jpg"))
    assert labels is not None and labels.shape[1] == 640  # two images side by side, each scaled up to 320 px
    test_cli.main([*argv, "--no-plots", "--save-txt"])  # --save-txt: a folder is still written, without pictures
    assert [p.name for p in (tmp_path / "exp2").glob("*.jpg")] == []
