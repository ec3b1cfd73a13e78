"""Ours beside YOLOv5 7.0.14 and Ultralytics 8.4.190: the same data and settings, one tool after another.

    bash ../shared/bench/peers.sh DATA.yaml     # once: builds the peers' venv (/tmp/peer-venv, PEER_VENV)
    python bench/side_by_side.py accuracy|train|loader|detect|curves [options]    # MODE -h: its options

accuracy  ../shared/bench/peers.sh (each peer's defaults, yolov5n from scratch), then our train.py (its defaults,
          batch 16, 2 workers), then the curves, into bench/out/side_by_side/; `--data shapes`: the built-in set.
train     training images/s, the median epoch (the first left out), mosaic on: YOLOv5 timed by its own epoch
          callbacks (its validation excluded), ours with --noval by results.csv's `time` (its last epoch left out),
          in FP32, bf16 and bf16 --cache off. --whole: the default commands timed from start to exit, with mAP.
loader    the loaders per CPU core (COCO128, 640 px, batch 16, mosaic, workers 0, one thread, a process per run,
          rounds ABBA): ours with --augment-on host and device (its "device CPU-s/batch": the rest, on this CPU),
          and YOLOv5's create_dataloader from the kit (cd REPO && tar xzf ../shared/bench/y5kit.tgz; packages it
          lacks: pip install --target WORKDIR/y5deps --no-deps psutil "pandas<3" pytz tzdata seaborn).
detect    detect.py beside YOLOv5's, one untrained yolov5s copied tensor by tensor into YOLOv5's Model (refused if
          the outputs differ), COCO128 at 640, FP32, each tool's defaults, each process timed start to exit.
curves    --ours RUN --yolov5 RUN --ultralytics RUN --out F: mAP against each tool's own clock (results.csv's
          `time`; for YOLOv5 the stamps of its TensorBoard event file).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from utils.data.data_config import SHARED_COCO128, load_data_config  # noqa: E402
from utils.report.results import read_records  # noqa: E402

PEER_VENV = Path(os.environ.get("PEER_VENV", "/tmp/peer-venv"))
PEER_PY = PEER_VENV / "bin" / "python"
PEERS_SH = ROOT.parent / "shared" / "bench" / "peers.sh"
OUT = ROOT / "bench" / "out" / "side_by_side"
Y5 = ROOT / ".y5"
NAMES = ("circle", "square", "triangle", "star", "cross")


def peer_env() -> dict:
    return {**os.environ, "YOLOV5_CONFIG_DIR": "/tmp/peer-runs/cfg/y5", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
            "CUDA_VISIBLE_DEVICES": "", "WANDB_MODE": "disabled", "COMET_MODE": "disabled", "CLEARML_OFF": "1"}


def need_peers() -> None:
    if not PEER_PY.exists():
        sys.exit(f"{PEER_PY} not found: build the peers' venv once with bash {PEERS_SH} DATA.yaml (or set PEER_VENV)")


def run(cmd: list[str], label: str, **kw) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode:
        sys.exit(f"{label} failed:\n{p.stderr[-2000:]}")
    return time.perf_counter() - t0, p


# ----------------------------------------------------------------------------------------------------- curves


def column(rows: list[dict[str, str]], *needles: str, without: str = "") -> np.ndarray:
    key = next(k for k in rows[0] if all(n in k for n in needles) and not (without and without in k))
    return np.array([float(r[key]) for r in rows])


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b, i = buf[i], i + 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def event_stamps(path: Path) -> dict[int, float]:
    """step -> latest wall_time among the records of a TensorBoard event file."""
    data, i, stamps = path.read_bytes(), 0, {}
    while i + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        rec, i = data[i + 12: i + 12 + n], i + 12 + n + 4  # length, its crc, the record, its crc
        j, wall, step = 0, None, 0
        while j < len(rec):
            key, j = _varint(rec, j)
            field, wire = key >> 3, key & 7
            if wire == 1:  # 64-bit: field 1 is wall_time
                wall = struct.unpack_from("<d", rec, j)[0] if field == 1 else wall
                j += 8
            elif wire == 0:  # varint: field 2 is step
                v, j = _varint(rec, j)
                step = v if field == 2 else step
            elif wire == 2:
                ln, j = _varint(rec, j)
                j += ln
            elif wire == 5:
                j += 4
            else:
                break
        if wall is not None:
            stamps[step] = max(stamps.get(step, 0.0), wall)
    return stamps


def curve(tool: str, path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seconds, mAP@0.5, mAP@0.5:0.95) per epoch. YOLOv5 writes no clock: epoch k ends at stamp(k) - stamp(0) + d,
    d (the first epoch, which has no earlier stamp) taken as the mean epoch length."""
    rows = read_records(path if path.suffix == ".csv" else path / "results.csv")
    if tool == "ultralytics":
        return column(rows, "time"), column(rows, "mAP50(B)"), column(rows, "mAP50-95")
    maps = column(rows, "mAP_0.5", without=":"), column(rows, "mAP_0.5:0.95")
    if tool == "ours":
        return (column(rows, "time"), *maps)
    events = sorted(path.glob("events.out.tfevents.*"))
    if not events:
        sys.exit(f"{path}: no TensorBoard event file, so no per-epoch clock for YOLOv5")
    stamps = event_stamps(events[-1])
    ends = np.array([stamps[k] for k in range(len(rows))])
    return (ends - ends[0] + (ends[-1] - ends[0]) / max(len(ends) - 1, 1), *maps)


def first_reaching(t: np.ndarray, m: np.ndarray, level: float) -> float:
    hit = np.nonzero(m >= level)[0]
    return float(t[hit[0]]) if len(hit) else float("nan")


def curves_mode(a: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {name: curve(tool, Path(path)) for name, tool, path in (
        ("ours", "ours", a.ours), ("YOLOv5 7.0.14", "yolov5", a.yolov5), ("Ultralytics 8.4.190", "ultralytics",
                                                                           a.ultralytics)) if path}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), tight_layout=True)
    for name, (t, m50, m) in curves.items():
        for ax, y in zip(axes, (m, m50)):
            ax.plot(t, y, marker=".", label=name)
    for ax, label in zip(axes, ("mAP@0.5:0.95", "mAP@0.5")):
        ax.set(xlabel="wall seconds", ylabel=label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(a.title)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=120)
    best = max(float(m[-1]) for _, _, m in curves.values())
    print(f"{'':20} {'epochs':>6} {'wall s':>8} {'mAP@0.5':>9} {'mAP@.5:.95':>10} {'s to 90% of best final':>23}")
    for name, (t, m50, m) in curves.items():
        reach = first_reaching(t, m, 0.9 * best)
        print(f"{name:20} {len(t):6d} {t[-1]:8.1f} {m50[-1]:9.5f} {m[-1]:10.5f} {reach:23.1f}")
    print(f"plot: {a.out}")


def accuracy_mode(a: argparse.Namespace) -> None:
    name, data, ours_data = a.data, a.data, a.data
    if a.data == "shapes":  # the built-in set as a plain YAML the peers read (generated first if missing)
        from utils.data.synthetic import ensure_shapes_dataset

        OUT.mkdir(parents=True, exist_ok=True)
        data, ours_data = OUT / "shapes_peers.yaml", ROOT / "data" / "shapes.yaml"
        data.write_text(f"path: {ensure_shapes_dataset()}\ntrain: images/train\nval: images/val\nnames: {list(NAMES)}\n")
    else:
        name = Path(a.data).stem
    epochs, imgsz = a.epochs or (40 if a.data == "shapes" else 30), a.imgsz or (192 if a.data == "shapes" else 320)
    out = OUT / f"{name}_{epochs}"
    shutil.rmtree(out, ignore_errors=True)
    for peer in ("yolov5", "ultralytics"):  # peers.sh reuses its run folders; YOLOv5 appends to a results.csv there
        shutil.rmtree(f"/tmp/peer-runs/{peer}/run", ignore_errors=True)
    subprocess.run(["bash", str(PEERS_SH), str(Path(data).resolve()), str(epochs), str(imgsz), "16"], check=True)
    for peer in ("yolov5", "ultralytics"):
        shutil.copytree(f"/tmp/peer-runs/{peer}", out / peer)
    with open(out / "ours.log", "w") as log:
        subprocess.run([sys.executable, "train.py", "--data", str(ours_data), "--epochs", str(epochs), "--imgsz",
                        str(imgsz), "--batch-size", "16", "--workers", "2", "--noplots", "--project", str(out),
                        "--name", "ours"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    curves_mode(argparse.Namespace(ours=out / "ours", yolov5=out / "yolov5/run", ultralytics=out / "ultralytics/run",
                                   out=out / "curves.png", title=f"{name}, yolov5n {imgsz} px batch 16, {epochs} epochs"))


# ----------------------------------------------------------------------------------------------------- train

# runs in the peer venv: YOLOv5's train.main with two timing callbacks; argv[1] = where the marks go
YOLOV5_DRIVER = """
import json, sys, time
from yolov5 import train
from yolov5.utils.callbacks import Callbacks
out = sys.argv[1]
sys.argv = sys.argv[:1] + sys.argv[2:]
marks, cb = [], Callbacks()
cb.register_action("on_train_epoch_start", callback=lambda *a, **k: marks.append(["start", time.perf_counter()]))
cb.register_action("on_train_epoch_end", callback=lambda *a, **k: marks.append(["end", time.perf_counter()]))
train.main(train.parse_opt(), callbacks=cb)
json.dump(marks, open(out, "w"))
"""


def median_epoch(ends: list[float]) -> float:
    """Median length of the epochs between the first and the last, from cumulative end times."""
    return statistics.median([b - a for a, b in zip(ends, ends[1:])][:-1])


def yolov5_args(a: argparse.Namespace, tmp: Path) -> list[str]:
    """YOLOv5 train.py's arguments for these settings, as ../shared/bench/peers.sh gives them."""
    import yaml

    _, p = run([str(PEER_PY), "-c", "import yolov5, os; print(os.path.dirname(yolov5.__file__))"], "yolov5",
               env=peer_env())
    d = yaml.safe_load(a.data.read_text())
    d["path"] = str((a.data.parent / (d.get("path") or ".")).resolve())  # the peers resolve it from their folder
    (tmp / "data.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    return ["--weights", "", "--cfg", f"{p.stdout.split()[-1]}/models/yolov5n.yaml", "--data", str(tmp / "data.yaml"),
            "--epochs", str(a.epochs), "--batch-size", str(a.batch), "--imgsz", str(a.imgsz), "--device", "cpu",
            "--workers", str(a.workers), "--seed", "0", "--noplots", "--project", str(tmp / "yolov5"), "--name", "run"]


def ours_cmd(a: argparse.Namespace, tmp: Path, name: str) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), "--data", str(a.data.resolve()), "--epochs", str(a.epochs),
            "--batch-size", str(a.batch), "--imgsz", str(a.imgsz), "--workers", str(a.workers), "--project",
            str(tmp / "ours"), "--name", name]


def train_mode(a: argparse.Namespace) -> None:
    need_peers()
    if a.epochs < 3:
        sys.exit("--epochs must be 3 or more (the first and last epochs are left out)")
    from utils.data.labels import list_image_files

    n = len(list_image_files(load_data_config(a.data)["train"]))
    setting = f"{a.data.name}: {n} training images, yolov5n, {a.imgsz} px, batch {a.batch}, {a.workers} workers, "
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if a.whole:  # each tool's default command, validation every epoch, its own threads
            runs = {"ours (default command)": (ours_cmd(a, tmp, "run"), None, tmp / "ours" / "run"),
                    "YOLOv5 7.0.14": ([str(PEER_PY), "-m", "yolov5.train", *yolov5_args(a, tmp)], peer_env(),
                                      tmp / "yolov5" / "run")}
            print(setting + f"{a.epochs} epochs, each tool's default command, seed 0")
            print(f"{'':24} {'wall s':>8} {'vs YOLOv5':>10} {'mAP@0.5':>8} {'mAP@0.5:0.95':>13}")
            walls = {}
            for label, (cmd, env, folder) in reversed(runs.items()):
                walls[label], _ = run(cmd, label, env=env, cwd=tmp)
                rows = read_records(folder / "results.csv")
                print(f"{label:24} {walls[label]:8.1f} {walls[label] / walls['YOLOv5 7.0.14']:9.2f}x "
                      f"{column(rows, 'mAP_0.5', without=':')[-1]:8.3f} {column(rows, 'mAP_0.5:0.95')[-1]:13.3f}")
            return
        run([str(PEER_PY), "-c", YOLOV5_DRIVER, str(tmp / "marks.json"), *yolov5_args(a, tmp)], "YOLOv5",
            env=peer_env(), cwd=tmp)
        marks = json.loads((tmp / "marks.json").read_text())
        starts, ends = ([t for kind, t in marks if kind == k] for k in ("start", "end"))
        secs = {"YOLOv5 7.0.14": statistics.median([e - s for s, e in zip(starts, ends)][1:])}
        for amp, cache, label in (("off", "auto", "ours, FP32"), ("bf16", "auto", "ours, bf16 autocast"),
                                  ("bf16", "off", "ours, bf16, --cache off")):
            run([*ours_cmd(a, tmp, f"{amp}_{cache}"), "--amp", amp, "--close-mosaic", "0", "--cache", cache, "--noval",
                 "--noplots"], label)
            secs[label] = median_epoch(list(curve("ours", tmp / "ours" / f"{amp}_{cache}")[0]))
    print(setting + f"mosaic on, median epoch of {a.epochs} (the first left out, and our last: final validation)")
    print(f"{'':22} {'s/epoch':>8} {'images/s':>9} {'vs YOLOv5':>10}")
    for label, s in secs.items():
        print(f"{label:22} {s:8.2f} {n / s:9.1f} {secs['YOLOv5 7.0.14'] / s:9.2f}x")


# ----------------------------------------------------------------------------------------------------- detect

# runs in the peer venv: YOLOv5's Model with our tensors, saved the way YOLOv5 saves (a pickled FP16 module), and
# its output on the probe input for the equality check
TO_YOLOV5 = """
import os, sys, torch, yolov5
sys.path.insert(0, os.path.dirname(yolov5.__file__))
from models.yolo import Model
sd_path, cfg, out, probe = sys.argv[1:5]
m = Model(cfg, ch=3, nc=80)
m.load_state_dict(torch.load(sd_path), strict=True)
m.names = {i: f"class{i}" for i in range(80)}
with torch.no_grad():
    torch.save(m.eval()(torch.load(probe))[0], out + ".probe_out")
torch.save({"model": m.half(), "epoch": -1}, out)
"""
SPEED = re.compile(r"Speed: ([\d.]+)ms pre-process, ([\d.]+)ms inference, ([\d.]+)ms NMS")


def detect_mode(a: argparse.Namespace) -> None:
    import torch

    from bench.speed import random_checkpoint
    from models.yolo import load_model

    need_peers()
    n = len([p for p in a.source.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png")])
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ours = random_checkpoint("yolov5s.yaml", tmp)
        model = load_model(ours, "cpu")[0].float().eval()
        torch.save(model.state_dict(), tmp / "sd.pt")
        probe = torch.rand(1, 3, 256, 320, generator=torch.Generator().manual_seed(0))
        torch.save(probe, tmp / "probe.pt")
        theirs = tmp / "yolov5s_peer.pt"
        run([str(PEER_PY), "-c", TO_YOLOV5, str(tmp / "sd.pt"), str(ROOT / "models" / "yolov5s.yaml"), str(theirs),
             str(tmp / "probe.pt")], "YOLOv5's Model", env=peer_env(), cwd=tmp)
        with torch.no_grad():
            diff = (model(probe)[0] - torch.load(str(theirs) + ".probe_out")).abs().max().item()
        print(f"same network check: max |our output - YOLOv5's| = {diff:.2e} on one 256x320 input")
        if diff > 1e-3:
            sys.exit("the two networks disagree; the comparison would not be like for like")
        common = ["--source", str(a.source), "--imgsz", str(a.imgsz)]
        commands = {"ours": ([sys.executable, str(ROOT / "detect.py"), "--weights", str(ours), *common, "--project",
                              str(tmp / "ours")], None),
                    "YOLOv5": ([str(PEER_PY), "-m", "yolov5.detect", "--weights", str(theirs), *common, "--device",
                                "cpu", "--project", str(tmp / "yolov5")], peer_env())}
        results: dict[str, list] = {k: [] for k in commands}
        for _ in range(a.rounds):
            for name, (cmd, env) in commands.items():
                wall, p = run(cmd, name, env=env, cwd=tmp)
                m = SPEED.findall(p.stdout + p.stderr)
                results[name].append((wall, tuple(float(x) for x in m[-1]) if m else (float("nan"),) * 3))
    print(f"{n} images from {a.source} at {a.imgsz}, yolov5s (same weights), FP32, each tool's defaults (annotated "
          f"images saved), {torch.get_num_threads()} CPU threads; best of {a.rounds} rounds")
    print(f"{'':8} {'wall s':>8} {'img/s':>8} {'pre ms':>8} {'infer ms':>9} {'NMS ms':>8}")
    for name, rs in results.items():
        wall, (pre, inf, nms) = min(rs)
        print(f"{name:8} {wall:8.1f} {n / wall:8.2f} {pre:8.1f} {inf:9.1f} {nms:8.1f}")
    print(f"ours / YOLOv5, end-to-end images/s: {min(results['YOLOv5'])[0] / min(results['ours'])[0]:.2f}x")


# ----------------------------------------------------------------------------------------------------- loader

LOADERS = ("ours", "ours-device", "yolov5")
IMGSZ, BATCH = 640, 16


def loader_batches(which: str, images: Path, cache: str):
    """An endless iterator over the loader's batches, and how many images it cached."""
    if which == "yolov5":
        import random

        import yaml
        from yolov5.utils.dataloaders import create_dataloader

        random.seed(0)  # YOLOv5's augmentation draws from the global generators
        np.random.seed(0)
        hyp = yaml.safe_load((Y5 / "yolov5" / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())
        loader, dataset = create_dataloader(str(images), IMGSZ, BATCH, 32, hyp=hyp, augment=True, rect=False,
                                            cache="ram" if cache == "ram" else False, rank=-1, workers=0,
                                            image_weights=False, quad=False, prefix="", shuffle=True, seed=0)
    else:
        from utils.hyp import load_hyp
        from utils.data.datasets import create_dataloader

        loader, dataset = create_dataloader([images], IMGSZ, BATCH, 32, hyp=load_hyp(), augment=True, shuffle=True,
                                            workers=0, seed=0, cache=cache, augment_on=which[5:] or "host")

    def epochs():
        for epoch in range(10**6):
            if which != "yolov5":
                loader.sampler.set_epoch(epoch)
            yield from loader

    return epochs(), sum(im is not None for im in dataset.ims)


def loader_worker(a: argparse.Namespace) -> dict:
    """One loader and cache mode, in a process of its own: images over wall and CPU seconds of --batches."""
    import cv2
    import torch

    it, cached = loader_batches(a.worker, a.images, a.cache)
    cv2.setNumThreads(1)  # YOLOv5's utils.general sets 0 on import; the same one thread for both
    torch.set_num_threads(1)
    for _ in range(a.warmup):
        next(it)
    seen, w0, c0, kept = 0, time.perf_counter(), time.process_time(), []
    for _ in range(a.batches):
        ims, targets, *_ = next(it)
        if a.worker == "ours-device":  # a RawBatch: the same samples, warped on the training device
            kept += [(ims, targets)][:4 - len(kept)]
        elif tuple(ims.shape) != (BATCH, 3, IMGSZ, IMGSZ) or ims.dtype != torch.uint8:  # like for like, or no figure
            sys.exit(f"{a.worker}: batch {tuple(ims.shape)} {ims.dtype}, expected ({BATCH}, 3, {IMGSZ}, {IMGSZ}) uint8")
        seen += len(ims)
    out = {"loader": a.worker, "cache": a.cache, "images": seen, "wall_s": time.perf_counter() - w0,
           "cpu_s": time.process_time() - c0, "cached": cached}
    if kept:
        from bench.speed import device_seconds

        out["device_cpu_s"] = device_seconds(kept, "cpu")
    return out


def child_env(which: str, workdir: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "NUMEXPR_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("PYTHONPATH", None)
    if which == "yolov5":
        cfg = workdir / "y5cfg"
        cfg.mkdir(parents=True, exist_ok=True)
        for ttf in Y5.glob("*.ttf"):  # the fonts it would otherwise try to download
            shutil.copy(ttf, cfg / ttf.name)
        env.update(PYTHONPATH=os.pathsep.join([str(Y5), str(workdir / "y5deps")]), YOLOV5_CONFIG_DIR=str(cfg),
                   YOLO_OFFLINE="1", WANDB_MODE="disabled", COMET_MODE="disabled", CLEARML_OFF="1", PIN_MEMORY="false",
                   TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    return env


def loader_mode(a: argparse.Namespace) -> None:
    if a.worker:
        print("RESULT " + json.dumps(loader_worker(a)))
        return
    if "yolov5" in a.loaders and not (Y5 / "yolov5" / "utils" / "dataloaders.py").is_file():
        sys.exit(f"YOLOv5 is not unpacked at {Y5}: cd {ROOT} && tar xzf ../shared/bench/y5kit.tgz "
                 f"&& echo /.y5/ >> .git/info/exclude")
    copy = a.workdir / "coco128"  # writable, so that both loaders keep their label caches
    if not (copy / "images" / "train2017").is_dir():
        for sub in ("images", "labels"):
            shutil.copytree(SHARED_COCO128 / sub, a.workdir / "partial" / sub, dirs_exist_ok=True)
        (a.workdir / "partial").rename(copy)
    for d, _, files in os.walk(copy):  # the shared copy has no write bits, which our loader takes as "leave it
        os.chmod(d, 0o755)  # untouched" (no label cache written): give the copy ordinary modes
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    runs = []
    for i in range(a.rounds):
        for cache in a.caches:
            for which in a.loaders if i % 2 == 0 else a.loaders[::-1]:
                _, p = run([sys.executable, str(Path(__file__).resolve()), "loader", "--worker", which, "--cache", cache,
                            "--images", str(copy / "images" / "train2017"), "--batches", str(a.batches), "--warmup",
                            str(a.warmup)], f"{which} cache={cache}", env=child_env(which, a.workdir), cwd=a.workdir)
                r = json.loads(next(ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("RESULT "))[7:])
                if cache == "ram" and r["cached"] == 0:
                    sys.exit(f"{which}: cache=ram cached no image (not enough memory?)")
                runs.append(r)
                print(f"round {i} {which:>11} cache={cache:<3} {r['images'] / r['wall_s']:6.1f} images/s "
                      f"{r['images'] / r['cpu_s']:6.1f} images/CPU-s", flush=True)
    lines = [f"# {datetime.datetime.now().isoformat(timespec='seconds')}",
             f"# python bench/side_by_side.py loader {' '.join(sys.argv[2:])}",
             f"# COCO128 (128 images), {IMGSZ} px, batch {BATCH}, mosaic, workers=0, 1 thread; {a.batches} batches "
             f"timed after {a.warmup}, {a.rounds} rounds ABBA; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", "",
             f"{'loader':<14} {'cache':>5} {'images/s':>9} {'images/CPU-s':>13} {'ours/YOLOv5 (wall, CPU)':>24} "
             f"{'device CPU-s/batch':>19}   runs (images/s)"]
    table = {}
    for cache in a.caches:
        for which in LOADERS:
            rs = [r for r in runs if r["cache"] == cache and r["loader"] == which]
            if rs:
                table[cache, which] = (statistics.fmean(r["images"] / r["wall_s"] for r in rs),
                                       statistics.fmean(r["images"] / r["cpu_s"] for r in rs), rs)
    for (cache, which), (ips, ipc, rs) in table.items():
        peer = table.get((cache, "yolov5"))
        ratio = f"{ips / peer[0]:.2f}x, {ipc / peer[1]:.2f}x" if peer and which != "yolov5" else ""
        dev = f"{statistics.fmean(r['device_cpu_s'] for r in rs):.3f}" if "device_cpu_s" in rs[0] else ""
        label = {"ours": "ours, host", "ours-device": "ours, device", "yolov5": "YOLOv5 7.0.14"}[which]
        lines.append(f"{label:<14} {cache:>5} {ips:>9.1f} {ipc:>13.1f} {ratio:>24} {dev:>19}   "
                     + " ".join(f"{r['images'] / r['wall_s']:.1f}" for r in rs))
    print("\n".join(lines))
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    from bench.speed import options

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    coco = SHARED_COCO128 / "coco128.yaml"
    options(sub.add_parser("accuracy"), data=str(coco), epochs=0, imgsz=0)  # 0: 30 epochs at 320 (shapes: 40 at 192)
    options(sub.add_parser("train"), data=coco, epochs=6, imgsz=320, batch=16, workers=2, whole=False)
    loader = options(sub.add_parser("loader"), rounds=3, batches=16, warmup=2, workdir=Path("/tmp/loader_vs_yolov5"),
                     out=None, worker=None, cache=None, images=Path())
    loader.add_argument("--loaders", nargs="+", choices=LOADERS, default=list(LOADERS))
    loader.add_argument("--caches", nargs="+", choices=("off", "ram"), default=["off", "ram"])
    options(sub.add_parser("detect"), source=SHARED_COCO128 / "images" / "train2017", imgsz=640, rounds=2)
    options(sub.add_parser("curves"), ours=None, yolov5=None, ultralytics=None, title="", out=Path("curves.png"))
    a = p.parse_args(argv)
    {"accuracy": accuracy_mode, "train": train_mode, "loader": loader_mode, "detect": detect_mode,
     "curves": curves_mode}[a.mode](a)


if __name__ == "__main__":
    main()
