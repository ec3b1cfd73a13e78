"""Faults injected on purpose, so tests and bench/kill_campaign.py can show that training survives them.

The plan is read once, by train.train, from the environment variable AMPYOLO_FAULTS and registers its
hooks as Trainer callbacks (utils/engine/callbacks.py); nothing else reads the variable. Without it nothing is
registered.

    AMPYOLO_FAULTS="nan_loss@1,4;nan_weights@0x2;slow_save@0.5"

    nan_loss@i,j,...  the loss of global batches i, j (epoch * batches_per_epoch + batch) is NaN
    overflow@i,j,...  the loss of global batches i, j is multiplied by 2**100: under fp16 autocast its
                      gradients overflow to inf, the overflow a GradScaler exists for (in FP32 and bf16
                      they stay finite and gradient clipping bounds the step)
    nan_weights@e[xN] the model's weights are set to NaN when epoch e ends, the first N times (default 1)
    slow_save@s       every checkpoint write pauses s seconds between writing its temp file and renaming it
                      (gives bench/kill_campaign.py a window to kill the process mid-write)
    disk_full@n       the n-th checkpoint write of this process, and every later one, fails with ENOSPC
    worker_exit@k     the DataLoader worker that builds its k-th batch exits at once (os._exit), as if
                      killed by the out-of-memory killer
    kill@e            the process sends itself SIGKILL as epoch e starts, once last.pt holds epoch e - 1:
                      a hard kill at a known point, where a parent's signal would race the run
    term@where:n      SIGTERM to the whole process group, workers included, as a job scheduler, systemd or
                      `kill -- -PGID` sends it; where: epoch (as epoch n starts), train / val (from the process
                      that builds its n-th training / validation batch: a loader worker, or train.py with
                      --workers 0), save (during the n-th checkpoint write, its temp file written). Only for a
                      train.py that leads its own process group (started with setsid): it signals the group
"""
from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from utils.engine.callbacks import Callbacks
from utils.engine.dist import de_parallel
from utils.errors import UserError

ENV = "AMPYOLO_FAULTS"


@dataclass
class FaultPlan:
    nan_loss: frozenset[int] = frozenset()
    overflow: frozenset[int] = frozenset()
    nan_weights: dict[int, int] = field(default_factory=dict)  # epoch -> times left to fire
    slow_save: float = 0.0
    disk_full: int = 0
    worker_exit: int = 0
    kill: int = -1  # the epoch whose start the process does not survive; -1: never
    term: tuple[str, int] | None = None  # (where, n): when the process group gets SIGTERM
    _saves: int = 0

    @property
    def active(self) -> bool:
        return bool(self.nan_loss or self.overflow or self.nan_weights or self.slow_save or self.disk_full
                    or self.worker_exit or self.kill >= 0 or self.term)

    def loss(self, ni: int, loss: torch.Tensor, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if ni in self.nan_loss:
            return loss * float("nan"), items * float("nan")
        if ni in self.overflow:
            return loss * 2.0**100, items  # the logged loss stays the true one
        return loss, items

    def epoch_end(self, epoch: int, model: nn.Module) -> None:
        if self.nan_weights.get(epoch, 0) > 0:
            self.nan_weights[epoch] -= 1
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))

    def before_replace(self) -> None:
        """A checkpoint write's before_save: its temp file is written, the rename comes next."""
        self._saves += 1
        if self.term == ("save", self._saves):
            terminate_group()
        if self.disk_full and self._saves >= self.disk_full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.slow_save:
            time.sleep(self.slow_save)

    def wrap_collate(self, collate):
        return _ExitingCollate(collate, self.worker_exit) if self.worker_exit else collate

    def register(self, callbacks: Callbacks) -> None:
        """Hook each fault the plan holds into the training loop's callbacks."""
        if self.nan_loss or self.overflow:
            callbacks.register("on_loss", lambda t, ni, loss, items: self.loss(ni, loss, items))
        if self.nan_weights:
            callbacks.register("on_train_epoch_end", lambda t, epoch: self.epoch_end(epoch, de_parallel(t.model)))
        if self.slow_save or self.disk_full or (self.term and self.term[0] == "save"):
            callbacks.register("before_save", lambda t, path: self.before_replace())
        if self.worker_exit:
            def wrap(t) -> None:
                t.train_loader.collate_fn = self.wrap_collate(t.train_loader.collate_fn)

            callbacks.register("on_train_start", wrap)
        if self.kill >= 0 or (self.term and self.term[0] == "epoch"):
            callbacks.register("on_epoch_start", lambda t, epoch: self.epoch_start(epoch))
        if self.term and self.term[0] in ("train", "val"):
            callbacks.register("on_train_start", self._signal_from_loader)

    def epoch_start(self, epoch: int) -> None:
        if epoch == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.term == ("epoch", epoch):
            terminate_group()

    def _signal_from_loader(self, t) -> None:
        """term@train / term@val: the loader's collate function sends the group's SIGTERM at its n-th batch."""
        loader = t.train_loader if self.term[0] == "train" else t.val_loader
        if loader is not None:
            loader.collate_fn = _SignallingCollate(loader.collate_fn, self.term[1], os.getpid())


class _ExitingCollate:
    """A collate function that ends its worker process at its k-th call (counted in each worker)."""

    def __init__(self, collate, k: int):
        self.collate, self.k, self.calls = collate, k, 0

    def __call__(self, batch):
        self.calls += 1
        if self.calls >= self.k and torch.utils.data.get_worker_info() is not None:
            os._exit(1)
        return self.collate(batch)


def terminate_group(leader: int | None = None) -> None:
    """SIGTERM to this process's group, refused unless train.py (`leader`, else this process) leads it: a run started
    without setsid shares its group with the shell or test runner that started it."""
    if os.getpgrp() != (leader or os.getpid()):
        raise UserError(f"{ENV}: term@ signals the whole process group; start train.py in a group of its own (setsid)")
    os.killpg(os.getpgrp(), signal.SIGTERM)


class _SignallingCollate:
    """A collate function that sends the process group SIGTERM at its n-th call (counted in each process)."""

    def __init__(self, collate, n: int, leader: int):
        self.collate, self.n, self.leader, self.calls = collate, n, leader, 0

    def __call__(self, batch):
        self.calls += 1
        if self.calls == self.n:
            terminate_group(self.leader)
        return self.collate(batch)


def parse_faults(spec: str | None) -> FaultPlan:
    """A FaultPlan from the AMPYOLO_FAULTS syntax above; a typo is a UserError, never silently ignored."""
    plan = FaultPlan()
    for item in filter(None, (x.strip() for x in (spec or "").split(";"))):
        name, _, arg = item.partition("@")
        try:
            if name in ("nan_loss", "overflow"):
                setattr(plan, name, frozenset(int(x) for x in arg.split(",")))
            elif name == "nan_weights":
                epoch, _, times = arg.partition("x")
                plan.nan_weights[int(epoch)] = int(times or 1)
            elif name in ("slow_save", "disk_full", "worker_exit", "kill"):
                setattr(plan, name, (float if name == "slow_save" else int)(arg))
            elif name == "term":
                where, _, n = arg.partition(":")
                if where not in ("epoch", "train", "val", "save"):
                    raise ValueError(where)
                plan.term = (where, int(n))
            else:
                raise ValueError(name)
        except ValueError:
            raise UserError(f"{ENV}: cannot parse {item!r}; see utils/engine/faults.py for the syntax") from None
    return plan


def faults_from_env() -> FaultPlan:
    return parse_faults(os.environ.get(ENV))
