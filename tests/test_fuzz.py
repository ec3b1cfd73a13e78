"""Property-based tests (hypothesis, bounded) of what reads hostile input: the label parser, letterbox and its
inverse, the box conversions, NMS and mosaic never crash and keep their promises; random data, hyperparameter and
model YAMLs and checkpoints with a valid format marker but random contents are accepted (and then usable) or refused
with one UserError line (exit 2 through run_cli), never a traceback, and never slower than FILE_BOUND_S per example
(SIGALRM fails the example instead of hanging)."""
from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, event, given, settings, strategies as st

from utils import errors
from utils.boxes import non_max_suppression, scale_boxes, xywh2xyxy, xywhn2xyxy, xyxy2xywh, xyxy2xywhn
from utils.data.augment import letterbox, mosaic4, random_perspective
from utils.data.labels import parse_label_file
from utils.engine.checkpoint import make_checkpoint
from utils.report.metrics import box_iou

BOUNDED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCRATCH = Path(tempfile.mkdtemp(prefix="hostile_"))  # hypothesis examples cannot use function-scoped tmp_path


pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------------------- label parser

TOKENS = st.sampled_from(["0", "1", "4", "5", "-1", "0.5", "0.25", "1e-9", "1.005", "-0.004", "0.0", "nan", "inf",
                          "-inf", "1e309", "0x10", "abc", "½", "\x00", "0.5.5", "3.0", "2.5", "1_0", "+0.5", "١"])
NUMBER = st.floats(allow_nan=True, allow_infinity=True).map(repr)
LINE = st.lists(st.one_of(TOKENS, NUMBER, st.text(max_size=4)), max_size=7).map(" ".join)
LABEL_FILE = st.one_of(st.lists(LINE, max_size=8).map("\n".join).map(lambda s: s.encode("utf-8", "surrogatepass")),
                       st.binary(max_size=80))


@BOUNDED
@given(content=LABEL_FILE, nc=st.sampled_from([None, 1, 5]))
def test_label_parser_returns_valid_rows_or_one_line_value_error(content, nc):
    path = SCRATCH / "label.txt"
    path.write_bytes(content)
    try:
        rows, dups, _ = parse_label_file(str(path), nc)
    except ValueError as e:
        assert str(e) and "\n" not in str(e) and "line" in str(e)
        return
    assert rows.dtype == np.float32 and rows.ndim == 2 and rows.shape[1] == 5 and dups >= 0
    assert np.isfinite(rows).all()
    cls = rows[:, 0]
    assert (cls >= 0).all() and (cls == np.round(cls)).all() and (nc is None or (cls < nc).all())
    xy1, xy2 = rows[:, 1:3] - rows[:, 3:5] / 2, rows[:, 1:3] + rows[:, 3:5] / 2
    assert (xy1 >= -1e-6).all() and (xy2 <= 1 + 1e-6).all() and (rows[:, 3:5] >= 0).all()


# ----------------------------------------------------------------------------------------- letterbox and back

SIDE = st.integers(1, 700)
NEW_SHAPE = st.one_of(st.integers(32, 320), st.tuples(st.integers(32, 320), st.integers(32, 320)))


def _boxes_in(h: int, w: int, data) -> np.ndarray:
    n = data.draw(st.integers(0, 6))
    xs = np.array(data.draw(st.lists(st.floats(0, w), min_size=2 * n, max_size=2 * n)), dtype=np.float64).reshape(n, 2)
    ys = np.array(data.draw(st.lists(st.floats(0, h), min_size=2 * n, max_size=2 * n)), dtype=np.float64).reshape(n, 2)
    return np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], 1) if n else np.zeros((0, 4))


@BOUNDED
@given(h=SIDE, w=SIDE, new=NEW_SHAPE, auto=st.booleans(), scaleup=st.booleans(), stride=st.sampled_from([32, 64]),
       data=st.data())
def test_letterbox_then_inverse_mapping_round_trips(h, w, new, auto, scaleup, stride, data):
    new_h, new_w = (new, new) if isinstance(new, int) else new
    out, (rx, ry), (left, top) = letterbox(np.zeros((h, w, 3), np.uint8), new, auto=auto, scaleup=scaleup, stride=stride)
    oh, ow = out.shape[:2]
    assert oh <= new_h and ow <= new_w and (auto or (oh, ow) == (new_h, new_w))
    w1, h1 = round(rx * w), round(ry * h)
    assert w1 >= 1 and h1 >= 1 and left + w1 <= ow and top + h1 <= oh  # the picture lies inside the canvas
    boxes = _boxes_in(h, w, data)
    fwd = boxes * [rx, ry, rx, ry] + [left, top, left, top]
    assert (fwd >= -1e-6).all() and (fwd[:, [0, 2]] <= ow + 1e-6).all() and (fwd[:, [1, 3]] <= oh + 1e-6).all()
    back = scale_boxes((oh, ow), fwd, (h, w), ratio_pad=((ry, rx), (left, top)))
    np.testing.assert_allclose(back, boxes, atol=1e-6 * max(h, w, 1))
    if not auto and scaleup:  # test.py's path without recorded geometry reconstructs the letterbox exactly
        np.testing.assert_allclose(scale_boxes((oh, ow), fwd, (h, w)), boxes, atol=1e-6 * max(h, w, 1))


# ----------------------------------------------------------------------------------------- box conversions

COORD = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=64)


@BOUNDED
@given(rows=st.lists(st.tuples(*[COORD] * 6), max_size=12), w=st.floats(1, 5000), h=st.floats(1, 5000),
       as_torch=st.booleans())
def test_box_conversions_round_trip_and_leave_the_input_alone(rows, w, h, as_torch):
    x = np.array(rows, dtype=np.float64).reshape(-1, 6)
    x = torch.from_numpy(x) if as_torch else x
    keep = x.clone() if as_torch else x.copy()
    tol = dict(atol=1e-6 * 1e4, rtol=1e-9)
    for y in (xywh2xyxy(xyxy2xywh(x)), xyxy2xywh(xywh2xyxy(x)), xywhn2xyxy(xyxy2xywhn(x, w, h), w, h)):
        assert type(y) is type(x) and tuple(y.shape) == tuple(x.shape)
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), **tol)
        np.testing.assert_array_equal(np.asarray(y)[:, 4:], np.asarray(x)[:, 4:])  # extra columns pass through
    np.testing.assert_array_equal(np.asarray(x), np.asarray(keep))
    clipped = xyxy2xywhn(x, w, h, clip=True)
    assert (np.asarray(clipped)[:, :2] >= -1e-9).all() and (np.asarray(clipped)[:, :2] <= 1 + 1e-9).all()


@BOUNDED
@given(rows=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)), max_size=12),
       w=st.integers(1, 4000), h=st.integers(1, 4000))
def test_label_box_conversions_of_the_loader_round_trip_inside_the_image(rows, w, h):
    xyxy = np.array([[min(a, c) * w, min(b, d) * h, max(a, c) * w, max(b, d) * h] for a, b, c, d in rows],
                    dtype=np.float32).reshape(-1, 4)
    xywhn = xyxy2xywhn(xyxy, w, h, clip=True)
    assert ((xywhn >= 0) & (xywhn <= 1 + 1e-6)).all()
    np.testing.assert_allclose(xywhn2xyxy(xywhn, w, h), xyxy, atol=1e-3 * max(w, h) / 1000 + 1e-3)


# ----------------------------------------------------------------------------------------- NMS


@st.composite
def predictions(draw):
    bs, n, nc = draw(st.integers(1, 3)), draw(st.integers(0, 150)), draw(st.integers(1, 4))
    h, w = draw(st.integers(32, 160)), draw(st.integers(32, 160))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    cxcy = torch.rand(bs, n, 2, generator=g) * torch.tensor([w + 40.0, h + 40.0]) - 20  # a little outside too
    wh = torch.rand(bs, n, 2, generator=g) * draw(st.sampled_from([4.0, 60.0, 1000.0]))  # decode: wh >= 0
    if draw(st.booleans()):  # duplicated boxes: the worst case for ties
        cxcy[:, n // 2:], wh[:, n // 2:] = cxcy[:, : n - n // 2].clone(), wh[:, : n - n // 2].clone()
    scores = torch.rand(bs, n, 1 + nc, generator=g) ** draw(st.sampled_from([0.3, 1.0, 4.0]))
    pred = torch.cat([cxcy, wh, scores], 2)
    if draw(st.booleans()) and n:  # a diverged model: NaN / inf in some rows
        pred[0, torch.randint(0, n, (max(n // 5, 1),), generator=g), draw(st.integers(0, 4))] = draw(
            st.sampled_from([float("nan"), float("inf"), -float("inf")]))
    return pred.to(draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))), nc, (h, w)


@BOUNDED
@given(p=predictions(), conf=st.floats(0, 1), iou=st.floats(0, 1), agnostic=st.booleans(), multi=st.booleans(),
       max_det=st.integers(1, 50), h0=st.integers(1, 3000), w0=st.integers(1, 3000))
def test_nms_never_crashes_and_keeps_its_promises(p, conf, iou, agnostic, multi, max_det, h0, w0):
    pred, nc, (h, w) = p
    out = non_max_suppression(pred, conf, iou, agnostic=agnostic, multi_label=multi, max_det=max_det, time_limit=60)
    assert len(out) == pred.shape[0]
    for det in out:
        assert det.dtype == torch.float32 and det.shape[1] == 6 and len(det) <= max_det
        assert torch.isfinite(det).all()  # rows with NaN/inf never come out
        c, cls = det[:, 4], det[:, 5]
        assert (c > conf).all() and (c[:-1] >= c[1:]).all()  # above threshold, sorted by confidence
        assert ((cls >= 0) & (cls < nc) & (cls == cls.round())).all()
        for k in ([None] if agnostic else cls.unique().tolist()):
            b = det[:, :4] if k is None else det[cls == k, :4]
            overlap = box_iou(b, b).fill_diagonal_(0)
            assert (overlap <= iou + 1e-4).all()  # kept boxes of one class overlap at most the threshold
        # detect.py's path: back to an original picture through the letterbox geometry; always inside it
        _, (rx, ry), pad = letterbox(np.zeros((h0, w0, 3), np.uint8), (h, w), auto=False)
        mapped = scale_boxes((h, w), det[:, :4], (h0, w0), ratio_pad=((ry, rx), pad))
        assert ((mapped[:, [0, 2]] >= 0) & (mapped[:, [0, 2]] <= w0)).all()
        assert ((mapped[:, [1, 3]] >= 0) & (mapped[:, [1, 3]] <= h0)).all()


# ----------------------------------------------------------------------------------------- mosaic


@BOUNDED
@given(sizes=st.lists(st.tuples(st.integers(1, 90), st.integers(1, 90)), min_size=4, max_size=4),
       labelled=st.lists(st.booleans(), min_size=4, max_size=4), size=st.integers(8, 48).map(lambda k: 2 * k), seed=st.integers(0, 2**32 - 1))
def test_mosaic_with_label_free_images(sizes, labelled, size, seed):
    rng = np.random.default_rng(seed)
    ims = [np.full((h, w, 3), 40 * k, np.uint8) for k, (h, w) in enumerate(sizes)]
    labels = [np.array([[k, 0.5, 0.5, 0.5, 0.5]], np.float32) if lab else np.zeros((0, 5), np.float32)
              for k, lab in enumerate(labelled)]
    canvas, lab = mosaic4(ims, labels, size, rng)
    assert canvas.shape == (2 * size, 2 * size, 3) and lab.shape == (sum(labelled), 5)
    assert ((lab[:, 1:] >= 0) & (lab[:, 1:] <= 2 * size)).all()
    im, lab = random_perspective(canvas, lab, rng, degrees=10, translate=0.1, scale=0.5, shear=2,
                                 border=(-size // 2, -size // 2))
    assert im.shape == (size, size, 3) and lab.shape[1] == 5 and len(lab) <= sum(labelled)
    assert ((lab[:, 1:] >= 0) & (lab[:, 1:] <= size)).all()


# ----------------------------------------------------------------------------------------- YAML and checkpoint files

FILE_BOUND_S = 30  # per example; a loaded two-core machine builds yolov5n in about a second
FILES = settings(max_examples=int(os.environ.get("AMPYOLO_HOSTILE_EXAMPLES", 20)), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])
REPO_DIR = Path(__file__).resolve().parents[1]


class Hang(Exception):
    pass


@contextlib.contextmanager
def bounded(seconds: float = FILE_BOUND_S):
    def alarm(signum, frame):
        raise Hang(f"an example took over {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def one_line_or_success(fn, what: str):
    """fn() through run_cli: (True, result) on success, (False, None) after one 'error:' line and exit 2."""
    out = {}
    try:
        with bounded():
            errors.run_cli(lambda: out.setdefault("value", fn()), restore_signals=True)
    except SystemExit as e:
        assert e.code == 2
        event(f"{what}: refused in one line")
        return False, None
    event(f"{what}: accepted")
    return True, out.get("value")


SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.integers(-2**70, 2**70),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                   st.sampled_from(["images", ".", "a.txt", "nearest", "nc", "anchors", "None", "Conv", "C3",
                                    "\x00", "x" * 300, "/nonexistent/dir", "~", "-1"]))
VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(SCALAR, inner, max_size=3),
                     max_leaves=12)
ALIAS_BOMB = "b0: &b0 [x]\n" + "".join(f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]\n" for i in range(1, 13))


def _yaml_text(obj: dict, data) -> str:
    text = yaml.safe_dump(obj, allow_unicode=True)
    extra = data.draw(st.sampled_from(["", "", "", ALIAS_BOMB + "names: *b12\n", "x: &a [1, *a]\n", "{{{: [",
                                       "!!python/object/apply:os.system ['true']\n"]))
    return text + extra if not extra.startswith("{") else extra


def _mutated(base: dict, keys: list[str], data) -> dict:
    d = dict(base)
    for _ in range(data.draw(st.integers(0, 4))):
        key = data.draw(st.sampled_from(keys) | st.text(max_size=8))
        if data.draw(st.booleans()) and key in d:
            del d[key]
        else:
            d[key] = data.draw(VALUE)
    return d


@FILES
@given(data=st.data())
def test_random_data_yaml_is_accepted_or_one_line(data):
    from utils.data.data_config import load_data_config

    folder = Path(tempfile.mkdtemp(dir=SCRATCH))
    (folder / "images").mkdir()
    base = {"path": ".", "train": "images", "val": "images", "names": ["a", "b"]}
    obj = _mutated(base, ["path", "train", "val", "test", "names", "nc", "defaults", "download_info",
                          "annotations", "coco91"], data)
    f = folder / "data.yaml"
    f.write_text(_yaml_text(obj, data), encoding="utf-8")
    ok, cfg = one_line_or_success(lambda: load_data_config(f), "data YAML")
    if ok:
        assert cfg["nc"] == len(cfg["names"]) >= 1 and all(isinstance(n, str) for n in cfg["names"])
        assert all(isinstance(v, int) and v >= 1 for v in cfg["defaults"].values() if v is not None) or True


@FILES
@given(data=st.data())
def test_random_hyp_yaml_is_accepted_or_one_line_and_then_usable(data):
    from utils.data.augment import augment_hsv, random_flips
    from utils.hyp import HYP_RULES, load_hyp
    from utils.data.datasets import _geometry
    from utils.engine.loss import loss_gains
    from utils.engine.optim import lr_lambda

    base = yaml.safe_load((REPO_DIR / "data" / "hyps" / "hyp.scratch.yaml").read_text())
    hyp = dict(base)
    for key in data.draw(st.lists(st.sampled_from(sorted(HYP_RULES)), max_size=4)):  # in-range and hostile values
        low, high, _ = HYP_RULES[key]
        hyp[key] = data.draw(st.one_of(st.floats(low, high), VALUE))
    f = Path(tempfile.mkdtemp(dir=SCRATCH)) / "hyp.yaml"
    f.write_text(_yaml_text(_mutated(hyp, sorted(HYP_RULES), data) if data.draw(st.booleans()) else hyp, data))
    ok, h = one_line_or_success(lambda: load_hyp(f), "hyp YAML")
    if not ok:
        return
    with bounded():  # what training does with it first: loss gains, the LR schedule, the augmentations
        gains = loss_gains(h, 3, 5, 320, True, 1.0)
        assert all(np.isfinite(getattr(gains, k)) for k in ("box", "cls", "obj"))
        sched = lr_lambda(10, h.lrf, data.draw(st.booleans()))
        assert all(np.isfinite(sched(e)) for e in range(10))
        rng = np.random.default_rng(0)
        im = np.full((64, 80, 3), 100, np.uint8)
        labels = np.array([[0, 10, 10, 40, 40]], np.float32)
        im2, lab = random_perspective(im, labels, rng, **_geometry(h))
        im2 = augment_hsv(im2, rng, h.hsv_h, h.hsv_s, h.hsv_v)
        im2, lab = random_flips(im2, lab, rng, h.flipud, h.fliplr)
        assert im2.shape == im.shape and np.isfinite(lab).all()


def _row_value(data):
    return data.draw(st.one_of(VALUE, st.integers(-3, 3), st.sampled_from([[-1, 6], [-1, 4], "nc", "anchors"])))


@pytest.mark.slow
@FILES
@given(data=st.data())
def test_random_model_yaml_is_built_or_one_line(data):
    from models.yolo import Model

    d = yaml.safe_load((REPO_DIR / "models" / "yolov5n.yaml").read_text())
    d = _mutated(d, ["nc", "depth_multiple", "width_multiple", "anchors", "backbone", "head", "ch"], data)
    for _ in range(data.draw(st.integers(0, 3))):  # edit single fields of single rows
        part = data.draw(st.sampled_from(["backbone", "head"]))
        rows = d.get(part)
        if isinstance(rows, list) and rows:
            i = data.draw(st.integers(0, len(rows) - 1))
            row = list(rows[i]) if isinstance(rows[i], list) else [rows[i]]
            if row:
                j = data.draw(st.integers(0, len(row) - 1))
                if j == 3 and isinstance(row[j], list) and row[j] and data.draw(st.booleans()):
                    row[j] = [*row[j]]
                    row[j][data.draw(st.integers(0, len(row[j]) - 1))] = _row_value(data)
                else:
                    row[j] = _row_value(data)
            rows[i] = row
    f = Path(tempfile.mkdtemp(dir=SCRATCH)) / "model.yaml"
    f.write_text(_yaml_text(d, data))
    ok, model = one_line_or_success(lambda: Model(f), "model YAML")
    if ok:
        with bounded(), torch.no_grad():
            model.eval()
            pred = model(torch.zeros(1, model.yaml["ch"], 64, 64))[0]
            assert pred.shape[-1] == model.nc + 5


@pytest.fixture(scope="module")
def train_checkpoint() -> dict:
    """A last.pt's contents as train.py writes them mid-training, without training (all parts built here)."""
    import train
    from models.yolo import Model
    from utils.engine.amp import Precision
    from utils.engine.train_state import fp32_state_dict
    from utils.engine.ema import ModelEMA
    from utils.engine.optim import build_optimizer, lr_lambda
    from utils.engine.updater import AmpUpdater
    from utils.engine.rng import rng_state
    from utils.options import as_dict

    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=2)
    ema = ModelEMA(model)
    optimizer = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(3, 0.01, False))
    opt = as_dict(train.parse_opt(["--epochs", "3", "--imgsz", "64"]))
    state = {"model": fp32_state_dict(model), "ema": ema.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(),
             "updater": AmpUpdater(model, optimizer, Precision("off", "cpu"), ema).state_dict(),
             "rng": rng_state(), "opt": {**opt, "save_dir": "runs/train/exp"},
             "hyp": yaml.safe_load((REPO_DIR / "data" / "hyps" / "hyp.scratch.yaml").read_text()),
             "best_fitness": 0.1, "best_epoch": 0, "completed_epoch": 0, "elapsed": 1.5}
    return make_checkpoint(model, model.yaml, ["a", "b"], 0, {"mAP_0.5": 0.1}, state)


TENSOR = st.builds(lambda shape, dtype: torch.zeros(shape, dtype=dtype),
                   st.lists(st.integers(0, 3), max_size=3), st.sampled_from([torch.float32, torch.float16, torch.uint8,
                                                                            torch.int64]))
CKPT_VALUE = st.one_of(VALUE, TENSOR, st.lists(TENSOR, max_size=2), st.dictionaries(st.text(max_size=5), TENSOR, max_size=2))


def _edit_at(obj, data, depth: int = 0):
    """A copy of obj with one entry somewhere inside (a dict key, a list item) deleted or replaced."""
    if isinstance(obj, dict) and obj and depth < 4 and data.draw(st.integers(0, 3)) > 0:
        key = data.draw(st.sampled_from(sorted(obj, key=str)))
        out = dict(obj)
        if data.draw(st.integers(0, 3)) > 0:  # mostly deeper: a wrong value inside 'train' or 'yaml'
            out[key] = _edit_at(obj[key], data, depth + 1)
        elif data.draw(st.booleans()):
            del out[key]
        else:
            out[key] = data.draw(CKPT_VALUE)
        return out
    if isinstance(obj, list) and obj and depth < 4 and data.draw(st.booleans()):
        out = list(obj)
        out[data.draw(st.integers(0, len(obj) - 1))] = data.draw(CKPT_VALUE)
        return out
    return data.draw(CKPT_VALUE)


@pytest.mark.slow
@FILES
@given(data=st.data())
def test_checkpoint_with_the_marker_and_random_contents_loads_or_is_one_line(train_checkpoint, data):
    import random as pyrandom

    from models.yolo import build_model
    from utils.engine import checkpoint as ck
    from utils.engine.ema import ModelEMA
    from utils.engine.rng import set_rng_state
    from utils.engine.train_options import saved_options

    ckpt = train_checkpoint
    for _ in range(data.draw(st.integers(0, 2))):
        ckpt = _edit_at(ckpt, data)
    if not isinstance(ckpt, dict):
        ckpt = {"value": ckpt}
    ckpt = {**ckpt, "format": "ampyolo"}  # the marker stays: what follows it is random
    path = Path(tempfile.mkdtemp(dir=SCRATCH)) / "run" / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    torch.save(ckpt, path)
    ok, loaded = one_line_or_success(lambda: ck.load_checkpoint(path), "checkpoint load")
    if not ok:
        return
    ok, model = one_line_or_success(lambda: build_model(loaded, source=path), "model build")
    if not ok or "train" not in loaded:
        return
    t = loaded["train"]
    ok, _ = one_line_or_success(lambda: saved_options(t["opt"], path), "resume options")
    # what the schema promises to a resume: these parts load into the model they belong to
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in t["model"].items()})
    ModelEMA(model).load_state_dict(t["ema"])
    saved = (torch.get_rng_state(), np.random.get_state(), pyrandom.getstate())
    try:
        set_rng_state(t["rng"])
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        pyrandom.setstate(saved[2])
