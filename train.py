"""Train a YOLOv5-architecture detector with native mixed precision.

    python train.py                                   # yolov5n on the built-in shapes dataset
    python train.py --data coco128.yaml --cfg yolov5s.yaml --epochs 100 --imgsz 640
    python train.py --resume                          # continue the latest run exactly
    torchrun --nproc_per_node 2 train.py ...          # DDP (NCCL on CUDA, Gloo on CPU)

The story: set up (options, precision, model, EMA, optimizer, data) -> epochs (train, validate,
log, save) -> finish (strip checkpoints to FP16 EMA, plots). Every concern lives in its own
object: the precision policy (utils/amp.py), the update under AMP (utils/optim.AmpUpdater), the
EMA (utils/ema.py), the checkpoint format (utils/checkpoint.py), the loss (utils/loss.py).
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import csv
import io
import logging
import math
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import test as validator
from utils.autoanchor import check_anchors
from models.yolo import Model, build_model
from utils.amp import AMP_MODES, Precision, amp_check, resolve_precision
from utils.checkpoint import (atomic_save, fp32_state_dict, load_checkpoint, make_checkpoint,
                              remove_stale_temps, strip_checkpoint)
from utils.data_config import load_data_config, load_hyp
from utils.datasets import create_dataloader
from utils.device import select_device
from utils.diagnostics import COLUMNS as DIAGNOSTICS_COLUMNS
from utils.diagnostics import EpochDiagnostics
from utils.dist import DistInfo, barrier, broadcast_flag, de_parallel, destroy, dist_info, init_process_group
from utils.ema import ModelEMA
from utils.errors import UserError, run_cli
from utils.faults import FaultPlan, faults_from_env
from utils.files import REPO_ROOT, RunLock, atomic_write, increment_path, resolve_weights, save_yaml
from utils.files import remove_stale_temps as remove_stale_run_temps
from utils.loss import ComputeLoss, loss_gains
from utils.optim import OPTIMIZERS, AmpUpdater, apply_warmup, build_optimizer, choose_recipe, lr_lambda

LOGGER = logging.getLogger("train")
DEFAULT_DATA = REPO_ROOT / "data" / "shapes.yaml"
DEFAULT_HYP = REPO_ROOT / "data" / "hyps" / "hyp.scratch.yaml"
CSV_COLUMNS = ("epoch", "time", "train/box_loss", "train/obj_loss", "train/cls_loss", "metrics/precision", "metrics/recall",
               "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "val/box_loss", "val/obj_loss", "val/cls_loss",
               "lr0", "lr1", "lr2", "skipped_steps")
MAX_REPLAYS = 3  # reloads of the last good checkpoint after the weights turn non-finite, per epoch
MAX_STRIDE = 32  # largest stride of the P5 models: the training size must be a multiple of it


# ----------------------------------------------------------------------------------------------- options
def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a YOLOv5-architecture detector with native AMP")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="dataset YAML (default: the built-in shapes dataset)")
    p.add_argument("--cfg", default="", help="model YAML, e.g. yolov5s.yaml (default: yolov5n, or the --weights model)")
    p.add_argument("--weights", default="", help="checkpoint of ours to start from ('' = from scratch)")
    p.add_argument("--hyp", default=str(DEFAULT_HYP), help="hyperparameter YAML")
    p.add_argument("--epochs", type=int, default=None, help="default: the dataset's suggestion, else 300")
    p.add_argument("--batch-size", type=int, default=16, help="total over all processes")
    p.add_argument("--imgsz", "--img", "--img-size", type=int, default=None, help="train/val size (default: dataset's, else 640)")
    p.add_argument("--device", default="", help="cpu, 0, or 0,1 (default: first GPU, else CPU)")
    p.add_argument("--workers", type=int, default=8, help="max dataloader workers per process")
    p.add_argument("--amp", default="auto", choices=AMP_MODES,
                   help="auto: fp16 on CUDA, else as utils/amp.py decides; fp16 on a CPU is emulated and slow")
    p.add_argument("--optimizer", default="auto", choices=OPTIMIZERS)
    p.add_argument("--cos-lr", action="store_true", help="cosine LR schedule")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--patience", type=int, default=100, help="stop after this many epochs without improvement")
    p.add_argument("--freeze", type=int, nargs="+", default=[0], help="freeze the first N layers, or the listed layers")
    p.add_argument("--resume", nargs="?", const=True, default=False, help="resume the latest run, or the given last.pt")
    p.add_argument("--nosave", action="store_true", help="only save the final checkpoint")
    p.add_argument("--noval", action="store_true", help="only validate after the final epoch")
    p.add_argument("--noplots", action="store_true")
    p.add_argument("--cache", nargs="?", const="ram", default="auto",
                   help="ram: keep the decoded, resized images in memory; auto (default): do so when they take under "
                        "2 GB and a quarter of the available memory; off")
    p.add_argument("--rect", action="store_true", help="rectangular training batches (no mosaic)")
    p.add_argument("--close-mosaic", type=int, default=0,
                   help="train the last N epochs on whole images, without mosaic (default 0: mosaic to the end)")
    p.add_argument("--noautoanchor", action="store_true", help="keep the model's anchors (no AutoAnchor check)")
    p.add_argument("--single-cls", action="store_true", help="train every class as one")
    p.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm under DDP")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-period", type=int, default=-1, help="also keep epoch{N}.pt every N epochs")
    p.add_argument("--project", default="runs/train")
    p.add_argument("--name", default="exp")
    p.add_argument("--exist-ok", action="store_true")
    return p.parse_args(argv)


def resolve_resume(opt: argparse.Namespace) -> tuple[argparse.Namespace, dict | None]:
    """For --resume: the saved options of that run and its checkpoint; otherwise (opt, None)."""
    if not opt.resume:
        return opt, None
    path = Path(opt.resume) if isinstance(opt.resume, str) else latest_run(opt.project)
    ckpt = load_checkpoint(path)
    if "train" not in ckpt:
        raise UserError(f"{path} is from a finished run (stripped to its EMA weights): nothing to resume; "
                        f"to train further start a new run with --weights {path}")
    if path.parent.name != "weights":
        raise UserError(f"--resume {path}: a run's last.pt lives in <run folder>/weights/; resume it there "
                        f"(the run continues in that folder)")
    saved = argparse.Namespace(**saved_options(ckpt["train"]["opt"], path))
    # the run continues in the folder that holds last.pt, never in a folder named inside the file: a
    # crafted last.pt could otherwise send the output anywhere, past the --name rule of increment_path
    saved.save_dir = str(path.parent.parent)
    saved.resume, saved.device, saved.workers = str(path), opt.device, opt.workers
    return saved, ckpt


RESUME_NEEDS = ("data", "cfg", "weights", "hyp", "epochs", "batch_size", "imgsz", "amp", "optimizer", "seed",
                "single_cls", "rect")  # options no resume can guess: a last.pt without them is refused
SKIP_ON_RESUME = ("resume", "device", "workers", "save_dir")  # taken from the command line or the path


def saved_options(saved: Any, path: Path) -> dict:
    """The options a last.pt saved, checked against this train.py's: the ones a resume needs present, each
    of the type (and among the choices) the command line would give; options newer than the file take
    their defaults. One UserError line naming the first problem."""
    fix = f"use another last.pt, or start a new run with --weights {path}"
    if not isinstance(saved, dict) or not all(isinstance(k, str) for k in saved):
        raise UserError(f"--resume {path}: its saved options are not a mapping of option names; {fix}")
    missing = [k for k in RESUME_NEEDS if k not in saved]
    if missing:
        raise UserError(f"--resume {path}: its saved options lack {', '.join(missing)}; {fix}")
    defaults = vars(parse_opt([]))
    out = dict(defaults)
    for key, default in defaults.items():
        if key in SKIP_ON_RESUME or key not in saved:
            continue
        v = saved[key]
        if default is None or key in ("epochs", "imgsz"):
            ok = v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)
        elif isinstance(default, bool):
            ok = isinstance(v, bool)
        elif isinstance(default, list):
            ok = isinstance(v, list) and len(v) > 0 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        elif isinstance(default, (int, float)):
            ok = isinstance(v, (int, float) if isinstance(default, float) else int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, str)
        ok = ok and (key != "amp" or v in AMP_MODES) and (key != "optimizer" or v in OPTIMIZERS)
        if not ok:
            raise UserError(f"--resume {path}: saved option {key}={str(v)[:60]!r} is not what train.py takes; {fix}")
        out[key] = v
    return out


def latest_run(project: str) -> Path:
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:  # a dangling link, a file removed meanwhile
            return -1.0

    runs = sorted(Path(project).glob("*/weights/last.pt"), key=mtime)
    if not runs:
        raise UserError(f"--resume: no last.pt under {project}/*/weights/; name one with --resume path/to/last.pt")
    return runs[-1]


@dataclass
class Setup:
    """The resolved, fixed configuration of a run: computed once in `setup`, never edited afterwards."""

    opt: argparse.Namespace
    info: DistInfo
    device: torch.device
    data: dict
    hyp: dict
    epochs: int
    imgsz: int
    batch_size: int  # per process
    save_dir: Path
    names: list[str]
    faults: FaultPlan  # test hook (utils/faults.py); no-op unless AMPYOLO_FAULTS is set


def check_options(opt: argparse.Namespace) -> None:
    """Numbers a user can get wrong, refused before anything is built, one line each."""
    rules = ((opt.epochs is None or opt.epochs >= 1, f"--epochs {opt.epochs} must be 1 or more"),
             (opt.batch_size >= 1, f"--batch-size {opt.batch_size} must be 1 or more"),
             (opt.imgsz is None or opt.imgsz >= 1, f"--imgsz {opt.imgsz} must be a positive number of pixels"),
             (opt.workers >= 0, f"--workers {opt.workers} must be 0 or more"),
             (opt.close_mosaic >= 0, f"--close-mosaic {opt.close_mosaic} must be 0 or more"),
             (0 <= opt.label_smoothing < 1, f"--label-smoothing {opt.label_smoothing} must lie in [0, 1)"))
    for ok, message in rules:
        if not ok:
            raise UserError(message)


def round_imgsz(imgsz: int) -> int:
    size = max(math.ceil(imgsz / MAX_STRIDE), 1) * MAX_STRIDE
    if size != imgsz:
        LOGGER.warning(f"warning: --imgsz {imgsz} is not a multiple of the largest stride {MAX_STRIDE}; using {size}")
    return size


def setup(opt: argparse.Namespace, held: contextlib.ExitStack | None = None) -> Setup:
    """Options, process group, data, hyperparameters and the run folder, locked for this run (RunLock) on
    rank 0; `held` releases the lock when the run ends (without it, when the process exits)."""
    check_options(opt)
    info = dist_info()
    device = select_device(opt.device)
    init_process_group(info, device)
    if opt.batch_size % info.world_size:
        raise UserError(f"--batch-size {opt.batch_size} must be a multiple of the {info.world_size} processes")
    data = load_data_config(opt.data)
    hyp = load_hyp(opt.hyp)
    defaults = data.get("defaults") or {}
    epochs = opt.epochs or int(defaults.get("epochs", 300))
    imgsz = round_imgsz(opt.imgsz or int(defaults.get("imgsz", 640)))
    names = ["item"] if opt.single_cls else list(data["names"])
    if opt.resume:
        save_dir = Path(opt.save_dir)
    elif info.is_main:
        save_dir = increment_path(opt.project, opt.name, opt.exist_ok)
    else:
        save_dir = Path(opt.project) / opt.name  # never written by other ranks
    if info.is_main and held is not None:
        held.enter_context(RunLock(save_dir))
    elif info.is_main:
        atexit.register(RunLock(save_dir).acquire().release)
    opt.save_dir, opt.epochs, opt.imgsz = str(save_dir), epochs, imgsz
    return Setup(opt, info, device, data, hyp, epochs, imgsz, opt.batch_size // info.world_size, save_dir, names,
                 faults_from_env())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ----------------------------------------------------------------------------------------------- model
def create_model(s: Setup) -> nn.Module:
    """From --cfg, or from our checkpoint (--weights) for fine-tuning; an nc mismatch re-initialises the head."""
    nc = len(s.names)
    if not s.opt.weights:
        return Model(s.opt.cfg or "yolov5n.yaml", nc=nc)
    path = resolve_weights(s.opt.weights)
    ckpt = load_checkpoint(path)
    model = Model(s.opt.cfg or ckpt["yaml"], nc=nc)
    pretrained = build_model(ckpt, source=path).state_dict()
    own = model.state_dict()
    fits = {k: v for k, v in pretrained.items() if k in own and v.shape == own[k].shape}
    model.load_state_dict(fits, strict=False)
    if len(fits) < len(own):
        LOGGER.info(f"{path}: {ckpt['nc']} classes vs {nc} in the data; {len(own) - len(fits)} tensors (the head) "
                    f"re-initialised, {len(fits)}/{len(own)} transferred")
    else:
        LOGGER.info(f"{path}: all {len(own)} tensors transferred")
    return model


def freeze_layers(model: nn.Module, freeze: list[int]) -> None:
    layers = range(freeze[0]) if len(freeze) == 1 else freeze
    prefixes = tuple(f"model.{i}." for i in layers)
    for k, p in model.named_parameters():
        if k.startswith(prefixes):
            p.requires_grad_(False)


def choose_precision(s: Setup, model: nn.Module) -> Precision:
    """--amp, then the AMP check on the model itself (rank 0 decides for everyone)."""
    precision = resolve_precision(s.opt.amp, s.device)
    if precision.enabled:
        ok = amp_check(model, precision) if s.info.is_main else True
        if not broadcast_flag(ok, s.device):
            LOGGER.warning(f"AMP check failed: {precision.mode} autocast changes this model's outputs; training in FP32")
            return Precision("off", s.device.type)
    LOGGER.info(f"precision: {precision.mode if precision.enabled else 'FP32'} on {s.device}"
                f"{' with GradScaler' if precision.use_scaler else ''}")
    return precision


# ----------------------------------------------------------------------------------------------- training state
@dataclass
class Trainer:
    """The stateful parts of a run. Each has state_dict/load_state_dict, and resume restores all of them."""

    s: Setup
    model: nn.Module  # possibly DDP-wrapped
    ema: ModelEMA
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    updater: AmpUpdater
    precision: Precision
    compute_loss: ComputeLoss
    train_loader: Any
    val_loader: Any
    accumulate: int
    momentum: float
    warmup_bias_lr: float
    diagnostics: EpochDiagnostics
    start_epoch: int = 0
    best_fitness: float = -1.0
    best_epoch: int = -1
    elapsed: float = 0.0  # seconds spent in finished epochs (training, validation, saving), over every process
    clock_mark: float = 0.0  # time.time() when `elapsed` was last brought up to date
    replays: dict[int, int] = field(default_factory=dict)  # epoch -> reloads after non-finite weights

    def train_state(self, epoch: int) -> dict:
        return {
            "model": fp32_state_dict(de_parallel(self.model)),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "updater": self.updater.state_dict(),
            "rng": rng_state(),
            "opt": vars(self.s.opt),
            "hyp": self.s.hyp,
            "best_fitness": self.best_fitness,
            "best_epoch": self.best_epoch,
            "completed_epoch": epoch,
            "elapsed": self.elapsed,
        }

    def load_train_state(self, ckpt: dict) -> None:
        t = ckpt["train"]
        de_parallel(self.model).load_state_dict(t["model"])
        self.ema.load_state_dict(t["ema"])
        self.optimizer.load_state_dict(t["optimizer"])
        self.scheduler.load_state_dict(t["scheduler"])
        self.updater.load_state_dict(t["updater"])
        set_rng_state(t["rng"])
        self.best_fitness, self.best_epoch = t["best_fitness"], t["best_epoch"]
        self.start_epoch = t["completed_epoch"] + 1
        self.elapsed = float(t.get("elapsed", 0.0))

    def weights_finite(self) -> bool:
        """Once per epoch: are the model's and the EMA's weights all finite? (rank 0 decides for all)"""
        params = [*de_parallel(self.model).parameters(), *self.ema.ema.parameters()]
        finite = bool(torch.stack([torch.isfinite(p).all() for p in params]).all())
        return broadcast_flag(finite, self.s.device)


def rng_state() -> dict:
    """Every global RNG, as plain tensors and numbers (checkpoints hold nothing else)."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(keys.astype(np.int64)),
            "numpy_pos": [int(pos), int(has_gauss), float(gauss)], "python": list(random.getstate()[1])}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    pos, has_gauss, gauss = state["numpy_pos"]
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate((3, tuple(state["python"]), None))


def build_trainer(s: Setup, resume_ckpt: dict | None) -> Trainer:
    seed_everything(s.opt.seed)
    # channels_last: oneDNN's fast bf16 convolutions (and cuDNN's tensor-core kernels) want NHWC
    model = create_model(s).to(s.device, memory_format=torch.channels_last)
    prepare_layers(s, model)
    precision = choose_precision(s, model)
    train_loader, val_loader = build_loaders(s, int(model.stride.max()))
    if resume_ckpt is None and not getattr(s.opt, "noautoanchor", False):  # a resumed run keeps last.pt's anchors
        ds = train_loader.dataset
        check_anchors(model, ds.shapes, ds.labels, s.imgsz, s.hyp["anchor_t"], s.opt.seed)
    r = choose_recipe(s.opt.optimizer, s.hyp, s.opt.batch_size, len(train_loader), s.epochs, len(s.names))
    weight_decay = r.weight_decay(s.hyp, s.opt.batch_size)
    optimizer = build_optimizer(model, r.optimizer, r.lr0, r.momentum, weight_decay)
    LOGGER.info(f"optimizer: {r.optimizer}(lr={r.lr0}, momentum={r.momentum}), weight decay {weight_decay:.2e}, "
                f"{r.accumulate} batch(es) of {s.opt.batch_size} per step, bias warmup from lr {r.warmup_bias_lr:g}, "
                f"EMA ramp {r.ema_tau:g} steps; "
                f"loss gains: box x{r.box_gain:g}, class {'x nc/80' if r.cls_by_nc else 'not scaled by class count'}")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(s.epochs, s.hyp["lrf"], s.opt.cos_lr))
    ema = ModelEMA(model, tau=r.ema_tau)  # on every rank (DDP keeps the weights equal); only rank 0's is saved
    model = wrap_distributed(s, model)
    nl = de_parallel(model).model[-1].nl
    gains = loss_gains(s.hyp, nl, len(s.names), s.imgsz, r.cls_by_nc, r.box_gain)
    compute_loss = ComputeLoss(model, gains, s.opt.label_smoothing)
    diagnostics = EpochDiagnostics()
    trainer = Trainer(s, model, ema, optimizer, scheduler,
                      AmpUpdater(model, optimizer, precision, ema, diagnostics=diagnostics), precision, compute_loss,
                      train_loader, val_loader, r.accumulate, r.momentum, r.warmup_bias_lr, diagnostics)
    if resume_ckpt is not None:
        trainer.load_train_state(resume_ckpt)
        LOGGER.info(f"resuming {s.opt.resume} from epoch {trainer.start_epoch} of {s.epochs}")
    LOGGER.info(de_parallel(model).info(s.imgsz))
    return trainer


def prepare_layers(s: Setup, model: nn.Module) -> None:
    """--freeze, and the checks that need the built model."""
    freeze_layers(model, s.opt.freeze)
    if not any(p.requires_grad for p in model.parameters()):
        raise UserError(f"--freeze {' '.join(map(str, s.opt.freeze))} freezes every layer: nothing would train; "
                        f"freeze fewer (e.g. --freeze 10 for the backbone)")
    if s.imgsz % int(model.stride.max()):
        raise UserError(f"--imgsz {s.imgsz} must be a multiple of the model's largest stride {int(model.stride.max())}")


def mosaic_epochs(s: Setup) -> int | None:
    """Epochs below this may use mosaics; the last --close-mosaic ones train on whole images, as at test time."""
    return max(s.epochs - s.opt.close_mosaic, 0) if s.opt.close_mosaic > 0 else None


def build_loaders(s: Setup, stride: int):
    """The augmenting training loader (sharded under DDP) and, on rank 0, the rectangular validation loader."""
    train_loader, _ = create_dataloader(
        s.data["train"], s.imgsz, s.batch_size, stride, hyp=s.hyp, augment=True, rect=s.opt.rect,
        cache=s.opt.cache, workers=s.opt.workers, shuffle=not s.opt.rect, seed=s.opt.seed, single_cls=s.opt.single_cls,
        rank=s.info.rank, world_size=s.info.world_size, prefix="train: ", nc=s.data["nc"], mosaic_epochs=mosaic_epochs(s))
    train_loader.collate_fn = s.faults.wrap_collate(train_loader.collate_fn)
    val_loader = None
    if s.info.is_main:
        val_loader, _ = create_dataloader(
            s.data["val"], s.imgsz, s.batch_size * 2, stride, rect=True, pad=0.5,
            cache=s.opt.cache, workers=s.opt.workers, single_cls=s.opt.single_cls, prefix="val: ", nc=s.data["nc"])
    return train_loader, val_loader


def wrap_distributed(s: Setup, model: nn.Module) -> nn.Module:
    if not s.info.distributed:
        return model
    if s.opt.sync_bn and s.device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    elif s.opt.sync_bn:
        LOGGER.warning("--sync-bn needs CUDA (SyncBatchNorm has no CPU kernel); each process keeps its own BN statistics")
    return nn.parallel.DistributedDataParallel(model, device_ids=[s.device.index] if s.device.type == "cuda" else None)


# ----------------------------------------------------------------------------------------------- one epoch
def train_one_epoch(t: Trainer, epoch: int) -> torch.Tensor:
    """One pass over the training data; returns the mean box/obj/cls loss of the epoch's finite batches."""
    s, model = t.s, t.model
    model.train()
    t.train_loader.sampler.set_epoch(epoch)
    if s.info.is_main and epoch == mosaic_epochs(s) and not s.opt.rect and s.hyp.get("mosaic", 0) > 0:
        LOGGER.info(f"mosaic off from epoch {epoch} (--close-mosaic {s.opt.close_mosaic})")
    nb = len(t.train_loader)
    nw = max(round(s.hyp["warmup_epochs"] * nb), 100)
    lr_factor = t.scheduler.lr_lambdas[0](epoch)
    mloss, counted = torch.zeros(3), 0
    t.diagnostics.reset()
    bar = progress(t.train_loader, s.info.is_main, nb)
    for i, (imgs, targets, _, _) in enumerate(bar):
        ni = i + nb * epoch
        if ni <= nw:
            apply_warmup(t.optimizer, ni, nw, lr_factor, s.hyp, t.momentum, t.warmup_bias_lr)
        imgs = imgs.to(s.device, non_blocking=True, memory_format=torch.channels_last).float() / 255
        with t.precision.autocast():
            loss, items = t.compute_loss(model(imgs), targets.to(s.device))
        loss, items = s.faults.loss(ni, loss, items)
        t.diagnostics.add_batch(t.compute_loss.last_positives, targets.shape[0])
        t.updater.backward(loss * s.info.world_size)  # DDP averages gradients over processes
        if (i + 1) % t.accumulate == 0 or i == nb - 1:  # no gradients cross an epoch boundary: exact resume
            t.updater.step()
        items = items.cpu()
        if torch.isfinite(items).all():
            mloss, counted = (mloss * counted + items) / (counted + 1), counted + 1
        if s.info.is_main:
            bar.set_description(f"{epoch}/{s.epochs - 1} {memory_used(s.device):>6} " + " ".join(f"{x:8.4g}" for x in mloss.tolist())
                                + f" {targets.shape[0]:5d} {imgs.shape[-1]:4d} skipped {t.updater.skipped}")
    return mloss


def memory_used(device: torch.device) -> str:
    """GPU memory reserved by the caching allocator, or the process's peak resident memory on CPU."""
    if device.type == "cuda":
        return f"{torch.cuda.memory_reserved(device) / 2**30:.2f}G"
    import resource

    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f}G"  # ru_maxrss is in KiB on Linux


def progress(loader, enabled: bool, total: int):
    if not enabled:
        return loader
    from tqdm import tqdm

    LOGGER.info(f"{'epoch':>5} {'mem':>6} {'box':>8} {'obj':>8} {'cls':>8} {'targets':>5} {'size':>4}")
    return tqdm(loader, total=total, bar_format="{l_bar}{bar:10}{r_bar}")


def validate(t: Trainer, final: bool) -> validator.ValResult:
    """mAP of the FP32 EMA through test.run's live mode (it never casts the EMA in place)."""
    return validator.run(
        data=t.s.data, model=t.ema.ema, dataloader=t.val_loader, batch_size=t.s.batch_size * 2, imgsz=t.s.imgsz,
        single_cls=t.s.opt.single_cls, plots=final and not t.s.opt.noplots, save_dir=t.s.save_dir,
        compute_loss=t.compute_loss, verbose=final, half=t.precision.eval_half)


# ----------------------------------------------------------------------------------------------- logging and saving
def log_epoch(t: Trainer, epoch: int, mloss: torch.Tensor, result: validator.ValResult | None, lrs: list[float]) -> None:
    """results.csv and diagnostics.csv (utils/diagnostics.py) get the epoch's row."""
    vloss = result.loss.tolist() if result is not None and result.loss is not None else [float("nan")] * 3
    metrics = [result.mp, result.mr, result.map50, result.map] if result is not None else [float("nan")] * 4
    row = [epoch, round(t.elapsed, 2), *mloss.tolist(), *metrics, *vloss, *lrs, t.updater.skipped]
    append_csv(t, "results.csv", CSV_COLUMNS, row)
    append_csv(t, "diagnostics.csv", DIAGNOSTICS_COLUMNS, t.diagnostics.row(epoch, de_parallel(t.model)))


def append_csv(t: Trainer, name: str, columns: tuple[str, ...], row: list) -> None:
    """One row of a per-epoch CSV in the run folder (the header first if the file is new)."""
    path = t.s.save_dir / name
    new = not path.exists()
    try:
        with open(path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(columns)
            w.writerow([f"{x:.6g}" if isinstance(x, float) else x for x in row])
    except OSError as e:
        raise UserError(f"could not write {path}: {e.strerror or e}; free disk space, then continue with "
                        f"python train.py --resume {t.s.save_dir / 'weights' / 'last.pt'}") from None


def results_rows(path: Path, clock: bool = True) -> list[list[str]]:
    """results.csv as rows, header first; clock=False leaves out the wall-clock column, the one column in
    which two runs of the same training (one interrupted and resumed, say) differ."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    drop = CSV_COLUMNS.index("time")
    return rows if clock else [r[:drop] + r[drop + 1:] for r in rows]


def truncate_results(path: Path, last_epoch: int) -> None:
    """On resume, drop rows of epochs after the checkpoint (written before a kill, then redone), and a
    row cut short by a kill. Rewritten atomically: a kill during the rewrite loses no row."""
    if not path.exists():
        return
    rows = results_rows(path)
    keep = rows[:1] + [r for r in rows[1:] if len(r) == len(rows[0]) and r[0].isdigit() and int(r[0]) <= last_epoch]
    if keep == rows:
        return
    text = io.StringIO(newline="")
    csv.writer(text).writerows(keep)
    atomic_write(path, lambda f: f.write(text.getvalue().encode("utf-8")))


def save_checkpoints(t: Trainer, epoch: int, result: validator.ValResult | None, improved: bool) -> None:
    s = t.s
    wdir = s.save_dir / "weights"
    metrics = {} if result is None else {"precision": result.mp, "recall": result.mr, "mAP_0.5": result.map50,
                                         "mAP_0.5:0.95": result.map, "fitness": result.fitness}
    yaml = de_parallel(t.model).yaml
    final = epoch == s.epochs - 1
    if s.opt.nosave and not final:
        return
    hook = s.faults.before_replace
    # best.pt first: a kill between the two leaves last.pt one epoch behind, so the resumed run redoes
    # this epoch and writes best.pt again; the other order could leave a best.pt that is never rewritten
    if improved or not (wdir / "best.pt").exists():
        atomic_save(make_checkpoint(t.ema.ema, yaml, s.names, epoch, metrics), wdir / "best.pt", hook)
    atomic_save(make_checkpoint(t.ema.ema, yaml, s.names, epoch, metrics, t.train_state(epoch)), wdir / "last.pt", hook)
    if s.opt.save_period > 0 and (epoch + 1) % s.opt.save_period == 0:
        atomic_save(make_checkpoint(t.ema.ema, yaml, s.names, epoch, metrics), wdir / f"epoch{epoch}.pt", hook)


def save_run_config(s: Setup) -> None:
    (s.save_dir / "weights").mkdir(parents=True, exist_ok=True)
    save_yaml(vars(s.opt), s.save_dir / "opt.yaml")
    save_yaml(s.hyp, s.save_dir / "hyp.yaml")


# ----------------------------------------------------------------------------------------------- the story
@dataclass
class Outcome:
    """What a run leaves: its folder, the final FP32 EMA (for callers that keep training in-process),
    and how it ended."""

    save_dir: Path
    ema: nn.Module
    best_fitness: float
    interrupted: bool = False


def train(opt: argparse.Namespace) -> Outcome:
    # from here on SIGTERM is a Ctrl-C: a clean stop that keeps last.pt; `held` releases the run folder's lock
    with stop_on_sigterm(), contextlib.ExitStack() as held:
        opt, resume_ckpt = resolve_resume(opt)
        s = setup(opt, held)
        t = build_trainer(s, resume_ckpt)
        if s.info.is_main:
            prepare_run_folder(t, fresh=resume_ckpt is None)
        LOGGER.info(f"training {s.epochs} epochs at {s.imgsz}px, results in {s.save_dir}")
        last = s.save_dir / "weights" / "last.pt"
        try:
            run_epochs(t)
        except KeyboardInterrupt:
            LOGGER.info(f"interrupted: {last} holds the last finished epoch; continue with: "
                        f"python train.py --resume {last}")
            destroy()
            return Outcome(s.save_dir, t.ema.ema, t.best_fitness, interrupted=True)
        except (RuntimeError, UserError) as e:
            failure = data_failure(e, last)
            if failure is None:
                raise
            raise failure from None
        if s.info.is_main:
            finish(t)
    destroy()
    return Outcome(s.save_dir, t.ema.ema, t.best_fitness)


def prepare_run_folder(t: Trainer, fresh: bool) -> None:
    """Options beside the run; on resume, clear what a killed process left half-done; a fresh run saves
    its initial state, so an interrupt in epoch 0 leaves a resumable last.pt (and a replay has a start)."""
    s = t.s
    save_run_config(s)
    for name in ("results.csv", "diagnostics.csv"):
        truncate_results(s.save_dir / name, t.start_epoch - 1)
    for p in remove_stale_temps(s.save_dir / "weights"):
        LOGGER.info(f"removed {p}: a checkpoint write cut short by the previous process")
    for p in remove_stale_run_temps(s.save_dir, ("opt.yaml", "hyp.yaml", "results.csv", "diagnostics.csv")):
        LOGGER.info(f"removed {p}: a write cut short by the previous process")  # the folder is ours: RunLock
    if fresh:
        atomic_save(make_checkpoint(t.ema.ema, de_parallel(t.model).yaml, s.names, -1, {}, t.train_state(-1)),
                    s.save_dir / "weights" / "last.pt", s.faults.before_replace)


def run_epochs(t: Trainer) -> None:
    s, epoch = t.s, t.start_epoch
    t.clock_mark = time.time()
    while epoch < s.epochs:
        t0 = time.time()
        mloss = train_one_epoch(t, epoch)
        s.faults.epoch_end(epoch, de_parallel(t.model))
        if not t.weights_finite():
            epoch = replay_from_last_good(t, epoch)
            continue
        lrs = [g["lr"] for g in t.optimizer.param_groups]
        t.scheduler.step()
        stop = end_epoch(t, epoch, mloss, lrs, t0) if s.info.is_main else False
        if broadcast_flag(stop, s.device):
            break
        barrier()
        epoch += 1


def end_epoch(t: Trainer, epoch: int, mloss: torch.Tensor, lrs: list[float], t0: float) -> bool:
    """Rank 0, after an epoch: validate, log, save. Returns True to stop early."""
    s = t.s
    final = epoch == s.epochs - 1
    result = validate(t, final) if (not s.opt.noval or final) else None
    fitness = result.fitness if result is not None else -1.0
    improved = fitness > t.best_fitness
    if improved:
        t.best_fitness, t.best_epoch = fitness, epoch
    # the clock runs from the previous update: an epoch's checkpoint writes count in the next epoch's time
    now = time.time()
    t.elapsed, t.clock_mark = t.elapsed + now - t.clock_mark, now
    log_epoch(t, epoch, mloss, result, lrs)
    save_checkpoints(t, epoch, result, improved)
    stop = epoch - t.best_epoch >= s.opt.patience and result is not None
    LOGGER.info(f"epoch {epoch} done in {time.time() - t0:.1f}s" +
                (f", mAP@0.5 {result.map50:.3f} mAP@0.5:0.95 {result.map:.3f}" if result else ""))
    if stop:
        LOGGER.info(f"early stop: no improvement for {s.opt.patience} epochs (best: epoch {t.best_epoch})")
    return stop


def replay_from_last_good(t: Trainer, epoch: int) -> int:
    """The weights turned non-finite in `epoch`: reload the training state of last.pt (the last good
    epoch, or the initial state) and return the epoch to continue from. After MAX_REPLAYS reloads for
    the same epoch the run stops with a clear message; last.pt is never overwritten with bad weights."""
    last = [str(t.s.save_dir / "weights" / "last.pt")]
    if t.s.info.distributed:  # other ranks do not know the incremented run folder
        torch.distributed.broadcast_object_list(last, src=0)
    last = Path(last[0])
    t.replays[epoch] = t.replays.get(epoch, 0) + 1
    if t.replays[epoch] > MAX_REPLAYS:
        raise UserError(f"the weights became non-finite (NaN/inf) in epoch {epoch} again after {MAX_REPLAYS} reloads "
                        f"of {last}; training stopped. Lower lr0 in {t.s.opt.hyp} or train with --amp off; "
                        f"{last} still holds the last good epoch")
    LOGGER.warning(f"warning: the weights became non-finite (NaN/inf) in epoch {epoch}; reloading {last} and "
                   f"replaying from there (reload {t.replays[epoch]} of at most {MAX_REPLAYS})")
    t.load_train_state(load_checkpoint(last))
    if t.s.info.is_main:
        for name in ("results.csv", "diagnostics.csv"):
            truncate_results(t.s.save_dir / name, t.start_epoch - 1)
    return t.start_epoch


def data_failure(e: Exception, last: Path) -> UserError | None:
    """A DataLoader failure (a worker killed or crashed, a timeout, an error raised inside a worker) as one
    line saying how to continue; None for any other error."""
    text = str(e)
    if "DataLoader" not in text:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # an error raised in a worker arrives as 'Caught X in DataLoader worker N' + its traceback: keep its last line
    cause = lines[-1].split(": ", 1)[-1] if "Traceback" in text else lines[0]
    return UserError(f"training stopped, the data loader failed: {cause.rstrip('.')}; {last} holds the last "
                     f"finished epoch: fix the cause, then continue with python train.py --resume {last}")


def finish(t: Trainer) -> None:
    """Strip both checkpoints to the FP16 EMA and plot the results."""
    wdir = t.s.save_dir / "weights"
    for f in ("last.pt", "best.pt"):
        if (wdir / f).exists():
            strip_checkpoint(wdir / f)
    if not t.s.opt.noplots and (t.s.save_dir / "results.csv").exists():
        from utils.plots import plot_results

        plot_results(t.s.save_dir / "results.csv")
    LOGGER.info(f"done: best epoch {t.best_epoch} (fitness {t.best_fitness:.4f}); weights in {wdir}")


class stop_on_sigterm:
    """SIGTERM behaves like Ctrl-C: training stops and last.pt stays resumable."""

    def __enter__(self):
        self._old = signal.getsignal(signal.SIGTERM)
        try:
            signal.signal(signal.SIGTERM, self._raise)
        except ValueError:  # not the main thread
            self._old = None
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False


def run(**kwargs) -> Outcome:
    """Programmatic entry with the CLI's defaults: train.run(data='data/shapes.yaml', epochs=3, imgsz=128)."""
    opt = parse_opt([])
    for k, v in kwargs.items():
        if not hasattr(opt, k):
            raise TypeError(f"unknown option {k}")
        setattr(opt, k, v)
    return train(opt)


def main(argv: list[str] | None = None) -> None:
    train(parse_opt(argv))


if __name__ == "__main__":
    run_cli(main)
