"""Same seeded commands, two source trees: are the results bit for bit the same?

    python bench/same_results.py --before 8578bf4          # a commit (checked out in a temporary worktree)
    python bench/same_results.py --before /tmp/old-tree    # or a folder holding another checkout

In each tree, on one CPU thread, on the first --pictures pictures of COCO128 at 96 px (the set needs
../shared/datasets/coco128): train.py from scratch and fine-tuned from ../shared/weights/yolov5n.pt (--epochs,
seed 0), then test.py and detect.py --save-txt on each run's last.pt. Compared: results.csv rows (time columns
aside), every tensor and value in last.pt, test.py's metric lines and detect.py's label files. Prints one line per
check, naming what differs, and exits 1 if anything does. A refactor that claims "behaviour and results unchanged"
runs this. --new-keys: last.pt entries that only the later tree writes (a field added on purpose since --before,
e.g. `data`, which checkpoints record since the OpenVINO export); they are listed, not compared.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
COCO128 = SHARED / "datasets" / "coco128"
YOLOV5N = SHARED / "weights" / "yolov5n.pt"


def subset(out: Path, n: int) -> Path:
    """A data YAML over links to the first `n` COCO128 pictures and their labels (train = val)."""
    for kind in ("images", "labels"):
        (out / kind).mkdir(parents=True)
    for p in sorted((COCO128 / "images" / "train2017").glob("*.jpg"))[:n]:
        os.symlink(p, out / "images" / p.name)
        label = COCO128 / "labels" / "train2017" / (p.stem + ".txt")
        if label.exists():
            os.symlink(label, out / "labels" / label.name)
    names = (COCO128 / "coco128.yaml").read_text().split("names:", 1)[1]
    yaml = out / "data.yaml"
    yaml.write_text(f"path: {out}\ntrain: images\nval: images\nnc: 80\nnames:{names}")
    return yaml


def run(tree: Path, args: list[str], log: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0"}
    p = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    log.write_text(p.stdout + p.stderr)
    if p.returncode:
        sys.exit(f"same_results: {' '.join(args[:1])} failed in {tree} (exit {p.returncode}); see {log}")
    return p.stdout + p.stderr


def one_tree(tree: Path, data: Path, out: Path, epochs: int) -> dict:
    """Every artefact the comparison looks at, for one source tree."""
    found = {}
    for start, extra in (("scratch", []), ("finetune", ["--weights", str(YOLOV5N)])):
        run(tree, ["train.py", "--data", str(data), "--epochs", str(epochs), "--imgsz", "96", "--batch-size", "16",
                   "--seed", "0", "--workers", "0", "--project", str(out), "--name", start, *extra],
            out / f"{start}_train.log")
        last = out / start / "weights" / "last.pt"
        test_out = run(tree, ["test.py", "--weights", str(last), "--data", str(data), "--imgsz", "96",
                              "--project", str(out), "--name", f"{start}_test", "--no-plots"], out / f"{start}_test.log")
        run(tree, ["detect.py", "--weights", str(last), "--source", str(data.parent / "images"), "--imgsz", "96",
                   "--conf-thres", "0.05", "--save-txt", "--save-conf", "--nosave", "--project", str(out),
                   "--name", f"{start}_detect"], out / f"{start}_detect.log")
        with open(out / start / "results.csv") as f:
            rows = [{k: v for k, v in r.items() if "time" not in k.lower()} for r in csv.DictReader(f)]
        labels = {p.name: p.read_text() for p in sorted((out / f"{start}_detect" / "labels").glob("*.txt"))}
        metrics = [line for line in test_out.splitlines() if line.strip().startswith("all") or "mAP" in line]
        found[start] = {"results.csv rows": rows, "last.pt entries": tensors(torch.load(last, weights_only=True)),
                        "test.py metrics": metrics, "detect.py labels": labels}
    return found


def tensors(obj, prefix: str = "") -> dict:
    """Every tensor (and number) in a nested checkpoint, by its path; the save date left out."""
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() if key != "date" for k, v in tensors(value, f"{prefix}{key}.").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, value in enumerate(obj) for k, v in tensors(value, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): obj}


def differences(a, b) -> list[str]:
    """What differs between two artefacts of one kind: the keys (or positions) whose values are not equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return sorted(str(k) for k in a.keys() | b.keys() if k not in a or k not in b or not equal(a[k], b[k]))
    if isinstance(a, list) and isinstance(b, list):
        return [f"item {i}" for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or not equal(a[i], b[i])]
    return [] if equal(a, b) else ["the value"]


def equal(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            a.shape == b.shape and torch.equal(a, b)
    return a == b


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="a commit of this repository or a folder with another checkout")
    p.add_argument("--pictures", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--keep", help="keep the runs in this folder (default: a temporary one, removed)")
    p.add_argument("--new-keys", nargs="*", default=[], help="top-level last.pt keys only the later tree writes")
    a = p.parse_args(argv)
    if not (COCO128.is_dir() and YOLOV5N.is_file()):
        sys.exit(f"same_results: needs {COCO128} and {YOLOV5N}")
    work = Path(a.keep or tempfile.mkdtemp(prefix="same_results_"))
    work.mkdir(parents=True, exist_ok=True)
    before = Path(a.before)
    worktree = None
    if not before.is_dir():
        worktree = work / "before-tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(worktree), a.before], cwd=ROOT, check=True,
                       capture_output=True)
        before = worktree
    try:
        data = subset(work / "data", a.pictures)
        results = {name: one_tree(tree, data, work / name, a.epochs) for name, tree in (("before", before),
                                                                                         ("after", ROOT))}
    finally:
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, capture_output=True)
    failed = 0
    for start in ("scratch", "finetune"):
        after = results["after"][start]
        new = sorted(k for k in after["last.pt entries"] if k.split(".")[0] in a.new_keys)
        for k in new:
            del after["last.pt entries"][k]
        for what, b in results["before"][start].items():
            diff = differences(b, after[what])
            failed += bool(diff)
            print(f"{start:9s} {what:17s} {'DIFFERENT: ' + ', '.join(diff[:8]) if diff else 'same'} ({len(b)} items)"
                  + (f"; new in the later tree, not compared: {', '.join(new)}" if new and what.startswith("last") else ""))
    print(f"before: {a.before}, after: {ROOT} ({'all the same' if not failed else f'{failed} differ'})")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
