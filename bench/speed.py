"""Component speed: each part of training and inference timed on its own, a mode each (MODE -h: its options).
Quote ratios between rows of one run: the machines here are shared, and absolute figures move with the load.

    python bench/speed.py step --imgsz 320 --candidates fp32 bf16 [--device 0] [--profile] [--json F]

step      train.py's step (autocast forward and loss, utils.engine.updater.AmpUpdater with the EMA) on one fixed
          random batch, channels_last, a row per candidate PRECISION[-VARIANT]: fp32 (TF32 arithmetic on CUDA), bf16,
          fp16; nchw (NCHW layout), foreach (AdamW's multi-tensor kernels, not the fused ones train.py takes on CUDA),
          graphs (CUDA graphs), compile (torch.compile, with its compile time). Images/s over --steps after --warmup;
          on CUDA also peak memory and the AMP check. On a CPU, fp16 shows what emulation costs.
loop      whole epochs through train.run, from each epoch's start to the end of its training pass (the first epoch
          left out); --deterministic on off alternates the two settings, --rounds times.
same-run  the same seeded command twice: are the final EMA weights and results.csv rows identical?
loader    the mosaic training loader's images/s over --batches after a warm-up, across epoch boundaries; with
          --augment-on device the workers only place the tiles and the rest (utils/data/device_augment) is timed per
          batch on --device. --decode: cv2.imdecode on one core against decode_jpeg on --device. --repeat N --out
          DIR: DIR/repeat.yaml, N linked copies of the training images under distinct names (k03_x.jpg), for epochs
          of many batches.
detect    detect.run per precision and batch size after a one-image warm-up, with its pre-process / inference / NMS
          split; --forward: the fused model's forward pass alone.
export    detect.py end to end with exported files against PyTorch, same threads, rounds alternating: --backends
          pytorch onnxruntime openvino openvino-int8 (INT8 calibrated on --data), at each of --threads 1 2; with
          lscpu's CPU model and flags. --weights a checkpoint, else random weights of --cfg with BatchNorm statistics
          from random pictures, the head zeroed (--head prior: few boxes, as a trained model) or not (random:
          thousands of candidates for NMS). --images N: the first N pictures only (a check that it runs).
metrics   test.py's mAP accumulation against pycocotools on tests/helpers.py's fixed COCO128 predictions.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import torch  # noqa: E402

from utils.data.data_config import SHARED_COCO128, load_data_config  # noqa: E402
from utils.hyp import load_hyp
from utils.device import select_device  # noqa: E402

COCO128_IMAGES = SHARED_COCO128 / "images" / "train2017"


def print_rows(rows: list[dict], skip: tuple[str, ...] = ()) -> None:
    """A table: a line per row, a column per key any row has ('-' where a row has none)."""
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in skip]
    print("  ".join(f"{k:>12}" for k in keys))
    for r in rows:
        print("  ".join((f"{r[k]:>12.1f}" if abs(r[k]) >= 10 else f"{r[k]:>12.3g}") if isinstance(r.get(k), float)
                        else f"{r.get(k, '-')!s:>12}" for k in keys))


def write_json(path: str | None, rows) -> None:
    if path:
        Path(path).write_text(json.dumps(rows, indent=1))


def sync_of(dev: torch.device):
    return torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)


# ----------------------------------------------------------------------------------------------------- step


def fake_batch(n: int, imgsz: int, nc: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """n random images and about six random boxes each, like COCO (the same every call)."""
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand(n, 3, imgsz, imgsz, device=dev, generator=g)
    k = n * 6
    t = torch.cat((torch.arange(k, device=dev).remainder(n)[:, None].float(),
                   torch.randint(0, nc, (k, 1), device=dev, generator=g).float(),
                   0.2 + 0.6 * torch.rand(k, 2, device=dev, generator=g),
                   0.05 + 0.3 * torch.rand(k, 2, device=dev, generator=g)), 1)
    return x, t


def step_rate(name: str, a: argparse.Namespace, imgsz: int, dev: torch.device) -> dict:
    """One candidate's row: images/s (and on CUDA peak GiB and the AMP check)."""
    from models.yolo import Model
    from utils.engine.amp import Precision, amp_check
    from utils.engine.ema import ModelEMA
    from utils.engine.loss import ComputeLoss, loss_gains
    from utils.engine.optim import build_optimizer
    from utils.engine.updater import AmpUpdater

    precision, _, variant = name.partition("-")
    if variant == "graphs" and dev.type != "cuda":
        return {"candidate": name, "imgsz": imgsz, "skipped": "needs CUDA"}
    torch.manual_seed(0)
    fmt = torch.contiguous_format if variant == "nchw" else torch.channels_last
    model = Model(a.cfg, nc=a.nc).to(dev, memory_format=fmt).train()
    prec = Precision({"fp32": "off"}.get(precision, precision), dev.type)
    loss_fn = ComputeLoss(model, loss_gains(load_hyp(), 3, a.nc, imgsz))
    optimizer = build_optimizer(model, a.optimizer, 0.001 if a.optimizer == "AdamW" else 0.01, 0.937, 5e-4,
                                fused=dev.type == "cuda" and variant != "foreach")
    updater = AmpUpdater(model, optimizer, prec, ModelEMA(model))
    x, t = fake_batch(a.batch, imgsz, a.nc, dev)
    x = x.contiguous(memory_format=fmt)
    forward, autocast = model, prec.autocast
    if variant == "graphs":  # autocast's weight cache cannot live across graph replays (PyTorch's rule)
        def autocast():
            return torch.autocast(dev.type, dtype=prec.dtype, enabled=prec.enabled, cache_enabled=False)

        with autocast():
            forward = torch.cuda.make_graphed_callables(model, (x,))
    elif variant == "compile":
        forward = torch.compile(model, backend=a.compile_backend)

    def step() -> None:
        with autocast():
            loss, _ = loss_fn(forward(x), t)
        updater.backward(loss)
        updater.step()

    sync = sync_of(dev)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "fp32"  # TF32: FP32's only
    first = timed(lambda: (step(), sync()))  # the first step: kernel choice, allocations, compilation
    for _ in range(a.warmup - 1):
        step()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if a.profile:
        print_profile(step, a.steps)
    seconds = timed(lambda: ([step() for _ in range(a.steps)], sync()))
    row = {"candidate": name, "imgsz": imgsz, "img/s": a.steps * a.batch / seconds, "skipped_steps": updater.skipped}
    if dev.type == "cuda":
        row.update({"peak GiB": torch.cuda.max_memory_allocated() / 2**30, "amp check": amp_check(model, prec)})
    if variant == "compile":
        row["compile s"] = first
    return row


def print_profile(step, steps: int, top: int = 18) -> None:
    """torch.profiler over `steps` steps: the operators with the most self CPU time, and their share."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"{'op':<44} {'self ms/step':>12} {'share':>7} {'calls/step':>10}")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        print(f"{e.key[:44]:<44} {e.self_cpu_time_total / 1e3 / steps:12.1f} {e.self_cpu_time_total / total:7.1%} "
              f"{e.count / steps:10.0f}")


def step_mode(a: argparse.Namespace) -> None:
    from utils.engine.amp import cpu_has_native_bf16

    dev = select_device(a.device)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    candidates = a.candidates or (["fp32", "fp16-foreach", "fp16", "bf16", "fp16-graphs"] if dev.type == "cuda" else
                                  ["fp32-nchw", "fp32"] + (["bf16-nchw", "bf16"] if cpu_has_native_bf16() else []))
    rows = []
    for imgsz in a.imgsz:
        for name in candidates:
            try:
                rows.append(step_rate(name, a, imgsz, dev))
            except Exception as e:  # noqa: BLE001 - one candidate's failure is its row; the others still run
                rows.append({"candidate": name, "imgsz": imgsz, "error": f"failed: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:200]}"})
            if dev.type == "cuda":
                torch.cuda.empty_cache()  # a graphed or compiled model's pool
            write_json(a.json, rows)  # after each: a time limit that stops the script keeps what was measured
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{a.cfg} batch {a.batch}, {a.optimizer}, {a.steps} timed steps after {a.warmup}, {where}")
    for r in rows:  # over the first candidate at the same size
        r["x first"] = r.get("img/s", 0) / next(b["img/s"] for b in rows if b["imgsz"] == r["imgsz"] and "img/s" in b)
    print_rows(rows)


# ----------------------------------------------------------------------------------------------------- loop


def loop_rate(epochs: int = 4, **options) -> dict:
    """{'it/s', 'img/s', ...} over the training passes after the first; options are train.run's."""
    import yaml

    import train
    from utils.hyp import DEFAULT_HYP_FILE
    from utils.engine.callbacks import Callbacks

    marks, spans, batches = {}, [], {}
    cb = Callbacks()
    cb.register("on_epoch_start", lambda t, e: marks.__setitem__(e, time.perf_counter()))
    cb.register("on_train_epoch_end", lambda t, e: spans.append((e, time.perf_counter() - marks[e])))
    cb.register("on_train_batch", lambda t, ni, imgs, targets, paths: batches.__setitem__(ni, imgs.shape[0]))
    with tempfile.TemporaryDirectory() as tmp:
        if "hyp" not in options:  # the batch asked for: the recipe's step floor would lower it on short runs
            options["hyp"] = str(Path(tmp) / "hyp.yaml")
            Path(options["hyp"]).write_text(yaml.safe_dump({**yaml.safe_load(DEFAULT_HYP_FILE.read_text()),
                                                            "min_steps": 0}))
        train.run(epochs=epochs, noval=True, noplots=True, project=str(Path(tmp) / "runs"), callbacks=cb, **options)
    nb, timed = len(batches) // epochs, [s for e, s in spans if e > 0]
    n_images, seconds = sum(batches.values()) / epochs, sum(timed)
    return {"it/s": nb * len(timed) / seconds, "img/s": n_images * len(timed) / seconds, "epochs": len(timed),
            "batches_per_epoch": nb, "images_per_epoch": n_images}


def loop_mode(a: argparse.Namespace) -> None:
    opts = dict(cfg=a.cfg, imgsz=a.imgsz, batch_size=a.batch_size, workers=a.workers, cache=a.cache, device=a.device,
                amp=a.amp, augment_on=a.augment_on, **({"data": a.data} if a.data else {}))
    runs: dict[str, list[dict]] = {}
    for r in range(a.rounds):
        for det in a.deterministic if r % 2 == 0 else a.deterministic[::-1]:  # drift falls on both alike
            runs.setdefault(det, []).append(loop_rate(a.epochs, **opts, deterministic=det == "on"))
    rows = [{"deterministic": det, **{k: statistics.fmean(x[k] for x in rs) for k in rs[0]}, **opts}
            for det, rs in runs.items()]
    for r in rows:
        print(f"loop: {a.cfg} {a.imgsz} px batch {a.batch_size} --amp {a.amp} --augment-on {a.augment_on} --workers "
              f"{a.workers} --deterministic {r['deterministic']} on {a.device or 'auto'}: {r['it/s']:.1f} it/s, "
              f"{r['img/s']:.0f} images/s over {a.rounds} x {r['epochs']:.0f} epochs of {r['batches_per_epoch']:.0f} "
              f"batches")
    if len(rows) == 2:
        print(f"deterministic on / off: {rows[0]['img/s'] / rows[1]['img/s']:.3f}x the images/s")
    write_json(a.json, rows)


def same_run_mode(a: argparse.Namespace) -> None:
    import train
    from utils.report.results import read_rows

    options = dict(epochs=a.epochs, imgsz=a.imgsz, device=a.device, workers=a.workers, seed=0, noplots=True,
                   deterministic=not a.no_deterministic, **({"data": a.data} if a.data else {}))
    with tempfile.TemporaryDirectory() as tmp:
        runs = [train.run(project=f"{tmp}/run{k}", **options) for k in range(2)]
        w0, w1 = (r.ema.state_dict() for r in runs)
        diff = max((w0[k].double() - w1[k].double()).abs().max().item() for k in w0)
        rows = [read_rows(r.save_dir / "results.csv", clock=False) for r in runs]
    r = {"identical_weights": diff == 0.0, "max_weight_diff": diff, "identical_results": rows[0] == rows[1]}
    print(f"same command twice ({a.epochs} epochs, device {a.device or 'auto'}, deterministic "
          f"{not a.no_deterministic}): weights identical {r['identical_weights']} (max diff {diff:.3g}), "
          f"results.csv identical {r['identical_results']}")
    write_json(a.json, r)


# ----------------------------------------------------------------------------------------------------- loader


def loader_rate(train: list, imgsz: int, workers: int, batch_size: int, batches: int, warmup: int = 2,
                cache: str = "off", chunk: int | None = None, augment_on: str = "host", device: str = "cpu"
                ) -> tuple[float, float | None]:
    """Images/s of the mosaic training loader; with augment_on device also the device's seconds per batch."""
    from utils.data.datasets import create_dataloader

    loader, _ = create_dataloader(train, imgsz, batch_size, 32, hyp=load_hyp(), augment=True, shuffle=True,
                                  workers=workers, seed=0, cache=cache, chunk=chunk, augment_on=augment_on)
    seen, t0, epoch, kept = 0, 0.0, 0, []
    while True:
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            if warmup:
                warmup -= 1
                t0 = time.perf_counter()
                continue
            seen, batches = seen + len(batch[0]), batches - 1
            if augment_on == "device" and len(kept) < 4:
                kept.append(batch[:2])
            if batches == 0:
                rate = seen / (time.perf_counter() - t0)
                return rate, device_seconds(kept, device) if kept else None
        epoch += 1


def device_seconds(batches: list, device: str) -> float:
    """Median seconds per batch of DeviceAugment on `device` after one untimed batch: wall seconds on a GPU
    (synchronised), this process's CPU seconds on a CPU (what the training process gives up)."""
    from utils.data.device_augment import DeviceAugment

    dev = select_device(device)
    augment = DeviceAugment(load_hyp(), dev)
    sync, clock = (sync_of(dev), time.perf_counter if dev.type == "cuda" else time.process_time)
    times = []
    for k, (raw, labels) in enumerate([batches[0], *batches]):
        sync()
        t0 = clock()
        augment(raw, labels)
        sync()
        times.append(clock() - t0)
    return statistics.median(times[1:])


def decode_rates(files: list[str], device: str = "0", rounds: int = 3, batch: int = 64) -> dict:
    """--decode: images/s of cv2.imdecode on one core and of decode_jpeg on `device` (batches of `batch`)."""
    import cv2
    import numpy as np
    from torchvision.io import decode_jpeg

    from utils.errors import UserError

    blobs = [Path(f).read_bytes() for f in files if f.lower().endswith((".jpg", ".jpeg"))]
    if not blobs:
        raise UserError("--decode: no JPEG files in the training split")
    cv2.setNumThreads(1)
    best_cv2 = min(timed(lambda: [cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR) for b in blobs])
                   for _ in range(rounds))
    dev = select_device(device)
    tensors, sync = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs], sync_of(dev)

    def device_pass():
        for k in range(0, len(tensors), batch):
            decode_jpeg(tensors[k:k + batch], device=dev)
        sync()

    device_pass()  # the decoder's start-up
    best_dev = min(timed(device_pass) for _ in range(rounds))
    return {"images": len(blobs), "cv2 img/s (1 core)": len(blobs) / best_cv2,
            f"decode_jpeg img/s ({dev.type})": len(blobs) / best_dev, "device": str(dev)}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def repeat_dataset(data: str | Path, copies: int, out: Path) -> Path:
    """--repeat: write `out`/repeat.yaml, `copies` x the training images of `data` (links); returns its path."""
    import yaml

    from utils.data.labels import img2label_paths, list_image_files

    cfg = load_data_config(data)
    files = list_image_files(cfg["train"])
    images, labels = out / "images" / "train", out / "labels" / "train"
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    for k in range(copies):
        for im, lab in zip(files, img2label_paths(files)):
            name = f"k{k:02d}_{Path(im).name}"
            if not (images / name).is_symlink():
                os.symlink(Path(im).resolve(), images / name)
            link = labels / (Path(name).stem + ".txt")
            if Path(lab).is_file() and not link.is_symlink():
                os.symlink(Path(lab).resolve(), link)
    yaml_file = out / "repeat.yaml"
    yaml_file.write_text(yaml.safe_dump({"path": str(out), "train": "images/train", "val": [str(v) for v in cfg["val"]],
                                         "names": dict(enumerate(cfg["names"]))}, sort_keys=False))
    return yaml_file


def loader_mode(a: argparse.Namespace) -> None:
    from utils.data.labels import list_image_files

    if a.repeat is not None:
        print(repeat_dataset(a.data, a.repeat, Path(a.out)))
        return
    train = load_data_config(a.data)["train"]
    if a.decode:
        r = decode_rates(list_image_files(train), a.device, a.rounds)
        print(json.dumps(r))
        write_json(a.json, r)
    else:  # the table prints once measured, after the loaders' own lines
        chunk = bool(a.chunk)
        lines = [f"{'imgsz':>6} {'cache':>6} {'workers':>8} {'augment':>8}" + (f" {'chunk':>6}" if chunk else "")
                 + f" {'images/s':>9}  device s/batch ({a.device})"]
        for s, c, w, k, aug in itertools.product(a.imgsz, a.cache, a.workers, a.chunk or [None], a.augment_on):
            ips, dev_s = loader_rate(train, s, w, a.batch_size, a.batches or 10, cache=c, chunk=k, augment_on=aug,
                                     device=a.device)
            lines.append(f"{s:>6} {c:>6} {w:>8} {aug:>8}" + (f" {k:>6}" if chunk else "") + f" {ips:>9.1f}  "
                         + ("-" if dev_s is None else f"{dev_s:.4f}"))
        print("\n" + "\n".join(lines))


# ----------------------------------------------------------------------------------------------------- detect, export


def random_checkpoint(cfg: str, folder: Path, nc: int = 80, head: str | None = None) -> Path:
    """A checkpoint of a random model (seed 0). With `head`, BatchNorm statistics are first measured on random
    pictures (at their initial values activations fade towards 0 layer by layer, and tiny floats can run at
    another speed than trained ones's); 'prior' then zeroes the head, which predicts its initial priors."""
    from models.yolo import Model
    from utils.engine.checkpoint import atomic_save, make_checkpoint

    torch.manual_seed(0)
    model = Model(cfg, nc=nc)
    if head:
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.momentum = None  # a plain mean over what it sees
        with torch.no_grad():
            model.train()(torch.rand(2, 3, 256, 256))
            for conv in model.model[-1].m if head == "prior" else ():
                conv.weight.zero_()
    path = folder / f"{Path(cfg).stem}_{head or 'untrained'}.pt"
    atomic_save(make_checkpoint(model.eval(), model.yaml, [f"class{i}" for i in range(nc)], epoch=0), path)
    return path


@torch.inference_mode()
def forward_ms(cfg: str, batch: int, imgsz: int, half: bool, device: str, budget_s: float = 4.0) -> float:
    """Median ms per forward pass of the fused model on a (batch, 3, imgsz, imgsz) input, after warm-up."""
    from models.yolo import Model
    from utils.engine.amp import prepare_inference

    dev, dtype = select_device(device), torch.float16 if half else torch.float32
    model = prepare_inference(Model(cfg, nc=80).fuse(), dev, dtype)
    x, sync = torch.rand(batch, 3, imgsz, imgsz, device=dev).to(dtype), sync_of(dev)
    for _ in range(3):
        model(x)
    times, end = [], time.perf_counter() + budget_s
    while len(times) < 5 or (time.perf_counter() < end and len(times) < 200):
        sync()
        times.append(timed(lambda: (model(x), sync())))
    return statistics.median(times) * 1e3


def detect_mode(a: argparse.Namespace) -> None:
    import detect

    device, rows = a.device or "cpu", []
    with tempfile.TemporaryDirectory() as tmp:
        weights = a.weights or str(random_checkpoint(a.cfg, Path(tmp)))
        for prec in a.precisions:
            for b in a.batch_sizes:
                if a.forward:
                    ms = forward_ms(a.cfg, b, a.imgsz, prec == "fp16", device)
                    rows.append({"precision": prec, "batch": b, "ms/batch": ms, "img/s": 1e3 * b / ms})
                    continue
                opts = detect.DetectOptions(weights=weights, source=a.source, imgsz=a.imgsz, device=device,
                                            half=prec == "fp16", batch_size=b, conf_thres=a.conf_thres,
                                            nosave=a.nosave, save_txt=a.save_txt, save_conf=a.save_txt,
                                            project=a.project or f"{tmp}/runs", name=f"{prec}-b{b}", exist_ok=True)
                first = sorted(p for p in Path(a.source).iterdir() if p.suffix.lower() in (".jpg", ".png"))[0]
                detect.detect(replace(opts, source=str(first), name="warmup", nosave=True, save_txt=False))
                t0 = time.perf_counter()
                r = detect.detect(opts)
                wall = time.perf_counter() - t0
                rows.append({"precision": prec, "batch": b, "images": r.seen, "wall s": wall, "img/s": r.seen / wall,
                             **{f"{k} ms": v for k, v in r.speed.items()}, "save_dir": str(r.save_dir)})
    what = "forward pass of the fused model" if a.forward else f"detect.run over {a.source}" + " --nosave" * a.nosave
    print(f"{what}, {Path(weights).name if a.weights else a.cfg + ' (untrained)'} at {a.imgsz}, on {device}, "
          f"{torch.get_num_threads()} CPU threads; ms per image")
    print_rows(rows, skip=("save_dir",))
    write_json(a.json, rows)


def cpu_description() -> str:
    """lscpu's model name and flags (the instruction sets decide what INT8 and bf16 can gain), or what Python knows."""
    import platform
    import subprocess

    try:
        fields = dict(line.split(":", 1) for line in subprocess.run(["lscpu"], capture_output=True, text=True,
                                                                   timeout=10).stdout.splitlines() if ":" in line)
        return f"CPU: {fields['Model name'].strip()}, {os.cpu_count()} logical CPUs; flags: {fields['Flags'].strip()}"
    except (OSError, KeyError, subprocess.SubprocessError):
        return f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs (no lscpu)"


def export_backends(a: argparse.Namespace, pt: Path, out: Path) -> tuple[dict[str, Path], dict[str, float]]:
    """(backend label -> weights to run, label -> export seconds): each asked backend exported once from `pt`
    (--dynamic, as detect.py letterboxes each picture to its own rectangle), into `out`."""
    import export

    jobs = {"onnxruntime": ("onnx", {}), "openvino": ("openvino", {}),
            "openvino-int8": ("openvino", {"int8": True, "data": a.data})}
    files, seconds = {"pytorch": pt}, {}
    for label in a.backends:
        if label == "pytorch":
            continue
        fmt, extra = jobs[label]
        t0 = time.perf_counter()
        (files[label],) = export.run(pt, include=(fmt,), imgsz=a.imgsz, dynamic=True, device="cpu",
                                     output_dir=out / label, **extra)
        seconds[label] = time.perf_counter() - t0
    return files, seconds


def picture_subset(source: str, n: int, out: Path) -> str:
    """A folder of links to the first `n` pictures of `source` (all of them when n is 0)."""
    if not n:
        return source
    folder = out / "pictures"
    folder.mkdir()
    for p in sorted(Path(source).glob("*.jpg"))[:n]:
        os.symlink(p.resolve(), folder / p.name)
    return str(folder)


def export_mode(a: argparse.Namespace) -> None:
    """detect.py end to end per backend and thread count, rounds alternating the backend order."""
    import detect

    out = Path(tempfile.mkdtemp(prefix="export_speed_"))
    pt = Path(a.weights) if a.weights else random_checkpoint(a.cfg, out, head=a.head)
    files, export_s = export_backends(a, pt, out)
    source = picture_subset(a.source, a.images, out)
    base = detect.DetectOptions(weights="", source=source, imgsz=a.imgsz, device="cpu", project=str(out / "runs"),
                                exist_ok=True, nosave=a.nosave)
    first = str(sorted(Path(source).glob("*.jpg"))[0])
    what = f"{pt.name}" if a.weights else f"{Path(a.cfg).stem} random weights (--head {a.head})"
    lines = [f"bench/speed.py export: {what}, detect.py over {source} at --imgsz {a.imgsz}, batch 1, CPU, "
             f"{a.rounds} alternating rounds; torch {torch.__version__}, {package_versions()}", cpu_description(),
             "exports (--dynamic): " + (", ".join(f"{k} {v:.1f} s" for k, v in export_s.items()) or "none")]
    for threads in a.threads:
        torch.set_num_threads(threads)  # ONNX Runtime and OpenVINO take torch's count (utils/interop/backends.py)
        for w in files.values():  # warm-up: page cache, allocator, each runtime's first session
            detect.detect(replace(base, weights=str(w), source=first, name="warmup", nosave=True))
        runs = time_backends(base, files, a.rounds, threads)
        lines += speed_table(runs, threads)
    print("\n".join(lines))
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


def time_backends(base, files: dict[str, Path], rounds: int, threads: int) -> dict[str, list[dict]]:
    import detect

    runs: dict[str, list[dict]] = {label: [] for label in files}
    for i in range(rounds):
        for label, w in list(files.items())[:: 1 if i % 2 == 0 else -1]:  # drift falls on every backend alike
            t0, c0 = time.perf_counter(), time.process_time()
            r = detect.detect(replace(base, weights=str(w), name=label))
            runs[label].append({"e2e": (time.perf_counter() - t0) / r.seen * 1e3, "n": r.seen,
                                "cpu": (time.process_time() - c0) / r.seen * 1e3, **r.speed})
            print(f"{threads} thread(s) round {i + 1} {label:14s} {runs[label][-1]['e2e']:.1f} ms/image end to end",
                  flush=True)
    return runs


def speed_table(runs: dict[str, list[dict]], threads: int) -> list[str]:
    """Medians per backend over the rounds, and each backend's speed-up over the first (PyTorch)."""
    lines = [f"{threads} thread(s), {next(iter(runs.values()))[0]['n']} images:",
             f"{'backend':14s} {'e2e ms/img':>11s} {'e2e CPU ms':>11s} {'pre ms':>8s} {'infer ms':>9s} {'NMS ms':>8s}"
             f" {'x e2e':>6s} {'x infer':>8s}   (wall e2e per round)"]
    med = {label: {k: statistics.median(r[k] for r in rs) for k in ("e2e", "cpu", "pre-process", "inference", "NMS")}
           for label, rs in runs.items()}
    ref = next(iter(med.values()))
    for label, m in med.items():
        lines.append(f"{label:14s} {m['e2e']:11.1f} {m['cpu']:11.1f} {m['pre-process']:8.1f} {m['inference']:9.1f} "
                     f"{m['NMS']:8.1f} {ref['e2e'] / m['e2e']:6.2f} {ref['inference'] / m['inference']:8.2f}   ("
                     + ", ".join(f"{r['e2e']:.1f}" for r in runs[label]) + ")")
    return lines


def package_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("onnxruntime", "openvino", "nncf"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def metrics_mode(a: argparse.Namespace) -> None:
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    import validator
    from tests.helpers import image_pairs, load_ground_truth, make_predictions

    preds, gt = make_predictions(a.dataset), load_ground_truth(a.dataset)
    ours_t, coco_t = [], []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        res = validator.score_predictions(image_pairs(preds, gt), nc=len(gt[2]))
        ours_t.append(time.perf_counter() - t0)
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
            ev = COCOeval(coco := COCO(str(a.dataset / "annotations.json")), coco.loadRes(preds), "bbox")
            coco_t.append(timed(lambda: (ev.evaluate(), ev.accumulate())))
            ev.summarize()
    print(f"{len(preds)} predictions on {a.dataset.name}; torch {torch.get_num_threads()} threads\n"
          f"{'':14}{'mAP50':>9}{'mAP50-95':>10}\n{'ours':14}{res.map50:9.5f}{res.map:10.5f}\n"
          f"{'pycocotools':14}{ev.stats[1]:9.5f}{ev.stats[0]:10.5f}\n"
          f"{'difference':14}{res.map50 - ev.stats[1]:+9.1e}{res.map - ev.stats[0]:+10.1e}\n"
          f"time (best of {a.repeat}): ours {min(ours_t) * 1e3:.1f} ms (matching + AP), pycocotools evaluate+accumulate "
          f"{min(coco_t) * 1e3:.1f} ms, ratio {min(coco_t) / min(ours_t):.1f}x")


# ----------------------------------------------------------------------------------------------------- command line


def options(parser: argparse.ArgumentParser, **defaults) -> argparse.ArgumentParser:
    """An option --NAME per keyword (NAME_X as --NAME-X), its type from the default: False a switch, a list any
    number of values, a tuple one of its values (the first by default), None a string."""
    for name, d in defaults.items():
        flag = "--" + name.replace("_", "-")
        if d is False:
            parser.add_argument(flag, action="store_true")
        elif isinstance(d, tuple):
            parser.add_argument(flag, choices=d, default=d[0])
        elif isinstance(d, list):
            parser.add_argument(flag, nargs="+", type=type(d[0]) if d else str, default=d or None)
        else:
            parser.add_argument(flag, type=str if d is None else type(d), default=d)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    options(sub.add_parser("step"), cfg="yolov5n.yaml", imgsz=[320, 640], batch=16, steps=5, warmup=1, device="cpu",
            candidates=[], optimizer=("AdamW", "SGD"), nc=80, profile=False, compile_backend="inductor", json=None)
    loop = options(sub.add_parser("loop"), data=None, cfg="yolov5n.yaml", imgsz=192, batch_size=16, epochs=4,
                   workers=8, cache="auto", device="", amp="auto", augment_on=("auto", "host", "device"), rounds=1,
                   json=None)
    loop.add_argument("--deterministic", nargs="+", default=["on"], choices=["on", "off"])
    options(sub.add_parser("same-run"), data=None, epochs=2, imgsz=192, device="", workers=8, no_deterministic=False,
            json=None)
    loader = options(sub.add_parser("loader"), data=str(SHARED_COCO128 / "coco128.yaml"), batches=0, batch_size=16,
                     imgsz=[640, 320], workers=[0, 2], cache=["off", "ram"], device="cpu", rounds=3, out=None,
                     json=None)
    loader.add_argument("--augment-on", nargs="+", default=["host"], choices=["host", "device"])
    loader.add_argument("--chunk", type=int, nargs="+", help="samples a worker builds at a time (0: whole batches)")
    options(exclusive := loader.add_mutually_exclusive_group(), decode=False)
    exclusive.add_argument("--repeat", type=int, metavar="N")
    detect = options(sub.add_parser("detect"), weights=None, cfg="yolov5s.yaml", source=str(COCO128_IMAGES), imgsz=640,
                     conf_thres=0.25, device="", batch_sizes=[1], nosave=False, save_txt=False, project=None,
                     forward=False, json=None)
    detect.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "fp16"])
    exp = options(sub.add_parser("export"), cfg="yolov5s.yaml", weights=None, imgsz=640, threads=[1], rounds=3,
                  source=str(COCO128_IMAGES), images=0, head=("prior", "random"), data=str(SHARED_COCO128 / "coco128.yaml"),
                  nosave=False, out=None)
    exp.add_argument("--backends", nargs="+", default=["pytorch", "onnxruntime"],
                     choices=["pytorch", "onnxruntime", "openvino", "openvino-int8"])
    options(sub.add_parser("metrics"), dataset=SHARED_COCO128, repeat=3)
    a = p.parse_args(argv)
    if a.mode == "loader" and a.repeat is not None and a.out is None:
        p.error("--repeat needs --out DIR")
    return a


def main(argv: list[str] | None = None) -> None:
    import logging

    from utils.errors import run_cli

    a = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # per-image lines would drown the tables
    modes = {"step": step_mode, "loop": loop_mode, "same-run": same_run_mode, "loader": loader_mode,
             "detect": detect_mode, "export": export_mode, "metrics": metrics_mode}
    run_cli(lambda: modes[a.mode](a))


if __name__ == "__main__":
    main()
