"""Every hyperparameter in one table: `Hyp`, a field per key with its type, default, bounds and meaning.

A hyperparameter file (data/hyps/hyp.scratch.yaml, a run's hyp.yaml, a search's hyp_evolve.yaml) is read and
checked once (`load_hyp`, `check_hyp`) into a frozen Hyp, and the code reads its attributes: no other module holds
a default. A key the file leaves out takes the field's default; `None` there means the recipe decides
(utils/engine/optim.choose_recipe, docs/recipe.md). `Hyp.given` keeps the file's own keys and values, unknown keys
included, for what is written back (hyp.yaml, checkpoints, --evolve's files).
"""
from __future__ import annotations

import difflib
import logging
import math
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from utils.files import REPO_ROOT, load_yaml
from utils.errors import UserError

LOGGER = logging.getLogger(__name__)
DEFAULT_HYP_FILE = REPO_ROOT / "data" / "hyps" / "hyp.scratch.yaml"
OPTIMIZERS = ("SGD", "Adam", "AdamW")  # a resolved hyp's `optimizer` (utils/engine/optim.resolved_hyp)


def key(low: float, high: float, meaning: str, default: Any = MISSING) -> Any:
    """A table row: bounds that keep the value where the code using it works, and what it does. No default: the
    file must name it."""
    return field(default=default, metadata={"low": low, "high": high, "meaning": meaning})


@dataclass(frozen=True, kw_only=True)
class Hyp:
    # ---- the optimizer and its schedule (YOLOv5's SGD recipe and the fine-tuning one take them as given)
    lr0: float = key(1e-12, 10.0, "initial learning rate of the SGD recipes")
    lrf: float = key(0.0, 10.0, "final learning rate, as a fraction of the initial one")
    momentum: float = key(0.0, 0.999999, "SGD momentum, Adam's beta1")
    weight_decay: float = key(0.0, 1.0, "decay of the weights (not biases or norm layers) per step of nbs images")
    warmup_epochs: float = key(0.0, 10_000.0, "linear warmup, in epochs (fractions allowed; at least 100 batches)")
    warmup_momentum: float = key(0.0, 0.999999, "momentum at the first warmup step")
    warmup_bias_lr: float = key(0.0, 10.0, "the biases' learning rate at the first warmup step")
    nbs: float = key(1.0, 1e6, "images a step of YOLOv5's recipe; weight_decay is stated per step of this many", 64.0)
    max_grad_norm: float = key(1e-6, 1e12, "gradient norm clip before each step", 10.0)
    warmup_max_fraction: float = key(0.0, 1.0, "the warmup's longest, as a share of the run's batches", 1.0)
    ema_tau: float | None = key(0.01, 1e9, "steps over which the EMA's decay ramps up (unset: the recipe's)", None)
    optimizer: str | None = key(0, 0, "a resolved hyp.yaml's optimizer: its numbers then stand as written", None)
    # ---- inputs of the recipe rule (resolved_hyp writes the recipe's numbers in their place)
    lr_adam_gain: float = key(1e-6, 100.0, "multiplies the short AdamW recipe's learning rate", 1.0)
    lr_batch_power: float = key(0.0, 2.0, "the short recipe's lr grows as (batch / 16) ** this, up to batch 64", 0.5)
    warmup_epochs_adam: float = key(0.0, 10_000.0, "the short AdamW recipe's warmup, in epochs", 6.0)
    warmup_bias_lr_adam: float | None = key(0.0, 10.0, "Adam/AdamW's bias warmup start (unset: the recipe's)", None)
    min_steps: int = key(0.0, 1e6, "the step floor: a larger batch is lowered to give the run this many steps", 1500)
    cls_by_nc: bool | None = key(0.0, 1.0, "scale the class loss gain by nc/80 (unset: the recipe's)", None)
    # ---- precision
    fp32_warmup: bool = key(0.0, 1.0, "a bf16 run trains its warmup steps in FP32 (docs/precision.md)", True)
    # ---- the loss (utils/engine/loss.py)
    box: float = key(0.0, 1000.0, "box loss gain")
    cls: float = key(0.0, 1000.0, "class loss gain")
    cls_pw: float = key(1e-6, 1000.0, "class BCE positive weight")
    obj: float = key(0.0, 1000.0, "objectness loss gain (scaled with image size and levels)")
    obj_pw: float = key(1e-6, 1000.0, "objectness BCE positive weight")
    anchor_t: float = key(1e-6, 1000.0, "anchor-to-target size ratio limit for matching")
    assign_topk: int = key(0.0, 1000.0, "k > 0: dynamic assignment, the k best-matching anchors", 0)
    assign_soft: bool = key(0.0, 1.0, "with assign_topk: the class target is the match quality instead of 1", False)
    iou_t: float = key(0.0, 1.0, "YOLOv5's IoU training threshold; unused (the matcher uses anchor ratios)", 0.2)
    fl_gamma: float = key(0.0, 100.0, "YOLOv5's focal loss gamma; unused (plain BCE)", 0.0)
    # ---- augmentation (each off unless the file sets it)
    hsv_h: float = key(0.0, 1.0, "hue jitter, a fraction of the hue circle", 0.0)
    hsv_s: float = key(0.0, 1.0, "saturation jitter (fraction)", 0.0)
    hsv_v: float = key(0.0, 1.0, "value (brightness) jitter (fraction)", 0.0)
    degrees: float = key(0.0, 180.0, "rotation, +/- degrees", 0.0)
    translate: float = key(0.0, 1.0, "translation, +/- a fraction of the picture", 0.0)
    scale: float = key(0.0, 0.99, "scale jitter, +/- a fraction", 0.0)
    shear: float = key(0.0, 89.0, "shear, +/- degrees", 0.0)
    perspective: float = key(0.0, 0.01, "perspective, +/- a fraction", 0.0)
    flipud: float = key(0.0, 1.0, "probability of an up-down flip", 0.0)
    fliplr: float = key(0.0, 1.0, "probability of a left-right flip", 0.0)
    mosaic: float = key(0.0, 1.0, "probability of a 4-picture mosaic", 0.0)
    mixup: float = key(0.0, 1.0, "probability of mixing two mosaics", 0.0)
    copy_paste: float = key(0.0, 1.0, "segment copy-paste; needs polygon labels, which no loader here keeps", 0.0)
    # the file as read: its keys and values, unknown ones included (written back, never read for a value)
    given: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def as_dict(self) -> dict:
        """The file's keys and values, as given (hyp.yaml's base, the checkpoints' `hyp`)."""
        return dict(self.given)

    def sets(self, name: str) -> bool:
        """Whether the file named `name` (else the field holds its default)."""
        return name in self.given

    def updated(self, **values: Any) -> Hyp:
        """This hyp with `values` set as if the file had them, checked as a file is."""
        return check_hyp({**self.given, **values}, "the updated hyperparameters")


# (lowest, highest, required) of every number, for --evolve's bounds and the tests
HYP_RULES: dict[str, tuple[float, float, bool]] = {
    f.name: (f.metadata["low"], f.metadata["high"], f.default is MISSING)
    for f in fields(Hyp) if f.name not in ("given", "optimizer")}
KNOWN_HYP_KEYS = frozenset(f.name for f in fields(Hyp) if f.name != "given")
_TYPES = {f.name: f.type for f in fields(Hyp)}


def load_hyp(path: str | Path = DEFAULT_HYP_FILE) -> Hyp:
    """A hyperparameter YAML (same error rules as the data YAML), checked by `check_hyp`."""
    return check_hyp(load_yaml(path, "hyperparameter file"), path)


def check_hyp(raw: Mapping, source: str | Path) -> Hyp:
    """A Hyp from a file's mapping: every known number finite and within its bounds, the required ones present;
    one line naming the first that is not. Keys the table does not know are kept in `given` and ignored, with one
    warning naming them and the nearest known key of each."""
    unknown = tuple(sorted(str(k) for k in raw if k not in KNOWN_HYP_KEYS))
    if unknown:
        _warn_unknown_keys(unknown, str(source))
    values = {}
    for name, (low, high, required) in HYP_RULES.items():
        if name not in raw:
            if required:
                raise UserError(f"hyperparameter file {source}: missing '{name}'; start from {DEFAULT_HYP_FILE}")
            continue
        v = raw[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low <= v <= high:
            raise UserError(f"hyperparameter file {source}: {name} must be a number from {low:g} to {high:g}, "
                            f"got {str(v)[:40]!r}")
        kind = _TYPES[name].split(" ")[0]
        values[name] = int(v) if kind == "int" else bool(v) if kind == "bool" else float(v)
    if "optimizer" in raw:
        if raw["optimizer"] not in OPTIMIZERS:
            raise UserError(f"hyperparameter file {source}: optimizer must be one of {', '.join(OPTIMIZERS)}, "
                            f"got {str(raw['optimizer'])[:40]!r}")
        values["optimizer"] = raw["optimizer"]
    return Hyp(**values, given=dict(raw))


def table_markdown() -> str:
    """The table as docs/hyperparameters.md prints it."""
    rows = ["| key | type | default | bounds | meaning |", "|---|---|---|---|---|"]
    for f in fields(Hyp):
        if f.name == "given":
            continue
        default = "required" if f.default is MISSING else "the recipe's" if f.default is None else f"{f.default:g}" \
            if isinstance(f.default, (int, float)) and not isinstance(f.default, bool) else str(f.default).lower()
        bounds = "SGD, Adam, AdamW" if f.name == "optimizer" else f"{f.metadata['low']:g} .. {f.metadata['high']:g}"
        rows.append(f"| `{f.name}` | {f.type.replace(' | None', '')} | {default} | {bounds} | {f.metadata['meaning']} |")
    return "\n".join(rows)


def _warn_unknown_keys(keys: tuple[str, ...], source: str,
                       reported: set[tuple[str, ...]] = set()) -> None:  # noqa: B006 - shared on purpose
    """Once per set of keys in a process: the loaders and every generation of a search read a hyp again (`reported`,
    the default set, is shared by every call on purpose)."""
    if keys in reported:
        return
    reported.add(keys)

    def nearest(k: str) -> str:
        return max(sorted(KNOWN_HYP_KEYS), key=lambda known: difflib.SequenceMatcher(None, k, known).ratio())

    listed = ", ".join(f"{k[:40]!r} (nearest known key: {nearest(k)})" for k in keys[:10])
    more = f" and {len(keys) - 10} more" if len(keys) > 10 else ""
    LOGGER.warning(f"warning: hyperparameter file {source}: unknown key(s) ignored: {listed}{more}; fix the spelling "
                   f"(utils/hyp.py lists every key)")
