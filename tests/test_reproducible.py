"""A seeded run is a function of its command: the same command gives the same weights and results.csv, bit for
bit, with several CPU threads; --no-deterministic opts out; the settings do not leak into the caller."""
from __future__ import annotations

import os

import pytest
import torch

import train
from utils.engine.callbacks import Callbacks
from utils.engine.rng import CUBLAS_WORKSPACE_CONFIG, reproducible
from utils.errors import UserError
from utils.files import load_yaml
from utils.report.results import read_rows

COCO_RUN = dict(cfg="yolov5n.yaml", imgsz=128, batch_size=16, epochs=2, seed=0, workers=2, noval=True, noplots=True)


def weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.slow
@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_two_seeded_runs_are_bit_identical_with_several_threads(amp, coco_subset, bf16_hyp, several_threads, tmp_path):
    assert several_threads >= 2
    # bf16 from the first step (bf16_hyp), the arithmetic of the default on CPUs with native bf16
    hyp = {"hyp": str(bf16_hyp)} if amp == "bf16" else {}
    runs = [train.run(data=str(coco_subset), amp=amp, project=str(tmp_path / f"run{k}"), **hyp, **COCO_RUN)
            for k in range(2)]
    assert weights_equal(runs[0].ema, runs[1].ema)
    assert read_rows(runs[0].save_dir / "results.csv", clock=False) == \
        read_rows(runs[1].save_dir / "results.csv", clock=False)
    a, b = (torch.load(r.save_dir / "weights" / "last.pt", weights_only=True)["model"] for r in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_reproducible_sets_the_flags_and_restores_the_callers(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("PYTHONHASHSEED", "random")
    before = torch.are_deterministic_algorithms_enabled()
    with reproducible(True, seed=7):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()  # an op without one warns, the run goes on
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE_CONFIG
        assert os.environ["PYTHONHASHSEED"] == "7"
    assert torch.are_deterministic_algorithms_enabled() == before
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ and os.environ["PYTHONHASHSEED"] == "random"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # a user's own (also deterministic) choice stands
    with reproducible(True, seed=7):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


@pytest.mark.slow
@pytest.mark.parametrize("flag", [True, False])
def test_train_runs_deterministic_by_default_and_no_deterministic_opts_out(flag, micro, tmp_path):
    seen = []
    cb = Callbacks()
    cb.register("on_train_start", lambda t: seen.append(torch.are_deterministic_algorithms_enabled()))
    out = train.run(data=str(micro), epochs=1, imgsz=64, batch_size=4, workers=0, noplots=True, amp="off",
                    project=str(tmp_path), deterministic=flag, callbacks=cb)
    assert seen == [flag]
    assert load_yaml(out.save_dir / "opt.yaml")["deterministic"] is flag
    assert not torch.are_deterministic_algorithms_enabled()  # the caller's setting is back


def test_no_deterministic_on_the_command_line():
    assert train.parse_opt([]).deterministic is True
    assert train.parse_opt(["--no-deterministic"]).deterministic is False


@pytest.mark.slow
def test_hyp_yaml_records_what_was_trained_and_repeats_the_run(micro, tmp_path):
    """The default recipe (AdamW, its own lr, warmup and decay) differs from the hyp file's SGD numbers; the run
    folder's hyp.yaml holds what the optimizer used, and --hyp of it gives the same run, bit for bit."""
    used = []
    cb = Callbacks()
    cb.register("on_train_start", lambda t: used.append((type(t.optimizer).__name__, {
        k: v for k, v in t.optimizer.param_groups[0].items() if k != "params"}, t.recipe.warmup_epochs, t.ema.tau)))
    args = dict(data=str(micro), epochs=2, imgsz=64, batch_size=4, workers=0, noplots=True, amp="off", seed=1)
    a = train.run(project=str(tmp_path / "a"), callbacks=cb, **args)
    hyp = load_yaml(a.save_dir / "hyp.yaml")
    name, group, warmup, tau = used[0]
    assert (hyp["optimizer"], hyp["lr0"], hyp["weight_decay"]) == (name, group["initial_lr"], group["weight_decay"])
    assert hyp["momentum"] == group["betas"][0] == 0.9 and hyp["warmup_epochs"] == warmup == 6 and hyp["ema_tau"] == tau
    assert hyp["lr0"] != load_yaml(train.TrainOptions().hyp)["lr0"]  # the recipe's lr, not the file's SGD lr0

    b = train.run(project=str(tmp_path / "b"), hyp=str(a.save_dir / "hyp.yaml"), callbacks=cb, **args)
    assert used[1] == used[0]
    assert weights_equal(a.ema, b.ema)
    assert read_rows(a.save_dir / "results.csv", clock=False) == read_rows(b.save_dir / "results.csv", clock=False)
    assert load_yaml(b.save_dir / "hyp.yaml") == hyp  # a fixed point: resolving a resolved hyp changes nothing


@pytest.mark.slow
def test_a_resolved_hyp_refuses_a_different_optimizer(micro, tmp_path):
    hyp = tmp_path / "hyp.yaml"
    run = dict(data=str(micro), hyp=str(hyp), epochs=1, imgsz=64, batch_size=4, workers=0, project=str(tmp_path))
    hyp.write_text(open(train.TrainOptions().hyp).read() + "optimizer: AdamW\n")
    with pytest.raises(UserError, match="--optimizer SGD: the hyperparameter file names optimizer AdamW"):
        train.run(optimizer="SGD", **run)
    hyp.write_text(open(train.TrainOptions().hyp).read() + "optimizer: Adagrad\n")
    with pytest.raises(UserError, match="optimizer must be one of SGD, Adam, AdamW"):
        train.run(**run)
