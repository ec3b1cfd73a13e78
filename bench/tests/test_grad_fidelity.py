"""bench/grad_fidelity.py: the measurement leaves training alone and tells FP32 from bf16."""
from __future__ import annotations

import csv

import pytest

from bench import grad_fidelity


def test_fp32_recomputed_agrees_exactly_and_bf16_does_not(micro, tmp_path):
    out = tmp_path / "g.csv"
    rows = grad_fidelity.main(["--data", str(micro), "--imgsz", "64", "--batch-size", "4", "--epochs", "3",
                               "--steps", "0", "1", "--modes", "off", "bf16", "--workers", "0",
                               "--project", str(tmp_path / "runs"), "--out", str(out)])
    assert [(r["step"], r["mode"]) for r in rows] == [(0, "off"), (0, "bf16"), (1, "off"), (1, "bf16")]
    assert list(csv.DictReader(open(out)))[3]["mode"] == "bf16"
    for r in rows:
        assert r["backbone_grad_norm"] > 0
        if r["mode"] == "off":  # the same weights, batch and BatchNorm state: the same gradient
            assert r["mean_cos"] == pytest.approx(1, abs=1e-6) and r["median_rel_err"] < 1e-5
        else:
            assert -1 <= r["p10_cos"] <= r["mean_cos"] < 1 - 1e-6 and r["median_rel_err"] > 1e-4
