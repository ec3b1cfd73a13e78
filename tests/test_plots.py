"""utils/report/plots.py: every chart writes a readable PNG; utils/report/draw.py: box drawing touches exactly the box
border, and detection never imports matplotlib."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from utils.report.draw import Annotator, Colors, detection_label, draw_detections, save_crop
from utils.report.plots import plot_confusion_matrix, plot_labels, plot_mc_curve, plot_pr_curve, plot_results

NAMES = ["circle", "square", "triangle"]


def _check_png(path, suffix: str = ".png") -> None:
    assert path.suffix == suffix and path.is_file() and path.stat().st_size > 1000
    im = cv2.imread(str(path))
    assert im is not None and im.shape[0] > 100 and im.shape[1] > 100


def test_colors_are_deterministic_and_distinct():
    a, b = Colors(), Colors()
    assert [a(i) for i in range(30)] == [b(i) for i in range(30)]
    assert len({a(i) for i in range(len(a))}) == len(a)
    assert a(3, bgr=True) == a(3)[::-1]
    assert a(len(a) + 2) == a(2)


def test_detection_label():
    assert detection_label("circle", 0.876) == "circle 0.88"
    assert detection_label("circle", 0.876, hide_conf=True) == "circle"
    assert detection_label("circle", 0.876, hide_labels=True) == ""


@pytest.mark.parametrize("lw", [1, 2, 3, 4])
def test_box_changes_exactly_its_border(lw):
    im = np.full((60, 80, 3), 100, np.uint8)
    x1, y1, x2, y2 = 20, 15, 50, 40
    Annotator(im, line_width=lw).box((x1, y1, x2, y2), (0, 0, 255))
    changed = (im != 100).any(2)
    a, b = (lw - 1) // 2, lw - 1 - (lw - 1) // 2
    expected = np.zeros_like(changed)
    expected[y1 - a:y2 + a + 1, x1 - a:x2 + a + 1] = True  # outer rectangle
    expected[y1 + b + 1:y2 - b, x1 + b + 1:x2 - b] = False  # inner hole
    assert np.array_equal(changed, expected)
    assert (changed.sum(0).max(), changed.sum(1).max()) == (y2 - y1 + 1 + 2 * a, x2 - x1 + 1 + 2 * a)
    # the band is lw pixels wide on every side
    assert changed[(y1 + y2) // 2].sum() == 2 * lw
    assert changed[:, (x1 + x2) // 2].sum() == 2 * lw


def test_box_at_image_edge_is_clipped():
    im = np.zeros((20, 20, 3), np.uint8)
    Annotator(im, line_width=3).box((-5, -5, 30, 30), (255, 255, 255))  # wholly outside: nothing drawn
    assert im.sum() == 0
    Annotator(im, line_width=3).box((0, 0, 19, 19), (255, 255, 255))
    assert im[0].all() and im[:, 0].all() and not im[5:15, 5:15].any()


def test_draw_detections_labels_above_box():
    im = np.full((200, 300, 3), 128, np.uint8)
    det = np.array([[50, 80, 150, 180, 0.9, 1]])
    draw_detections(im, det, NAMES, line_width=2)
    assert (im[60:79, 50:120] != 128).any()  # label tab drawn above the box
    assert (im[90:170, 60:140] == 128).all()  # interior untouched
    plain = np.full_like(im, 128)
    draw_detections(plain, det, NAMES, line_width=2, hide_labels=True)
    assert (plain[60:78, 50:120] == 128).all()


def test_annotator_rejects_float_images():
    with pytest.raises(ValueError):
        Annotator(np.zeros((10, 10, 3), np.float32))


def test_save_crop(tmp_path):
    im = np.random.default_rng(0).integers(0, 255, (100, 120, 3), dtype=np.uint8)
    p = save_crop(im, (10, 20, 50, 60), tmp_path / "crops" / "a" / "x.jpg", gain=1.0, pad=0)
    crop = cv2.imread(str(p))
    assert crop.shape == (40, 40, 3)
    p = save_crop(im, (0, 0, 120, 100), tmp_path / "full.png")  # padding clipped to the image
    assert np.array_equal(cv2.imread(str(p)), im)


def test_plot_results(tmp_path):
    csv = tmp_path / "results.csv"
    rows = ["      epoch,  train/box_loss,   metrics/mAP_0.5,  x/lr0"]
    rows += [f"{e:>10}, {1 / (e + 1):.5f}, {e / 10:.5f}, 0.01" for e in range(10)]
    csv.write_text("\n".join(rows) + "\n")
    p = plot_results(csv)
    assert p == tmp_path / "results.png"
    _check_png(p)


def test_plot_results_single_row_and_nonnumeric(tmp_path):
    csv = tmp_path / "results.csv"
    csv.write_text("epoch,loss,note\n0,1.5,nan\n")
    _check_png(plot_results(csv))


@pytest.mark.slow
def test_curves_and_matrix(tmp_path):
    px = np.linspace(0, 1, 1000)
    py = np.stack([1 - px ** (i + 2) for i in range(3)])
    _check_png(plot_pr_curve(px, py, np.full((3, 10), 0.5), tmp_path, NAMES))
    p = plot_mc_curve(px, py * px, tmp_path, NAMES, ylabel="F1")
    assert p.name == "F1_curve.png"
    _check_png(p)
    m = np.random.default_rng(0).integers(0, 20, (4, 4))
    _check_png(plot_confusion_matrix(m, NAMES, tmp_path / "confusion_matrix.png"))
    _check_png(plot_confusion_matrix(np.zeros((4, 4)), NAMES, tmp_path / "cm0.png", normalize=False))
    # many classes: no legend entries per class, no cell text; still a picture
    _check_png(plot_pr_curve(px, np.tile(py, (10, 1)), np.full(30, 0.4), tmp_path / "pr30.png", {}))


@pytest.mark.slow
def test_plot_labels(tmp_path):
    rng = np.random.default_rng(0)
    lb = np.c_[rng.integers(0, 3, 200), rng.random((200, 4)) * [1, 1, 0.3, 0.3]]
    out = plot_labels(lb, NAMES, tmp_path)
    assert out.name == "labels.jpg"  # the run folder's name for it, as in YOLOv5
    _check_png(out, ".jpg")
    _check_png(plot_labels(np.zeros((0, 5)), NAMES, tmp_path / "empty.png"))


@pytest.mark.slow
def test_importing_detect_does_not_import_matplotlib():
    """Detection draws with OpenCV only: importing detect.py must neither need matplotlib nor switch a
    notebook's plotting backend (utils/report/plots.py calls matplotlib.use at import)."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, detect; print('matplotlib' in sys.modules, 'utils.report.draw' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


@pytest.mark.slow
def test_charts_leave_the_callers_matplotlib_backend_alone(tmp_path):
    """A notebook user's backend survives importing utils.report.plots and drawing a chart."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import matplotlib; matplotlib.use('svg')\n"
            "import numpy as np, utils.report.plots as p\n"
            f"p.plot_mc_curve(np.linspace(0, 1, 11), np.random.rand(2, 11), {str(tmp_path)!r}, ['a', 'b'])\n"
            "print(matplotlib.get_backend())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "svg"
    assert list(tmp_path.glob("*.png"))


@pytest.mark.slow
@pytest.mark.parametrize("nc", [200, 1203])
def test_confusion_matrix_of_many_classes_is_a_bounded_picture(tmp_path, nc):
    """The figure no longer grows with the class count: at 200 classes it was 18,690 x 16,580 px, at 1,203 (LVIS) a
    ~42 GB canvas that ended the run with a MemoryError."""
    import time

    rng = np.random.default_rng(0)
    m = rng.integers(0, 5, (nc + 1, nc + 1)) * (rng.random((nc + 1, nc + 1)) < 0.01)
    m[np.diag_indices(nc + 1)] += 20
    t0 = time.perf_counter()
    p = plot_confusion_matrix(m, [f"class{i}" for i in range(nc)], tmp_path)
    seconds = time.perf_counter() - t0
    im = cv2.imread(str(p))
    assert im is not None and max(im.shape[:2]) <= 3300 and min(im.shape[:2]) >= 800, im.shape
    assert seconds < 60, seconds


def test_a_failing_chart_is_one_warning_line(tmp_path, monkeypatch, caplog):
    """Whatever goes wrong inside a chart (here: the figure cannot be allocated) is one warning line naming the chart
    and the error, and the caller goes on; train.py's results.png and validation's charts are drawn this way."""
    from matplotlib.figure import Figure

    def no_memory(*args, **kwargs):
        raise MemoryError("cannot allocate 42 GB\nfor the canvas")

    csv = tmp_path / "results.csv"
    csv.write_text("epoch,loss\n0,1.5\n1,1.2\n")
    monkeypatch.setattr(Figure, "savefig", no_memory)
    caplog.set_level("WARNING")
    px = np.linspace(0, 1, 11)
    assert plot_results(csv) is None
    assert plot_confusion_matrix(np.eye(4), NAMES, tmp_path) is None
    assert plot_mc_curve(px, np.ones((3, 11)), tmp_path, NAMES) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("\n" not in ln and "MemoryError: cannot allocate 42 GB" in ln for ln in lines), lines
    assert [ln.split()[1] for ln in lines] == ["plot_results", "plot_confusion_matrix", "plot_mc_curve"], lines
    assert not list(tmp_path.glob("*.png"))
