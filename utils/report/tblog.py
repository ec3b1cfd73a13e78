"""TensorBoard curves of a run: `tensorboard --logdir runs/train` shows every run folder.

Two kinds of scalars go into the run folder's event files:
  per epoch (x = epoch):  every numeric column of the results.csv row (train/box_loss, metrics/mAP_0.5, lr0, ...)
  per step (x = global batch index, every `every` batches):
                          step/box_loss, step/obj_loss, step/cls_loss, step/lr<k> for each parameter group,
                          step/scale (the GradScaler's scale, when there is one), step/skipped_steps

Resume: opening the logger at (start_epoch, start_step) first rewrites the folder's event history without the
epoch points at or after start_epoch and the step points at or after start_step (what the killed process logged
past its last checkpoint), so the resumed run continues the same curves with no duplicated or missing points.
TensorBoard's own purge_step cannot do this here: it cuts one step value across all tags, and the epoch curves
count epochs while the step curves count batches. The rewrite also keeps the files readable by any reader
(the Rust data server, EventAccumulator, tbparse), none of which then has to honour a purge.

Cost: one event with all of a step's values, serialised at once and written in batches (37 us a step against
100 with EventFileWriter's thread, measured against a training step at commit 3c86681). Events are built with TensorBoard's protos and record framing, not
torch.utils.tensorboard's SummaryWriter, whose add_scalar costs ~15x more per value.
Only rank 0 writes; without the tensorboard package the logger is a no-op after one line naming the pip command.
"""
from __future__ import annotations

import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

LOGGER = logging.getLogger(__name__)

STEP_PREFIX = "step/"
STEP_LOSSES = ("box_loss", "obj_loss", "cls_loss")
EVENT_GLOB = "events.out.tfevents.*"
FLUSH_EVERY = 1000  # events held in memory at most before they are written
FLUSH_SECS = 30  # ...and seconds at most, so `tensorboard` shows a long epoch as it goes


def default_every(batches_per_epoch: int, points_per_epoch: int = 200) -> int:
    """Log every N batches so an epoch gives about `points_per_epoch` step points (every batch on small
    datasets; every ~36th on COCO at batch 16): event files stay small (~250 bytes a point) on long runs.
    Depends only on the epoch length, so a resumed run logs the same steps."""
    return max(1, batches_per_epoch // points_per_epoch)


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class TBLogger:
    """Writes the run's scalars; every method is a no-op when disabled (rank != 0, tensorboard missing)."""

    def __init__(self, log_dir: str | Path | None, every: int = 1, start_epoch: int = 0, start_step: int = 0):
        """log_dir None: disabled. Otherwise the history at or after (start_epoch, start_step) is cut first."""
        self.every = max(int(every), 1)
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._writer = None
        if self.log_dir is None:
            return
        from tensorboard.compat.proto.event_pb2 import Event  # imported only when logging is on
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._Event, self._Summary = Event, Summary
        self.rewind(start_epoch, start_step)

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def _open(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = _EventWriter(self.log_dir, self._Event)

    def _add(self, step: int, values: list[tuple[str, float]]) -> None:
        if values:
            s = self._Summary(value=[self._Summary.Value(tag=t, simple_value=v) for t, v in values])
            try:
                self._writer.add(self._Event(wall_time=time.time(), step=int(step), summary=s))
            except OSError as e:
                self._give_up(e)

    def _give_up(self, e: OSError) -> None:
        """A full disk or a vanished folder ends the curves, never the training."""
        LOGGER.warning(f"warning: TensorBoard logging off: cannot write in {self.log_dir} ({e.strerror or e}); "
                       f"training goes on")
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass

    def log_step(self, step: int, losses: Sequence[float] | Any, lrs: Sequence[float], scale: float | None = None,
                 skipped: int | None = None) -> None:
        """Per-step scalars at global batch index `step` (logged when step % every == 0).

        losses: box, obj, cls (a CPU tensor or floats; non-finite values are left out), lrs: each parameter
        group's lr, scale: GradScaler.get_scale() or None without a scaler, skipped: steps skipped so far.
        """
        if self._writer is None or step % self.every:
            return
        values = [(STEP_PREFIX + n, v) for n, v in zip(STEP_LOSSES, (_finite(x) for x in _floats(losses))) if v is not None]
        values += [(f"{STEP_PREFIX}lr{k}", float(lr)) for k, lr in enumerate(lrs)]
        if scale is not None:
            values.append((STEP_PREFIX + "scale", float(scale)))
        if skipped is not None:
            values.append((STEP_PREFIX + "skipped_steps", float(skipped)))
        self._add(step, values)

    def log_epoch(self, epoch: int, row: Mapping[str, Any]) -> None:
        """Every finite numeric column of a results.csv row (its 'epoch' column is the x axis), then a flush: an
        epoch's points are on disk before its checkpoint is written, so a resume never misses them."""
        if self._writer is None:
            return
        values = [(str(k), v) for k, v in ((k, _finite(x)) for k, x in row.items()) if k != "epoch" and v is not None]
        self._add(epoch, values)
        self.flush()

    def flush(self) -> None:
        self._io("flush")

    def close(self) -> None:
        self._io("close")
        self._writer = None

    def _io(self, method: str) -> None:
        """The writer's flush or close; a disk error turns logging off with one warning, training goes on."""
        if self._writer is not None:
            try:
                getattr(self._writer, method)()
            except OSError as e:
                self._give_up(e)

    def rewind(self, start_epoch: int, start_step: int) -> None:
        """Continue from (start_epoch, start_step): cut the history at or after them and reopen the writer.
        Called on resume (by the constructor) and when training replays from an earlier checkpoint."""
        if self.log_dir is None:
            return
        self.close()
        try:
            cut_history(self.log_dir, start_epoch, start_step)
            self._open()
        except OSError as e:
            self._give_up(e)


class _EventWriter:
    """One event file, written from the training thread: events are serialised when logged and framed (with
    TensorBoard's pure-Python CRC) and written in batches: at each flush, every FLUSH_EVERY events and when
    FLUSH_SECS have passed. TensorBoard's EventFileWriter hands each event to a writer thread instead, which
    costs more per step here than the write itself: the thread and the loop take turns on the GIL."""

    count = 0  # writers opened by this process: part of the file name, as in TensorBoard's own

    def __init__(self, log_dir: Path, event_cls: Any) -> None:
        import socket

        from tensorboard.summary.writer.record_writer import RecordWriter

        _EventWriter.count += 1
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{_EventWriter.count}"
        self.path = log_dir / name
        self._file = open(self.path, "wb")
        self._records = RecordWriter(self._file)
        self._pending: list[bytes] = [event_cls(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()]
        self._last = time.monotonic()
        self.flush()

    def add(self, event: Any) -> None:
        self._pending.append(event.SerializeToString())
        if len(self._pending) >= FLUSH_EVERY or time.monotonic() - self._last > FLUSH_SECS:
            self.flush()

    def flush(self) -> None:
        for data in self._pending:
            self._records.write(data)
        self._pending.clear()
        self._file.flush()
        self._last = time.monotonic()

    def close(self) -> None:
        self.flush()
        self._file.close()


def _floats(x: Any) -> list:
    if hasattr(x, "tolist"):
        x = x.tolist()
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _event_files(log_dir: Path) -> list[Path]:
    # the writer names files events.out.tfevents.<10-digit time>...: name order is time order
    return sorted(p for p in log_dir.glob(EVENT_GLOB) if p.is_file() and not p.name.endswith(".tmp"))


def cut_history(log_dir: str | Path, start_epoch: int, start_step: int) -> int:
    """Rewrite the event files of `log_dir` into one, keeping epoch points before start_epoch and step points
    before start_step, each (tag, step) once (the last one written). Returns the number of points dropped.

    The kept history goes to a temp file that is renamed over a name sorting before every later event file,
    then the old files are removed; a kill in between leaves duplicates that the next cut removes."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    log_dir = Path(log_dir)
    files = _event_files(log_dir)
    if not files:
        return 0
    events = []
    for f in files:
        try:
            events += [Event.FromString(raw) for raw in RawEventFileLoader(str(f)).Load()]
        except Exception as e:  # noqa: BLE001 - a damaged file loses its curves, never the run
            LOGGER.warning(f"warning: TensorBoard file {f} is unreadable past some point ({e}); kept what was read")
    seen: set[tuple[str, int]] = set()
    kept, dropped, version = [], 0, None
    for ev in reversed(events):  # newest first, so the last value written for a (tag, step) wins
        if ev.HasField("file_version"):
            version = ev
            continue
        if not ev.HasField("summary"):
            continue  # session logs (purge markers), graphs: nothing of ours
        vals = []
        for v in ev.summary.value:
            key = (v.tag, ev.step)
            limit = start_step if v.tag.startswith(STEP_PREFIX) else start_epoch
            if ev.step >= limit or key in seen:
                dropped += 1
                continue
            seen.add(key)
            vals.append(v)
        if vals:
            ev2 = Event(wall_time=ev.wall_time, step=ev.step)
            ev2.summary.value.extend(reversed(vals))
            kept.append(ev2)
    kept.reverse()
    if version is not None:
        kept.insert(0, version)
    first = re.match(r"events\.out\.tfevents\.(\d+)", files[0].name)
    stamp = int(first.group(1)) - 1 if first else 0
    target = log_dir / f"events.out.tfevents.{max(stamp, 0):010d}.history"
    tmp = log_dir / f".{target.name}.tmp"
    with open(tmp, "wb") as fh:
        w = RecordWriter(fh)
        for ev in kept:
            w.write(ev.SerializeToString())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    for f in files:
        if f != target:
            f.unlink(missing_ok=True)
    return dropped


def open_logger(log_dir: str | Path, rank: int = -1, enabled: bool = True, every: int = 1, start_epoch: int = 0,
                start_step: int = 0) -> TBLogger:
    """The run's logger: writing on rank 0 (or -1, no DDP) when enabled and tensorboard is installed, else a no-op.
    start_epoch / start_step: where a resumed run continues (0, 0 for a fresh run, which clears old curves)."""
    if not enabled or rank not in (-1, 0):
        return TBLogger(None)
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        LOGGER.info("TensorBoard logging off: the tensorboard package is missing (pip install tensorboard)")
        return TBLogger(None)
    logger = TBLogger(log_dir, every, start_epoch, start_step)
    LOGGER.info(f"TensorBoard: tensorboard --logdir {Path(log_dir).parent} (every {logger.every} steps)")
    return logger


class TrainingCurves:
    """The Trainer callbacks that feed a run's TBLogger (train.py registers them through register_tensorboard).
    Always on, rank 0 only; x axes: the epoch, and the global batch index ni = epoch * batches_per_epoch + i."""

    def __init__(self) -> None:
        self.logger = TBLogger(None)
        self.batches_per_epoch = 1

    def start(self, t: Any) -> None:
        """on_train_start: a resumed run continues its curves where last.pt left off (later points are cut)."""
        nb = self.batches_per_epoch = len(t.train_loader)
        self.logger = open_logger(t.s.save_dir, t.s.info.rank, every=default_every(nb), start_epoch=t.start_epoch,
                                  start_step=t.start_epoch * nb)

    def step(self, t: Any, ni: int, items: Any) -> None:
        if self.logger.enabled and ni % self.logger.every == 0:
            self.logger.log_step(ni, items, [g["lr"] for g in t.optimizer.param_groups], t.updater.scale(),
                                 t.updater.skipped)

    def epoch(self, t: Any, epoch: int, row: Mapping[str, Any]) -> None:
        self.logger.log_epoch(epoch, row)

    def rewind(self, t: Any) -> None:
        """on_rewind: the run replays from t.start_epoch; the points of the abandoned steps go."""
        self.logger.rewind(t.start_epoch, t.start_epoch * self.batches_per_epoch)

    def close(self, t: Any) -> None:
        self.logger.close()


def register_tensorboard(callbacks: Any) -> TrainingCurves:
    """Register a run's TensorBoard logging into a utils.engine.callbacks.Callbacks; returns the hooks' owner."""
    curves = TrainingCurves()
    for event, fn in (("on_train_start", curves.start), ("on_step_end", curves.step), ("on_epoch_end", curves.epoch),
                      ("on_rewind", curves.rewind), ("on_train_exit", curves.close)):
        callbacks.register(event, fn)
    return curves
