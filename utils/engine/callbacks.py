"""Hooks into the training loop: what observes or perturbs a run (fault injection, benchmarks,
TensorBoard) registers here instead of being threaded through train.py's story.

    callbacks = Callbacks()
    callbacks.register("on_epoch_end", lambda trainer, epoch, row: print(epoch, row["metrics/mAP_0.5"]))
    train.run(epochs=3, callbacks=callbacks)

Events, in the order a run fires them (every callback gets the Trainer first; see train.py):

    on_train_start(trainer)                 every rank: the run is built (and its folder prepared on rank 0),
                                            before the first epoch; loaders may still be wrapped here
    on_epoch_start(trainer, epoch)          before the training pass of `epoch` (every rank)
    on_train_batch(trainer, ni, imgs,       global batch `ni` as the model will see it (float 0..1, after
                   targets, paths)          --multi-scale's resize), before the forward pass; read only
    on_loss(trainer, ni, loss, items)       after the forward pass and loss of global batch `ni` (epoch *
                                            batches_per_epoch + batch), before backward; may return a
                                            replacement (loss, items) pair, None keeps them
    on_step_end(trainer, ni, items)         after the batch's backward (and optimizer step at an
                                            accumulation boundary); items: box, obj, cls loss (CPU)
    on_train_epoch_end(trainer, epoch)      after the training pass, before the weights' finiteness check
    on_rewind(trainer)                      after non-finite weights made the run reload last.pt: training
                                            continues at trainer.start_epoch (whatever was recorded from
                                            that epoch on is to be forgotten)
    on_epoch_end(trainer, epoch, row)       rank 0, after validation, once results.csv has the epoch's row
                                            (row: {column: value} as written)
    before_save(trainer, path)              each checkpoint write, between its temp file and the rename
    on_train_end(trainer)                   rank 0, after the checkpoints are stripped and plots drawn
    on_train_exit(trainer)                  every rank, whenever the run leaves after on_train_start: finished,
                                            interrupted or failed; release what on_train_start opened

A callback that raises stops the run as any other error would.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

EVENTS = ("on_train_start", "on_epoch_start", "on_train_batch", "on_loss", "on_step_end", "on_train_epoch_end",
          "on_rewind", "on_epoch_end", "before_save", "on_train_end", "on_train_exit")


class Callbacks:
    def __init__(self) -> None:
        self._hooks: dict[str, list[Callable[..., Any]]] = defaultdict(list)

    def register(self, event: str, fn: Callable[..., Any]) -> None:
        if event not in EVENTS:
            raise ValueError(f"unknown training event {event!r}; one of {', '.join(EVENTS)}")
        self._hooks[event].append(fn)

    def copy(self) -> Callbacks:
        """A new Callbacks with these hooks: a run registers its own observers into a copy, never into the
        caller's object (which may serve several runs)."""
        other = Callbacks()
        for event, fns in self._hooks.items():
            other._hooks[event] = list(fns)
        return other

    def merged(self, other: Callbacks) -> Callbacks:
        """A new Callbacks with these hooks, then `other`'s, for each event."""
        out = self.copy()
        for event, fns in other._hooks.items():
            out._hooks[event] += fns
        return out

    def __contains__(self, event: str) -> bool:
        return bool(self._hooks.get(event))

    def fire(self, event: str, *args: Any) -> None:
        for fn in self._hooks.get(event, ()):
            fn(*args)

    def loss(self, trainer: Any, ni: int, loss: Any, items: Any) -> tuple[Any, Any]:
        """on_loss: each callback in turn may replace (loss, items)."""
        for fn in self._hooks.get("on_loss", ()):
            out = fn(trainer, ni, loss, items)
            if out is not None:
                loss, items = out
        return loss, items
