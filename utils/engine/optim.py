"""The optimizer, its learning-rate schedule and warmup, and the one object that performs an update under AMP."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Collection, Sequence

import numpy as np
import torch
from torch import nn

from utils.data.data_config import DEFAULT_HYP_FILE
from utils.engine.amp import Precision
from utils.engine.diagnostics import EpochDiagnostics, group_grad_norms
from utils.engine.ema import ModelEMA
from utils.errors import UserError

OPTIMIZERS = ("auto", "SGD", "Adam", "AdamW")
NOMINAL_BATCH = 64  # gradients are accumulated up to this many images per optimizer step
EMA_TAU = 2000.0  # YOLOv5's EMA ramp, made for schedules of many thousand steps
# gradients are clipped to this total norm before each step (YOLOv5's and Ultralytics' 10); without the clip
# the short AdamW recipe lost on both real-image sets at both seeds (bench/fidelity.py fp32-noclip)
MAX_GRAD_NORM = 10.0
# the short AdamW recipe's lr is BASE * 5 / (4 + nc), at most ADAMW_LR_MAX (choose_recipe)
ADAMW_LR_SCRATCH = 0.008
ADAMW_LR_FINETUNE = 0.004
ADAMW_LR_MAX = ADAMW_LR_SCRATCH * 5 / 9  # the built-in dataset's (5 classes): the largest the harness measured
# the short AdamW recipe's warmup from scratch, in epochs: twice YOLOv5's 3 (choose_recipe)
ADAMW_WARMUP_EPOCHS = 6.0
MIN_WARMUP_STEPS = 100  # YOLOv5's floor: a warmup of fewer batches than this is stretched to it ...
# ... but never past this share of the run's batches (Recipe.warmup_steps). A cap of a quarter was measured and did
# not hold (15 epochs, batch 16: paste8 0.114 against 0.109, paste10n 0.153 against 0.171; docs/recipe.md)
WARMUP_MAX_FRACTION = 1.0
# the short AdamW recipe was tuned at 16 images per step: larger batches scale its lr by
# (batch / ADAMW_NOMINAL_BATCH) ** LR_BATCH_POWER (hyp lr_batch_power); smaller ones keep it (choose_recipe). The
# square root, once the step floor (MIN_STEPS) has given the run its steps: at 50 and 100 epochs on 1000 images,
# batch 32 and 64, it beat the unscaled lr in 7 of 9 pairs (mean +1.4 points; docs/recipe.md). Under the floor no rule on the
# lr made up for the missing steps (15 epochs, batch 64's 240 steps: sqrt with a warmup cap 0.046 and 0.068, none
# 0.058 and 0.066)
ADAMW_NOMINAL_BATCH = 16
LR_BATCH_POWER = 0.5
# the largest batch the lr rule was measured at: larger batches take its lr (x2 at the square root), not more
LR_SCALE_MAX_BATCH = 64
# the EMA's ramp and decay count a step of B images as (B / ADAMW_NOMINAL_BATCH) ** EMA_BATCH_POWER steps of 16
EMA_BATCH_POWER = 0.0
# Adam's moment averages likewise: 1 - beta grows by (B / 16) ** ADAM_BETA_BATCH_POWER, the square-root rule of
# Malladi et al. (2022, "On the SDEs and scaling rules for adaptive gradient algorithms") at power 1 with the lr's 0.5;
# beta1 (and its warmup start) no lower than MIN_BETA1
ADAM_BETA_BATCH_POWER = 0.0
MIN_BETA1 = 0.5
# the short recipe's floor on optimizer steps: a batch over 16 that would leave a run fewer is lowered (steps_batch).
# At 15 epochs on 1000 images (mean of 2 seeds) batch 24 (630 steps) learned 0.95x and 0.84x of batch 16 (945 steps)
# on two real-image sets, batch 32 (480) 0.89x and 0.73x, batch 64 (240) 0.54x and 0.44x; at 100 epochs (lr as
# tuned) batch 64 (1600 steps) 0.79-0.90x and batch 104 (960 steps) 0.69x of batch 16 (docs/recipe.md)
MIN_STEPS = 1500
# fine-tuning from a weights file (--weights) takes YOLOv5's SGD recipe, made for it, with one change: a step per
# batch of FINETUNE_NOMINAL_BATCH images, not gradients accumulated to NOMINAL_BATCH (64). On real photos COCO never
# held (rice-pest, 20 epochs, 320 px) that took YOLOv5's own recipe from 0.268 to 0.325 mAP@0.5:0.95, where the AdamW
# recipe fine-tuning had before reached 0.163 (docs/recipe.md, "Fine-tuning from COCO weights"); hyp
# finetune_sgd: 0 keeps that one
FINETUNE_NOMINAL_BATCH = 16


@dataclass(frozen=True)
class Recipe:
    """How the optimizer is set up: which one, its step size and momentum, and batches per step."""

    optimizer: str
    lr0: float
    momentum: float
    accumulate: int  # batches whose gradients are summed into one optimizer step
    cls_by_nc: bool = True  # scale the class loss gain by nc/80 (utils/engine/loss.loss_gains)
    box_gain: float = 1.0  # multiplies the hyp's box loss gain
    warmup_bias_lr: float = 0.0  # the biases' lr at the first warmup step (it then falls to the scheduled lr)
    warmup_epochs: float = 3.0  # the warmup's length in epochs (choose_recipe), bounded by warmup_steps
    warmup_max_fraction: float = WARMUP_MAX_FRACTION  # the warmup's longest, as a share of the run's batches
    ema_tau: float = EMA_TAU  # optimizer steps over which the EMA's decay ramps up (utils/engine/ema.ModelEMA)
    ema_step_weight: float = 1.0  # what one optimizer step counts for in the EMA (ModelEMA.step_weight)
    beta2: float = 0.999  # Adam's second-moment decay
    warmup_momentum: float | None = None  # momentum (Adam's beta1) at the warmup's start; None: the hyp's
    max_grad_norm: float = MAX_GRAD_NORM  # the clip (optional hyp max_grad_norm: bench/fidelity.py's ablation)
    nbs: float = 0.0  # the images per step the weight decay is stated for; 0: the hyp's nbs (weight_decay)
    # fine-tuning: the lr of the tensors that came from the weights file, as a share of the new ones' (the head's)
    body_lr_gain: float = 1.0
    head_only_epochs: int = 0  # fine-tuning: the first epochs train the new tensors alone (the others at lr 0)

    @property
    def splits_body(self) -> bool:
        """Whether the optimizer needs separate groups for the transferred tensors (build_optimizer's `body`)."""
        return self.body_lr_gain != 1.0 or self.head_only_epochs > 0

    def warmup_steps(self, batches_per_epoch: int, epochs: int) -> int:
        """Batches of warmup: warmup_epochs of them, at least MIN_WARMUP_STEPS (YOLOv5's floor, for datasets of
        few batches), at most warmup_max_fraction of the run: by default all of it (a run shorter than its warmup
        ends warming up); hyp warmup_max_fraction caps it lower (a quarter was measured and lost, docs/recipe.md)."""
        wanted = max(round(self.warmup_epochs * batches_per_epoch), MIN_WARMUP_STEPS)
        return min(wanted, math.ceil(self.warmup_max_fraction * batches_per_epoch * epochs))

    def weight_decay(self, hyp: dict, batch_size: int) -> float:
        # hyp's decay is stated per step of nbs images (NOMINAL_BATCH, or the recipe's own): scale it to the images
        # per step actually taken
        return hyp["weight_decay"] * (batch_size * self.accumulate / (self.nbs or hyp.get("nbs", NOMINAL_BATCH)))


# hyp keys that only steer choose_recipe's choice; a resolved hyp holds their effect instead (resolved_hyp)
RECIPE_INPUTS = ("lr_adam_gain", "lr_adam_base", "ema_ramp_fraction", "finetune_sgd", "warmup_epochs_adam", "warmup_bias_lr_adam", "lr_batch_power",
                 "ema_batch_power", "adam_beta_batch_power")


def resolved_hyp(hyp: dict, r: Recipe, batch_size: int) -> dict:
    """The hyperparameters as a run used them, for its hyp.yaml: the recipe's optimizer, lr, momentum, warmup, EMA
    ramp, clip and box gain in place of the hyp's inputs, and the weight decay per optimizer step (`nbs`, the
    images per step, says what it is per). choose_recipe takes a hyp that names its `optimizer` as settled, so
    `--hyp <run>/hyp.yaml` trains with exactly these numbers again."""
    out = {k: v for k, v in hyp.items() if k not in RECIPE_INPUTS}
    if r.warmup_momentum is not None:
        out["warmup_momentum"] = r.warmup_momentum
    out.update(optimizer=r.optimizer, lr0=r.lr0, momentum=r.momentum, weight_decay=r.weight_decay(hyp, batch_size),
               nbs=batch_size * r.accumulate, warmup_epochs=r.warmup_epochs, warmup_bias_lr=r.warmup_bias_lr,
               warmup_max_fraction=r.warmup_max_fraction,
               ema_tau=r.ema_tau, ema_step_weight=r.ema_step_weight, beta2=r.beta2, max_grad_norm=r.max_grad_norm,
               box=hyp["box"] * r.box_gain, cls_by_nc=int(r.cls_by_nc), lr_body_gain=r.body_lr_gain,
               head_only_epochs=r.head_only_epochs)
    return out


def settled_recipe(hyp: dict, batch_size: int) -> Recipe:
    """The recipe a resolved hyp (resolved_hyp) records, taken as it stands."""
    accumulate = max(round(hyp.get("nbs", NOMINAL_BATCH) / batch_size), 1)
    return Recipe(hyp["optimizer"], hyp["lr0"], hyp["momentum"], accumulate, cls_by_nc=bool(hyp.get("cls_by_nc", 1)),
                  warmup_bias_lr=float(hyp["warmup_bias_lr"]), warmup_epochs=float(hyp["warmup_epochs"]),
                  warmup_max_fraction=float(hyp.get("warmup_max_fraction", WARMUP_MAX_FRACTION)), ema_tau=float(hyp.get("ema_tau", EMA_TAU)),
                  ema_step_weight=float(hyp.get("ema_step_weight", 1.0)), beta2=float(hyp.get("beta2", 0.999)),
                  max_grad_norm=float(hyp.get("max_grad_norm", MAX_GRAD_NORM)),
                  body_lr_gain=float(hyp.get("lr_body_gain", 1.0)), head_only_epochs=int(hyp.get("head_only_epochs", 0)))


def choose_recipe(name: str, hyp: dict, batch_size: int, batches_per_epoch: int, epochs: int, nc: int,
                  pretrained: bool = False) -> Recipe:
    """The optimizer recipe. An explicit --optimizer keeps YOLOv5's: the hyp's lr0 and momentum, gradients
    accumulated to a nominal batch of 64. 'auto' keeps that for long schedules (over 10k steps) and takes
    AdamW, one step per batch, for short ones: SGD from scratch at 64 images per step gets too few steps
    to converge there, and AdamW's scale-free steps need no large-batch averaging.

    The short recipe's numbers were measured on the built-in dataset (yolov5n, 40 epochs, 192 px; final
    mAP@0.5 / mAP@0.5:0.95, one run each): YOLOv5's gains and an lr of 0.002*5/(4+nc) gave 0.692 / 0.519;
    the class gain left at its 80-class value (YOLOv5's nc/80 scaling had kept the class loss flat for
    15 of 40 epochs) 0.857 / 0.513; then the box gain x2 0.939 / 0.627, x4 0.958 / 0.688, and x4 with
    twice the lr 0.963 / 0.714. AdamW is blind to the loss's overall scale, so only the gains' ratios
    matter: the box term gets 4x its YOLOv5 weight against objectness and class. On real images
    (bench/fidelity.py, seed 0) x1 lost badly (paste10n 0.179, paste8 0.091 against x4's 0.336, 0.241) and
    x8 lost on paste10n at three seeds (mean -6.9 points) and was level on paste8 (+1.4, inside the
    spread), so x4 stays.

    The lr: twice that again from scratch, ADAMW_LR_SCRATCH (docs/recipe.md). Over seeds 0-4 it
    was higher on paste10n at every seed, level on paste8 and, over seeds 0-2, on the built-in dataset.
    The harness measured it for 5 to 10 classes only (lr 0.0029 to 0.0044), so fewer classes do not get
    more than the built-in dataset's lr (ADAMW_LR_MAX).

    The warmup: ADAMW_WARMUP_EPOCHS from scratch, twice YOLOv5's 3 (an optional hyp warmup_epochs_adam sets
    it). The spread over seeds on the real-image sets is settled early (bench/seed_fork.py), and the longer
    warmup acts there: at today's lr it was higher in FP32 on all three harness sets over paired seeds, and bf16
    with it is within a point of FP32; 10 epochs lost, and so did 6 at half the lr. The figures are kept in one
    place, docs/recipe.md ("Early remedies") and "Precision".

    Fine-tuning (`pretrained`, short schedules) takes finetune_recipe instead: YOLOv5's SGD recipe with a step
    per batch of 16. With hyp finetune_sgd: 0 it takes the AdamW recipe at half the lr, with the hyp's
    warmup_epochs and no bias warmup, as it stood before the transfer study.

    A hyp that names its `optimizer` (a run's hyp.yaml, resolved_hyp) is settled: its numbers are used as they
    stand, and an explicit --optimizer must agree with it."""
    if "optimizer" in hyp:
        if name not in ("auto", hyp["optimizer"]):
            raise UserError(f"--optimizer {name}: the hyperparameter file names optimizer {hyp['optimizer']} (a run's "
                            f"resolved hyp.yaml); drop --optimizer, or start from {DEFAULT_HYP_FILE}")
        return settled_recipe(hyp, batch_size)
    accumulate = max(round(hyp.get("nbs", NOMINAL_BATCH) / batch_size), 1)
    steps = epochs * math.ceil(batches_per_epoch / accumulate)
    common = {"max_grad_norm": float(hyp.get("max_grad_norm", MAX_GRAD_NORM)),
              "warmup_max_fraction": float(hyp.get("warmup_max_fraction", WARMUP_MAX_FRACTION))}
    if pretrained:  # fine-tuning only: the transferred tensors' share of the lr, and a start that trains the head alone
        common.update(body_lr_gain=float(hyp.get("lr_body_gain", 1.0)),
                      head_only_epochs=int(hyp.get("head_only_epochs", 0)))
    if name == "auto" and pretrained and int(hyp.get("finetune_sgd", 1)):
        recipe = finetune_recipe(hyp, batch_size, batches_per_epoch, epochs, common)
        if recipe is not None:
            return recipe
    if name == "auto" and steps <= 10_000:
        return adamw_recipe(hyp, batch_size, batches_per_epoch, epochs, nc, pretrained, common)
    return yolov5_recipe("SGD" if name == "auto" else name, hyp, accumulate, steps, pretrained, common)


def adamw_recipe(hyp: dict, batch_size: int, batches_per_epoch: int, epochs: int, nc: int, pretrained: bool,
                 common: dict) -> Recipe:
    """The short schedules' AdamW recipe, one step per batch (choose_recipe's docstring has its measurements)."""
    # fewer classes tolerate a larger step (fewer competing logits): Ultralytics' rule 0.002*5/(4+nc),
    # x4 from scratch, x2 fine-tuning; an optional hyp lr_adam_gain multiplies it (the harness's lr ablation)
    base = float(hyp.get("lr_adam_base", ADAMW_LR_FINETUNE if pretrained else ADAMW_LR_SCRATCH))
    lr = min(base * 5 / (4 + nc), ADAMW_LR_MAX) * float(hyp.get("lr_adam_gain", 1.0))
    # a batch larger than the 16 it was tuned at takes fewer steps: each takes a larger one
    lr *= (min(max(batch_size, ADAMW_NOMINAL_BATCH), LR_SCALE_MAX_BATCH) / ADAMW_NOMINAL_BATCH) ** float(
        hyp.get("lr_batch_power", LR_BATCH_POWER))
    # the EMA: a step of more images counts for more, so its memory in images stays put
    ema_weight = (max(batch_size, ADAMW_NOMINAL_BATCH) / ADAMW_NOMINAL_BATCH) ** float(
        hyp.get("ema_batch_power", EMA_BATCH_POWER))
    # and Adam's own averages, which remember a number of steps, not of images
    kappa = (max(batch_size, ADAMW_NOMINAL_BATCH) / ADAMW_NOMINAL_BATCH) ** float(
        hyp.get("adam_beta_batch_power", ADAM_BETA_BATCH_POWER))
    beta1 = max(1 - 0.1 * kappa, MIN_BETA1)
    beta2 = 1 - 0.001 * kappa
    warmup_beta1 = max(1 - (1 - hyp["warmup_momentum"]) * kappa, MIN_BETA1) if kappa != 1 else None
    warmup = hyp["warmup_epochs"] if pretrained else ADAMW_WARMUP_EPOCHS  # hyp warmup_epochs_adam overrides
    # the class gain unscaled by nc/80 and the box term x4 (docstring); hyp cls_by_nc: 1 scales it as YOLOv5
    return Recipe("AdamW", round(lr, 6), round(beta1, 6), 1, cls_by_nc=bool(hyp.get("cls_by_nc", 0)), box_gain=4.0,
                  beta2=round(beta2, 6), warmup_momentum=warmup_beta1,
                  warmup_bias_lr=bias_warmup_start("AdamW", hyp, pretrained),
                  warmup_epochs=float(hyp.get("warmup_epochs_adam", warmup)),
                  ema_tau=float(hyp.get("ema_tau", ema_tau_for(epochs * batches_per_epoch * ema_weight,
                                                               hyp.get("ema_ramp_fraction", 0.25)))),
                  ema_step_weight=ema_weight, **common)


def yolov5_recipe(name: str, hyp: dict, accumulate: int, steps: int, pretrained: bool, common: dict,
                  nbs: float = 0.0) -> Recipe:
    """YOLOv5's recipe: the hyp's lr0, momentum, warmup and EMA ramp (or, with hyp ema_ramp_fraction, a share of
    this run's `steps`, as the short recipe's), gradients accumulated `accumulate` batches a step."""
    tau = ema_tau_for(steps, hyp["ema_ramp_fraction"]) if "ema_ramp_fraction" in hyp else EMA_TAU
    return Recipe(name, hyp["lr0"], hyp["momentum"], accumulate, warmup_bias_lr=bias_warmup_start(name, hyp, pretrained),
                  warmup_epochs=float(hyp["warmup_epochs"]), ema_tau=float(hyp.get("ema_tau", tau)), nbs=nbs, **common)


def finetune_recipe(hyp: dict, batch_size: int, batches_per_epoch: int, epochs: int, common: dict) -> Recipe | None:
    """Fine-tuning from a weights file: YOLOv5's SGD recipe (hyp lr0 and momentum, its 3-epoch warmup with the biases
    from 0.1, its loss gains, its EMA ramp) with a step per batch of FINETUNE_NOMINAL_BATCH images instead of
    gradients summed over 64. SGD moves each weight in proportion to its gradient, so the transferred layers, whose
    gradients are small, move little while the new head learns; AdamW moves every weight by about its lr, and lost
    to YOLOv5 fine-tuning at every lr tried (docs/recipe.md, "Fine-tuning from COCO weights"). The summed loss
    (utils/engine/loss.py) makes a larger batch's step larger in proportion, so its lr needs no batch rule. None
    for schedules over 10k steps, which keep YOLOv5's recipe as it is (choose_recipe)."""
    accumulate = max(round(FINETUNE_NOMINAL_BATCH / batch_size), 1)
    steps = epochs * math.ceil(batches_per_epoch / accumulate)
    if steps > 10_000:
        return None
    return yolov5_recipe("SGD", hyp, accumulate, steps, True, common, nbs=FINETUNE_NOMINAL_BATCH)


def steps_batch(name: str, hyp: dict, batch_size: int, n_images: int, epochs: int, multiple: int = 1) -> int:
    """The batch the short recipe trains at: `batch_size`, lowered (to a multiple of 8, not under 16, and of
    `multiple`, the processes) where it would leave the run fewer than hyp `min_steps` optimizer steps. AdamW's
    step moves the weights by about its lr whatever the batch, so a run of few steps moves them little: at 15
    epochs on 1000 images batch 64 (240 steps) ended at half of batch 16 (945 steps) whatever the lr (docs/recipe.md).
    Explicit --optimizer, settled hyps (a run's hyp.yaml), long schedules and batches of 16 or less are kept."""
    min_steps = int(hyp.get("min_steps", MIN_STEPS))
    if name != "auto" or "optimizer" in hyp or not min_steps or batch_size <= ADAMW_NOMINAL_BATCH or n_images < 1:
        return batch_size
    steps = epochs * math.ceil(n_images / batch_size)
    if steps >= min_steps or steps > 10_000:
        return batch_size
    step = math.lcm(8, multiple)
    cap = max(n_images * epochs // min_steps // step * step, math.ceil(ADAMW_NOMINAL_BATCH / step) * step)
    return min(batch_size, cap)


def ema_tau_for(steps: int, fraction: float = 0.25) -> float:
    """The EMA ramp for a schedule of `steps` optimizer steps: YOLOv5's 2000, or a quarter of the
    schedule (`fraction`, hyp ema_ramp_fraction) if that is shorter.

    The EMA's decay is 0.9999 * (1 - exp(-updates / tau)). With tau 2000, a 625-step run (400 images,
    batch 16, 25 epochs) ends at decay 0.27: the "EMA" is the last step's weights, and the final mAP
    jumps by several points from one epoch to the next. With tau = steps / 4 every run ends at decay
    0.98 (an average over the last ~55 steps), whatever its length; runs of 8000 steps and more keep
    YOLOv5's ramp."""
    return min(EMA_TAU, max(steps, 1) * float(fraction))


def bias_warmup_start(optimizer: str, hyp: dict, pretrained: bool = False) -> float:
    """The biases' warmup lr at step 0: hyp warmup_bias_lr (0.1), for Adam and AdamW too when training from
    scratch, unless the hyp sets warmup_bias_lr_adam. Adam/AdamW fine-tuning (--weights) starts the biases
    at 0 like every other group, unless the hyp sets warmup_bias_lr_adam.

    Under Adam a step moves a parameter by about lr whatever its gradient, so 0.1 moves every bias (the
    Detect layer's objectness priors, each BatchNorm shift) by up to 0.1 per step early in warmup. Taking
    that away (warmup_bias_lr_adam: 0, Ultralytics' choice for its AdamW recipe) was measured with
    bench/fidelity.py and did not hold: on both datasets training learned more slowly (train box loss a
    third in 0.29 vs 0.27 on paste8) and ended lower on average (docs/recipe.md).

    From trained weights the same kick undoes training: one epoch of fine-tuning a converged checkpoint on
    its own data (AdamW auto recipe) fell from mAP@0.5:0.95 0.238 to 0.159 on paste8 and from 0.718 to
    0.605 on the built-in dataset with the warmup, and held at 0.235 and 0.708 without it; over 3 seeds on
    paste8 and paste10n checkpoints it lost every pair (bench/results/finetune_bias_warmup_seeds.txt)."""
    if optimizer in ("Adam", "AdamW"):
        return float(hyp.get("warmup_bias_lr_adam", 0.0 if pretrained else hyp["warmup_bias_lr"]))
    return float(hyp["warmup_bias_lr"])


GROUP_KINDS = 3  # parameter groups per part of the model: weights with decay, normalisation weights, biases


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float,
                    fused: bool = False, beta2: float = 0.999, body: Collection[str] | None = None,
                    body_lr_gain: float = 1.0) -> torch.optim.Optimizer:
    """Three parameter groups: 0 weights with decay, 1 normalisation weights (no decay), 2 biases (no decay).
    With `body` (the names of the parameters that came from a weights file, fine-tuning) three more, 3-5, hold
    those at lr x body_lr_gain, and 0-2 the new ones (the head); is_bias_group tells the biases in either layout.
    fused: one kernel for the whole update (train.py asks for it on CUDA), which also takes a skip flag on the
    device (AmpUpdater); elsewhere PyTorch's default implementation, whose arithmetic the CPU figures were
    measured with."""
    parts: list[list[list[nn.Parameter]]] = [[[], [], []], [[], [], []]]  # [new, body][decay, no_decay, biases]
    norm_types = tuple(v for k, v in nn.__dict__.items() if "Norm" in k and isinstance(v, type))
    body = frozenset(body or ())
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            kind = 2 if pname == "bias" else 1 if isinstance(module, norm_types) else 0
            full = f"{mname}.{pname}" if mname else pname
            parts[full in body][kind].append(p)
    groups = [{"params": params, "weight_decay": weight_decay if kind == 0 else 0.0}
              for params, kind in zip(parts[0], range(GROUP_KINDS))]
    if body:
        groups += [{"params": params, "weight_decay": weight_decay if kind == 0 else 0.0, "lr": lr * body_lr_gain}
                   for params, kind in zip(parts[1], range(GROUP_KINDS))]
    extra = {"fused": True} if fused else {}
    if name == "SGD":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True, **extra)
    if name in ("Adam", "AdamW"):
        cls = torch.optim.Adam if name == "Adam" else torch.optim.AdamW
        return cls(groups, lr=lr, betas=(momentum, beta2), **extra)
    raise ValueError(f"unknown optimizer {name}")


def lr_lambda(epochs: int, lrf: float, cosine: bool) -> Callable[[int], float]:
    """LR factor per epoch: from 1 down to lrf, linearly or along a half cosine."""
    if cosine:
        return lambda e: ((1 - math.cos(e * math.pi / epochs)) / 2) * (lrf - 1) + 1
    return lambda e: (1 - e / epochs) * (1.0 - lrf) + lrf


def group_lr_lambdas(optimizer: torch.optim.Optimizer, schedule: Callable[[int], float],
                     head_only_epochs: int = 0) -> list[Callable[[int], float]]:
    """The LR factor of each parameter group (LambdaLR's lr_lambda list): `schedule` for all, except that the
    transferred tensors' groups (3-5, build_optimizer's `body`) stay at 0 for the first head_only_epochs."""
    if not head_only_epochs or len(optimizer.param_groups) <= GROUP_KINDS:
        return [schedule] * len(optimizer.param_groups)
    held = lambda e: 0.0 if e < head_only_epochs else schedule(e)  # noqa: E731
    return [schedule] * GROUP_KINDS + [held] * (len(optimizer.param_groups) - GROUP_KINDS)


def is_bias_group(j: int) -> bool:
    """Group j holds biases (build_optimizer's layout, with or without the body's groups)."""
    return j % GROUP_KINDS == GROUP_KINDS - 1


def apply_warmup(optimizer: torch.optim.Optimizer, ni: int, nw: int, lr_factor: float | Sequence[float], hyp: dict,
                 momentum: float, bias_lr: float, warmup_momentum: float | None = None) -> None:
    """Iteration ni of nw warmup iterations: LRs ramp up from 0 (biases from bias_lr, see
    bias_warmup_start) to their scheduled value, and momentum ramps from warmup_momentum to its final value.
    lr_factor: the schedule's factor this epoch, one for all groups or one per group; a group whose factor is 0
    (held, group_lr_lambdas) stays at lr 0, its biases too."""
    factors = [lr_factor] * len(optimizer.param_groups) if isinstance(lr_factor, (int, float)) else list(lr_factor)
    for j, (g, factor) in enumerate(zip(optimizer.param_groups, factors)):
        start = bias_lr if is_bias_group(j) and factor else 0.0
        g["lr"] = float(np.interp(ni, [0, nw], [start, g["initial_lr"] * factor]))
        start = hyp["warmup_momentum"] if warmup_momentum is None else warmup_momentum
        m = float(np.interp(ni, [0, nw], [start, momentum]))
        if "betas" in g:
            g["betas"] = (m, g["betas"][1])
        else:
            g["momentum"] = m


class AmpUpdater:
    """Owns the optimizer update under AMP, for every precision.

    backward() scales the loss (a no-op without fp16); step(), called at effective-batch boundaries
    only, does unscale_ -> clip -> step -> update -> zero_grad -> EMA update. A step whose gradients
    are not finite is skipped and counted, with or without a GradScaler, so a bad batch can never
    reach the weights or the EMA.

    With a fused optimizer (train.py's on CUDA) the whole step stays on the device: the skip is a flag the
    fused kernel reads (`found_inf`, the attribute GradScaler itself hands fused optimizers), the EMA and the
    skip count take the same flag, and nothing waits for the GPU to say whether the step was finite. Otherwise
    the flag is read on the host, as a CPU has nothing to wait for.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
                 ema: ModelEMA | None = None, max_norm: float = MAX_GRAD_NORM, diagnostics: EpochDiagnostics | None = None):
        self.model, self.optimizer, self.ema, self.max_norm = model, optimizer, ema, max_norm
        self.diagnostics = diagnostics
        self.scaler = precision.grad_scaler()
        self.on_device = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
        self._skipped: int | torch.Tensor = 0
        self._params = [p for g in optimizer.param_groups for p in g["params"]]

    @property
    def skipped(self) -> int:
        """Steps skipped for non-finite gradients so far (a host read when the count lives on the device)."""
        return int(self._skipped)

    @skipped.setter
    def skipped(self, value: int) -> None:
        self._skipped = int(value)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self) -> bool | torch.Tensor:
        """One update; returns whether it was applied (a bool tensor on the device with a fused optimizer)."""
        self.scaler.unscale_(self.optimizer)
        if self.diagnostics is not None:
            self.diagnostics.add_step(group_grad_norms(self.optimizer), self.max_norm)
        norm = nn.utils.clip_grad_norm_(self._params, self.max_norm)
        finite = torch.isfinite(norm) if self.on_device else bool(torch.isfinite(norm))
        if self.on_device:
            self._fused_step(finite)
            self._skipped = self._skipped + (~finite).int()
        elif finite:
            self.scaler.step(self.optimizer)
        else:
            self._skipped += 1
        self.scaler.update()  # with a scaler, an overflow lowers the scale for the next step
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None and self.on_device:
            self.ema.update(self.model, finite)  # weight 0 where the step was skipped
        elif self.ema is not None and finite:
            self.ema.update(self.model)
        return finite

    def _fused_step(self, finite: torch.Tensor) -> None:
        """The fused kernel skips the update where found_inf is non-zero; the scaler's own inf check (from
        unscale_) goes in when there is a scaler, our finite flag otherwise (FP32, bf16)."""
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)
            return
        self.optimizer.found_inf = (~finite).float()
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf

    def scale(self) -> float | None:
        """The GradScaler's current loss scale, None without one (bf16, FP32)."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else None

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.skipped = int(state["skipped"])
