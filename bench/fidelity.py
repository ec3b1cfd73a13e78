"""The robust-training harness: every default judged over several datasets and seeds.

    python bench/fidelity.py                                   # all datasets, modes fp32 bf16, seeds 0 1 2
    python bench/fidelity.py --datasets paste8 --modes bf16 bf16-biaswarm --seeds 0 1 2
    python bench/fidelity.py --summary                         # the table of what the CSV holds so far
    python bench/fidelity.py --datasets paste8-1k --modes fp32-scale-sqrt --batch-sizes 16 32 64 --epochs 15
    python bench/fidelity.py --datasets paste8 --modes ultralytics --seeds 0 1 2   # a peer, same settings
    python bench/fidelity.py --weights ../shared/weights/yolov5n.pt --datasets rice-pest shapes \
        --modes ft-default yolov5 --epochs 20 60 --seeds 0 1                      # the transfer mode
    python bench/fidelity.py --datasets shapes --modes ft-default --epochs 30 --continue-epochs 30   # train longer
    python bench/fidelity.py --recipe-table                     # the recipe rule's choice over the users' regime

The transfer mode (--weights) fine-tunes every run from one weights file (COCO-trained yolov5n), the yolov5 peer
too, into bench/out/transfer.csv; its summary sets each mode beside YOLOv5 at the same seeds. Sets made of COCO's
own objects (SEEN_BY_COCO) are marked "seen": there the weights have met the objects, so it is not transfer.
The peers (PEERS: YOLOv5 7.0.14, Ultralytics 8.4.190) train with their own defaults from the venv that
../shared/bench/peers.sh builds; they validate every epoch, ours only after the last (see peer_command).

For each (seed, dataset, mode) it trains `python train.py` from scratch in its own process (one at a
time: two runs on 2 cores distort each other's clocks) and appends a row to bench/out/fidelity.csv as
soon as the run ends, so an interrupted pass loses nothing and a rerun skips what is done. Seeds are the
outer loop, so a pass cut short still holds every mode at the same seeds.

Runs train with --noval (validation only after the last epoch, the figure compared), which halves
their time; every mode runs the same way. The summary gives, per dataset and mode, the final
mAP@0.5:0.95 of each seed, their mean, spread (max - min) and worst-to-mean ratio (the issue's stall
rule: >= 0.85), how many of its 3-seed subsets pass that rule and their worst seed's mean (the
expected worst of three runs), the mean wall time, and the training box loss a third of the way in
(a stalled run still sits near its starting value there). diagnostics.csv in each run folder has the
rest. --batch-sizes and --epochs add the two axes of the recipe-scaling study (default: batch 16 and each
dataset's own schedule); the summary then has a row per (dataset, mode, batch, epochs).

A mode is an --amp value plus hyperparameter overrides, so a recipe variant needs no code path of its own.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from utils.data.data_config import SHARED_COCO128, load_data_config  # noqa: E402
from utils.hyp import load_hyp

OUT = ROOT / "bench" / "out"
STALL_RATIO = 0.85  # the issue's no-stall rule: the worst of 3 seeds at >= 0.85 of their mean
COCO128 = SHARED_COCO128 / "coco128.yaml"

SHARED = SHARED_COCO128.parent.parent  # ../shared beside the checkout
# name -> (data YAML, epochs, imgsz[, more train.py arguments]); sizes chosen so a run takes 4 to 15 minutes on 2 cores
DATASETS = {
    "shapes": (ROOT / "data" / "shapes.yaml", 40, 192),
    "paste8": (OUT / "paste8" / "paste8.yaml", 25, 256),
    "paste10n": (OUT / "paste10n" / "paste10n.yaml", 30, 256),  # the robust-training issue's kind of data
    "coco128": (COCO128, 100, 320),  # 80 classes: ours ended at mAP 0.007 (seed 0), too little to compare
    "coco128-person": (OUT / "coco128-person" / "coco128-person.yaml", 100, 320),  # COCO128, person boxes only
    # the scaling study's sets: 1000 training images so that batch 64 still takes 16 steps an epoch, at 128 px
    "paste8-1k": (OUT / "paste8-1k" / "paste8-1k.yaml", 15, 128),
    "paste10n-1k": (OUT / "paste10n-1k" / "paste10n-1k.yaml", 15, 128),
    # the built-in generator at 5,000 training pictures: a fine-tune that YOLOv5's defaults' length (35 epochs at
    # batch 16, 175,000 images seen) sent to AdamW before the recipe rule (docs/recipe.md, "The rule")
    "shapes-5k": (OUT / "shapes-5k" / "shapes-5k.yaml", 35, 128),
    # the long-run study's sets (docs/recipe.md, "Long runs"): 5,000 training pictures, so that 128 epochs are
    # 640,000 images seen, at 64 px, where such a run takes about 45 minutes on one thread
    "paste10n-5k": (OUT / "paste10n-5k" / "paste10n-5k.yaml", 127, 64),
    # its second set: paste8's kind (COCO objects on backgrounds of real photographs, 8 classes) at 5,000 pictures
    "paste8-5k": (OUT / "paste8-5k" / "paste8-5k.yaml", 127, 64),
    # real photographs COCO never held (7 pest classes, 424 / 106 images): the fine-tuning study's set
    "rice-pest": (SHARED / "datasets" / "rice-pest" / "rice-pest.yaml", 20, 320),
}
# sets made of COCO's own objects: COCO-trained weights (--weights) have seen them, so a transfer row on them is
# marked "seen" in the summary (continued training more than transfer)
SEEN_BY_COCO = {"coco128", "coco128-person", "paste8", "paste10n", "paste8-1k", "paste10n-1k", "paste8-5k",
                "paste10n-5k"}
# the peers, trained by the same harness on the same data, epochs, size, batch, seed and --weights (their own
# defaults otherwise): a mode name that is a peer's runs it in the venv ../shared/bench/peers.sh builds (PEER_VENV)
PEER_VENV = Path(os.environ.get("PEER_VENV", "/tmp/peer-venv"))
PEERS = ("yolov5", "ultralytics")
# name -> (--amp, hyperparameter overrides[, more train.py arguments]). Each mode names its settings in full,
# so its rows keep their meaning when a default changes. The default as shipped: "bf16-warm32-lr2-warm6" on
# CPUs with native bf16 (bf16 after FP32 warmup steps), "fp32-lr2-warm6" on others and with --amp off
# (YOLOv5's bias warmup, the EMA ramp scaled to the schedule, AdamW at utils/engine/optim.ADAMW_LR_SCRATCH, warmup
# utils/hyp.py warmup_epochs_adam). The modes measured before that lr became the default pin the lr they ran
# at, half of it (OLD_LR; on every set here but coco128-person, whose one class the cap now bounds), and
# those measured before that warmup pin theirs, 3 epochs (WARM3).
# "-old" is the recipe before the robust-training issue.
WARM3 = {"warmup_epochs_adam": 3.0}  # YOLOv5's warmup, the short recipe's until 2026-12-03
DEFAULT = {"warmup_bias_lr_adam": 0.1, "warmup_epochs_adam": 6.0}  # the shipped recipe, named in full
LR2 = {**DEFAULT, **WARM3}  # "fp32-lr2": the default from 2026-12-02 to 2026-12-03
OLD_LR = {"lr_adam_gain": 0.5, **WARM3}
OLD_DEFAULT = {**OLD_LR, "warmup_bias_lr_adam": 0.1}  # "fp32-biaswarm"'s settings: the one-change modes start here
NO_SCALING = {"lr_batch_power": 0.0, "warmup_max_fraction": 1.0, "min_steps": 0}  # no scaling, no cap
MODES = {
    "fp32": ("off", {**OLD_LR, "warmup_bias_lr_adam": 0.0}),
    "bf16": ("bf16", {**OLD_LR, "warmup_bias_lr_adam": 0.0, "fp32_warmup": 0}),
    "fp32-biaswarm": ("off", OLD_DEFAULT),
    "bf16-biaswarm": ("bf16", {**OLD_DEFAULT, "fp32_warmup": 0}),
    "bf16-warm32": ("bf16", {**OLD_DEFAULT, "fp32_warmup": 1}),  # bf16 after FP32 warmup steps
    "fp32-close10": ("off", OLD_DEFAULT, ["--close-mosaic", "10"]),  # whole images at the end
    "fp32-box1": ("off", {**OLD_DEFAULT, "box": 0.0125}),  # box gain x4 undone
    "fp32-box8": ("off", {**OLD_DEFAULT, "box": 0.1}),  # box gain x8, not x4
    "fp32-cls2": ("off", {**OLD_DEFAULT, "cls": 1.0}),  # the class gain x2
    "fp32-cls05": ("off", {**OLD_DEFAULT, "cls": 0.25}),  # the class gain x0.5
    "fp32-lr2": ("off", LR2),  # the AdamW lr x2 of before: the default from 2026-12-02 to 2026-12-03
    "fp32-noclip": ("off", {**OLD_DEFAULT, "max_grad_norm": 1e9}),  # no gradient clip (10)
    "fp32-anchor3": ("off", {**OLD_DEFAULT, "anchor_t": 3.0}),  # fewer positives (anchor_t 4)
    "fp32-anchor5": ("off", {**OLD_DEFAULT, "anchor_t": 5.0}),  # more positives
    "fp32-warm6": ("off", {**OLD_DEFAULT, "warmup_epochs_adam": 6.0}),  # warmup 6 epochs, not 3
    "fp32-nomomramp": ("off", {**OLD_DEFAULT, "warmup_momentum": 0.9}),  # beta1 0.9 from step 0
    "fp32-tal": ("off", {**OLD_DEFAULT, "assign_topk": 10}),  # 10 best-aligned per target
    "fp32-tal-soft": ("off", {**OLD_DEFAULT, "assign_topk": 10, "assign_soft": 1}),  # + soft targets
    "fp32-cos": ("off", OLD_DEFAULT, ["--cos-lr"]),  # half-cosine LR
    "fp32-obj2": ("off", {**OLD_DEFAULT, "obj": 2.0}),  # the objectness gain x2
    "fp32-obj05": ("off", {**OLD_DEFAULT, "obj": 0.5}),  # the objectness gain x0.5
    "bf16-warm32-close10": ("bf16", {**OLD_DEFAULT, "fp32_warmup": 1}, ["--close-mosaic", "10"]),
    "bf16-ema2000": ("bf16", {**OLD_LR, "warmup_bias_lr_adam": 0.0, "ema_tau": 2000, "fp32_warmup": 0}),
    "bf16-old": ("bf16", {**OLD_DEFAULT, "ema_tau": 2000, "fp32_warmup": 0}),
    "fp32-old": ("off", {**OLD_DEFAULT, "ema_tau": 2000}),
    "bf16-box1": ("bf16", {**OLD_DEFAULT, "box": 0.0125, "fp32_warmup": 0}),  # box gain x4 undone
    "bf16-warm32-lr2": ("bf16", {**LR2, "fp32_warmup": 1}),  # --amp bf16 with today's lr
    "fp32-lr3": ("off", {**LR2, "lr_adam_gain": 1.5}),  # today's lr x1.5 (above the cap where it binds)
    # remedies that act early in the run, where paste8's spread is set (bench/results/seed_fork_paste8.txt)
    "fp32-lr2-warm6": ("off", DEFAULT),  # today's lr, warmup 6 epochs, not 3: the default from 2026-12-03
    "fp32-lr2-bias05": ("off", {**LR2, "warmup_bias_lr_adam": 0.05}),  # biases' warmup from lr 0.05, not 0.1
    "fp32-lr2-clip5": ("off", {**LR2, "max_grad_norm": 5.0}),  # gradients clipped to norm 5, not 10
    "bf16-warm32-lr2-warm6": ("bf16", {**DEFAULT, "fp32_warmup": 1}),  # --amp bf16 as shipped
    # tries for the issue's 1.5x on paste10n, against the shipped recipe
    "fp32-lr2-warm10": ("off", {**DEFAULT, "warmup_epochs_adam": 10.0}),  # warmup 10 epochs, not 6
    "fp32-lr3-warm6": ("off", {**DEFAULT, "lr_adam_gain": 1.5}),  # today's lr x1.5 with the 6-epoch warmup
    # AdamW's decay at 0.05 per unit lr (RTMDet's), not the hyp's 0.0005 scaled to batch 16 (0.000125)
    "fp32-lr2-wd05": ("off", {**DEFAULT, "weight_decay": 0.2}),
    # the recipe across batch sizes and schedules (--batch-sizes, --epochs): lr x (batch/16) ** power, and the
    # warmup at most a quarter of the run's batches. "-none" is the recipe before either (2026-12-03 to 12-04)
    "fp32-scale-none": ("off", {**DEFAULT, **NO_SCALING}),
    "fp32-scale-cap": ("off", {**DEFAULT, **NO_SCALING, "warmup_max_fraction": 0.25}),  # the warmup cap alone
    "fp32-scale-sqrt": ("off", {**DEFAULT, "lr_batch_power": 0.5, "warmup_max_fraction": 0.25}),
    "fp32-scale-lin": ("off", {**DEFAULT, "lr_batch_power": 1.0, "warmup_max_fraction": 0.25}),
    # the floor alone: no lr, beta or EMA scaling; a batch that would leave the run under 450 optimizer steps is
    # lowered (at 15 epochs on 1000 images, 64 -> 32)
    "fp32-scale-floor": ("off", {**DEFAULT, **NO_SCALING, "min_steps": 450}),
    # higher floors: 600 steps (15 epochs on 1000 images: 64 -> 24), 900 (64 -> 16, the batch-16 run's 945 steps)
    "fp32-scale-floor600": ("off", {**DEFAULT, **NO_SCALING, "min_steps": 600}),
    "fp32-scale-floor900": ("off", {**DEFAULT, **NO_SCALING, "min_steps": 900}),
    # 1500 steps: the same as 900 over 15 epochs on 1000 images; over 100 epochs batch 256 -> 64 (1600 steps)
    "fp32-scale-floor1500": ("off", {**DEFAULT, **NO_SCALING, "min_steps": 1500}),
    # the shipped recipe, scaling named in full: the 1500-step floor and the lr x sqrt(batch / 16) where the floor
    # leaves a batch over 16 (long schedules)
    "fp32-scale-sqrt-floor1500": ("off", {**DEFAULT, **NO_SCALING, "lr_batch_power": 0.5, "min_steps": 1500}),
    "fp32-first": ("off", {**OLD_DEFAULT, "ema_tau": 2000, **NO_SCALING}),  # the first recipe (commit 17dd765)
    # the shipped fine-tuning default as a user runs it (no hyp, no --optimizer): the step floor applies to its batch
    "ft-default": ("auto", {}),
    # the fine-tuning recipe without its bias warmup: what the rule's "continue" case does, so a --continue-epochs
    # run under ft-default is this run (shapes seed 1: the same results.csv); kept for continue.csv's seed-0 rows
    "ft-nobias": ("auto", {"warmup_bias_lr": 0.0}),
    "ft-lr001": ("auto", {"lr0": 0.001}),  # a tenth of the lr: a probe of the dip after a continued run's warmup
    "ft-sgd": ("auto", {}, ["--optimizer", "SGD"]),  # YOLOv5's recipe (SGD lr 0.01, 64 images a step, EMA 2000)
    # the fine-tuning recipe (utils/engine/optim.finetune_recipe) spelled out: with --optimizer SGD given, the step
    # floor never lowers its batch, so batch 64 here is batch 64
    "ft-sgd-nbs16": ("auto", {"nbs": 16}, ["--optimizer", "SGD"]),
    "ft-sgd-lr2": ("auto", {"lr0": 0.02}, ["--optimizer", "SGD"]),  # twice YOLOv5's lr
    "ft-sgd-nbs16-lr05": ("auto", {"nbs": 16, "lr0": 0.005}, ["--optimizer", "SGD"]),
    # for longer runs: YOLOv5's medium augmentation (scale 0.9, mixup 0.1: hyp.scratch-med); whole images for the
    # last 10 epochs
    "ft-sgd-nbs16-aug": ("auto", {"nbs": 16, "scale": 0.9, "mixup": 0.1}, ["--optimizer", "SGD"]),
    "ft-sgd-nbs16-close10": ("auto", {"nbs": 16}, ["--optimizer", "SGD", "--close-mosaic", "10"]),
    "ft-sgd-nbs16-freeze10": ("auto", {"nbs": 16}, ["--optimizer", "SGD", "--freeze", "10"]),  # backbone frozen
    "ft-sgd-close5": ("auto", {}, ["--optimizer", "SGD", "--close-mosaic", "5"]),  # the last 5 epochs whole images
    # the peers (PEERS): trained by their own code with their own defaults; the amp value is not used
    "yolov5": ("peer", {}),
    "ultralytics": ("peer", {}),  # its yolov5n is the anchor-free "YOLOv5u": from scratch only (no --weights)
    # where the warp, HSV and flips run (--augment-on), with the from-scratch default as shipped on a CPU with bf16
    # (rice-pest's rows: --weights ../shared/weights/yolov5n.pt --epochs 10, made at commit 30dd08d with the AdamW
    # fine-tuning of the time, hyp finetune_sgd: 0, a key the recipe rule removed)
    "bf16-warm32-lr2-warm6-aughost": ("bf16", {**DEFAULT, "fp32_warmup": 1}, ["--augment-on", "host"]),
    "bf16-warm32-lr2-warm6-augdevice": ("bf16", {**DEFAULT, "fp32_warmup": 1}, ["--augment-on", "device"]),
}
# generated datasets: bench/make_paste_dataset.py arguments
PASTE10N = ["--classes", "10", "--background", "noise", "--scale", "0.10", "0.30", "--objects", "1", "6"]
PASTE_ARGS = {"paste8": [], "paste10n": [*PASTE10N, "--train", "600", "--val", "150"],
              "paste8-1k": ["--train", "1000", "--val", "250"], "paste10n-1k": [*PASTE10N, "--train", "1000", "--val", "250"],
              "paste10n-5k": [*PASTE10N, "--train", "5000", "--val", "500"],
              "paste8-5k": ["--train", "5000", "--val", "500"]}
FIELDS = ("dataset", "mode", "seed", "batch", "epochs", "imgsz", "map50", "map", "box_loss_third", "wall_s",
          "min_obj_bias_p3", "max_positives_per_target", "run")
TRANSFER_FIELDS = (*FIELDS[:6], "weights", "trained_batch", *FIELDS[6:])  # the transfer mode's CSV


def ensure_dataset(name: str) -> Path:
    data, *_ = DATASETS[name]
    if name in PASTE_ARGS and not data.exists():
        from bench.make_paste_dataset import main as make_paste

        make_paste([*PASTE_ARGS[name], "--out", str(data.parent)])
    if name == "shapes-5k" and not data.exists():
        from utils.data.synthetic import generate_shapes

        generate_shapes(data.parent, n_train=5000, n_val=250)
        names = "".join(f"  {i}: {n}\n" for i, n in enumerate(load_data_config(ROOT / "data" / "shapes.yaml")["names"]))
        data.write_text(f"path: {data.parent}\ntrain: images/train\nval: images/val\nnames:\n{names}")
    if name == "coco128-person" and not data.exists():
        person_subset(COCO128.parent, data)
    if not data.exists():
        raise SystemExit(f"{data}: missing; the {name} dataset is not on this machine")
    return data


def person_subset(coco: Path, yaml_file: Path) -> None:
    """COCO128 with only its person boxes (254 of 929): every image kept, other objects left unlabelled.
    The images are copied (7 MB), not linked: the peers resolve links and would read COCO128's own labels."""
    if not (coco / "images" / "train2017").is_dir():
        return
    out = yaml_file.parent
    shutil.copytree(coco / "images" / "train2017", out / "images" / "train2017", dirs_exist_ok=True)
    (out / "labels" / "train2017").mkdir(parents=True, exist_ok=True)
    for f in sorted((coco / "labels" / "train2017").glob("*.txt")):
        rows = [r for r in f.read_text().splitlines() if r.split()[:1] == ["0"]]
        (out / "labels" / "train2017" / f.name).write_text("".join(r + "\n" for r in rows))
    yaml_file.write_text("# COCO128, person boxes only (bench/fidelity.py)\npath: .\ntrain: images/train2017\n"
                         "val: images/train2017\nnames:\n  0: person\n")


def mode_hyp_file(mode: str, runs: Path, name: str) -> tuple[str, Path, list]:
    """A mode's --amp value, its hyp file (the defaults with the mode's overrides, written to runs/name.hyp.yaml)
    and its extra train.py arguments ([] when none)."""
    amp, overrides, *more = MODES[mode]
    runs.mkdir(parents=True, exist_ok=True)
    hyp_file = runs / f"{name}.hyp.yaml"
    hyp_file.write_text(yaml.safe_dump({**load_hyp().as_dict(), **overrides}, sort_keys=False))
    return amp, hyp_file, more[0] if more else []


def run_name(dataset: str, mode: str, seed: int, batch: int = 16, epochs: int | None = None,
             imgsz: int | None = None) -> str:
    """The run folder's name: batch, epochs and size are named only where they differ from the dataset's defaults."""
    _, default_epochs, default_imgsz = DATASETS[dataset]
    extra = ("" if batch == 16 else f"-b{batch}") + ("" if epochs in (None, default_epochs) else f"-e{epochs}")
    extra += "" if imgsz in (None, default_imgsz) else f"-{imgsz}px"
    return f"{dataset}-{mode}{extra}-s{seed}"


def train_once(dataset: str, mode: str, seed: int, runs: Path, threads: int | None = None, batch: int = 16,
               epochs: int | None = None, imgsz: int | None = None, weights: str | None = None,
               val: bool = False, suffix: str = "") -> dict:
    """One run of train.py (or of a peer, PEERS) in its own process; its summary row. val: validate every epoch,
    as the peers do (whole-command times), not only after the last (--noval, the harness's default). suffix: added
    to the run's name (a continuation's "-cont")."""
    data, default_epochs, default_imgsz = DATASETS[dataset]
    epochs, imgsz = epochs or default_epochs, imgsz or default_imgsz
    name = run_name(dataset, mode + ("-val" if val and mode not in PEERS else ""), seed, batch, epochs, imgsz) + suffix
    runs.mkdir(parents=True, exist_ok=True)
    if mode in PEERS:
        cmd, env, results = peer_command(mode, data, epochs, imgsz, batch, seed, weights, runs, name)
    else:
        amp, hyp_file, more = mode_hyp_file(mode, runs, name)
        cmd = [sys.executable, "train.py", "--data", str(data), "--epochs", str(epochs), "--imgsz", str(imgsz),
               "--batch-size", str(batch), "--workers", "2", "--seed", str(seed), "--amp", amp, "--hyp", str(hyp_file),
               *([] if val else ["--noval"]), "--noplots", "--project", str(runs), "--name", name, "--exist-ok", *more,
               *(["--weights", str(weights)] if weights else [])]
        env, results = dict(os.environ), runs / name
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    t0 = time.time()
    with open(runs / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}); see {runs / name}.log")
    wall = time.time() - t0
    row = (summarise_peer(results, dataset, mode, seed, epochs, imgsz, wall) if mode in PEERS
           else summarise_run(results, dataset, mode, seed, epochs, imgsz, wall))
    return {**row, "batch": batch, "weights": Path(weights).name if weights else "",
            "trained_batch": trained_batch(runs / name) if mode not in PEERS else batch}


def summarise_run(run: Path, dataset: str, mode: str, seed: int, epochs: int, imgsz: int, wall: float) -> dict:
    rows = list(csv.DictReader(open(run / "results.csv")))
    diag = list(csv.DictReader(open(run / "diagnostics.csv")))
    third = rows[len(rows) // 3]  # a stalled run still has a high box loss a third of the way in
    return {"dataset": dataset, "mode": mode, "seed": seed, "epochs": epochs, "imgsz": imgsz,
            "map50": float(rows[-1]["metrics/mAP_0.5"]), "map": float(rows[-1]["metrics/mAP_0.5:0.95"]),
            "first_map": float(rows[0]["metrics/mAP_0.5:0.95"] or "nan"),
            "box_loss_third": float(third["train/box_loss"]), "wall_s": round(wall, 1),
            "min_obj_bias_p3": min(float(r["obj_bias_p3"]) for r in diag),
            "max_positives_per_target": max(float(r["positives_per_target"]) for r in diag), "run": str(run)}


def trained_batch(run: Path) -> int:
    """The batch a run trained at (opt.yaml: after the step floor, utils/engine/optim.floor_batch)."""
    return int(yaml.safe_load(open(run / "opt.yaml"))["batch_size"])


def peer_command(peer: str, data: Path, epochs: int, imgsz: int, batch: int, seed: int, weights: str | None,
                 runs: Path, name: str) -> tuple[list[str], dict, Path]:
    """A peer's training on the same run, in ../shared/bench/peers.sh's venv (PEER_VENV), offline, on the CPU, with
    its own defaults otherwise: (command, environment, its run folder). YOLOv5 7.0.14 (hyp.scratch-low, SGD)
    validates every epoch (its --noval fails in 7.0.14: map50s unbound before the last epoch), and so does
    Ultralytics 8.4.190 (amp off, as on a CPU): their wall times here hold validations that ours, with --noval, do
    not, so whole-command times are compared with validation on in both (README, "Against YOLOv5")."""
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python}: missing; build the peers' venv once with bash ../shared/bench/peers.sh "
                         f"(or set PEER_VENV)")
    # the peer resolves a relative `path:` against its working folder: a copy of the data YAML with it absolute
    d = {k: v for k, v in yaml.safe_load(open(data)).items() if k not in ("generate", "defaults")}
    d["path"] = str(load_data_config(data)["path"])  # generated sets (shapes) included
    peer_data = runs / f"{name}.data.yaml"
    peer_data.write_text(yaml.safe_dump(d, sort_keys=False))
    cfg = runs / "peer-config"
    cfg.mkdir(exist_ok=True)
    font = Path(subprocess.check_output([str(python), "-c", "import matplotlib, os; print(os.path.join("
                                         "matplotlib.get_data_path(), 'fonts/ttf/DejaVuSans.ttf'))"], text=True).strip())
    for f in ("Arial.ttf", "Arial.Unicode.ttf"):  # placed, so that plotting never downloads one
        if not (cfg / f).exists():
            shutil.copy(font, cfg / f)
    env = {**os.environ, "YOLOV5_CONFIG_DIR": str(cfg), "YOLO_OFFLINE": "1", "WANDB_MODE": "disabled",
           "COMET_MODE": "disabled", "CLEARML_OFF": "1", "CUDA_VISIBLE_DEVICES": "", "MPLCONFIGDIR": str(cfg / "mpl"),
           "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}  # YOLOv5 pickles whole modules; torch >= 2.6 refuses them
    if peer == "ultralytics":
        if weights:
            raise SystemExit("ultralytics: its yolov5n is anchor-free and cannot take YOLOv5's weights; "
                             "compare fine-tuning with the yolov5 peer")
        env = {**env, "YOLO_CONFIG_DIR": str(cfg / "ul"), "HF_HUB_OFFLINE": "1", "YOLO_AUTOINSTALL": "False"}
        for f in ("Arial.ttf", "Arial.Unicode.ttf"):
            (cfg / "ul" / "Ultralytics").mkdir(parents=True, exist_ok=True)
            if not (cfg / "ul" / "Ultralytics" / f).exists():
                shutil.copy(font, cfg / "ul" / "Ultralytics" / f)
        cmd = [str(PEER_VENV / "bin" / "yolo"), "detect", "train", "model=yolov5n.yaml", f"data={peer_data}",
               f"epochs={epochs}", f"imgsz={imgsz}", f"batch={batch}", "workers=2", f"seed={seed}", "device=cpu",
               "pretrained=False", "plots=False", "amp=False", f"project={runs.resolve()}", f"name={name}",
               "exist_ok=True"]
        return cmd, env, runs / name
    model = ["--weights", str(Path(weights).resolve())] if weights else ["--weights", "", "--cfg", "yolov5n.yaml"]
    cmd = [str(python), "-m", "yolov5.train", *model, "--data", str(peer_data), "--epochs", str(epochs),
           "--batch-size", str(batch), "--imgsz", str(imgsz), "--device", "cpu", "--workers", "2", "--seed", str(seed),
           "--noplots", "--project", str(runs.resolve()), "--name", name, "--exist-ok"]
    return cmd, env, runs / name


def summarise_peer(run: Path, dataset: str, mode: str, seed: int, epochs: int, imgsz: int, wall: float) -> dict:
    """A peer's row from its results.csv (YOLOv5's and Ultralytics' column names)."""
    rows = [{k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(open(run / "results.csv"))]
    third = rows[len(rows) // 3]
    m50, m95 = ("metrics/mAP50(B)", "metrics/mAP50-95(B)") if mode == "ultralytics" else \
        ("metrics/mAP_0.5", "metrics/mAP_0.5:0.95")
    return {"dataset": dataset, "mode": mode, "seed": seed, "epochs": epochs, "imgsz": imgsz,
            "map50": float(rows[-1][m50]), "map": float(rows[-1][m95]),
            "box_loss_third": float(third["train/box_loss"]), "wall_s": round(wall, 1), "min_obj_bias_p3": "",
            "max_positives_per_target": "", "run": str(run)}


def read_results(path: Path) -> list[dict]:
    return list(csv.DictReader(open(path))) if path.exists() else []


def append_result(path: Path, row: dict, fields: tuple[str, ...] = FIELDS) -> None:
    """One row onto a results CSV (the header first when the file is new), written as soon as a run ends; a file
    written before a column was added keeps its own columns."""
    new = not path.exists()
    if not new:
        with open(path, newline="") as f:
            fields = tuple(next(csv.reader(f), fields))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)


def seed_sets(maps: list[float], size: int = 3, ratio: float = STALL_RATIO) -> tuple[int, int, float]:
    """Over every `size`-seed subset of `maps`: how many keep their worst at >= `ratio` of their mean, of
    how many, and the mean of their worst (nan when there are fewer seeds than `size`). A user's three
    seeds are one such subset: these are the stall rule's odds and the expected worst of three, which
    one fixed set (seeds 0-2) only samples. The ratio also falls when one seed is high; the worst is the
    downside alone."""
    sets = list(itertools.combinations(maps, size))
    passing = sum(min(c) >= ratio * statistics.fmean(c) for c in sets)
    return passing, len(sets), statistics.fmean(min(c) for c in sets) if sets else float("nan")


def setting(r: dict) -> str:
    """'' for batch 16 at the dataset's own schedule and size (every row before the scaling study), else ' b64 e15'
    (and ' 640px' where the size is not the dataset's)."""
    batch, epochs, imgsz = int(r.get("batch") or 16), int(r.get("epochs") or 0), int(r.get("imgsz") or 0)
    _, default, default_imgsz = DATASETS.get(r["dataset"], (None, epochs, imgsz))
    size = "" if imgsz in (0, default_imgsz) else f" {imgsz}px"
    return ("" if batch == 16 and epochs in (0, default) else f" b{batch} e{epochs}") + size


def summary(rows: list[dict]) -> str:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["mode"] + setting(r)), []).append(r)
    lines = ["| dataset | mode | final mAP@0.5:0.95 per seed | mean | spread | worst/mean | 3-seed sets passing | "
             "worst of 3, mean | mean wall s | train box loss a third in, per seed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (dataset, mode), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: int(r["seed"]))
        maps = [float(r["map"]) for r in rs]
        mean = statistics.fmean(maps)
        per_seed = ", ".join(f"s{r['seed']} {float(r['map']):.3f}" for r in rs)
        thirds = "/".join(f"{float(r['box_loss_third']):.3f}" for r in rs)
        passing, sets, worst3 = seed_sets(maps)
        three = f"{passing}/{sets} | {worst3:.3f}" if sets else "- | -"
        lines.append(f"| {dataset} | {mode} | {per_seed} | {mean:.3f} | {max(maps) - min(maps):.3f} | "
                     f"{min(maps) / mean if mean else float('nan'):.2f} | {three} | "
                     f"{statistics.fmean(float(r['wall_s']) for r in rs):.0f} | {thirds} |")
    return "\n".join(lines)


def peer_summary(rows: list[dict], peer: str = "yolov5") -> str:
    """The transfer mode's table: per dataset and setting, each mode's final mAP@0.5:0.95 per seed against the peer's
    at the same seeds (mean ratio), and wall time against the peer's; sets COCO's weights have seen are marked."""
    groups: dict[tuple[str, str], dict[str, dict[int, dict]]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], setting(r).strip() or "default"), {}).setdefault(r["mode"], {})[
            int(r["seed"])] = r
    lines = [f"| dataset | setting | mode | trained at batch | final mAP@0.5:0.95 per seed | mean | x {peer} (same seeds) | "
             f"wall s | x {peer} wall |", "|---|---|---|---|---|---|---|---|---|"]
    for (dataset, where), modes in sorted(groups.items()):
        ref = modes.get(peer, {})
        for mode, by_seed in sorted(modes.items(), key=lambda kv: (kv[0] != peer, kv[0])):
            maps = {s: float(r["map"]) for s, r in by_seed.items()}
            common = sorted(set(maps) & set(ref))
            ratio = (statistics.fmean(maps[s] for s in common) / statistics.fmean(float(ref[s]["map"]) for s in common)
                     if common and mode != peer else float("nan"))
            wall = statistics.fmean(float(r["wall_s"]) for r in by_seed.values())
            ref_wall = statistics.fmean(float(ref[s]["wall_s"]) for s in common) if common else float("nan")
            batches = "/".join(sorted({str(r.get("trained_batch") or r.get("batch") or 16) for r in by_seed.values()}))
            lines.append(f"| {dataset}{' (seen)' if dataset in SEEN_BY_COCO else ''} | {where} | {mode} | {batches} | "
                         + ", ".join(f"s{s} {m:.3f}" for s, m in sorted(maps.items()))
                         + f" | {statistics.fmean(maps.values()):.3f} | "
                         + ("-" if ratio != ratio else f"{ratio:.2f}x") + f" | {wall:.0f} | "
                         + ("-" if mode == peer or ref_wall != ref_wall else f"{wall / ref_wall:.2f}x") + " |")
    return "\n".join(lines)


CONTINUE_FIELDS = ("dataset", "mode", "seed", "batch", "imgsz", "epochs", "map", "continue_mode", "continue_epochs",
                   "first_map", "continue_map", "first_ratio", "end_ratio", "run")


def train_longer(first: dict, epochs: int, runs: Path, threads: int | None, batch: int, imgsz: int,
                 modes: list[str]) -> None:
    """'Train longer' as README puts it: a new run of `epochs` from the finished run's last.pt (--weights), validating
    every epoch, for each of `modes` not yet in continue.csv; its first epoch's and last epoch's mAP@0.5:0.95 against
    the first run's final one."""
    last = Path(first["run"]) / "weights" / "last.pt"
    done = {(r["dataset"], r["mode"], r["seed"], r.get("continue_mode") or "ft-default", r["continue_epochs"])
            for r in read_results(OUT / "continue.csv")}
    for mode in modes:
        if (first["dataset"], first["mode"], str(first["seed"]), mode, str(epochs)) in done:
            continue
        row = train_once(first["dataset"], mode, int(first["seed"]), runs, threads, batch, epochs, imgsz, str(last),
                         val=True, suffix=f"-from-{first['mode']}-cont")
        out = {"dataset": first["dataset"], "mode": first["mode"], "seed": first["seed"], "batch": batch,
               "imgsz": imgsz, "epochs": first["epochs"], "map": first["map"], "continue_mode": mode,
               "continue_epochs": epochs, "first_map": row["first_map"], "continue_map": row["map"],
               "first_ratio": round(row["first_map"] / float(first["map"]), 3),
               "end_ratio": round(row["map"] / float(first["map"]), 3), "run": row["run"]}
        append_result(OUT / "continue.csv", out, CONTINUE_FIELDS)
        print(f"{time.strftime('%H:%M:%S')} continued {epochs} epochs ({mode}): first epoch {out['first_map']:.3f} "
              f"({out['first_ratio']}x), last {out['continue_map']:.3f} ({out['end_ratio']}x)", flush=True)


RULE_PICTURES = (500, 1_000, 2_000, 5_000, 20_000, 120_000)
RULE_EPOCHS = (10, 30, 100, 300)
RULE_BATCHES = (8, 16, 64, 128)


def recipe_table(nc: int = 7) -> str:
    """The recipe rule's choice (utils/engine/optim.choose_recipe, the default hyp, --optimizer auto) over the
    users' regime, fine-tune / from scratch in each cell: "ft" is the fine-tuning recipe (SGD), "y5" YOLOv5's (SGD),
    "AdamW" the short recipe from scratch, each with the images it steps over; * where the step floor lowered the
    batch to give the run its steps."""
    from utils.engine.optim import choose_recipe

    hyp = load_hyp()

    def cell(n: int, e: int, b: int, share: float) -> str:
        r = choose_recipe("auto", hyp, b, n, e, nc, share)
        name = {"finetune": "ft", "yolov5": "y5", "short": "AdamW"}[r.kind] + f" {r.batch_size * r.accumulate}"
        return name + ("*" if r.batch_size != b else "")

    lines = ["| pictures | batch | " + " | ".join(f"{e} epochs" for e in RULE_EPOCHS) + " |",
             "|---|---|" + "---|" * len(RULE_EPOCHS)]
    for n, b in itertools.product(RULE_PICTURES, RULE_BATCHES):
        lines.append(f"| {n:,} | {b} | " + " | ".join(f"{cell(n, e, b, 343 / 349)} / {cell(n, e, b, 0.0)}"
                                                       for e in RULE_EPOCHS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--modes", nargs="+", default=["fp32", "bf16"], choices=list(MODES))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[16])
    p.add_argument("--epochs", nargs="+", type=int, default=[0], help="schedules to run (0: each dataset's own)")
    p.add_argument("--imgsz", nargs="+", type=int, default=[0], help="image sizes to run (0: each dataset's own)")
    p.add_argument("--weights", default=None,
                   help="the transfer mode: every run fine-tunes from this file (e.g. ../shared/weights/yolov5n.pt), "
                        "the peers too; results go to bench/out/transfer.csv and the summary sets them beside the peer")
    p.add_argument("--val", action="store_true",
                   help="validate every epoch, as the peers do: for whole-command times (mode rows get ' val')")
    p.add_argument("--csv", default=None, help="default bench/out/fidelity.csv (transfer.csv with --weights)")
    p.add_argument("--runs", default=None, help="default bench/out/fidelity (transfer with --weights)")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for the runs (1 when other work shares the cores: a starved second "
                        "thread makes every op wait; runs then differ from 2-thread runs in rounding only)")
    p.add_argument("--continue-epochs", type=int, default=0,
                   help="'train longer': after each run, a second one of this many epochs from its last.pt "
                        "(--weights last.pt, validating every epoch), into bench/out/continue.csv")
    p.add_argument("--continue-modes", nargs="+", default=["ft-default"], choices=list(MODES),
                   help="the modes of the --continue-epochs runs")
    p.add_argument("--summary", action="store_true", help="only print the table of what the CSV holds")
    p.add_argument("--recipe-table", action="store_true",
                   help="only print the recipe rule's choice over the users' regime (no training; docs/recipe.md)")
    a = p.parse_args(argv)
    if a.recipe_table:
        print(recipe_table())
        return
    kind = "transfer" if a.weights else "fidelity"
    path, runs = Path(a.csv or OUT / f"{kind}.csv"), Path(a.runs or OUT / kind)
    if a.weights and not Path(a.weights).is_file():
        raise SystemExit(f"{a.weights}: missing; the transfer mode needs a weights file (../shared/weights/yolov5n.pt)")
    if not a.summary:
        done = {(r["dataset"], r["mode"] + setting(r), int(r["seed"])) for r in read_results(path)}
        for seed, dataset, epochs, imgsz, batch, mode in itertools.product(a.seeds, a.datasets, a.epochs, a.imgsz,
                                                                           a.batch_sizes, a.modes):
            epochs, imgsz = epochs or DATASETS[dataset][1], imgsz or DATASETS[dataset][2]
            key = {"dataset": dataset, "batch": batch, "epochs": epochs, "imgsz": imgsz}
            name = f"{mode}-val" if a.val and mode not in PEERS else mode  # ours validating every epoch, as peers do
            if (dataset, name + setting(key), seed) in done:
                row = next(r for r in read_results(path) if (r["dataset"], r["mode"] + setting(r), int(r["seed"])) ==
                           (dataset, name + setting(key), seed))
            else:
                ensure_dataset(dataset)
                row = {**train_once(dataset, mode, seed, runs, a.threads, batch, epochs, imgsz, a.weights, a.val),
                       "mode": name}
                append_result(path, row, TRANSFER_FIELDS if a.weights else FIELDS)
                print(f"{time.strftime('%H:%M:%S')} {dataset} {mode}{setting(key)} seed {seed}: mAP@0.5:0.95 "
                      f"{row['map']:.3f} ({row['wall_s']:.0f} s)", flush=True)
            if a.continue_epochs:
                train_longer(row, a.continue_epochs, runs, a.threads, batch, imgsz, a.continue_modes)
    print(peer_summary(read_results(path)) if a.weights else summary(read_results(path)))


if __name__ == "__main__":
    main()
