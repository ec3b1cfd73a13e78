"""The precision policy: --amp resolution, the AMP check, the inference dtype rule."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from utils.engine import amp
from utils.engine.amp import Precision, amp_check, inference_dtype, prepare_inference, resolve_precision
from utils.errors import UserError
from utils.hyp import Hyp, load_hyp

CPU, CUDA = torch.device("cpu"), torch.device("cuda:0")


def test_resolve_auto_on_cuda_is_fp16_with_scaler():
    p = resolve_precision("auto", CUDA)
    assert (p.mode, p.dtype, p.use_scaler) == ("fp16", torch.float16, True)


def test_resolve_auto_on_cpu_follows_native_bf16(monkeypatch):
    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", CPU).mode == ("bf16" if amp.CPU_AUTO_BF16 else "off")
    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", CPU).mode == "off"


def test_bf16_runs_without_scaler_and_fp16_on_cpu_has_a_live_scaler_and_a_warning(caplog):
    p = resolve_precision("bf16", CPU)
    assert p.dtype == torch.bfloat16 and not p.use_scaler and not p.grad_scaler().is_enabled()
    assert p.eval_half is None and resolve_precision("fp16", CUDA).eval_half is None
    assert not caplog.records
    p = resolve_precision("fp16", CPU)  # the CUDA path, emulated: for reproducing fp16 numerics without a GPU
    assert (p.mode, p.dtype, p.device_type) == ("fp16", torch.float16, "cpu") and p.grad_scaler().is_enabled()
    assert p.eval_half is True  # validates on a half copy, as on CUDA
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"about {amp.CPU_FP16_TRAIN_SLOWDOWN}x slower than FP32" in warnings[0]
    with p.autocast():
        assert nn.Conv2d(3, 4, 3)(torch.randn(1, 3, 8, 8)).dtype == torch.float16
    with pytest.raises(UserError, match="fp16 needs a CUDA GPU or the CPU"):
        resolve_precision("fp16", torch.device("meta"))
    with pytest.raises(UserError, match="not valid"):
        resolve_precision("fp8", CPU)


def test_off_autocast_is_plain_fp32():
    p = resolve_precision("off", CPU)
    lin = nn.Linear(4, 4)
    with p.autocast():
        assert lin(torch.randn(2, 4)).dtype == torch.float32


def test_bf16_autocast_computes_conv_in_bf16():
    conv = nn.Conv2d(3, 4, 3)
    with Precision("bf16", "cpu").autocast():
        assert conv(torch.randn(1, 3, 8, 8)).dtype == torch.bfloat16


def test_bf16_trains_its_warmup_steps_in_fp32_unless_the_hyp_says_otherwise(caplog):
    conv, x = nn.Conv2d(3, 4, 3), torch.randn(1, 3, 8, 8)
    p = resolve_precision("bf16", CPU)
    assert p.fp32_warmup == Hyp.fp32_warmup is True
    with p.autocast(warmup=True):
        assert conv(x).dtype == torch.float32
    with p.autocast():
        assert conv(x).dtype == torch.bfloat16
    q = resolve_precision("bf16", CPU, load_hyp().updated(fp32_warmup=0))
    with q.autocast(warmup=True):
        assert conv(x).dtype == torch.bfloat16
    assert resolve_precision("bf16", CPU, load_hyp().updated(fp32_warmup=1)).fp32_warmup
    # only bf16 has it: fp16's gradients at the first step agree with FP32's (bench/results/grad_fidelity_*.csv)
    assert not resolve_precision("fp16", CPU).fp32_warmup
    assert not resolve_precision("off", CPU, load_hyp().updated(fp32_warmup=1)).fp32_warmup


class _Broken(nn.Module):
    """Fine in FP32, but overflows whenever autocast lowers the matmul precision."""

    stride = torch.tensor([32.0])

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x.mean((2, 3)))
        if y.dtype != torch.float32:
            y = y * float("inf")
        return y.unsqueeze(1).expand(-1, 4, -1).repeat(1, 1, 3)


@pytest.mark.slow
def test_amp_check_passes_a_real_model_and_fails_a_broken_one():
    from models.yolo import Model

    model = Model("yolov5n.yaml", nc=3)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert amp_check(model, Precision("bf16", "cpu"), imgsz=64)
    assert model.training  # the caller's model is untouched (it ran on a copy)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not amp_check(_Broken(), Precision("bf16", "cpu"), imgsz=32)
    assert amp_check(_Broken(), Precision("off", "cpu"))


def _props(name, major, minor):
    return SimpleNamespace(name=name, major=major, minor=minor)


@pytest.mark.parametrize("props, half, expected", [
    (_props("NVIDIA A100-SXM4-80GB", 8, 0), None, torch.float16),
    (_props("NVIDIA H200", 9, 0), None, torch.float16),
    (_props("Tesla T4", 7, 5), None, torch.float16),
    (_props("Tesla T4", 7, 5), False, torch.float32),
    (_props("Tesla P100-PCIE-16GB", 6, 0), None, torch.float32),
    (_props("NVIDIA GeForce GTX 1080", 6, 1), None, torch.float32),
    (_props("NVIDIA GeForce GTX 1660 SUPER", 7, 5), None, torch.float32),
    (_props("Quadro T1000", 7, 5), None, torch.float32),
])
def test_inference_dtype_on_cuda(props, half, expected):
    assert inference_dtype(CUDA, half, props=props) == expected


def test_inference_dtype_on_cpu(caplog):
    assert inference_dtype(CPU) == torch.float32  # the default stays FP32
    assert inference_dtype(CPU, half=False) == torch.float32
    assert not caplog.records
    amp._warn_once.cache_clear()
    assert inference_dtype(CPU, half=True) == torch.float16  # asked for: a truly FP16 model, with a warning
    assert inference_dtype(CPU, half=True) == torch.float16
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"about {amp.CPU_FP16_INFER_SLOWDOWN}x slower than FP32" in warnings[0]
    with pytest.raises(UserError, match="needs a CUDA GPU or the CPU"):
        inference_dtype(torch.device("meta"), half=True)


def test_prepare_inference_copy_leaves_callers_model_alone():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    out = prepare_inference(model, CPU, torch.bfloat16, copy_model=True)
    assert out is not model and next(out.parameters()).dtype == torch.bfloat16 and not out.training
    assert model.training and all(torch.equal(ref[k], v) for k, v in model.state_dict().items())
    model.eval()
    assert prepare_inference(model, CPU, torch.float32, copy_model=True) is model
