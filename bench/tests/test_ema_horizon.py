"""bench/ema_horizon.py: its averages must be what they claim, and its train.py EMA must be the run's own."""
from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

from bench import ema_horizon
from utils.engine.ema import ModelEMA


def toy():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))


def trajectory(model, steps):
    """Moves every float tensor of `model` (BatchNorm statistics too) at each step; returns each step's state."""
    states = []
    for _ in range(steps):
        with torch.no_grad():
            for v in model.state_dict().values():
                if v.is_floating_point():
                    v.add_(torch.randn_like(v))
                else:
                    v.add_(1)
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return states


def test_ema_quarter_matches_model_ema_and_swa_is_the_plain_mean_of_its_steps():
    model, steps = toy(), 40
    avg = ema_horizon.Averages(model, steps, ema_k=(4, 8), swa_f=(0.25,))
    ref = ModelEMA(model, tau=steps / 4)
    states = trajectory_with(model, steps, avg, ref)
    assert ema_horizon.max_difference(avg.models["ema/4"], ref.ema) < 1e-6
    assert ema_horizon.max_difference(avg.models["ema/8"], ref.ema) > 1e-3  # a longer average is another model
    swa = avg.models["swa/0.25"].state_dict()
    for k, v in swa.items():
        if v.is_floating_point():
            assert torch.allclose(v, torch.stack([s[k] for s in states[30:]]).mean(0), atol=1e-5), k
        else:  # integer buffers (num_batches_tracked) follow the model
            assert torch.equal(v, states[-1][k])


def trajectory_with(model, steps, avg, ref):
    states = []
    for step in range(1, steps + 1):
        states += trajectory(model, 1)
        avg.update(model, step)
        ref.update(model)
    return states


def test_swa_takes_nothing_before_its_start_and_a_longer_ema_takes_less_of_each_step():
    avg = ema_horizon.Averages(toy(), 100, ema_k=(4, 8), swa_f=(0.1,))
    assert avg.swa_start["swa/0.1"] == 91
    assert avg.weight("swa/0.1", 90) == 0.0 and avg.weight("swa/0.1", 91) == 1.0 and avg.weight("swa/0.1", 100) == 0.1
    assert avg.weight("ema/8", 100) < avg.weight("ema/4", 100)


def test_one_run_evaluates_every_average_and_its_train_ema_is_the_runs(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setitem(ema_horizon.DATASETS, "tiny", (tiny_data, 3, 64))
    rows = ema_horizon.run_one("tiny", "fp32-lr2", 0, tmp_path)
    by = {r["variant"]: r for r in rows}
    assert set(by) == {*(f"ema/{k}" for k in ema_horizon.EMA_K), *(f"swa/{f:g}" for f in ema_horizon.SWA_F), "raw"}
    assert float(by["ema/4"]["ema_check"]) == 0.0  # the same updates in the same order as train.py's EMA
    final = list(csv.DictReader(open(tmp_path / "tiny-fp32-lr2-s0" / "results.csv")))[-1]
    assert by["ema/4"]["map"] == pytest.approx(float(final["metrics/mAP_0.5:0.95"]), abs=1e-6)


def test_summary_pairs_each_variant_with_train_py_ema_at_the_same_seed():
    rows = [{"dataset": "d", "mode": "m", "seed": s, "variant": v, "map": m}
            for s, (a, b) in enumerate([(0.20, 0.22), (0.30, 0.29), (0.25, 0.28)])
            for v, m in (("ema/4", a), ("ema/8", b))]
    text = ema_horizon.summary(rows)
    line = next(x for x in text.splitlines() if x.startswith("| ema/8 "))
    assert "+0.0133, 2/3" in line and "| .220 .290 .280 | 0.263 |" in line
    assert "| ema/4 | .200 .300 .250 | 0.250 |" in text and "+0.0000, 0/3" in text


def test_variants_sort_by_their_number_not_their_text():
    names = ["swa/0.5", "ema/10", "raw", "ema/2", "swa/0.1"]
    assert sorted(names, key=ema_horizon.variant_order) == ["ema/2", "ema/10", "raw", "swa/0.1", "swa/0.5"]
