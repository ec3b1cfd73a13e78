"""Tests for models/: exact YOLOv5 sizes and key names, output contract, fuse, FLOPs, YAML errors (maps that cannot
be joined, an Upsample that could not run), AMP."""
from __future__ import annotations

import copy
import logging
import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from models.common import Conv
from models.yolo import MODELS_DIR, Detect, Model
from utils.errors import UserError

REPO = Path(__file__).resolve().parents[1]

# Parameter counts of the YOLOv5 v6 models with nc=80 (published model table).
PARAMS = {"n": 1_872_157, "s": 7_235_389, "m": 21_190_557, "l": 46_563_709, "x": 86_749_405}
YAML_ANCHORS = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]

_cache: dict[tuple[str, int], Model] = {}


def built(size: str = "n", nc: int = 80) -> Model:
    """One shared model per (size, nc); tests that change a model take a deepcopy."""
    key = (size, nc)
    if key not in _cache:
        torch.manual_seed(0)
        _cache[key] = Model(f"yolov5{size}.yaml", nc=nc)
    return _cache[key]


def randomize_bn(model: nn.Module) -> None:
    """Non-trivial BN statistics, so fusing is really tested (fresh BN is the identity)."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)


def write_cfg(tmp_path: Path, edit) -> Path:
    """A copy of yolov5n.yaml with `edit(dict)` applied, written to tmp_path."""
    d = yaml.safe_load((MODELS_DIR / "yolov5n.yaml").read_text())
    edit(d)
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("size", list(PARAMS))
def test_parameter_counts_match_yolov5(size):
    model = built(size)
    assert sum(p.numel() for p in model.parameters()) == PARAMS[size]


def test_state_dict_key_names_follow_yolov5():
    keys = set(built("s").state_dict())
    for k in ("model.0.conv.weight", "model.0.bn.running_mean", "model.0.bn.num_batches_tracked",
              "model.2.cv1.conv.weight", "model.2.cv3.bn.bias", "model.2.m.0.cv1.conv.weight",
              "model.9.cv2.conv.weight", "model.24.m.0.weight", "model.24.m.2.bias", "model.24.anchors"):
        assert k in keys, k
    assert "model.24.stride" not in keys  # YOLOv5 state dicts have no stride entry
    assert len([k for k in keys if k.startswith("model.24.")]) == 7


def test_stride_anchors_and_blocks():
    model = built("n")
    det = model.model[-1]
    assert isinstance(det, Detect) and (det.nl, det.na, det.no) == (3, 3, 85)
    assert model.stride.tolist() == [8.0, 16.0, 32.0]
    # anchors are stored in grid units
    pixels = torch.tensor(YAML_ANCHORS, dtype=torch.float).view(3, 3, 2)
    assert torch.allclose(det.anchors * det.stride.view(-1, 1, 1), pixels)
    stem = model.model[0]
    assert stem.conv.kernel_size == (6, 6) and stem.conv.stride == (2, 2) and stem.conv.padding == (2, 2)
    assert stem.bn.eps == 1e-3 and stem.bn.momentum == 0.03 and stem.act.inplace
    # the stride probe ran in eval mode: BN statistics untouched, model left in train mode
    assert model.training and torch.all(stem.bn.running_mean == 0)
    assert model.model[9].m.kernel_size == 5 and [m.i for m in model.model] == list(range(25))
    assert model.save == [4, 6, 10, 14, 17, 20, 23]


def test_anchor_order_is_fixed(tmp_path):
    model = Model(write_cfg(tmp_path, lambda d: d.update(anchors=d["anchors"][::-1])))
    assert torch.allclose(model.model[-1].anchors, built("n").model[-1].anchors)


@pytest.mark.slow
@pytest.mark.parametrize("nc", [80, 3])
@pytest.mark.parametrize("hw", [(64, 64), (96, 96), (64, 96), (96, 64)])
def test_train_and_eval_output_shapes(nc, hw):
    model = copy.deepcopy(built("n", nc))
    h, w = hw
    x = torch.rand(2, 3, h, w)
    raw = model.train()(x)
    assert isinstance(raw, list) and [r.shape for r in raw] == [(2, 3, h // s, w // s, nc + 5) for s in (8, 16, 32)]
    with torch.no_grad():
        pred, raw = model.eval()(x)
    n = sum(3 * (h // s) * (w // s) for s in (8, 16, 32))
    assert pred.shape == (2, n, nc + 5) and pred.dtype == torch.float32
    assert [r.shape for r in raw] == [(2, 3, h // s, w // s, nc + 5) for s in (8, 16, 32)]
    assert pred[..., 4:].min() >= 0 and pred[..., 4:].max() <= 1


def test_eval_decode_matches_contract_across_sizes():
    model = copy.deepcopy(built("n")).eval()
    det = model.model[-1]
    for h, w in ((64, 96), (96, 64), (64, 96)):  # size changes must refresh the cached grids
        with torch.no_grad():
            pred, raw = model(torch.rand(1, 3, h, w))
        i, s = 1, 16.0
        r = raw[i].sigmoid()
        ny, nx = h // 16, w // 16
        yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
        xy = (2 * r[..., :2] - 0.5 + torch.stack((xv, yv), -1)) * s
        wh = (2 * r[..., 2:4]) ** 2 * (det.anchors[i] * s).view(1, 3, 1, 1, 2)
        start = 3 * (h // 8) * (w // 8)
        got = pred[:, start:start + 3 * ny * nx].view(1, 3, ny, nx, 85)
        assert torch.allclose(got[..., :2], xy, atol=1e-4) and torch.allclose(got[..., 2:4], wh, atol=1e-4)
        assert torch.allclose(got[..., 4:], r[..., 4:])


def test_fuse_keeps_outputs():
    model = copy.deepcopy(built("n"))
    randomize_bn(model)
    model.eval()
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        before, _ = model(x)
        assert model.fuse() is model
        after, _ = model(x)
    assert all(m.bn is None for m in model.modules() if isinstance(m, Conv))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert (before - after).abs().max() < 1e-4


def test_info_reports_gflops():
    line = built("s").info(640)
    assert "\n" not in line and "7,235,389 parameters" in line and "GFLOPs" in line
    gflops = float(re.search(r"([\d.]+) GFLOPs", line).group(1))
    assert 16.0 <= gflops <= 17.0


def test_nc_override_changes_head(caplog):
    with caplog.at_level(logging.INFO, logger="models.yolo"):
        model = Model("yolov5n", nc=3)
    assert "nc=3" in caplog.text
    det = model.model[-1]
    assert model.nc == det.nc == 3 and model.yaml["nc"] == 3 and det.no == 8
    assert all(m.out_channels == 3 * 8 for m in det.m)


def test_dict_cfg_is_not_mutated():
    d = yaml.safe_load((MODELS_DIR / "yolov5n.yaml").read_text())
    original = copy.deepcopy(d)
    Model(d, nc=5)
    assert d == original


def test_bias_priors():
    det = built("n").model[-1]
    for conv, s in zip(det.m, (8, 16, 32)):
        b = conv.bias.detach().view(3, 85)
        assert torch.allclose(b[:, 4], torch.full((3,), math.log(8 / (640 / s) ** 2)))
        assert torch.allclose(b[:, 5:], torch.full((3, 80), math.log(0.6 / (80 - 0.99))))


def test_unknown_module_names_the_file(tmp_path):
    path = write_cfg(tmp_path, lambda d: d["backbone"][1].__setitem__(2, "__import__('os').system"))
    with pytest.raises(UserError, match="custom.yaml") as e:
        Model(path)
    assert "unknown module" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("edit", [
    lambda d: d["head"][1][3].__setitem__(2, "os.system"),  # unknown argument name
    lambda d: d["head"].__setitem__(2, [-1, 1, "Concat"]),  # short row
    lambda d: d["head"].__setitem__(2, [[-1, 99], 1, "Concat", [1]]),  # from a later layer
    lambda d: d.pop("head"),
    lambda d: d.update(nc="eighty"),
    lambda d: d["backbone"][0].__setitem__(3, ["wide", 6]),  # bad channel arg
])
def test_malformed_yaml_raises_user_error(tmp_path, edit):
    with pytest.raises(UserError, match="custom.yaml"):
        Model(write_cfg(tmp_path, edit))


def test_invalid_yaml_syntax(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("nc: [80\nbackbone: {")
    with pytest.raises(UserError, match="broken.yaml"):
        Model(path)


def test_cfg_resolution_and_missing_file(tmp_path):
    assert Model("yolov5n").yaml == Model("yolov5n.yaml").yaml
    with pytest.raises(UserError, match="not found"):
        Model("yolov5q.yaml")
    with pytest.raises(UserError, match="not found"):
        Model(tmp_path / "nope.yaml")


@pytest.mark.slow
@pytest.mark.parametrize("train", [True, False])
def test_bf16_autocast_forward(train):
    model = copy.deepcopy(built("n", 3)).train(train)
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    raw = out if train else out[1]
    assert [r.shape for r in raw] == [(2, 3, 64 // s, 96 // s, 8) for s in (8, 16, 32)]
    assert all(torch.isfinite(r.float()).all() for r in raw)
    if not train:
        pred = out[0]
        assert pred.shape == (2, 378, 8) and pred.dtype == torch.bfloat16 and torch.isfinite(pred.float()).all()


def test_tta_output():
    model = copy.deepcopy(built("n")).eval()
    x = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        pred, extra = model(x, augment=True)
        plain, _ = model(x)
    # scale 1 (64x96), 0.83 (53x79 padded to 64x96), 0.67 (42x64 padded to 64x64)
    n = 3 * (8 * 12 + 4 * 6 + 2 * 3)
    assert extra is None and pred.shape == (1, n + n + 3 * (8 * 8 + 4 * 4 + 2 * 2), 85)
    assert torch.equal(pred[:, :n], plain)
    assert pred[..., 0].max() < 96 * 1.5 and torch.isfinite(pred).all()
    with pytest.raises(ValueError):
        model.train()(x, augment=True)


def test_tta_unflips_boxes(monkeypatch):
    """A flipped pass at scale 1 must equal the plain prediction on the mirrored image, mirrored back."""
    import models.yolo
    monkeypatch.setattr(models.yolo, "TTA_PASSES", ((1.0, True), (0.5, False)))
    model = copy.deepcopy(built("n")).eval()
    x = torch.rand(1, 3, 128, 192)
    with torch.no_grad():
        tta, _ = model(x, augment=True)
        mirrored, _ = model(x.flip(-1))
        half, _ = model(torch.nn.functional.interpolate(x, size=(64, 96), mode="bilinear", align_corners=False))
    n = mirrored.shape[1]
    assert torch.allclose(tta[:, :n, 0], 192 - mirrored[..., 0], atol=1e-4)
    assert torch.allclose(tta[:, :n, 1:], mirrored[..., 1:])
    assert torch.allclose(tta[:, n:, :4], half[..., :4] * 2, atol=1e-4)  # half scale: boxes doubled


# ----------------------------------------------------------------------------------------- layers that could never run


def _nano_dict() -> dict:
    import yaml

    return yaml.safe_load((REPO / "models" / "yolov5n.yaml").read_text())


def test_a_concat_of_unequal_maps_is_one_line_not_a_traceback(tmp_path):
    import yaml

    from models.yolo import Model

    d = _nano_dict()
    d["head"][2] = [[-1, 0], 1, "Concat", [1]]  # layer 12 joins the upsampled P4 map with the stem's P1 map
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(d))
    with pytest.raises(UserError, match="Concat of maps of different sizes"):
        Model(cfg)


@pytest.mark.parametrize("args, says", [([None, 2, 0], "Upsample mode '0' is not one of"),
                                        ([None, 2, "nearest", True], "align_corners applies to")])
def test_an_upsample_that_could_not_run_is_refused_at_build(tmp_path, args, says):
    """The model-YAML fuzz test (tests/test_fuzz.py) found mode 0 built and failing at the first forward."""
    import yaml

    from models.yolo import Model
    from utils.errors import UserError

    d = yaml.safe_load((REPO / "models" / "yolov5n.yaml").read_text())
    row = next(r for r in d["head"] if "Upsample" in str(r[2]))
    row[3] = args
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(UserError, match=says):
        Model(tmp_path / "m.yaml")
