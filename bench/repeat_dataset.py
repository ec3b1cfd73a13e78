"""A dataset of several copies of another one's training images, under distinct names (symlinks), so the training
loop can be timed over many batches (COCO128 at batch 64 is 2 batches an epoch: it times epoch start-up).

    python bench/repeat_dataset.py --data ../shared/datasets/coco128/coco128.yaml --copies 16 --out /tmp/coco2048
    # -> /tmp/coco2048/repeat.yaml: 2,048 training images (copy 3 of x.jpg is images/train/k03_x.jpg),
    #    validation as the source's

Labels are linked beside them (labels/train/k03_x.txt), so each copy is its own sample with its own label file;
the validation split is the source's own. Links, not copies: 2,048 images cost no disk. Running it again on the
same folder keeps what is there.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from utils.data.data_config import load_data_config  # noqa: E402
from utils.data.labels import img2label_paths, list_image_files  # noqa: E402


def repeat_dataset(data: str | Path, copies: int, out: Path) -> Path:
    """Write `out`/repeat.yaml: `copies` x the training images of `data` (links); returns its path."""
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="the source dataset YAML")
    p.add_argument("--copies", type=int, default=16)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    print(repeat_dataset(a.data, a.copies, a.out))


if __name__ == "__main__":
    main()
