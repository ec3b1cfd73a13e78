"""The training recipe (one rule: choose_recipe), the optimizer, its schedule and warmup. docs/recipe.md has the
measurements behind every number here, and the rule's table; utils/engine/updater.py performs the update."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from utils.errors import UserError
from utils.hyp import DEFAULT_HYP_FILE, Hyp

OPTIMIZERS = ("auto", "SGD", "Adam", "AdamW")
# the rule's one threshold (choose_recipe)
PRETRAINED_SHARE = 0.5  # a run with at least this share of its tensors from --weights is a fine-tune
NOMINAL_BATCH = 64  # YOLOv5's recipe sums gradients over this many images a step (hyp nbs)
FINETUNE_BATCH = 16  # the fine-tuning recipe steps every this many images (or every batch, if larger)
MIN_STEPS = Hyp.min_steps  # the short recipes' floor on optimizer steps (floor_batch)
MAX_GRAD_NORM = Hyp.max_grad_norm  # the clip before each step (YOLOv5's and Ultralytics')
EMA_TAU = 2000.0  # YOLOv5's EMA ramp, in optimizer steps
MIN_WARMUP_STEPS = 100  # YOLOv5's floor on warmup batches, for datasets of few batches
# the short AdamW recipe from scratch: lr BASE * 5 / (4 + nc), at most the built-in set's (5 classes); 6 epochs of
# warmup; its lr grows as (batch / 16) ** (hyp lr_batch_power) up to batch 64
ADAMW_LR_SCRATCH = 0.008
ADAMW_LR_MAX = ADAMW_LR_SCRATCH * 5 / 9
ADAMW_NOMINAL_BATCH = 16
LR_SCALE_MAX_BATCH = 64


@dataclass(frozen=True)
class Recipe:
    """What choose_recipe decided: the optimizer and its numbers, the batch the run trains at, and why."""

    kind: str  # auto's "short" (AdamW), "finetune", "continue"; "explicit" (--optimizer); "settled" (hyp.yaml)
    why: str  # the inputs that decided it, for the log line
    optimizer: str
    lr0: float
    momentum: float
    batch_size: int  # the batch the run trains at (floor_batch may lower the one given)
    accumulate: int  # batches whose gradients are summed into one optimizer step
    nbs: float  # images per step the hyp's weight_decay is stated for
    warmup_epochs: float
    warmup_bias_lr: float  # the biases' lr at the first warmup step (it then falls to the scheduled lr)
    ema_tau: float  # optimizer steps over which the EMA's decay ramps up (utils/engine/ema.ModelEMA)
    box_gain: float = 1.0  # multiplies the hyp's box loss gain
    cls_by_nc: bool = True  # scale the class loss gain by nc/80 (utils/engine/loss.loss_gains)
    warmup_max_fraction: float = 1.0  # the warmup's longest, as a share of the run's batches
    max_grad_norm: float = MAX_GRAD_NORM
    note: str = ""  # a warning the log gives beside the recipe's line ("" when none)

    def warmup_steps(self, batches_per_epoch: int, epochs: int) -> int:
        """Batches of warmup: warmup_epochs of them, at least MIN_WARMUP_STEPS, at most warmup_max_fraction of the
        run (by default all of it: a run shorter than its warmup ends warming up)."""
        wanted = max(round(self.warmup_epochs * batches_per_epoch), MIN_WARMUP_STEPS)
        return min(wanted, math.ceil(self.warmup_max_fraction * batches_per_epoch * epochs))

    def weight_decay(self, hyp: Hyp) -> float:
        """The hyp's decay, stated per step of `nbs` images, scaled to the images this recipe steps over."""
        return hyp.weight_decay * self.batch_size * self.accumulate / self.nbs

    def describe(self, hyp: Hyp, batches_per_epoch: int, epochs: int) -> str:
        """The run's one log line: the optimizer (scripts read 'optimizer: NAME('), why, and its numbers."""
        return (f"optimizer: {self.optimizer}(lr={self.lr0:g}, momentum={self.momentum:g}), the {self.kind} recipe: "
                f"{self.why}; batch {self.batch_size}, {self.accumulate * self.batch_size} images a step, weight decay "
                f"{self.weight_decay(hyp):.2e}, warmup {self.warmup_steps(batches_per_epoch, epochs)} batches with the "
                f"biases from lr {self.warmup_bias_lr:g}, EMA ramp {self.ema_tau:g} steps, loss gains box x{self.box_gain:g} and class "
                f"{'x nc/80' if self.cls_by_nc else 'unscaled'}")


def choose_recipe(name: str, hyp: Hyp, batch_size: int, n_images: int, epochs: int, nc: int,
                  transferred: float = 0.0, processes: int = 1) -> Recipe:
    """The one rule. From what the run is: the share of its tensors that came from --weights (`transferred`), never
    from its length or how the batch is accounted:

      a hyp that names its optimizer (a run's hyp.yaml)    -> its numbers as they stand ("settled")
      --optimizer SGD/Adam/AdamW                           -> YOLOv5's recipe with that optimizer ("explicit")
      PRETRAINED_SHARE of the tensors or more              -> SGD, a step every 16 images ("finetune"; "continue"
                                                              when every tensor came, the biases warm up from 0)
      from scratch                                         -> AdamW ("short")

    No length hands a run to another recipe: the switch to YOLOv5's at 640,000 images seen cost a third of the mAP
    two epochs past it (docs/recipe.md, "Long runs"). The recipes step every batch, so a batch that would leave a
    run under MIN_STEPS steps is lowered (floor_batch). docs/recipe.md ("The rule") prints the choice over the
    users' regime."""
    seen = n_images * epochs
    if hyp.optimizer is not None:
        if name not in ("auto", hyp.optimizer):
            raise UserError(f"--optimizer {name}: the hyperparameter file names optimizer {hyp.optimizer} (a run's "
                            f"resolved hyp.yaml); drop --optimizer, or start from {DEFAULT_HYP_FILE}")
        return settled_recipe(hyp, batch_size)
    share = f"{transferred:.0%} of the tensors from --weights"
    images = f"sees {seen:,} images ({n_images:,} pictures x {epochs} epochs)"
    pretrained = transferred >= PRETRAINED_SHARE
    if name != "auto":
        return yolov5_recipe(name, hyp, batch_size, "explicit", f"--optimizer {name} ({share})", pretrained)
    what = "continuing" if transferred == 1.0 else "fine-tuning" if pretrained else "from scratch"
    why = f"{what} ({share}); the run {images}"
    batch = floor_batch(hyp, batch_size, n_images, epochs, processes)
    if batch != batch_size:
        why += f"; the step floor lowers batch {batch_size} ({epochs * math.ceil(n_images / batch_size):,} steps, " \
               f"under min_steps {hyp.min_steps:,}) to {batch}"
    if pretrained:
        return finetune_recipe(hyp, batch, why, continuing=transferred == 1.0)
    return short_recipe(hyp, batch, math.ceil(n_images / batch) * epochs, nc, why)


def floor_batch(hyp: Hyp, batch_size: int, n_images: int, epochs: int, processes: int = 1) -> int:
    """A batch over 16 that would give a short run fewer than hyp min_steps optimizer steps, lowered until it gets
    them (to a multiple of 8 and of the processes, never under 16): AdamW's step moves the weights by about its lr
    whatever the batch, and SGD fine-tuning lost as much at batch 64 over 20 epochs (docs/recipe.md)."""
    min_steps = hyp.min_steps
    if not min_steps or batch_size <= ADAMW_NOMINAL_BATCH or epochs * math.ceil(n_images / batch_size) >= min_steps:
        return batch_size
    step = math.lcm(8, processes)
    cap = n_images * epochs // min_steps // step * step
    return min(batch_size, max(cap, math.ceil(ADAMW_NOMINAL_BATCH / step) * step))


def short_recipe(hyp: Hyp, batch: int, steps: int, nc: int, why: str) -> Recipe:
    """AdamW, a step per batch, for short runs from scratch: lr 0.008 x 5/(4 + nc) (fewer classes take a larger
    step) times hyp lr_adam_gain, growing as the square root of the batch over 16 up to batch 64; the box loss x4
    and the class loss unscaled by nc/80 (AdamW sees only the gains' ratios); a 6-epoch warmup; an EMA ramp a
    quarter of the run's steps (YOLOv5's 2000 would leave a 625-step run's EMA at decay 0.27)."""
    lr = min(ADAMW_LR_SCRATCH * 5 / (4 + nc), ADAMW_LR_MAX) * hyp.lr_adam_gain
    lr *= (min(max(batch, ADAMW_NOMINAL_BATCH), LR_SCALE_MAX_BATCH) / ADAMW_NOMINAL_BATCH) ** hyp.lr_batch_power
    return Recipe("short", why, "AdamW", round(lr, 6), 0.9, batch, 1, NOMINAL_BATCH, hyp.warmup_epochs_adam,
                  _or(hyp.warmup_bias_lr_adam, hyp.warmup_bias_lr), _or(hyp.ema_tau, ema_tau_for(steps)),
                  box_gain=4.0, cls_by_nc=_or(hyp.cls_by_nc, False), **_common(hyp))


def finetune_recipe(hyp: Hyp, batch: int, why: str, continuing: bool = False) -> Recipe:
    """YOLOv5's SGD (hyp lr0, momentum, 3-epoch warmup with the biases from 0.1, loss gains, EMA ramp) stepping every
    16 images instead of 64: SGD moves each weight in proportion to its gradient, so the transferred layers move
    little while the new head learns; the summed loss makes a larger batch's step larger in proportion.
    `continuing`: every tensor came from the file, the class outputs too (a finished run trained longer with
    --weights last.pt): the biases are trained already and warm up from 0 like the rest, as the 0.1 kick cost the
    first epochs (docs/recipe.md, "Train longer")."""
    accumulate = max(round(FINETUNE_BATCH / batch), 1)
    bias_lr = 0.0 if continuing else hyp.warmup_bias_lr
    return Recipe("continue" if continuing else "finetune", why, "SGD", hyp.lr0, hyp.momentum, batch,
                  accumulate, FINETUNE_BATCH, hyp.warmup_epochs, bias_lr, _or(hyp.ema_tau, EMA_TAU),
                  cls_by_nc=_or(hyp.cls_by_nc, True), **_common(hyp))


def yolov5_recipe(name: str, hyp: Hyp, batch: int, kind: str, why: str, pretrained: bool) -> Recipe:
    """YOLOv5's recipe with optimizer `name`: the hyp's lr0, momentum and warmup, gradients summed to nbs (64) images.
    Adam and AdamW start the biases' warmup at warmup_bias_lr_adam (else 0 from --weights, as a kick of 0.1 under
    Adam undid trained weights, and the hyp's 0.1 from scratch)."""
    adam = name in ("Adam", "AdamW")
    bias_lr = _or(hyp.warmup_bias_lr_adam, 0.0 if pretrained else hyp.warmup_bias_lr) if adam else hyp.warmup_bias_lr
    note = (f"warning: --optimizer {name} trains at the hyp's lr0 {hyp.lr0:g}, made for SGD; Adam-style "
            f"optimizers want about a tenth of it (set lr0 in a --hyp file), or drop --optimizer for the recipe "
            f"made for this run") if adam and hyp.lr0 >= 0.005 else ""
    return Recipe(kind, why, name, hyp.lr0, hyp.momentum, batch, max(round(hyp.nbs / batch), 1), hyp.nbs,
                  hyp.warmup_epochs, bias_lr, _or(hyp.ema_tau, EMA_TAU), cls_by_nc=_or(hyp.cls_by_nc, True), note=note,
                  **_common(hyp))


def _common(hyp: Hyp) -> dict:
    return {"warmup_max_fraction": hyp.warmup_max_fraction, "max_grad_norm": hyp.max_grad_norm}


def _or(value, recipe_default):
    """A hyperparameter the file may leave to the recipe (None in utils/hyp.Hyp): the file's, else the recipe's."""
    return recipe_default if value is None else value


def ema_tau_for(steps: int) -> float:
    """YOLOv5's ramp of 2000 steps, or a quarter of the run's steps if shorter: every run's EMA then ends at decay
    0.98 (an average over its last ~55 steps), whatever its length."""
    return min(EMA_TAU, max(steps, 1) / 4)


# ----------------------------------------------------------------------------------------------- hyp.yaml
# what resolved_hyp writes in place of the inputs that steered the choice
RECIPE_INPUTS = ("lr_adam_gain", "warmup_epochs_adam", "warmup_bias_lr_adam", "lr_batch_power", "min_steps")


def resolved_hyp(hyp: Hyp, r: Recipe) -> dict:
    """The hyperparameters as the run used them, for its hyp.yaml: the recipe's numbers in place of its inputs, the
    weight decay per optimizer step and `nbs`, the images a step. choose_recipe takes a hyp that names its
    `optimizer` as settled, so `--hyp <run>/hyp.yaml` trains with exactly these numbers again."""
    out = {k: v for k, v in hyp.as_dict().items() if k not in RECIPE_INPUTS}
    out.update(optimizer=r.optimizer, lr0=r.lr0, momentum=r.momentum, weight_decay=r.weight_decay(hyp),
               nbs=r.batch_size * r.accumulate, warmup_epochs=r.warmup_epochs, warmup_bias_lr=r.warmup_bias_lr,
               warmup_max_fraction=r.warmup_max_fraction, ema_tau=r.ema_tau, max_grad_norm=r.max_grad_norm,
               box=hyp.box * r.box_gain, cls_by_nc=int(r.cls_by_nc))
    return out


def settled_recipe(hyp: Hyp, batch_size: int) -> Recipe:
    """The recipe a resolved hyp records, as it stands; a note when this batch cannot step over its images."""
    nbs = hyp.nbs
    accumulate = max(round(nbs / batch_size), 1)
    note = "" if batch_size * accumulate == nbs else (
        f"warning: the hyperparameter file's numbers are for a step of {nbs:g} images (nbs: the batch its run trained "
        f"at); at --batch-size {batch_size} this run steps every {batch_size * accumulate}, so it does not repeat "
        f"that run: pass --batch-size {nbs:g} to repeat it")
    return Recipe("settled", f"the hyperparameter file names its optimizer (a run's hyp.yaml; start from "
                             f"{DEFAULT_HYP_FILE} for the rule's own choice)", hyp.optimizer, hyp.lr0,
                  hyp.momentum, batch_size, accumulate, nbs, hyp.warmup_epochs, hyp.warmup_bias_lr,
                  _or(hyp.ema_tau, EMA_TAU), cls_by_nc=_or(hyp.cls_by_nc, True), note=note, **_common(hyp))


# ----------------------------------------------------------------------------------------------- the optimizer
def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float,
                    fused: bool = False) -> torch.optim.Optimizer:
    """Three parameter groups: 0 weights with decay, 1 normalisation weights (no decay), 2 biases (no decay).
    fused: one kernel for the whole update (train.py asks for it on CUDA), which also takes a skip flag on the
    device (utils/engine/updater.AmpUpdater); elsewhere PyTorch's default implementation."""
    groups: list[list[nn.Parameter]] = [[], [], []]
    norm_types = tuple(v for k, v in nn.__dict__.items() if "Norm" in k and isinstance(v, type))
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if p.requires_grad:
                groups[2 if pname == "bias" else 1 if isinstance(module, norm_types) else 0].append(p)
    param_groups = [{"params": params, "weight_decay": weight_decay if kind == 0 else 0.0}
                    for kind, params in enumerate(groups)]
    extra = {"fused": True} if fused else {}
    if name == "SGD":
        return torch.optim.SGD(param_groups, lr=lr, momentum=momentum, nesterov=True, **extra)
    if name in ("Adam", "AdamW"):
        cls = torch.optim.Adam if name == "Adam" else torch.optim.AdamW
        return cls(param_groups, lr=lr, betas=(momentum, 0.999), **extra)
    raise ValueError(f"unknown optimizer {name}")


def lr_lambda(epochs: int, lrf: float, cosine: bool) -> Callable[[int], float]:
    """LR factor per epoch: from 1 down to lrf, linearly or along a half cosine."""
    if cosine:
        return lambda e: ((1 - math.cos(e * math.pi / epochs)) / 2) * (lrf - 1) + 1
    return lambda e: (1 - e / epochs) * (1.0 - lrf) + lrf


def apply_warmup(optimizer: torch.optim.Optimizer, ni: int, nw: int, lr_factor: float, hyp: Hyp,
                 momentum: float, bias_lr: float) -> None:
    """Iteration ni of nw warmup iterations: LRs ramp up from 0 (the biases, group 2, from bias_lr) to their
    scheduled value, and momentum (Adam's beta1) from hyp warmup_momentum to its final value."""
    m = float(np.interp(ni, [0, nw], [hyp.warmup_momentum, momentum]))
    for j, g in enumerate(optimizer.param_groups):
        g["lr"] = float(np.interp(ni, [0, nw], [bias_lr if j == 2 else 0.0, g["initial_lr"] * lr_factor]))
        if "betas" in g:
            g["betas"] = (m, g["betas"][1])
        else:
            g["momentum"] = m
