"""bench/seed_fork.py: a fork must train exactly as its base before the fork epoch and on other data after it."""
from __future__ import annotations

import csv

import pytest

from bench import seed_fork
from utils.data.datasets import SeededSampler


def epoch_items(sampler, epoch):
    sampler.set_epoch(epoch)
    return list(sampler)


def test_a_forked_sampler_repeats_the_base_before_the_fork_and_differs_after():
    base, fork = SeededSampler(50, shuffle=True, seed=0), SeededSampler(50, shuffle=True, seed=0)
    seed_fork.fork_sampler(fork, fork_epoch=2, stream=3)
    for e in (0, 1):
        assert epoch_items(fork, e) == epoch_items(base, e)
    after = epoch_items(fork, 2)
    assert {e for _, e in after} == {3002}  # the dataset seeds each sample's augmentation from this tag
    assert [i for i, _ in after] != [i for i, _ in epoch_items(base, 2)]
    assert sorted(i for i, _ in after) == list(range(50))  # still every sample once


def losses(run):
    rows = csv.DictReader(open(run / "results.csv"))
    return [(r["train/box_loss"], r["train/obj_loss"], r["train/cls_loss"]) for r in rows]


def test_a_fork_trains_as_its_base_up_to_the_fork_epoch_then_on_other_data(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setitem(seed_fork.DATASETS, "tiny", (tiny_data, 2, 64))
    base = seed_fork.run_one("tiny", "fp32-lr2", 0, None, 0, tmp_path)
    fork = seed_fork.run_one("tiny", "fp32-lr2", 0, 1, 1, tmp_path)
    a, b = losses(tmp_path / "tiny-fp32-lr2-s0"), losses(tmp_path / "tiny-fp32-lr2-s0-fork1-k1")
    assert a[0] == b[0] and base["epoch0_box_loss"] == fork["epoch0_box_loss"]  # epoch 0: bit-identical
    assert a[1] != b[1]  # epoch 1: other batches
    assert (base["fork_epoch"], fork["fork_epoch"], fork["stream"]) == ("", 1, 1)


def test_each_family_counts_the_base_run_as_stream_zero():
    row = {"dataset": "d", "mode": "m", "seed": "0", "map50": "0"}
    rows = [{**row, "fork_epoch": "", "stream": "0", "map": "0.20"},
            *({**row, "fork_epoch": e, "stream": str(k), "map": m}
              for e, k, m in (("0", 1, "0.10"), ("0", 2, "0.30"), ("12", 1, "0.19"), ("12", 2, "0.21")))]
    fams = seed_fork.families(rows)
    assert fams[("d", "m", 0, 0)] == [(0, 0.20), (1, 0.10), (2, 0.30)]
    assert fams[("d", "m", 0, 12)] == [(0, 0.20), (1, 0.19), (2, 0.21)]
    text = seed_fork.summary(rows)
    assert "| d | m | 0 | 0 | k0 0.200 k1 0.100 k2 0.300 | 0.200 | 0.100 | 0.200 |" in text
    assert "| d | m | 0 | 12 | k0 0.200 k1 0.190 k2 0.210 | 0.200 | 0.010 | 0.020 |" in text


def test_stream_zero_and_forks_outside_the_run_are_refused():
    with pytest.raises(SystemExit, match="stream 0 is the base run"):
        seed_fork.main(["--streams", "0", "1"])
    with pytest.raises(SystemExit, match="epochs of paste8's run are 0..24"):
        seed_fork.main(["--forks", "25"])


def test_a_rerun_trains_only_what_the_csv_lacks_base_first(tmp_path, monkeypatch):
    calls = []

    def fake_run(dataset, mode, seed, fork, stream, runs):
        calls.append((fork, stream))
        return {"dataset": dataset, "mode": mode, "seed": seed, "fork_epoch": "" if fork is None else fork,
                "stream": stream, "map50": 0.5, "map": 0.25, "wall_s": 1.0, "epoch0_box_loss": 0.1}

    monkeypatch.setattr(seed_fork, "run_one", fake_run)
    monkeypatch.setattr(seed_fork, "ensure_dataset", lambda name: None)
    out = tmp_path / "f.csv"
    seed_fork.main(["--forks", "0", "12", "--streams", "1", "--csv", str(out)])
    assert calls == [(None, 0), (0, 1), (12, 1)]
    calls.clear()
    seed_fork.main(["--forks", "0", "12", "--streams", "1", "2", "--csv", str(out)])
    assert calls == [(0, 2), (12, 2)]
