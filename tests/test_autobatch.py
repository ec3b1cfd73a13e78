"""AutoBatch: the fit on fake memory readings, the fallbacks, -1 on CPU (and through a run), the choice a resume
trains with, and what it is told of the augmentation."""
from __future__ import annotations

import logging
import math

import pytest
import torch
import yaml
from helpers import batch_recorder as _batch_recorder, cli_in_process

import train

from utils.engine import run_setup
from utils.engine.autobatch import DEFAULT_BATCH, GIB, fit_batch_size, resolve_batch_size
from utils.errors import UserError

MIB = 2**20
TINY = dict(imgsz=64, batch_size=8, workers=0, amp="bf16", seed=3)


def line(b, slope=200 * MIB, intercept=1 * GIB):
    return slope * b + intercept


def test_fit_exact_line():
    bs = [1, 2, 4, 8, 16]
    free, total = 40 * GIB, 80 * GIB
    fit = fit_batch_size(bs, [line(b) for b in bs], free, total)
    # 0.6 * 40 GiB = 24 GiB; (24 GiB - 1 GiB) / 200 MiB = 117.76 -> 117
    assert fit.fitted and fit.batch_size == 117
    assert fit.slope == pytest.approx(200 * MIB) and fit.intercept == pytest.approx(GIB)
    assert fit.fraction == pytest.approx((line(117)) / free)
    assert fit.fraction <= 0.6
    assert "batch size 117" in fit.message and "GiB free" in fit.message


def test_fit_fraction_changes_answer():
    bs = [1, 2, 4, 8, 16]
    mem = [line(b) for b in bs]
    small = fit_batch_size(bs, mem, 40 * GIB, 80 * GIB, fraction=0.3).batch_size
    big = fit_batch_size(bs, mem, 40 * GIB, 80 * GIB, fraction=0.9).batch_size
    assert small < 117 < big


def test_fit_noisy_readings():
    bs = [1, 2, 4, 8, 16]
    mem = [line(b) * (1.02 if k % 2 else 0.98) for k, b in enumerate(bs)]
    b = fit_batch_size(bs, mem, 40 * GIB, 80 * GIB).batch_size
    assert 100 <= b <= 135


def test_oom_at_larger_sizes_caps_below_it():
    bs = [1, 2, 4, 8, 16]
    # fit says ~117, but batch 16 ran out of memory (fragmentation, another process...)
    fit = fit_batch_size(bs, [line(1), line(2), line(4), line(8), None], 40 * GIB, 80 * GIB)
    assert fit.batch_size == 8 and "ran out of memory" in fit.message


def test_oom_everywhere_but_one():
    fit = fit_batch_size([1, 2, 4], [line(1), None, None], 40 * GIB, 80 * GIB)
    assert not fit.fitted and fit.batch_size == 1
    assert "fewer than two" in fit.message and "out of memory at batch 2, 4" in fit.message


def test_oom_at_batch_one():
    fit = fit_batch_size([1, 2], [None, None], 4 * GIB, 8 * GIB)
    assert not fit.fitted and fit.batch_size == 1


def test_nan_counts_as_oom():
    fit = fit_batch_size([1, 2, 4], [line(1), line(2), math.nan], 40 * GIB, 80 * GIB)
    assert fit.batch_size == 2


def test_memory_not_increasing_falls_back():
    bs = [1, 2, 4, 8, 16]
    fit = fit_batch_size(bs, [5 * GIB, 4 * GIB, 4 * GIB, 3 * GIB, 3 * GIB], 40 * GIB, 80 * GIB)
    assert not fit.fitted and fit.batch_size == DEFAULT_BATCH and "did not grow" in fit.message
    flat = fit_batch_size(bs, [2 * GIB] * 5, 40 * GIB, 80 * GIB)
    assert not flat.fitted and flat.batch_size == DEFAULT_BATCH


def test_fit_below_one_gives_one():
    bs = [1, 2, 4]
    # 3 GiB + 1 GiB per image, but 60% of 4 GiB free is 2.4 GiB: not even batch 1 fits the target
    fit = fit_batch_size(bs, [line(b, GIB, 3 * GIB) for b in bs], 4 * GIB, 8 * GIB)
    assert fit.batch_size == 1 and "no room" in fit.message


def test_cap_at_max_batch():
    bs = [1, 2, 4]
    fit = fit_batch_size(bs, [line(b, MIB, 0) for b in bs], 100 * GIB, 140 * GIB, max_batch=512)
    assert fit.batch_size == 512 and "capped at 512" in fit.message


def test_bad_arguments():
    with pytest.raises(ValueError):
        fit_batch_size([1, 2], [1.0], GIB, GIB)
    with pytest.raises(ValueError):
        fit_batch_size([1, 2], [1.0, 2.0], GIB, GIB, fraction=1.5)


def test_cpu_minus_one_is_16_with_one_line(caplog):
    with caplog.at_level(logging.INFO):
        assert resolve_batch_size(-1, torch.device("cpu")) == DEFAULT_BATCH
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "needs CUDA" in lines[0] and "16" in lines[0]


def test_cpu_minus_one_under_ddp_is_16_when_the_processes_share_it():
    assert resolve_batch_size(-1, torch.device("cpu"), world_size=2) == DEFAULT_BATCH
    with pytest.raises(UserError, match="3 processes cannot share evenly"):
        resolve_batch_size(-1, torch.device("cpu"), world_size=3)


def test_explicit_batch_passes_through():
    assert resolve_batch_size(8, torch.device("cpu")) == 8


@pytest.mark.parametrize("bad", [0, -2])
def test_invalid_batch_size(bad):
    with pytest.raises(UserError, match="-1 for AutoBatch"):
        resolve_batch_size(bad, torch.device("cpu"))


def test_ddp_refused_on_cuda():
    with pytest.raises(UserError, match="several processes"):
        resolve_batch_size(-1, torch.device("cuda", 0), world_size=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_autobatch_on_cuda():
    from models.yolo import Model
    from utils.engine.autobatch import autobatch

    model = Model("models/yolov5n.yaml", nc=80).cuda()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    b = autobatch(model, 192, torch.device("cuda", 0), autocast=lambda: torch.autocast("cuda", torch.float16))
    assert b >= 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "the caller's model is untouched"


_SEEN: list[int] = []  # batch sizes the profiled copy ran (module level: deepcopy does not copy it)


class _FakeNet(torch.nn.Module):
    """Runs on CPU; 'runs out of memory' from batch 8 on."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        _SEEN.append(x.shape[0])
        if x.shape[0] >= 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")
        return [self.bn(self.conv(x))]


def test_profile_orchestration_with_fake_cuda(monkeypatch, caplog):
    """autobatch() on a faked CUDA memory API: one reading per size, an OOM stops the larger sizes, the fit is
    printed, and the caller's model (weights, BatchNorm statistics, gradients) is untouched."""
    from utils.engine.autobatch import autobatch

    _SEEN.clear()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (40 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 2 * GIB)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 2 * GIB + line(_SEEN[-1]))
    net = _FakeNet()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with caplog.at_level(logging.INFO):
        b = autobatch(net, 32, torch.device("cpu"), batch_sizes=(1, 2, 4, 8, 16))
    assert b == 4, "the line says 117, but batch 8 ran out of memory: the largest size that ran"
    assert _SEEN == [1, 2, 4, 8], "sizes after the first OOM are not tried"
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())
    msgs = [r.getMessage() for r in caplog.records if "AutoBatch" in r.getMessage()]
    assert len(msgs) == 1 and "batch size 4" in msgs[0] and "MiB x batch" in msgs[0]


def test_autobatch_never_takes_more_than_a_quarter_of_the_training_set():
    """A 400-image set on a large GPU: the memory alone would allow a batch of hundreds (one step an epoch); the
    cap keeps 4+ steps an epoch, at a multiple of 8, and says why in its one line."""
    from utils.engine.autobatch import MAX_BATCH, dataset_cap

    assert dataset_cap(400) == (96, ": a quarter of the 400 training images, so an epoch takes 4+ steps")
    assert dataset_cap(128)[0] == 32 and dataset_cap(20)[0] == 5 and dataset_cap(3)[0] == 1
    assert dataset_cap(118_287) == (MAX_BATCH, "") and dataset_cap(None) == (MAX_BATCH, "")
    bs = [1, 2, 4, 8, 16]
    cap, reason = dataset_cap(400)
    fit = fit_batch_size(bs, [line(b, MIB, GIB) for b in bs], 100 * GIB, 140 * GIB, max_batch=cap, cap_reason=reason)
    assert fit.batch_size == 96 and "capped at 96: a quarter of the 400 training images" in fit.message
    assert "aiming at 60% of it" in fit.message


@pytest.mark.parametrize("mixup", [False, True], ids=["one picture", "mixup"])
def test_device_augmentation_memory_is_counted(monkeypatch, caplog, mixup):
    """--augment-on device warps the batch on the GPU before the forward pass (utils/data/device_augment.py):
    AutoBatch adds that memory (device_augment_bytes) to each reading, so it picks a smaller batch and says why."""
    from utils.data.device_augment import device_augment_bytes
    from utils.engine.autobatch import autobatch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            _SEEN.append(x.shape[0])
            return [self.conv(x[:, :, :8, :8])]

    imgsz = 640
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (40 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 0)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: line(_SEEN[-1]))
    monkeypatch.setattr(torch, "rand", lambda b, *shape, **kw: torch.zeros(b, 3, 8, 8))  # the fake needs no pixels
    with caplog.at_level(logging.INFO):
        host = autobatch(Net(), imgsz, torch.device("cpu"), augment_on="host", mixup=mixup)
        device = autobatch(Net(), imgsz, torch.device("cpu"), augment_on="device", mixup=mixup)
    per_image = device_augment_bytes(2, imgsz, imgsz, mixup) - device_augment_bytes(1, imgsz, imgsz, mixup)
    assert host == math.floor((0.6 * 40 * GIB - GIB) / (200 * MIB))
    assert device == math.floor((0.6 * 40 * GIB - GIB - device_augment_bytes(0, imgsz, imgsz, mixup)) /
                                (200 * MIB + per_image)) < host
    msgs = [r.getMessage() for r in caplog.records if "AutoBatch" in r.getMessage()]
    assert "augment" not in msgs[0] and "--augment-on device" in msgs[1], msgs


# ----------------------------------------------------------------------------------------- --batch-size -1 through train.py


@pytest.mark.slow
def test_batch_size_minus_one_on_cpu_trains_16_with_one_line_and_records_16(tiny_data, tmp_path, caplog):
    cb, seen = _batch_recorder()
    with caplog.at_level(logging.INFO):
        out = train.run(data=str(tiny_data), project=str(tmp_path), epochs=1, noplots=True, noval=True, callbacks=cb,
                        **{**TINY, "batch_size": -1})
    lines = [r.getMessage() for r in caplog.records if "AutoBatch" in r.getMessage()]
    assert lines == ["AutoBatch (--batch-size -1) needs CUDA; using batch size 16 on cpu"]
    assert [shape[0] for _, shape in seen] == [16, 8]  # 24 images
    assert yaml.safe_load((out.save_dir / "opt.yaml").read_text())["batch_size"] == 16


@pytest.mark.slow
def test_autobatch_choice_is_what_resume_trains_with_without_profiling_again(micro, tmp_path, monkeypatch):
    """The number AutoBatch picks (on CUDA; faked here) goes into the Setup, opt.yaml and last.pt; --resume reads it."""
    monkeypatch.setattr(run_setup, "resolve_batch_size", lambda requested, *a, **k: 4)
    cb, seen = _batch_recorder()

    def stop(t, epoch, row):
        raise KeyboardInterrupt

    cb.register("on_epoch_end", stop)
    first = train.run(data=str(micro), project=str(tmp_path), epochs=2, noplots=True, callbacks=cb,
                      **{**TINY, "batch_size": -1})
    assert first.interrupted and [shape[0] for _, shape in seen] == [4, 4]  # micro: 8 images
    assert yaml.safe_load((first.save_dir / "opt.yaml").read_text())["batch_size"] == 4
    last = first.save_dir / "weights" / "last.pt"
    assert torch.load(last, weights_only=True)["train"]["opt"]["batch_size"] == 4

    def must_not_profile(*a, **k):
        raise AssertionError("a resume profiled again")

    monkeypatch.setattr(run_setup, "resolve_batch_size", must_not_profile)
    cb2, seen2 = _batch_recorder()
    train.run(resume=str(last), workers=0, callbacks=cb2)
    assert [shape[0] for _, shape in seen2] == [4] * 4 and [ni for ni, _ in seen2] == [0, 1, 2, 3]


@pytest.mark.parametrize("value", ["-2", "0"])
def test_bad_batch_size_is_one_line(value, micro, tmp_path, capsys, monkeypatch):
    code, lines = cli_in_process(train.main, ["--data", str(micro), "--project", str(tmp_path), "--batch-size", value],
                                 capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --batch-size") and "-1" in lines[0], lines


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
