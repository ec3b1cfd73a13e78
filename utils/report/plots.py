"""Training and evaluation charts (matplotlib, Agg); boxes drawn on images live in utils/report/draw.py.

Imported only where charts are made. Nothing here downloads anything: the charts use matplotlib's
bundled font. Figures are drawn on their own Agg canvas, without pyplot: nothing here changes the
process's matplotlib backend (a notebook keeps its own), it works without a display (CI, servers, DDP
workers), and it is safe off the main thread (batch previews draw on one).
"""
from __future__ import annotations

import functools
import logging
import math
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from utils.report.draw import class_name, colors
from utils.report.results import read_table

LOGGER = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable)


def never_fatal(fn: F, name: str | None = None) -> F:
    """`fn` (a chart) with any failure inside it (MemoryError, a matplotlib error, a full disk) turned into one
    warning line naming the chart and the error, and None returned: a picture is never the end of a training run,
    a validation or a test. Every chart below is wrapped; validator.py wraps what it calls again, so a chart
    replaced at run time (a plugin, a test) is covered too."""
    label = name or getattr(fn, "__name__", "chart")

    @functools.wraps(fn)
    def drawn(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - whatever it is, the results it would draw are already safe
            detail = " ".join(str(e).split())[:160]
            LOGGER.warning(f"warning: {label} could not be drawn ({type(e).__name__}: {detail}); "
                           f"the results are not affected")
            return None

    return drawn  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------ charts


def _png_path(save: str | Path, default_name: str) -> Path:
    """`save` is either a folder (the default file name goes inside) or a .png / .jpg path."""
    save = Path(save)
    path = save if save.suffix.lower() in (".png", ".jpg") else save / default_name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _subplots(nrows: int, ncols: int, figsize: tuple[float, float], squeeze: bool = True):
    """pyplot.subplots' (figure, axes) on a figure of its own Agg canvas."""
    fig = Figure(figsize=figsize, tight_layout=True)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=200)
    return path


@never_fatal
def plot_results(csv_path: str | Path) -> Path | None:
    """results.png beside train.py's results.csv: one panel per column, plotted against epoch."""
    csv_path = Path(csv_path)
    header, data = read_table(csv_path)
    has_epoch = header[0].lower() == "epoch"
    x = data[:, 0] if has_epoch else np.arange(len(data))
    cols = [i for i, h in enumerate(header) if not (has_epoch and i == 0)]
    ncol = min(5, max(len(cols), 1))
    nrow = max(math.ceil(len(cols) / ncol), 1)
    fig, axes = _subplots(nrow, ncol, (3 * ncol, 2.6 * nrow), squeeze=False)
    for ax in axes.ravel()[len(cols):]:
        ax.axis("off")
    for ax, i in zip(axes.ravel(), cols):
        y = data[:, i]
        ax.plot(x, y, marker=".", linewidth=1.5, markersize=5, label="results")
        if len(y) >= 5 and np.isfinite(y).all():
            ax.plot(x, _smooth(y), ":", linewidth=1.5, label="smoothed")
        ax.set_title(header[i], fontsize=10)
        if len(x) > 1 and np.isfinite(x).all():
            ax.set_xlim(x.min(), x.max())  # same span everywhere, also for columns filled only at the end
        ax.set_xlabel("epoch" if has_epoch else "row", fontsize=8)
        ax.tick_params(labelsize=7)
    return _save(fig, csv_path.parent / "results.png")


@never_fatal
def plot_evolve(csv_path: str | Path) -> Path | None:
    """evolve.png beside train.py --evolve's evolve.csv: one panel per evolved hyperparameter (the columns after
    the metrics), its value against fitness, coloured by generation; the fittest generation is the cross and
    its value the panel's title."""
    csv_path = Path(csv_path)
    header, data = read_table(csv_path)
    fit = data[:, header.index("fitness")]
    genes = [i for i, h in enumerate(header) if h not in ("generation", "fitness") and not h.startswith("metrics/")]
    best = int(np.nanargmax(fit)) if np.isfinite(fit).any() else 0
    ncol = min(6, max(len(genes), 1))
    nrow = max(math.ceil(len(genes) / ncol), 1)
    fig, axes = _subplots(nrow, ncol, (2.6 * ncol, 2.4 * nrow), squeeze=False)
    for ax in axes.ravel()[len(genes):]:
        ax.axis("off")
    for ax, i in zip(axes.ravel(), genes):
        ax.scatter(data[:, i], fit, c=np.arange(len(fit)), cmap="viridis", s=12, alpha=0.8, edgecolors="none")
        ax.plot(data[best, i], fit[best], "k+", markersize=12)
        ax.set_title(f"{header[i]} = {data[best, i]:.4g}", fontsize=9)
        ax.tick_params(labelsize=6)
    axes[0, 0].set_ylabel("fitness", fontsize=8)
    return _save(fig, csv_path.parent / "evolve.png")


def _smooth(y: np.ndarray, frac: float = 0.1) -> np.ndarray:
    """Moving average over ~frac of the points (odd window, edges padded) to show the trend."""
    k = max(round(len(y) * frac) // 2 * 2 + 1, 3)
    padded = np.pad(y, k // 2, mode="edge")
    return np.convolve(padded, np.ones(k) / k, mode="valid")


def _names_list(names: Sequence[str] | dict[int, str], n: int) -> list[str]:
    return [class_name(names, i) for i in range(n)]


@never_fatal
def plot_pr_curve(px: np.ndarray, py: np.ndarray, ap: np.ndarray, save_dir: str | Path,
                  names: Sequence[str] | dict) -> Path | None:
    """Precision-recall curve per class and their mean; legend shows AP@0.5.

    px: recall grid (K,); py: precision at px per class (nc, K); ap: (nc,) or (nc, T) where column 0 is AP@0.5.
    """
    py = np.asarray(py, dtype=float).reshape(-1, len(px))
    ap = np.asarray(ap, dtype=float).reshape(len(py), -1)[:, 0] if len(py) else np.zeros(0)
    labels = _names_list(names, len(py))
    fig, ax = _subplots(1, 1, (9, 6))
    per_class = 0 < len(py) < 21  # a legend with more entries is unreadable
    for i, y in enumerate(py):
        ax.plot(px, y, linewidth=1, label=f"{labels[i]} {ap[i]:.3f}" if per_class else None, color="grey" if not per_class else None)
    if len(py):
        ax.plot(px, py.mean(0), linewidth=3, color="blue", label=f"all classes {ap.mean():.3f} mAP@0.5")
    ax.set(xlabel="Recall", ylabel="Precision", xlim=(0, 1), ylim=(0, 1), title="Precision-Recall curve")
    ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left", fontsize=8)
    return _save(fig, _png_path(save_dir, "PR_curve.png"))


@never_fatal
def plot_mc_curve(
    px: np.ndarray,
    py: np.ndarray,
    save_dir: str | Path,
    names: Sequence[str] | dict,
    xlabel: str = "Confidence",
    ylabel: str = "F1",
) -> Path | None:
    """A metric (F1, precision, recall) against confidence threshold, per class and averaged.

    The legend names the best mean value and the threshold where it is reached.
    """
    py = np.asarray(py, dtype=float).reshape(-1, len(px))
    labels = _names_list(names, len(py))
    fig, ax = _subplots(1, 1, (9, 6))
    per_class = 0 < len(py) < 21
    for i, y in enumerate(py):
        ax.plot(px, y, linewidth=1, label=labels[i] if per_class else None, color="grey" if not per_class else None)
    if len(py):
        mean = _smooth(py.mean(0), 0.05)
        best = int(np.nanargmax(mean))
        ax.plot(px, mean, linewidth=3, color="blue", label=f"all classes {mean[best]:.2f} at {px[best]:.3f}")
    ax.set(xlabel=xlabel, ylabel=ylabel, xlim=(0, 1), ylim=(0, 1), title=f"{ylabel}-{xlabel} curve")
    ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left", fontsize=8)
    return _save(fig, _png_path(save_dir, f"{ylabel}_curve.png"))


CM_MAX_LABELLED = 60  # rows and columns: up to this many the class names are written along the axes
CM_MAX_INCHES = (16.0, 14.0)  # the figure's size at most: 3,200 x 2,800 px at the dpi of _save


def confusion_figsize(n: int) -> tuple[float, float]:
    """(width, height) in inches of the confusion matrix of n rows: room for the cells and their names while they
    are written (up to CM_MAX_LABELLED), then a fixed figure in which each class is a few pixels. It grew with n
    before: 18,690 x 16,580 px at 200 classes, a 42 GB canvas (a MemoryError at the end of training) at 1,203."""
    return min(max(6.0, 0.22 * n + 3), CM_MAX_INCHES[0]), min(max(5.0, 0.19 * n + 2.5), CM_MAX_INCHES[1])


@never_fatal
def plot_confusion_matrix(matrix: np.ndarray, names: Sequence[str] | dict, save_path: str | Path,
                          normalize: bool = True) -> Path | None:
    """Heat map of a confusion matrix laid out as matrix[predicted, true].

    A matrix one larger than the class list has a final 'background' row/column (missed objects and
    false detections). With normalize=True each column (true class) sums to 1.
    """
    m = np.asarray(matrix, dtype=float)
    n = m.shape[0]
    labels = _names_list(names, n)
    if len(names) == n - 1:
        labels[-1] = "background"
    if normalize:
        m = m / np.maximum(m.sum(0, keepdims=True), 1e-9)
        m[m < 0.005] = np.nan  # blank cells instead of a sea of 0.00
    fig, ax = _subplots(1, 1, confusion_figsize(n))
    im = ax.imshow(m, cmap="Blues", vmin=0.0, vmax=1.0 if normalize else None)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    show_ticks = n <= CM_MAX_LABELLED
    font = 8 if n <= 30 else 6
    ax.set_xticks(range(n) if show_ticks else [], labels if show_ticks else [], rotation=90, fontsize=font)
    ax.set_yticks(range(n) if show_ticks else [], labels if show_ticks else [], fontsize=font)
    if n < 30:  # cell values only while they fit
        vmax = np.nanmax(m) if np.isfinite(m).any() else 1.0
        for (i, j), v in np.ndenumerate(m):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}" if normalize else f"{int(v)}", ha="center", va="center",
                        fontsize=7, color="white" if v > 0.6 * vmax else "black")
    ax.set(xlabel="True", ylabel="Predicted", title="Confusion matrix" + (" (normalised by true class)" if normalize else ""))
    return _save(fig, _png_path(save_path, "confusion_matrix.png"))


@never_fatal
def plot_labels(labels: np.ndarray, names: Sequence[str] | dict, save_dir: str | Path) -> Path | None:
    """labels.jpg: instances per class, box centres (x, y) and box sizes (w, h) of a dataset.

    labels: (n, 5) array of cls, cx, cy, w, h normalised to the image (all images concatenated).
    """
    lb = np.asarray(labels, dtype=float).reshape(-1, 5)
    nc = max(len(names), int(lb[:, 0].max()) + 1 if len(lb) else 0)
    counts = np.bincount(lb[:, 0].astype(int), minlength=nc) if len(lb) else np.zeros(nc, int)
    fig, axes = _subplots(1, 3, (15, 4.5))
    bar_colors = [np.array(colors(i)) / 255 for i in range(nc)]
    axes[0].bar(range(nc), counts, color=bar_colors)
    axes[0].set(ylabel="instances", title=f"{len(lb)} labels, {nc} classes")
    if nc < 30:
        axes[0].set_xticks(range(nc), _names_list(names, nc), rotation=90, fontsize=8)
    # subsample so a large dataset plots in seconds; the point cloud looks the same
    pts = lb[np.random.default_rng(0).permutation(len(lb))[:50_000]] if len(lb) > 50_000 else lb
    alpha = float(np.clip(200 / max(len(pts), 1), 0.05, 0.8))
    for ax, (a, b), title in ((axes[1], (1, 2), "box centres"), (axes[2], (3, 4), "box sizes")):
        ax.scatter(pts[:, a], pts[:, b], s=4, alpha=alpha, color="tab:blue", linewidths=0)
        ax.set(xlim=(0, 1), ylim=(0, 1), title=title, aspect="equal")
    axes[1].set(xlabel="x", ylabel="y")
    axes[1].invert_yaxis()  # image convention: y grows downwards
    axes[2].set(xlabel="width", ylabel="height")
    return _save(fig, _png_path(save_dir, "labels.jpg"))
