"""train.py --evolve (utils/engine/evolve.py): mutations stay within the bounds check_hyp enforces, parent and
mutation are a function of (seed, generation), the evolved keys are the ones that change what a run trains for
each recipe, a search continues from its evolve.csv as if never stopped, and two tiny generations run through
train.main; a search stopped (by a signal between generations, or from Python) names the command
that continues it."""
from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from helpers import cli_in_process, log_lines as _lines
from hypothesis import given, settings, strategies as st

import train
from models.yolo import Model
from utils.hyp import HYP_RULES, Hyp, check_hyp, load_hyp
from utils.data.datasets import create_dataloader
from utils.engine import evolve as ev
from utils.engine.callbacks import Callbacks
from utils.engine.loss import ComputeLoss, loss_gains
from utils.engine.optim import ADAMW_LR_SCRATCH, apply_warmup, build_optimizer, choose_recipe, lr_lambda, resolved_hyp
from utils.engine.train_options import TrainOptions, parse_opt
from utils.errors import UserError
from utils.options import to_argv
from utils.report.results import read_rows

REPO = Path(__file__).resolve().parents[1]
TINY = dict(imgsz=64, batch_size=4, workers=0, noplots=True, amp="off", seed=0)
BASE = load_hyp()
OPTIMIZER_KEYS = ("lr0", "momentum", "warmup_epochs", "warmup_bias_lr", "lr_adam_gain", "warmup_epochs_adam",
                  "warmup_bias_lr_adam")
AUGMENT_KEYS = ("hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "flipud", "fliplr", "mosaic",
                "mixup")
ALL_GENE_SETS = (ev.SGD_GENES + ev.SHARED_GENES, ev.ADAM_GENES + ev.SHARED_GENES,
                 ev.ADAMW_AUTO_GENES + ("warmup_max_fraction",) + ev.SHARED_GENES)


def _value(hyp: Hyp, key: str, unset: float) -> float:
    """The hyp's number for `key`, or `unset` where the table leaves it to the recipe (None)."""
    v = getattr(hyp, key)
    return unset if v is None else v


def far(key: str, value: float) -> float:
    """A value of the gene, within its bounds, far from `value`: the bound on the other side of the middle."""
    low, high = ev.bounds(key)
    return high if value < (low + high) / 2 else low


# ----------------------------------------------------------------------------------------------- bounds
def test_gene_bounds_lie_within_hyp_rules():
    for key, gene in ev.GENES.items():
        low, high, _ = HYP_RULES[key]
        assert low <= gene.low < gene.high <= high, key
        assert ev.bounds(key) == (gene.low, gene.high)
    for genes in ALL_GENE_SETS:
        assert set(genes) <= set(ev.GENES) and len(set(genes)) == len(genes)


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(0, 2**32 - 1), st.sampled_from(ALL_GENE_SETS), st.floats(0.0, 1.0),
       st.floats(0.0, 10.0))
def test_mutation_never_leaves_the_bounds(data, seed, genes, prob, sigma):
    # any parent check_hyp accepts (also outside the evolution's own bounds), any mutation strength
    parent = {k: data.draw(st.floats(HYP_RULES[k][0], HYP_RULES[k][1], allow_nan=False), label=k) for k in genes}
    child = ev.mutate(parent, genes, np.random.default_rng(seed), prob, sigma)
    for k, v in child.items():
        low, high = ev.bounds(k)
        assert low <= v <= high and HYP_RULES[k][0] <= v <= HYP_RULES[k][1], (k, v)
    check_hyp({**BASE.as_dict(), **child}, "mutated")


def test_a_gene_at_zero_can_evolve_and_return_to_zero():
    genes = ("degrees", "mixup")
    parent, moved, back = {"degrees": 0.0, "mixup": 0.0}, set(), set()
    for seed in range(50):
        child = ev.mutate(parent, genes, np.random.default_rng(seed))
        moved |= {k for k in genes if child[k] > 0}
        again = ev.mutate({"degrees": 0.1, "mixup": 0.002}, genes, np.random.default_rng(seed))
        back |= {k for k in genes if again[k] == 0}
    assert moved == back == set(genes)


# ----------------------------------------------------------------------------------------------- the genetics
def rows_with(fitness: list[float]) -> list[dict]:
    return [{"generation": g, "fitness": f, "box": 0.01 * (g + 1), "cls": 0.1 * (g + 1)} for g, f in enumerate(fitness)]


def test_parent_and_mutation_are_a_function_of_seed_and_generation():
    genes = ev.ADAMW_AUTO_GENES + ev.SHARED_GENES
    rows = [{"generation": g, "fitness": 0.1 * g, **ev.mutate({k: _value(BASE, k, 1.0) for k in genes}, genes,
                                                               np.random.default_rng(g))} for g in range(8)]
    a, b = ev.next_values(rows, genes, 0, 8), ev.next_values(rows, genes, 0, 8)
    assert a == b
    assert ev.next_values(rows, genes, 0, 9) != a and ev.next_values(rows, genes, 1, 8) != a
    assert ev.next_values([], genes, 0, 0) == {}


def test_parent_is_one_of_the_fittest_weighted_by_fitness():
    rows = rows_with([0.0, 0.9, 0.1, 0.5, 0.2, 0.8, 0.3, 0.7])  # top 5: generations 1, 5, 7, 3, 6 (0.3 weighs 1e-6)
    rng = np.random.default_rng(0)
    picks = [ev.select_parent(rows, ("box",), rng)["box"] for _ in range(2000)]
    counts = {round(b / 0.01) - 1: picks.count(b) for b in set(picks)}
    assert set(counts) <= {1, 5, 7, 3} and counts[1] > counts[5] > counts[7] > counts[3] > 0
    equal = [ev.select_parent(rows_with([0.0] * 3), ("box",), rng)["box"] for _ in range(600)]
    assert all(150 < equal.count(b) < 250 for b in (0.01, 0.02, 0.03))  # equal fitness: drawn evenly


# ----------------------------------------------------------------------------------------------- what is evolved
@pytest.fixture(scope="module")
def loss_probe():
    """A yolov5n's raw outputs on a fixed input and targets of many sizes (anchor_t decides which anchors match)."""
    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=5).train()
    with torch.no_grad():
        preds = model(torch.rand(2, 3, 64, 64))
    g = torch.Generator().manual_seed(1)
    n = 24
    wh = torch.rand(n, 2, generator=g) * 0.9 + 0.05
    image, cls = torch.arange(n).remainder(2)[:, None], torch.randint(0, 5, (n, 1), generator=g)
    targets = torch.cat([image.float(), cls.float(), torch.rand(n, 2, generator=g) * 0.6 + 0.2, wh], 1)
    return model, preds, targets


def used(hyp: Hyp, optimizer: str, batches: int, epochs: int, share: float, probe) -> tuple:
    """What train.build_trainer and train_one_epoch make of a hyp: the recipe, the optimizer's groups over the
    warmup and the schedule, and the loss on fixed outputs (batch 16, 5 classes, 64 px)."""
    r = choose_recipe(optimizer, hyp, 16, 16 * batches, epochs, 5, share)
    nw = r.warmup_steps(batches, epochs)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), torch.nn.BatchNorm2d(1))
    opt = build_optimizer(net, r.optimizer, r.lr0, r.momentum, r.weight_decay(hyp))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(epochs, hyp.lrf, False))  # sets initial_lr
    factors = tuple(sched.lr_lambdas[0](e) for e in range(epochs))
    groups = []
    for ni in (0, nw // 3, nw // 2):
        apply_warmup(opt, ni, nw, factors[0], hyp, r.momentum, r.warmup_bias_lr)
        groups += [(g["lr"], g["weight_decay"], g.get("momentum"), g.get("betas")) for g in opt.param_groups]
    model, preds, targets = probe
    loss = ComputeLoss(model, loss_gains(hyp, 3, 5, 64, r.cls_by_nc, r.box_gain))(preds, targets)[1]
    return r.optimizer, nw, factors, tuple(groups), tuple(loss.tolist())


SETTLED = check_hyp(resolved_hyp(BASE, choose_recipe("auto", BASE, 16, 400, 30, 5)), "hyp.yaml")  # a run's hyp.yaml
RECIPES = {  # optimizer option, hyp, batches per epoch, epochs, share from --weights -> the optimizer the run uses
    "auto-AdamW": ("auto", BASE, 25, 30, 0.0, "AdamW"),
    "auto-AdamW-short": ("auto", BASE, 25, 3, 0.0, "AdamW"),
    "auto-SGD-finetune": ("auto", BASE, 25, 30, 343 / 349, "SGD"),
    "auto-SGD-continue": ("auto", BASE, 25, 30, 1.0, "SGD"),
    "auto-AdamW-long": ("auto", BASE, 2000, 30, 0.0, "AdamW"),  # no run length hands a scratch run to SGD
    "SGD": ("SGD", BASE, 25, 30, 0.0, "SGD"),
    "Adam": ("Adam", BASE, 25, 30, 0.0, "Adam"),
    "AdamW": ("AdamW", BASE, 25, 30, 0.0, "AdamW"),
    "settled": ("auto", SETTLED, 25, 30, 0.0, "AdamW"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_evolved_key_changes_what_the_run_uses_and_the_rest_would_not(name, loss_probe):
    optimizer, hyp, batches, epochs, pretrained, expect = RECIPES[name]
    recipe = choose_recipe(optimizer, hyp, 16, 16 * batches, epochs, 5, pretrained)
    assert recipe.optimizer == expect
    genes = ev.genes_for(recipe, optimizer, hyp, False, batches, epochs)
    hyp = hyp.updated(**ev.base_values(hyp, recipe, genes))  # as generations after the first train
    base = used(hyp, optimizer, batches, epochs, pretrained, loss_probe)
    assert base == used(hyp.updated(**ev.base_values(hyp, recipe, genes)), optimizer, batches, epochs, pretrained,
                        loss_probe)  # generation 0's values are what the recipe used
    for k in genes:
        if k not in AUGMENT_KEYS:  # those reach the data loader: the next test
            assert used(hyp.updated(**{k: far(k, getattr(hyp, k))}), optimizer, batches, epochs, pretrained, loss_probe) != base, k
    for k in set(OPTIMIZER_KEYS) - set(genes):  # the optimizer keys left out change nothing for this recipe
        unused = hyp.updated(**{k: far(k, _value(hyp, k, 0.0))})
        assert used(unused, optimizer, batches, epochs, pretrained, loss_probe) == base, k
    if name == "auto-AdamW":
        assert {"lr_adam_gain", "warmup_epochs_adam", "warmup_bias_lr_adam"} <= set(genes)
        assert not {"lr0", "momentum", "warmup_epochs", "warmup_bias_lr", "warmup_max_fraction"} & set(genes)
    if name == "auto-AdamW-short":  # 75 batches: the 100-batch floor makes the warmup the whole run, whatever warmup_epochs_adam
        assert "warmup_max_fraction" in genes and "warmup_epochs_adam" not in genes


def test_rect_leaves_out_the_mosaic_genes():
    recipe = choose_recipe("auto", BASE, 16, 400, 30, 5)
    assert not {"mosaic", "mixup"} & set(ev.genes_for(recipe, "auto", BASE, True, 25, 30))
    assert {"mosaic", "mixup"} <= set(ev.genes_for(recipe, "auto", BASE, False, 25, 30))


def test_every_evolved_augmentation_changes_the_training_samples(micro):
    hyp = BASE.updated(mixup=0.0)
    _, ds = create_dataloader(load_hyp_paths(micro), 64, 4, 32, hyp=hyp, augment=True, cache="off", workers=0,
                              seed=3, nc=5)

    def samples(h: Hyp) -> list[torch.Tensor]:
        ds.hyp = h
        return [ds[(i, 0)][0] for i in range(len(ds))]

    base = samples(hyp)
    for k in AUGMENT_KEYS:
        changed = samples(hyp.updated(**{k: far(k, _value(hyp, k, 0.0))}))
        assert any(not torch.equal(a, b) for a, b in zip(base, changed)), k


def load_hyp_paths(data_yaml: Path) -> list[Path]:
    from utils.data.data_config import load_data_config

    return load_data_config(data_yaml)["train"]


# ----------------------------------------------------------------------------------------------- the search, fast
def landscape_train(calls: list[int], interrupt_at: int | None = None, diverge_at: int | None = None):
    """A stand-in for train.train: fires the callbacks the search listens to and scores the hyp on a smooth
    landscape (best at box 0.15, lr_adam_gain 2), so the search runs in milliseconds."""

    def fake(opt: TrainOptions, callbacks, interrupt_line: str | None = None) -> SimpleNamespace:
        g = opt.seed  # the search seeds generation g with --seed + g; these tests use --seed 0
        calls.append(g)
        hyp = load_hyp(opt.hyp)
        t = SimpleNamespace(recipe=choose_recipe(opt.optimizer, hyp, 16, 400, 30, 5), train_loader=[0] * 25,
                            s=SimpleNamespace(epochs=30))
        callbacks.fire("on_train_start", t)
        if g == diverge_at:
            callbacks.fire("on_rewind", t)
            raise UserError("the weights became non-finite (NaN/inf) in epoch 3 again")
        if g == interrupt_at:
            return SimpleNamespace(save_dir=Path(opt.project, opt.name), best_fitness=-1.0, interrupted=True)
        fit = 1 / (1 + 5 * abs(hyp.box - 0.15) + abs(hyp.lr_adam_gain - 2))
        callbacks.fire("on_epoch_end", t, 0, {"metrics/precision": 0.5, "metrics/recall": 0.5,
                                              "metrics/mAP_0.5": fit, "metrics/mAP_0.5:0.95": fit})
        return SimpleNamespace(save_dir=Path(opt.project, opt.name), best_fitness=fit, interrupted=False)

    return fake


@pytest.fixture
def no_plot(monkeypatch):
    monkeypatch.setattr(ev.SearchFolder, "plot", lambda self: None)  # drawn in the end-to-end test


def search(tmp_path: Path, n: int, fake, name: str = "exp", **options) -> ev.SearchOutcome:
    return ev.evolve(TrainOptions(evolve=n, project=str(tmp_path), name=name, **options), fake)


def test_a_continued_search_writes_what_an_uninterrupted_one_does(tmp_path, no_plot):
    calls: list[int] = []
    whole = search(tmp_path, 6, landscape_train(calls), "whole")
    assert calls == list(range(6))
    calls.clear()
    cut = search(tmp_path, 6, landscape_train(calls, interrupt_at=3), "cut")
    assert cut.interrupted and calls == [0, 1, 2, 3] and (cut.save_dir / "gen003").exists()
    calls.clear()
    search(tmp_path, 6, landscape_train(calls), "cut")  # the same command again
    assert calls == [3, 4, 5]
    assert (cut.save_dir / "evolve.csv").read_bytes() == (whole.save_dir / "evolve.csv").read_bytes()
    assert (cut.save_dir / "hyp_evolve.yaml").read_bytes() != b""
    calls.clear()
    search(tmp_path, 6, landscape_train(calls), "cut")  # done: nothing to train
    search(tmp_path, 8, landscape_train(calls), "cut")  # a larger N extends the search
    assert calls == [6, 7]


def test_the_search_climbs_and_hyp_evolve_holds_the_fittest(tmp_path, no_plot):
    out = search(tmp_path, 30, landscape_train([]))
    genes, rows = ev.SearchFolder(TrainOptions(evolve=30, project=str(tmp_path))).read()
    best = max(rows, key=lambda r: r["fitness"])
    assert best["fitness"] > rows[0]["fitness"] + 0.05 and out.best_fitness == best["fitness"]
    hyp = load_hyp(out.save_dir / "hyp_evolve.yaml")  # a complete hyp --hyp accepts
    assert all(getattr(hyp, k) == best[k] for k in genes) and hyp.lr0 == BASE.lr0
    assert hyp == load_hyp(out.save_dir / f"gen{int(best['generation']):03d}" / "hyp_given.yaml")


def test_a_damaged_evolve_csv_is_one_line(tmp_path, no_plot):
    out = search(tmp_path, 3, landscape_train([]))
    csv = out.save_dir / "evolve.csv"
    lines = csv.read_text().splitlines()
    csv.write_text("\n".join(lines[:2] + [lines[3], lines[2]]) + "\n")  # generations 0, 2, 1
    with pytest.raises(UserError, match="row 2 is not generation 1"):
        search(tmp_path, 4, landscape_train([]))


def test_a_diverging_generation_scores_zero_and_the_search_goes_on(tmp_path, no_plot):
    out = search(tmp_path, 3, landscape_train([], diverge_at=1))
    _, rows = ev.SearchFolder(TrainOptions(evolve=3, project=str(tmp_path))).read()
    assert [r["generation"] for r in rows] == [0, 1, 2] and rows[1]["fitness"] == 0 and not out.interrupted


def test_another_command_in_the_same_folder_is_refused(tmp_path, no_plot):
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text(yaml.safe_dump(BASE.as_dict()))
    search(tmp_path, 1, landscape_train([]), hyp=str(hyp))
    with pytest.raises(UserError, match="--epochs None, not 5"):
        search(tmp_path, 2, landscape_train([]), hyp=str(hyp), epochs=5)
    hyp.write_text(yaml.safe_dump({**BASE.as_dict(), "box": 0.07}))
    with pytest.raises(UserError, match="has changed since the search"):
        search(tmp_path, 2, landscape_train([]), hyp=str(hyp))
    hyp.write_text(yaml.safe_dump(BASE.as_dict()))
    search(tmp_path, 2, landscape_train([]), hyp=str(hyp), workers=0, device="cpu")  # these change no generation


def test_evolve_flag_and_its_refusals(capsys, monkeypatch):
    assert parse_opt(["--evolve"]).evolve == 300 and parse_opt(["--evolve", "4"]).evolve == 4
    assert parse_opt([]).evolve is None
    code, lines = cli_in_process(train.main, ["--evolve", "2", "--resume"], capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and "--resume" in lines[0], lines
    with pytest.raises(UserError, match="1 or more"):
        ev.check_evolve_options(TrainOptions(evolve=0))


# ----------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_two_tiny_generations_through_train_main(micro, tmp_path):
    train.main(["--evolve", "2", "--data", str(micro), "--epochs", "1", "--imgsz", "64", "--batch-size", "4",
                "--workers", "0", "--noplots", "--project", str(tmp_path)])
    d = tmp_path / "exp"
    genes, rows = ev.SearchFolder(TrainOptions(evolve=2, project=str(tmp_path))).read()
    assert [r["generation"] for r in rows] == [0, 1] and (d / "evolve.png").stat().st_size > 0
    assert "lr_adam_gain" in genes and "lr0" not in genes  # the short AdamW recipe's keys
    load_hyp(d / "hyp_evolve.yaml")
    # generation 1 trained with its evolved values: its resolved hyp.yaml (what the run used) follows them
    given, used_ = (load_hyp(d / "gen001" / f) for f in ("hyp_given.yaml", "hyp.yaml"))
    first = load_hyp(d / "gen000" / "hyp.yaml")
    assert used_.lr0 == round(ADAMW_LR_SCRATCH * 5 / (4 + 5) * given.lr_adam_gain, 6)  # 5 classes, batch 4
    assert used_.warmup_bias_lr == given.warmup_bias_lr_adam
    assert used_.box == pytest.approx(given.box * 4) and used_.weight_decay == pytest.approx(given.weight_decay * 4 / 64)
    assert all(getattr(used_, k) == getattr(given, k) for k in AUGMENT_KEYS + ("lrf", "cls", "obj", "anchor_t"))
    assert any(getattr(used_, k) != getattr(first, k) for k in genes if used_.sets(k))
    assert (d / "gen000" / "opt.yaml").exists() and yaml.safe_load((d / "gen001" / "opt.yaml").read_text())["seed"] == 1
    kept = [g for g in ("gen000", "gen001") if (d / g / "weights").exists()]
    assert len(kept) == 1  # only the fittest generation keeps its weights


# ----------------------------------------------------------------------------------------------- a stopped search


@pytest.mark.slow
def test_a_stop_between_evolve_generations_gives_the_search_command(tmp_path):
    """SIGTERM right after generation 0 was written (outside any run): before, exit -15 and no line. Now the search
    ends as it does when a generation is stopped: the continue line, exit 130, generation 0 kept."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / "tests")!r}]
        import train
        from test_evolve import landscape_train
        from utils.engine import evolve as ev
        from utils.engine.train_options import parse_opt
        from utils.errors import run_cli

        calls = []
        ev.SearchFolder.plot = lambda self: None
        write = ev.SearchFolder.write
        def write_then_stop(self, genes, rows):
            write(self, genes, rows)
            os.kill(os.getpid(), signal.SIGTERM)
        ev.SearchFolder.write = write_then_stop
        def main():
            out = ev.evolve(parse_opt(["--evolve", "3", "--project", {str(tmp_path)!r}]), landscape_train(calls))
            if out.interrupted:
                raise SystemExit(130)
        run_cli(main)
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    text = p.stdout + p.stderr
    assert p.returncode == 130, (p.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    assert "interrupted after 1 of 3 generations (continue with: python train.py --evolve 3" in text, text[-3000:]
    assert (tmp_path / "exp" / "evolve.csv").read_text().count("\n") == 2  # the header and generation 0


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_run_with_evolve_runs_the_search_and_its_interrupt_line_is_the_search_command(micro, tmp_path, caplog):
    """train.run(evolve=2) searches as --evolve does; stopped in generation 1, it says to run the search's command
    again (--resume of the generation's last.pt would train that generation alone), and that command, parsed,
    is the search's own options."""
    options = dict(data=str(micro), project=str(tmp_path), epochs=1, evolve=2, **TINY)
    starts = []

    def stop_in_generation_1(t, epoch):
        starts.append(t.s.save_dir.name)
        if t.s.save_dir.name == "gen001":
            raise KeyboardInterrupt

    cb = Callbacks()
    cb.register("on_epoch_start", stop_in_generation_1)
    with caplog.at_level(logging.INFO):
        out = train.run(callbacks=cb, **options)
    assert out.interrupted and starts == ["gen000", "gen001"]
    assert len(read_rows(out.save_dir / "evolve.csv")) == 2  # the header and generation 0
    lines = [ln for ln in _lines(caplog) if "interrupted" in ln]
    assert lines and not any("--resume" in ln for ln in lines), lines
    cmd = lines[0].split("continue the search with: ", 1)[1]
    assert parse_opt(shlex.split(cmd)[2:]) == parse_opt(to_argv(options))
    out = train.run(**options)  # that command continues: generation 1 again, then done
    assert not out.interrupted and len(read_rows(out.save_dir / "evolve.csv")) == 3
