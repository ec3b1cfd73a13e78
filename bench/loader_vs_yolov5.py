"""Training data loader beside YOLOv5 7.0.14's create_dataloader, per CPU core: COCO128, 640 px, batch 16,
mosaic on (both loaders' augment=True defaults, hyp.scratch-low), single process (workers=0), cache off and ram.
Ours runs twice: "ours" is the host path (train.py --augment-on host: the workers augment), "ours-device" the
device path (--augment-on device: the workers read and place the mosaic tiles, the training device does the rest),
whose figure is what the host must sustain when a GPU augments.

    cd /work/main && tar xzf ../shared/bench/y5kit.tgz   # once: .y5/ (git-ignored via .git/info/exclude)
    pip install --target /tmp/loader_vs_yolov5/y5deps --no-deps psutil "pandas<3" pytz tzdata seaborn  # once
    python bench/loader_vs_yolov5.py [--rounds 3] [--batches 16] [--warmup 2] [--loaders ours ours-device yolov5]
                                     [--profile] [--out FILE]

COCO128 is copied once to --workdir (default: /tmp/loader_vs_yolov5; the shared copy is read-only), so both
loaders write their label caches there and neither verifies labels on every run. Each measurement is its own
subprocess (YOLOv5's package and ours are never imported together; the YOLOv5 one also sees y5deps/, the
packages its import chain needs that this machine lacks and .y5 does not hold), with OMP/MKL/OpenBLAS threads 1,
torch.set_num_threads(1) and cv2.setNumThreads(1): one core each. Runs alternate ours/YOLOv5 for each cache
mode and the order flips every round (ABBA), so drift on a shared machine falls on both alike.

Timed: `--batches` batches after `--warmup` batches (start-up, first decodes and, for ram, the caching pass
excluded), looping over epochs as needed. Reported per loader and cache mode (means over rounds):
  images/s      images / wall seconds of the timed batches
  images/CPU-s  images / CPU seconds of the process over the same batches (time.process_time): the
                per-core figure, which other load on the machine disturbs much less than wall time
and the ratio ours / YOLOv5 of each. For ours-device also "device CPU-s/batch": the CPU seconds (one thread)
that the rest of the augmentation (utils/data/device_augment.DeviceAugment, what train.py calls) takes per batch
when the training device is this CPU, timed on 4 of the batches after the loader's clock stopped. --profile adds
cProfile's top functions (by own time) of our loaders and of YOLOv5's, single process, cache ram and off (one run
each, outside the timed rounds).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
Y5 = REPO / ".y5"
SHARED_COCO128 = Path("/work/shared/datasets/coco128")
LOADERS = ("ours", "ours-device", "yolov5")
DEVICE_BATCHES = 4  # batches whose device-side augmentation ours-device times on the CPU
CACHES = ("off", "ram")
IMGSZ, BATCH, STRIDE = 640, 16, 32
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "NUMEXPR_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


# =============================================================================================
# worker: one loader, one cache mode, in its own process


def _build_ours(images: Path, cache: str, augment_on: str = "host"):
    sys.path.insert(0, str(REPO))
    from utils.data.data_config import load_hyp
    from utils.data.datasets import create_dataloader

    loader, dataset = create_dataloader([images], IMGSZ, BATCH, STRIDE, hyp=load_hyp(), augment=True, shuffle=True,
                                        workers=0, seed=0, cache=cache, augment_on=augment_on)
    cached = sum(im is not None for im in dataset.ims)

    def epochs():
        epoch = 0
        while True:
            loader.sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    return epochs(), cached


def _build_yolov5(images: Path, cache: str):
    import random

    import numpy as np
    import yaml
    from yolov5.utils.dataloaders import create_dataloader

    random.seed(0)  # YOLOv5's augmentation draws from the global generators
    np.random.seed(0)
    hyp = yaml.safe_load((Y5 / "yolov5" / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())
    loader, dataset = create_dataloader(str(images), IMGSZ, BATCH, STRIDE, single_cls=False, hyp=hyp, augment=True,
                                        cache="ram" if cache == "ram" else False, rect=False, rank=-1, workers=0,
                                        image_weights=False, quad=False, prefix="", shuffle=True, seed=0)
    cached = sum(im is not None for im in dataset.ims)

    def epochs():
        while True:
            yield from loader

    return epochs(), cached


def worker(which: str, images: Path, cache: str, batches: int, warmup: int, profile: int) -> dict:
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    t_build = time.perf_counter()
    build = {"ours": _build_ours, "ours-device": lambda i, c: _build_ours(i, c, "device"), "yolov5": _build_yolov5}
    it, cached = build[which](images, cache)
    cv2.setNumThreads(1)  # YOLOv5's utils.general sets 0 on import; the same one thread for both
    torch.set_num_threads(1)
    build_s = time.perf_counter() - t_build
    for _ in range(warmup):
        next(it)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    seen, w0, c0, kept = 0, time.perf_counter(), time.process_time(), []
    for _ in range(batches):
        ims, targets, *_ = next(it)
        if which == "ours-device":  # a RawBatch: the same samples, warped on the training device
            if len(ims) != BATCH or ims.out_hw != (IMGSZ, IMGSZ):
                raise SystemExit(f"{which}: batch of {len(ims)} at {ims.out_hw}, expected {BATCH} at {IMGSZ}")
            if len(kept) < DEVICE_BATCHES:
                kept.append((ims, targets))
        elif tuple(ims.shape) != (BATCH, 3, IMGSZ, IMGSZ) or ims.dtype != torch.uint8:  # like for like, or no figure
            raise SystemExit(f"{which}: batch {tuple(ims.shape)} {ims.dtype}, expected ({BATCH}, 3, {IMGSZ}, {IMGSZ}) uint8")
        seen += len(ims)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    out = {"loader": which, "cache": cache, "images": seen, "wall_s": wall, "cpu_s": cpu, "cached": cached,
           "build_s": build_s, "threads": torch.get_num_threads(), "cv2_threads": cv2.getNumThreads()}
    if kept:
        out["device_cpu_s"] = device_cpu_seconds(kept)
    if prof is not None:
        import io
        import pstats

        prof.disable()
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        st.sort_stats("tottime").print_stats(profile)
        out["profile"] = _trim_profile(s.getvalue())
        out["profile_total_s"] = st.total_tt
    return out


def device_cpu_seconds(batches: list) -> float:
    """Mean CPU seconds per batch of DeviceAugment on the CPU (after one untimed call that builds its tables)."""
    from utils.data.data_config import load_hyp
    from utils.data.device_augment import DeviceAugment

    augment = DeviceAugment(load_hyp(), "cpu")
    augment(*batches[0])
    c0 = time.process_time()
    for raw, labels in batches:
        augment(raw, labels)
    return (time.process_time() - c0) / len(batches)


def _trim_profile(text: str) -> str:
    """pstats output from its column header on, with long paths shortened to their last two parts."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    keep = []
    for ln in lines[start:]:
        if not ln.strip():
            continue
        parts = ln.rsplit(None, 1)
        if len(parts) == 2 and "/" in parts[1]:
            path, _, rest = parts[1].partition(":")
            short = "/".join(Path(path).parts[-2:])
            ln = f"{parts[0]} {short}:{rest}"
        keep.append(ln)
    return "\n".join(keep)


# =============================================================================================
# driver


def prepare(workdir: Path) -> Path:
    """A writable copy of COCO128 (images and labels); returns its images folder."""
    dst = workdir / "coco128"
    if not (dst / "images" / "train2017").is_dir():
        tmp = workdir / "coco128.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for sub in ("images", "labels"):
            shutil.copytree(SHARED_COCO128 / sub, tmp / sub)
        tmp.rename(dst)
    for d, _, files in os.walk(dst):  # the shared copy has no write bits, which our loader takes as "leave it
        os.chmod(d, 0o755)  # untouched" (no label cache written): give the copy ordinary modes
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    return dst / "images" / "train2017"


def child_env(which: str, workdir: Path) -> dict:
    env = {**os.environ, **ONE_THREAD}
    env.pop("PYTHONPATH", None)
    if which == "yolov5":
        cfg = workdir / "y5cfg"
        cfg.mkdir(parents=True, exist_ok=True)
        for ttf in Y5.glob("*.ttf"):  # the fonts it would otherwise try to download
            if not (cfg / ttf.name).exists():
                shutil.copy(ttf, cfg / ttf.name)
        env.update(PYTHONPATH=os.pathsep.join([str(Y5), str(workdir / "y5deps")]), YOLOV5_CONFIG_DIR=str(cfg), YOLO_OFFLINE="1", WANDB_MODE="disabled",
                   COMET_MODE="disabled", CLEARML_OFF="1", PIN_MEMORY="false", TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    return env


def run_one(which: str, cache: str, images: Path, workdir: Path, batches: int, warmup: int, profile: int = 0) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", which, "--cache", cache, "--images", str(images),
           "--batches", str(batches), "--warmup", str(warmup), "--profile-lines", str(profile)]
    p = subprocess.run(cmd, env=child_env(which, workdir), cwd=workdir, capture_output=True, text=True)
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("RESULT ")), None)
    if p.returncode or line is None:
        sys.exit(f"{which} cache={cache} failed (rc {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    r = json.loads(line[len("RESULT "):])
    if cache == "ram" and r["cached"] == 0:
        sys.exit(f"{which}: cache=ram cached no image (not enough memory?); the ram row would be a second 'off'")
    return r


def order(round_i: int, loaders: tuple[str, ...] = LOADERS) -> tuple[str, ...]:
    """ABBA: ours first in even rounds, YOLOv5 first in odd ones."""
    return loaders if round_i % 2 == 0 else loaders[::-1]


def summarise(runs: list[dict]) -> list[dict]:
    """Per (cache, loader): mean images/s and images/CPU-s over rounds, with each run's wall rate; ratios
    ours / YOLOv5 on the 'ours' rows."""
    rows = []
    for cache in CACHES:
        for which in LOADERS:
            rs = [r for r in runs if r["cache"] == cache and r["loader"] == which]
            if not rs:
                continue
            rows.append({"cache": cache, "loader": which, "n": len(rs),
                         "ips": sum(r["images"] / r["wall_s"] for r in rs) / len(rs),
                         "ipc": sum(r["images"] / r["cpu_s"] for r in rs) / len(rs),
                         "each": [r["images"] / r["wall_s"] for r in rs]})
            dev = [r["device_cpu_s"] for r in rs if "device_cpu_s" in r]
            if dev:
                rows[-1]["device_cpu_s"] = sum(dev) / len(dev)
    by = {(r["cache"], r["loader"]): r for r in rows}
    for r in rows:
        peer = by.get((r["cache"], "yolov5"))
        if r["loader"] != "yolov5" and peer:
            r["ratio_wall"], r["ratio_cpu"] = r["ips"] / peer["ips"], r["ipc"] / peer["ipc"]
    return rows


NAMES = {"ours": "ours, host", "ours-device": "ours, device", "yolov5": "YOLOv5 7.0.14"}


def table(rows: list[dict]) -> str:
    out = [f"{'loader':<14} {'cache':>5} {'images/s':>9} {'images/CPU-s':>13} {'ours/YOLOv5 (wall, CPU)':>24} "
           f"{'device CPU-s/batch':>19}   runs (images/s)"]
    for r in rows:
        ratio = f"{r['ratio_wall']:.2f}x, {r['ratio_cpu']:.2f}x" if "ratio_wall" in r else ""
        dev = f"{r['device_cpu_s']:.3f}" if "device_cpu_s" in r else ""
        each = " ".join(f"{x:.1f}" for x in r["each"])
        out.append(f"{NAMES[r['loader']]:<14} {r['cache']:>5} {r['ips']:>9.1f} {r['ipc']:>13.1f} {ratio:>24} "
                   f"{dev:>19}   {each}")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (each: both loaders, both caches)")
    p.add_argument("--batches", type=int, default=16, help="timed batches per run (8 x 16 = one COCO128 epoch)")
    p.add_argument("--warmup", type=int, default=2, help="batches before timing")
    p.add_argument("--loaders", nargs="+", choices=LOADERS, default=list(LOADERS), help="which loaders to time")
    p.add_argument("--caches", nargs="+", choices=CACHES, default=list(CACHES), help="which cache modes to time")
    p.add_argument("--profile", action="store_true", help="add cProfile top functions of the loaders, cache ram and off")
    p.add_argument("--profile-lines", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/loader_vs_yolov5"), help="writable COCO128 copy here")
    p.add_argument("--out", type=Path, help="also write the command, date, table (and profiles) to this file")
    p.add_argument("--worker", choices=LOADERS, help=argparse.SUPPRESS)
    # (the worker's --cache below is one mode; the driver's --caches lists them)
    p.add_argument("--cache", choices=CACHES, help=argparse.SUPPRESS)
    p.add_argument("--images", type=Path, help=argparse.SUPPRESS)
    opt = p.parse_args()
    if opt.worker:
        print("RESULT " + json.dumps(worker(opt.worker, opt.images, opt.cache, opt.batches, opt.warmup, opt.profile_lines)))
        return
    if not (Y5 / "yolov5" / "utils" / "dataloaders.py").is_file():
        sys.exit(f"YOLOv5 is not unpacked at {Y5}: cd {REPO} && tar xzf ../shared/bench/y5kit.tgz "
                 f"&& echo /.y5/ >> .git/info/exclude")
    images = prepare(opt.workdir)
    probe = subprocess.run([sys.executable, "-c", "import yolov5.utils.dataloaders"], env=child_env("yolov5", opt.workdir),
                           capture_output=True, text=True)
    if probe.returncode:
        sys.exit(f"YOLOv5's loader does not import: {probe.stderr.strip().splitlines()[-1]}\n"
                 f"install what it lacks beside it, once: pip install --target {opt.workdir / 'y5deps'} --no-deps "
                 f"psutil 'pandas<3' pytz tzdata seaborn")
    runs = []
    for i in range(opt.rounds):
        for cache in opt.caches:
            for which in order(i, tuple(opt.loaders)):
                r = run_one(which, cache, images, opt.workdir, opt.batches, opt.warmup)
                runs.append(r)
                print(f"round {i} {which:>6} cache={cache:<3} {r['images'] / r['wall_s']:6.1f} images/s "
                      f"{r['images'] / r['cpu_s']:6.1f} images/CPU-s (built in {r['build_s']:.1f} s, "
                      f"{r['cached']} cached, torch/cv2 threads {r['threads']}/{r['cv2_threads']})", flush=True)
    load = os.getloadavg()
    text = (f"# {datetime.datetime.now().isoformat(timespec='seconds')}\n"
            f"# python bench/loader_vs_yolov5.py {' '.join(sys.argv[1:])}\n"
            f"# COCO128 (128 images), {IMGSZ} px, batch {BATCH}, mosaic (augment=True, hyp.scratch-low), workers=0, "
            f"1 thread; {opt.batches} batches timed after {opt.warmup}, {opt.rounds} rounds ABBA; "
            f"{os.cpu_count()} CPUs, load average at the end {load[0]:.2f}\n\n" + table(summarise(runs)) + "\n")
    if opt.profile:
        for which in opt.loaders:
            for cache in opt.caches[::-1]:
                r = run_one(which, cache, images, opt.workdir, opt.batches, opt.warmup, profile=25)
                text += (f"\n## cProfile, {which}, cache {cache}: {r['images']} images in {r['wall_s']:.2f} s wall "
                         f"under the profiler ({r['images'] / r['wall_s']:.1f} images/s), sorted by own time\n"
                         + r["profile"] + "\n")
    print("\n" + text)
    if opt.out:
        opt.out.parent.mkdir(parents=True, exist_ok=True)
        opt.out.write_text(text)


if __name__ == "__main__":
    main()
