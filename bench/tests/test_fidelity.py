"""bench/fidelity.py: its modes must mean what their names say, and its summary must add up."""
import pytest

from bench import fidelity
from utils.hyp import HYP_RULES, check_hyp, load_hyp
from utils.engine.train_options import parse_opt


@pytest.mark.parametrize("mode", sorted(set(fidelity.MODES) - set(fidelity.PEERS)))
def test_every_mode_changes_only_known_settings(mode):
    # check_hyp keeps unknown keys and ignores them: a misspelt override would run the default silently
    amp, overrides, *more = fidelity.MODES[mode]
    assert set(overrides) <= set(HYP_RULES), f"{mode}: unknown hyperparameters {set(overrides) - set(HYP_RULES)}"
    check_hyp({**load_hyp().as_dict(), **overrides}, mode)
    opt = parse_opt(["--amp", amp, *(more[0] if more else [])])
    assert opt.amp == amp
    if "close" in mode:
        assert opt.close_mosaic == int(mode.rsplit("close", 1)[1])


def test_modes_are_distinct():
    settings = [(amp, sorted(o.items()), tuple(m[0]) if m else ()) for name, (amp, o, *m) in fidelity.MODES.items()
                if name not in fidelity.PEERS]  # the peers are told apart by name: their own code, no settings
    assert len(set(map(str, settings))) == len(settings)


def test_summary_mean_spread_and_worst_to_mean():
    rows = [{"dataset": "d", "mode": "m", "seed": str(s), "map": str(v), "wall_s": str(w), "box_loss_third": "0.2"}
            for s, v, w in ((2, 0.30, 100), (0, 0.40, 200), (1, 0.50, 300))]
    line = fidelity.summary(rows).splitlines()[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:2] == ["d", "m"]
    assert cells[2] == "s0 0.400, s1 0.500, s2 0.300"  # in seed order
    # mean, spread, worst/mean, sets passing, their worst's mean, wall
    assert cells[3:9] == ["0.400", "0.200", "0.75", "0/1", "0.300", "200"]


def test_seed_sets_count_every_three_seed_subset():
    # 0.30 sinks any set it is in below 0.85 of the mean unless the other two are near it
    maps = [0.40, 0.40, 0.40, 0.30]
    passing, sets, worst = fidelity.seed_sets(maps)
    assert (passing, sets) == (1, 4)  # only {0.40, 0.40, 0.40}: 0.30/0.367 = 0.82
    assert worst == pytest.approx((0.40 + 3 * 0.30) / 4)  # the 0.30 is the worst of the three sets holding it
    assert fidelity.seed_sets([0.40, 0.40, 0.40, 0.36])[:2] == (4, 4)  # 0.36/0.387 = 0.93
    passing, sets, worst = fidelity.seed_sets([0.5, 0.4])  # fewer seeds than a set
    assert (passing, sets) == (0, 0) and worst != worst
    rows = [{"dataset": "d", "mode": "m", "seed": str(s), "map": str(v), "wall_s": "1", "box_loss_third": "0.2"}
            for s, v in enumerate(maps)]
    cells = [c.strip() for c in fidelity.summary(rows).splitlines()[2].strip("|").split("|")]
    assert cells[6:8] == ["1/4", "0.325"]
    rows = rows[:2]
    cells = [c.strip() for c in fidelity.summary(rows).splitlines()[2].strip("|").split("|")]
    assert cells[6:9] == ["-", "-", "1"]  # two seeds: no set, and the columns stay aligned


def test_the_shipped_modes_change_nothing_and_the_older_defaults_pin_what_they_ran_at():
    """fp32-lr2-warm6 is train.py's default as shipped: its overrides leave the recipe as it is. The modes
    measured before a default changed keep their meaning: fp32-lr2 warms up 3 epochs, fp32-biaswarm also
    runs at half the lr."""
    from utils.engine.optim import choose_recipe

    hyp = load_hyp()
    recipe = lambda mode: choose_recipe("auto", hyp.updated(**fidelity.MODES[mode][1]), 16, 400, 40, 5)  # noqa: E731
    shipped = choose_recipe("auto", hyp, 16, 400, 40, 5)
    assert recipe("fp32-lr2-warm6") == shipped and shipped.warmup_epochs == 6.0
    assert fidelity.MODES["fp32-lr2-warm6"][0] == "off" and fidelity.MODES["bf16-warm32-lr2-warm6"][0] == "bf16"
    assert recipe("bf16-warm32-lr2-warm6") == shipped
    old = recipe("fp32-lr2")
    assert old.warmup_epochs == 3.0 and old.lr0 == shipped.lr0
    assert recipe("fp32-biaswarm").warmup_epochs == 3.0 and recipe("fp32-biaswarm").lr0 == pytest.approx(shipped.lr0 / 2)
    assert recipe("fp32-warm6").warmup_epochs == 6.0 and recipe("fp32-warm6").lr0 == recipe("fp32-biaswarm").lr0


def test_the_transfer_summary_divides_by_the_peer_at_the_same_seeds():
    def row(dataset, mode, seed, m, wall, batch=16, trained=16):
        return {"dataset": dataset, "mode": mode, "seed": str(seed), "map": str(m), "wall_s": str(wall),
                "batch": str(batch), "epochs": "60", "imgsz": "320", "trained_batch": str(trained)}

    rows = [row("rice-pest", "yolov5", 0, 0.30, 1000), row("rice-pest", "yolov5", 1, 0.20, 1000),
            row("rice-pest", "ft-x", 0, 0.33, 400), row("rice-pest", "ft-x", 1, 0.27, 400),
            row("rice-pest", "ft-x", 2, 0.90, 400),  # no peer run at seed 2: left out of the ratio
            row("paste8", "ft-x", 0, 0.10, 100, batch=64)]
    lines = fidelity.peer_summary(rows).splitlines()[2:]
    cells = {tuple(c.strip() for c in line.strip("|").split("|"))[2]: [c.strip() for c in line.strip("|").split("|")]
             for line in lines if "rice-pest" in line}
    assert cells["ft-x"][5:9] == ["0.500", "1.20x", "400", "0.40x"]  # (0.33 + 0.27) / (0.30 + 0.20); seed 2 only in the mean
    assert cells["yolov5"][6] == "-"
    assert lines.index(next(line for line in lines if "| yolov5 |" in line)) < lines.index(
        next(line for line in lines if "rice-pest" in line and "ft-x" in line))  # the peer first
    seen = next(line for line in lines if "paste8" in line)
    assert "paste8 (seen)" in seen and "b64 e60" in seen


def test_ft_sgd_nbs16_is_the_shipped_fine_tuning_recipe():
    from utils.engine.optim import choose_recipe

    hyp = load_hyp()
    shipped = choose_recipe("auto", hyp, 16, 424, 20, 7, 343 / 349)
    amp, overrides, more = fidelity.MODES["ft-sgd-nbs16"]
    assert more == ["--optimizer", "SGD"] and amp == "auto"
    mode = choose_recipe("SGD", hyp.updated(**overrides), 16, 424, 20, 7, 343 / 349)
    assert (mode.optimizer, mode.lr0, mode.momentum, mode.accumulate, mode.warmup_bias_lr, mode.ema_tau) == (
        shipped.optimizer, shipped.lr0, shipped.momentum, shipped.accumulate, shipped.warmup_bias_lr, shipped.ema_tau)
    assert shipped.weight_decay(hyp) == mode.weight_decay(hyp.updated(**overrides))


def test_every_mode_names_only_keys_the_product_reads():
    """A mode is an --amp value and hyp overrides the product still reads: the modes of removed keys left with them
    (their figures stay in docs/recipe.md with the commit that made them)."""
    from utils.hyp import KNOWN_HYP_KEYS

    for name, (amp, overrides, *_) in fidelity.MODES.items():
        assert set(overrides) <= KNOWN_HYP_KEYS, name


def test_the_recipe_table_covers_the_grid_with_no_adamw_fine_tune():
    lines = fidelity.recipe_table().splitlines()[2:]
    assert len(lines) == len(fidelity.RULE_PICTURES) * len(fidelity.RULE_BATCHES)
    cells = [c.strip() for line in lines for c in line.strip("|").split("|")[2:]]
    assert len(cells) == len(lines) * len(fidelity.RULE_EPOCHS)
    assert all(not c.split(" / ")[0].startswith("AdamW") for c in cells)  # fine-tunes: SGD everywhere

