"""What last.pt holds for an exact resume: one entry per stateful part of a run, in one table (PARTS).

Each part is saved from the Trainer, loaded back into it and, since a checkpoint is an untrusted file, checked
before anything is loaded, through its entry: a new stateful part is one more entry here. The parts kept in files
beside last.pt, one row per epoch (EPOCH_FILES: results.csv, diagnostics.csv), are cut back to the checkpoint's epoch
by rewind_epoch_files on resume and on a replay; the TensorBoard history is its callback's own
(utils/report/tblog.py cuts it when the logger opens at the resumed epoch and on `on_rewind`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from utils.engine.dist import de_parallel
from utils.engine.rng import rng_state, set_rng_state
from utils.engine.schema import MISSING, field_of, is_int, is_number, plain, require, state_dict_of
from utils.report.results import truncate_after

EPOCH_FILES = ("results.csv", "diagnostics.csv")  # a row per finished epoch, beside last.pt


def fp32_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


@dataclass(frozen=True)
class Part:
    """One stateful part, stored as last.pt's train[key]. save(trainer, epoch) -> value; load(trainer, value), None
    where the value is read before the Trainer exists (the options, the hyperparameters) or only reported;
    check(value, model_state) raises SchemaError naming the field. optional: files from before it have none (not
    checked, not loaded)."""

    key: str
    save: Callable[[Any, int], Any]
    check: Callable[[Any, dict], None]
    load: Callable[[Any, Any], None] | None = None
    optional: bool = False


def _mapping(key: str) -> Callable[[Any, dict], None]:
    return lambda v, _: require(isinstance(v, dict), f"train.{key}", "a mapping", v)


def _plain_mapping(key: str) -> Callable[[Any, dict], None]:
    def check(v: Any, _: dict) -> None:
        require(isinstance(v, dict), f"train.{key}", "a mapping", v)
        plain(v, f"train.{key}")
    return check


def _check_ema(v: Any, model: dict) -> None:
    require(isinstance(v, dict), "train.ema", "a mapping", v)
    state_dict_of(field_of(v, "ema"), "train.ema.ema", model)
    updates = field_of(v, "updates")
    require(is_int(updates) and updates >= 0, "train.ema.updates", "a count", updates)


def _check_optimizer(v: Any, _: dict) -> None:
    groups = v.get("param_groups") if isinstance(v, dict) else None
    require(isinstance(v, dict) and isinstance(v.get("state"), dict) and isinstance(groups, list) and len(groups) > 0
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) and all(is_int(i) for i in g["params"])
                    for g in groups),
            "train.optimizer", "an optimizer state (state, param_groups with params)", v)


def _check_updater(v: Any, _: dict) -> None:
    require(isinstance(v, dict), "train.updater", "a mapping", v)
    require(isinstance(v.get("scaler", MISSING), dict) and is_int(v.get("skipped")),
            "train.updater", "{scaler: mapping, skipped: count}", v)


def _check_rng(v: Any, _: dict) -> None:
    require(isinstance(v, dict), "train.rng", "a mapping", v)
    ok = (isinstance(v.get("torch"), torch.Tensor) and v["torch"].dtype == torch.uint8
          and tuple(v["torch"].shape) == tuple(torch.get_rng_state().shape)
          and isinstance(v.get("numpy"), torch.Tensor) and tuple(v["numpy"].shape) == (624,)
          and not v["numpy"].is_floating_point()
          and isinstance(v.get("numpy_pos"), list) and len(v["numpy_pos"]) == 3
          and is_int(v["numpy_pos"][0]) and is_int(v["numpy_pos"][1]) and is_number(v["numpy_pos"][2])
          and 0 <= v["numpy_pos"][0] <= 624
          and isinstance(v.get("python"), list) and len(v["python"]) == 625
          and all(is_int(x) and 0 <= x < 2**32 for x in v["python"]))
    require(ok, "train.rng", "the saved random-generator states (torch, numpy, numpy_pos, python)", v)


def _value(key: str, ok: Callable[[Any], bool], expected: str) -> Callable[[Any, dict], None]:
    return lambda v, _: require(ok(v), f"train.{key}", expected, v)


def _count(key: str) -> Callable[[Any, dict], None]:
    return _value(key, lambda x: is_int(x) and x >= 1, "a count of 1 or more")


def _set(name: str, kind: Callable[[Any], Any] = lambda x: x) -> Callable[[Any, Any], None]:
    return lambda t, v: setattr(t, name, kind(v))


PARTS: tuple[Part, ...] = (
    Part("model", lambda t, _: fp32_state_dict(de_parallel(t.model)),
         lambda v, model: state_dict_of(v, "train.model", model),
         lambda t, v: de_parallel(t.model).load_state_dict(v)),
    Part("ema", lambda t, _: t.ema.state_dict(), _check_ema, lambda t, v: t.ema.load_state_dict(v)),
    Part("optimizer", lambda t, _: t.optimizer.state_dict(), _check_optimizer,
         lambda t, v: t.optimizer.load_state_dict(v)),
    Part("scheduler", lambda t, _: t.scheduler.state_dict(), _mapping("scheduler"),
         lambda t, v: t.scheduler.load_state_dict(v)),
    Part("updater", lambda t, _: t.updater.state_dict(), _check_updater,  # the gradient scaler, skipped steps
         lambda t, v: t.updater.load_state_dict(v)),
    Part("rng", lambda t, _: rng_state(), _check_rng, lambda t, v: set_rng_state(v)),
    Part("opt", lambda t, _: t.s.saved_options(), _plain_mapping("opt")),  # read by resolve_resume
    Part("hyp", lambda t, _: t.s.hyp.as_dict(), _plain_mapping("hyp")),  # read by resolve_resume
    Part("best_fitness", lambda t, _: t.best_fitness, _value("best_fitness", is_number, "a number"),
         _set("best_fitness")),
    Part("best_epoch", lambda t, _: t.best_epoch, _value("best_epoch", is_int, "a whole number"), _set("best_epoch")),
    Part("completed_epoch", lambda t, epoch: epoch,
         _value("completed_epoch", lambda x: is_int(x) and x >= -1, "an epoch number"),
         lambda t, v: setattr(t, "start_epoch", v + 1)),
    Part("elapsed", lambda t, _: t.elapsed, _value("elapsed", is_number, "a number of seconds"),
         _set("elapsed", float), optional=True),
    Part("pictures", lambda t, _: len(t.train_loader.dataset), _count("pictures"),
         optional=True),  # compared with the data now by Trainer.check_same_data
    Part("batches_per_epoch", lambda t, _: t.batches_per_epoch, _count("batches_per_epoch"),
         _set("schedule_batches", int), optional=True),  # none in files from before it: the loader's
)


def save_train_state(t: Any, epoch: int) -> dict[str, Any]:
    """Every part of the Trainer `t` after `epoch` (-1: the initial state), as last.pt's 'train'."""
    return {p.key: p.save(t, epoch) for p in PARTS}


def load_train_state(t: Any, state: dict[str, Any]) -> None:
    """Every part back into `t` (the state was checked when its file was loaded: check_train_state)."""
    for p in PARTS:
        if p.load is not None and p.key in state:
            p.load(t, state[p.key])


def check_train_state(state: Any, model: dict[str, torch.Tensor]) -> None:
    """The 'train' part of a last.pt written during training, part by part (SchemaError naming the first bad field)."""
    require(isinstance(state, dict), "train", "a mapping", state)
    for p in PARTS:
        if not (p.optional and p.key not in state):
            p.check(field_of(state, p.key), model)


def rewind_epoch_files(save_dir: Path, last_epoch: int) -> None:
    """The rows of EPOCH_FILES after `last_epoch` dropped: what a killed process or an abandoned epoch wrote."""
    for name in EPOCH_FILES:
        truncate_after(save_dir / name, last_epoch)
