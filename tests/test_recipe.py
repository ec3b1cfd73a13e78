"""The recipe rule (utils/engine/optim.choose_recipe): its invariants over the users' regime, each recipe's numbers,
the step floor, hyp.yaml's settled recipe, the pruned keys and the run's one log line."""
from __future__ import annotations

import itertools
import logging
import math
from dataclasses import replace

import pytest
import yaml

from utils.hyp import Hyp, check_hyp, load_hyp
from utils.engine.optim import (MIN_STEPS, PRETRAINED_SHARE, Recipe,
                                choose_recipe, floor_batch, resolved_hyp)

HYP = load_hyp()
# the regime users live in, and past it: docs/recipe.md ("The rule") prints this grid (bench/fidelity.py --recipe-table)
PICTURES = (500, 1_000, 2_000, 3_000, 5_000, 10_000, 20_000, 50_000, 120_000)
EPOCHS = (10, 20, 30, 50, 100, 200, 300)
BATCHES = (8, 16, 24, 32, 64, 128)
SHARES = (0.0, 0.3, PRETRAINED_SHARE, 0.98, 1.0)  # from scratch, another model's --cfg, the threshold, fine-tunes


def _grid():
    for n, e, b, share in itertools.product(PICTURES, EPOCHS, BATCHES, SHARES):
        yield (n, e, b, share), choose_recipe("auto", HYP, b, n, e, 7, share)


def test_every_fine_tune_is_sgd_and_the_batch_never_picks_the_recipe():
    by_run: dict[tuple, set] = {}
    for (n, e, b, share), r in _grid():
        if share >= PRETRAINED_SHARE:
            assert r.optimizer == "SGD" and r.kind == ("continue" if share == 1.0 else "finetune"), (n, e, b, share)
        else:
            assert (r.kind, r.optimizer) == ("short", "AdamW"), (n, e, b, share)
        by_run.setdefault((n, e, share), set()).add((r.kind, r.optimizer))
        assert min(b, 16) <= r.batch_size <= b  # the floor lowers, never raises, never under 16
    assert all(len(kinds) == 1 for kinds in by_run.values())  # the batch alone never changes the recipe


@pytest.mark.slow
def test_no_length_hands_a_run_to_another_recipe():
    """The switch to YOLOv5's recipe at 640,000 images seen cost a third of the mAP two epochs past it (docs/recipe.md,
    "Long runs"): along the run length a run keeps its recipe, and what moves with the length moves one way only
    (the images a step, the warmup, the EMA ramp never shrink when the run grows)."""
    for n, b, share in itertools.product(PICTURES, BATCHES, SHARES):
        runs = [choose_recipe("auto", HYP, b, n, e, 7, share) for e in range(1, 401)]
        assert len({(r.kind, r.optimizer, r.momentum) for r in runs}) == 1, (n, b, share)
        for e, (short, longer) in enumerate(zip(runs, runs[1:]), start=1):
            step = lambda r: r.batch_size * r.accumulate  # noqa: E731  the images a step
            batches = lambda r: math.ceil(n / r.batch_size)  # noqa: E731
            assert step(longer) >= step(short) and longer.lr0 >= short.lr0, (n, b, share, e)
            # the EMA ramp and the warmup, in epochs, never shrink (but for a step's rounding)
            assert longer.ema_tau * longer.accumulate / batches(longer) >= \
                short.ema_tau * short.accumulate / batches(short) - 0.01, (n, b, share, e)
            assert longer.warmup_steps(batches(longer), e + 1) / batches(longer) >= \
                short.warmup_steps(batches(short), e) / batches(short) - 0.01, (n, b, share, e)


def test_the_old_switch_is_gone():
    """The runs at the switch the long-run study measured (5,000 pictures, 127 and 129 epochs, batch 16 and 64) and
    COCO's 300 epochs train with the recipe they had below 640,000 images seen."""
    for b, share in itertools.product((16, 64), (0.0, 343 / 349)):
        below, above = (choose_recipe("auto", HYP, b, 5000, e, 10, share) for e in (127, 129))
        assert replace(above, why=below.why) == below, (b, share)
        assert "sees 645,000 images (5,000 pictures x 129 epochs)" in above.why
    coco = choose_recipe("auto", HYP, 16, 118_287, 300, 80)
    assert (coco.kind, coco.optimizer, coco.accumulate, coco.ema_tau, coco.warmup_epochs) == ("short", "AdamW", 1,
                                                                                              2000, 6.0)
    assert choose_recipe("auto", HYP, 16, 118_287, 300, 80, 343 / 349).kind == "finetune"


def test_yolov5s_defaults_on_2000_pictures_fine_tune_with_sgd():
    """The issue's case: 100 epochs at batch 16 on 2,000 pictures sent yolov5n.pt to AdamW (steps counted at 64
    images for one threshold and at 16 for the other)."""
    for b in (16, 64):
        for e in (30, 100, 300):
            r = choose_recipe("auto", HYP, b, 2000, e, 7, 343 / 349)
            assert (r.optimizer, r.kind) == ("SGD", "finetune")
    assert choose_recipe("auto", HYP, 16, 5000, 300, 7, 1.0).kind == "continue"  # 1.5M images seen


def test_the_short_recipe_from_scratch():
    r = choose_recipe("auto", HYP, 16, 400, 40, 5)  # the built-in dataset: 25 batches x 40 epochs
    assert (r.kind, r.optimizer, r.accumulate, r.cls_by_nc, r.box_gain, r.momentum) == ("short", "AdamW", 1, False,
                                                                                          4.0, 0.9)
    assert r.lr0 == pytest.approx(0.008 * 5 / 9, abs=1e-6)
    assert r.warmup_epochs == Hyp.warmup_epochs_adam == 6.0 and r.warmup_bias_lr == 0.1
    assert r.ema_tau == pytest.approx(1000 / 4)  # a quarter of the run's 1000 steps
    assert r.weight_decay(HYP) == pytest.approx(5e-4 / 4)  # 5e-4 per 64 images, here per 16
    assert choose_recipe("auto", HYP, 16, 600, 30, 10).lr0 == pytest.approx(0.008 * 5 / 14, abs=1e-6)
    assert choose_recipe("auto", HYP, 16, 600, 30, 1).lr0 == pytest.approx(r.lr0, abs=1e-6)  # capped at 5 classes'
    # the hyp keys it reads: lr_adam_gain, warmup_epochs_adam, warmup_bias_lr_adam, cls_by_nc, ema_tau
    tuned = choose_recipe("auto", HYP.updated(lr_adam_gain=2.0, warmup_epochs_adam=3.0, warmup_bias_lr_adam=0.0,
                                   cls_by_nc=1, ema_tau=50), 16, 400, 40, 5)
    assert (tuned.lr0, tuned.warmup_epochs, tuned.warmup_bias_lr, tuned.cls_by_nc, tuned.ema_tau) == \
        (pytest.approx(2 * r.lr0, abs=1e-6), 3.0, 0.0, True, 50)


def test_the_short_recipe_scales_its_lr_by_the_square_root_of_the_batch_from_16_to_64():
    at = {b: choose_recipe("auto", HYP, b, 1000, 100, 10) for b in (4, 8, 16, 32, 64)}
    base = at[16].lr0
    assert all(r.accumulate == 1 and r.batch_size == b for b, r in at.items())
    assert at[4].lr0 == at[8].lr0 == base
    assert at[32].lr0 == pytest.approx(2 ** 0.5 * base, abs=1e-6) and at[64].lr0 == pytest.approx(2 * base, abs=1e-6)
    assert choose_recipe("auto", HYP, 256, 2000, 300, 10).lr0 == at[64].lr0  # past 64, measured largest: 64's
    assert choose_recipe("auto", HYP.updated(lr_batch_power=0.0), 64, 1000, 100, 10).lr0 == base


def test_continuing_a_run_is_the_fine_tuning_recipe_with_the_biases_from_0():
    """--weights last.pt of a finished run on its own data: every tensor transfers, the class outputs too. The 0.1
    bias kick of the fine-tuning warmup cost rice-pest's first continued epoch 9% of the run's mAP (docs/recipe.md)."""
    cont, ft = choose_recipe("auto", HYP, 16, 424, 30, 7, 1.0), choose_recipe("auto", HYP, 16, 424, 30, 7, 343 / 349)
    assert (cont.kind, ft.kind) == ("continue", "finetune") and (cont.warmup_bias_lr, ft.warmup_bias_lr) == (0.0, 0.1)
    assert cont.why.startswith("continuing (100% of the tensors") and ft.why.startswith("fine-tuning (98% of the")
    assert replace(cont, kind="finetune", why=ft.why, warmup_bias_lr=0.1) == ft  # nothing else differs
    assert choose_recipe("auto", HYP, 16, 118_287, 30, 80, 1.0).kind == "continue"  # long runs too


def test_the_fine_tuning_recipe_is_yolov5s_sgd_stepping_every_16_images():
    r = choose_recipe("auto", HYP, 16, 424, 20, 7, 343 / 349)
    assert (r.kind, r.optimizer, r.lr0, r.momentum, r.accumulate, r.warmup_bias_lr, r.box_gain, r.cls_by_nc,
            r.warmup_epochs, r.ema_tau) == ("finetune", "SGD", 0.01, 0.937, 1, 0.1, 1.0, True, 3.0, 2000)
    assert r.weight_decay(HYP) == pytest.approx(5e-4)  # YOLOv5's 5e-4 per 64 images, here per step of 16
    small = choose_recipe("auto", HYP, 8, 424, 20, 7, 1.0)
    assert small.accumulate == 2 and small.weight_decay(HYP) == pytest.approx(5e-4)
    big = choose_recipe("auto", HYP, 64, 5000, 30, 7, 1.0)  # 9,390 steps: kept; a step per batch, 4x the decay
    assert (big.batch_size, big.accumulate) == (64, 1) and big.weight_decay(HYP) == pytest.approx(2e-3)


def test_an_explicit_optimizer_takes_yolov5s_recipe():
    coco = choose_recipe("SGD", HYP, 16, 118_287, 300, 80)
    assert (coco.kind, coco.optimizer, coco.accumulate, coco.batch_size) == ("explicit", "SGD", 4, 16)
    assert coco.weight_decay(HYP) == pytest.approx(5e-4) and coco.ema_tau == 2000 and coco.warmup_epochs == 3.0
    assert replace(choose_recipe("SGD", HYP, 16, 118_287, 300, 80, 1.0), why=coco.why) == coco  # from --weights too
    adam = choose_recipe("Adam", HYP, 8, 100, 3, 3)
    assert (adam.kind, adam.optimizer, adam.lr0, adam.accumulate, adam.warmup_bias_lr) == ("explicit", "Adam", 0.01,
                                                                                           8, 0.1)
    assert choose_recipe("SGD", HYP, 64, 100, 3, 3).batch_size == 64  # the floor is the short recipes'
    # Adam fine-tuning starts the biases at 0 (a 0.1 kick undid trained weights), unless the hyp says otherwise
    assert choose_recipe("AdamW", HYP, 16, 400, 20, 5, 1.0).warmup_bias_lr == 0.0
    assert choose_recipe("AdamW", HYP.updated(warmup_bias_lr_adam=0.05), 16, 400, 20, 5, 1.0).warmup_bias_lr == 0.05


def test_adam_at_sgds_lr_is_said():
    """--optimizer AdamW with the default hyp trains at lr0 0.01 (mAP 0.268 -> 0.000 in one fine-tuning epoch)."""
    assert "lr0 0.01, made for SGD" in choose_recipe("AdamW", HYP, 16, 400, 20, 5, 1.0).note
    assert choose_recipe("AdamW", HYP.updated(lr0=0.001), 16, 400, 20, 5, 1.0).note == ""
    assert choose_recipe("SGD", HYP, 16, 400, 20, 5, 1.0).note == ""


def test_the_step_floor():
    assert MIN_STEPS == 1500
    assert floor_batch(HYP, 64, 1000, 15) == 16  # 240 steps -> batch 16 (945 steps)
    assert floor_batch(HYP, 64, 4000, 15) == 40  # 945 steps -> batch 40 (1500), a multiple of 8
    assert floor_batch(HYP, 32, 4000, 15) == 32  # 1875 steps: kept
    assert floor_batch(HYP, 256, 1000, 100) == 64  # 400 steps -> 1600
    assert floor_batch(HYP, 64, 1000, 100) == 64  # 1600 steps: kept
    h = HYP.updated(min_steps=500)
    assert floor_batch(h, 64, 1000, 15) == 24 and floor_batch(h, 64, 100, 15) == 16
    assert floor_batch(h, 64, 1000, 15, processes=3) == 24  # a multiple of the processes too
    assert floor_batch(HYP.updated(min_steps=0), 64, 1000, 15) == 64  # the floor off
    assert floor_batch(HYP, 16, 10, 1) == 16  # 16 and below are as tuned
    # the same floor for both short recipes, said in the reason
    ft, scratch = choose_recipe("auto", HYP, 64, 424, 20, 7, 1.0), choose_recipe("auto", HYP, 64, 424, 20, 7)
    assert ft.batch_size == scratch.batch_size == 16 and "the step floor lowers batch 64 (140 steps" in ft.why


def test_the_warmup_is_its_epochs_with_a_floor_in_batches_and_an_optional_cap():
    r = choose_recipe("auto", HYP, 16, 2000, 30, 5)
    assert r.warmup_steps(125, 30) == 750 and r.warmup_steps(16, 15) == 100 and r.warmup_steps(2, 40) == 80
    quarter = choose_recipe("auto", HYP.updated(warmup_max_fraction=0.25), 16, 2000, 30, 5)
    assert quarter.warmup_steps(125, 15) == 469 and quarter.warmup_steps(16, 15) == 60


@pytest.mark.parametrize("key, value", [("lr_body_gain", 0.0), ("head_only_epochs", 2), ("lr_adam_base", 0.004),
                                        ("ema_ramp_fraction", 0.25), ("finetune_sgd", 0.5), ("ema_batch_power", 1.0),
                                        ("adam_beta_batch_power", 1.0)])
def test_the_experiment_knobs_are_unknown_keys(key, value, caplog):
    with caplog.at_level(logging.WARNING):
        hyp = check_hyp({**HYP.as_dict(), key: value}, f"{key}.yaml")
    assert f"{key}.yaml: unknown key(s) ignored: '{key}'" in caplog.text
    for share in (0.0, 1.0):
        assert choose_recipe("auto", hyp, 64, 424, 20, 7, share) == choose_recipe("auto", HYP, 64, 424, 20, 7, share)


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_a_runs_hyp_yaml_repeats_its_recipe_and_says_when_the_batch_differs(share):
    r = choose_recipe("auto", HYP, 64, 424, 20, 7, share)  # trained at 16 (the floor)
    saved = check_hyp(yaml.safe_load(yaml.safe_dump(resolved_hyp(HYP, r))), "hyp.yaml")
    again = choose_recipe("auto", saved, 16, 424, 20, 7, share)
    assert again.kind == "settled" and again.note == ""
    assert (again.optimizer, again.lr0, again.momentum, again.accumulate, again.warmup_epochs, again.warmup_bias_lr,
            again.ema_tau, again.cls_by_nc) == (r.optimizer, r.lr0, r.momentum, r.accumulate, r.warmup_epochs,
                                                r.warmup_bias_lr, r.ema_tau, r.cls_by_nc)
    assert again.weight_decay(saved) == pytest.approx(r.weight_decay(HYP))
    assert saved.box == pytest.approx(HYP.box * r.box_gain)
    other = choose_recipe("auto", saved, 64, 424, 20, 7, share)  # --batch-size 64 as the first run was given
    assert "pass --batch-size 16 to repeat it" in other.note
    with pytest.raises(Exception, match="names optimizer"):
        choose_recipe("SGD" if r.optimizer == "AdamW" else "AdamW", saved, 16, 424, 20, 7, share)


def test_recipe_is_a_plain_record():
    r = choose_recipe("auto", HYP, 16, 400, 40, 5)
    assert isinstance(r, Recipe) and r.note == ""
    line = r.describe(HYP, 25, 40)
    assert line.startswith("optimizer: AdamW(lr=0.004444, momentum=0.9), the short recipe: from scratch (0% of the")
    assert "; the run sees 16,000 images (400 pictures x 40 epochs); batch 16," in line


@pytest.mark.slow
def test_train_logs_the_recipe_in_one_line(micro, tmp_path, caplog):
    """From a checkpoint of the same model: the fine-tuning recipe, why, and its numbers in the run's one line."""
    import train
    from models.yolo import Model
    from utils.data.data_config import load_data_config
    from utils.engine.checkpoint import atomic_save, make_checkpoint

    names = load_data_config(micro)["names"]
    model = Model("yolov5n.yaml", nc=len(names))
    atomic_save(make_checkpoint(model, model.yaml, list(names), epoch=-1), tmp_path / "w.pt")
    with caplog.at_level(logging.INFO):
        train.run(data=str(micro), weights=str(tmp_path / "w.pt"), epochs=1, imgsz=64, batch_size=8, workers=0,
                  noval=True, noplots=True, project=str(tmp_path), name="ft", device="cpu")
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("optimizer: ")]
    assert line.startswith("optimizer: SGD(lr=0.01, momentum=0.937), the continue recipe: continuing (100% of the "
                           "tensors from --weights)")
    assert "batch 8, 16 images a step" in line and "biases from lr 0" in line and "EMA ramp 2000 steps" in line


def test_the_hyperparameter_page_is_the_table():
    """docs/hyperparameters.md prints utils/hyp.Hyp: a key added to the table without the page fails here."""
    from pathlib import Path

    from utils.hyp import table_markdown

    page = (Path(__file__).resolve().parents[1] / "docs" / "hyperparameters.md").read_text()
    assert table_markdown() in page, "regenerate the table: python -c 'from utils.hyp import table_markdown; print(table_markdown())'"


def test_a_file_without_a_key_trains_its_default_and_the_written_hyp_keeps_the_files_keys(tmp_path):
    """The table's defaults are what a key left out means (augmentations off, the recipe's choice where None), and
    what is written back (hyp.yaml, checkpoints) is the file's own keys, an unknown one included."""
    raw = {k: v for k, v in HYP.as_dict().items() if k not in ("mosaic", "hsv_s")}
    h = check_hyp({**raw, "my_note": 3}, "partial.yaml")
    assert h.mosaic == 0.0 and h.hsv_s == 0.0 and h.ema_tau is None and h.min_steps == 1500 and not h.sets("mosaic")
    assert h.as_dict() == {**raw, "my_note": 3}
    assert choose_recipe("auto", h, 16, 400, 40, 5).ema_tau == choose_recipe("auto", HYP, 16, 400, 40, 5).ema_tau
    with pytest.raises(Exception, match="missing 'lr0'"):
        check_hyp({k: v for k, v in raw.items() if k != "lr0"}, "no-lr0.yaml")
