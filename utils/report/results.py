"""The per-epoch CSV files of a run (results.csv, diagnostics.csv): their columns, the one writer and the
readers that train.py, utils/report/plots.py and the benchmarks share.

Rows are appended once per epoch; on resume (or a replay after non-finite weights) the rows of epochs
after the checkpoint are dropped by an atomic rewrite, so a kill at any moment loses no finished row.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from utils.errors import UserError
from utils.files import atomic_write

COLUMNS = ("epoch", "time", "train/box_loss", "train/obj_loss", "train/cls_loss", "metrics/precision", "metrics/recall",
           "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "val/box_loss", "val/obj_loss", "val/cls_loss",
           "lr0", "lr1", "lr2", "skipped_steps")  # results.csv
CLOCK = "time"  # the one column in which two runs of the same training (one resumed, say) differ


def append_row(path: str | Path, columns: Sequence[str], row: Sequence, fix: str) -> None:
    """One row of a per-epoch CSV (the header first if the file is new); floats with 6 significant
    digits. A failed write is one UserError line ending in `fix`."""
    path = Path(path)
    new = not path.exists()
    try:
        with open(path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(columns)
            w.writerow([f"{x:.6g}" if isinstance(x, float) else x for x in row])
    except OSError as e:
        raise UserError(f"could not write {path}: {e.strerror or e}; {fix}") from None


def read_rows(path: str | Path, clock: bool = True) -> list[list[str]]:
    """A per-epoch CSV as rows of text, header first; clock=False leaves out the wall-clock column of
    results.csv (files without one are returned whole)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if clock or not rows or CLOCK not in rows[0]:
        return rows
    drop = rows[0].index(CLOCK)
    return [r[:drop] + r[drop + 1:] for r in rows]


def read_records(path: str | Path) -> list[dict[str, str]]:
    """Rows as {column: value}, names and values stripped (also reads other tools' results.csv)."""
    with open(path, newline="") as f:
        return [{k.strip(): (v or "").strip() for k, v in row.items() if k is not None} for row in csv.DictReader(f)]


def read_table(path: str | Path) -> tuple[list[str], np.ndarray]:
    """Column names (whitespace stripped) and a float array (rows, cols); non-numbers become NaN."""
    rows = [r for r in read_rows(path) if r]
    if not rows:
        raise ValueError(f"{path} is empty")
    header = [h.strip() for h in rows[0]]

    def num(s: str) -> float:
        try:
            return float(s)
        except ValueError:
            return math.nan

    data = np.array([[num(v) for v in r[: len(header)]] + [math.nan] * (len(header) - len(r)) for r in rows[1:]])
    return header, data.reshape(-1, len(header))


def truncate_after(path: str | Path, last_epoch: int) -> None:
    """Drop rows of epochs after `last_epoch` (written before a kill, then redone) and a row cut short by
    a kill. Rewritten atomically: a kill during the rewrite loses no row."""
    path = Path(path)
    if not path.exists():
        return
    rows = read_rows(path)
    keep = rows[:1] + [r for r in rows[1:] if len(r) == len(rows[0]) and r[0].isdigit() and int(r[0]) <= last_epoch]
    if keep == rows:
        return
    text = io.StringIO(newline="")
    csv.writer(text).writerows(keep)
    atomic_write(path, lambda f: f.write(text.getvalue().encode("utf-8")))
