"""Shared test fixtures: repository paths, the optional COCO128 copy beside the checkout, the tiny datasets, thread
counts, and a set of untrusted files."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from utils.data.data_config import SHARED_COCO128
from utils.engine import checkpoint as ck

REPO = Path(__file__).resolve().parents[1]
COCO128 = SHARED_COCO128


@pytest.fixture
def coco128_dir() -> Path:
    if not (COCO128 / "coco128.yaml").is_file():
        pytest.skip(f"COCO128 not found at {COCO128}")
    return COCO128


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A small copy of the built-in shapes dataset (24 train, 8 val images) and its data YAML."""
    from utils.data.synthetic import tiny_shapes

    return tiny_shapes(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def micro(tiny_data, tmp_path_factory) -> Path:
    """8 training and 4 validation images of tiny_data: the cheapest real run."""
    d = tmp_path_factory.mktemp("micro")
    shapes = tiny_data.parent / "shapes" / "images"
    for split, n in (("train", 8), ("val", 4)):
        (d / f"{split}.txt").write_text("".join(f"{p}\n" for p in sorted((shapes / split).iterdir())[:n]))
    (d / "micro.yaml").write_text(tiny_data.read_text().replace("train: images/train", f"train: {d / 'train.txt'}")
                                  .replace("val: images/val", f"val: {d / 'val.txt'}"))
    return d / "micro.yaml"


@pytest.fixture(scope="session")
def bf16_hyp(tmp_path_factory) -> Path:
    """The default hyperparameters with fp32_warmup 0: bf16 from the first step. A tiny run's steps are all
    warmup steps (at least 100), which a bf16 run trains in FP32 by default; tests of the bf16 arithmetic use this."""
    from helpers import hyp_file  # here, not at the top: bench/tests imports this module without tests/ on sys.path

    return hyp_file(tmp_path_factory.mktemp("hyp"), fp32_warmup=0)


@pytest.fixture(scope="session")
def coco_subset(tmp_path_factory) -> Path:
    """48 training and 16 validation images of COCO128 (real photos, many objects each) as a data YAML;
    skipped when COCO128 is absent. Real images give the loss enough positives per batch that several CPU
    threads share its sums, which is where an unseeded summation order shows."""
    if not (COCO128 / "coco128.yaml").is_file():
        pytest.skip(f"COCO128 not found at {COCO128}")
    import yaml

    d = tmp_path_factory.mktemp("coco_subset")
    images = sorted((COCO128 / "images" / "train2017").glob("*.jpg"))
    (d / "train.txt").write_text("".join(f"{p}\n" for p in images[:48]))
    (d / "val.txt").write_text("".join(f"{p}\n" for p in images[48:64]))
    names = yaml.safe_load((COCO128 / "coco128.yaml").read_text())["names"]
    (d / "coco_subset.yaml").write_text(yaml.safe_dump({"path": str(d), "train": "train.txt", "val": "val.txt",
                                                        "nc": len(names), "names": names}))
    return d / "coco_subset.yaml"


@pytest.fixture
def several_threads():
    """At least 2 intra-op threads for the test (the machine's count when it has more), restored after."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(max(2, n))
    yield torch.get_num_threads()
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`): tiny models gain
    nothing from a second one, and when other jobs share the two cores, OpenMP threads waiting on each other slow
    a training step from ~50 ms to seconds."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, tiny_data) -> dict[str, Path]:
    """Every kind of untrusted file, each made to run `touch PWNED` if it were ever executed."""
    d = tmp_path_factory.mktemp("untrusted")
    from models.yolo import Model

    model = Model("yolov5n.yaml", nc=5)
    good = d / "good.pt"
    ck.atomic_save(ck.make_checkpoint(model, model.yaml, [f"c{i}" for i in range(5)], 0), good)
    files = {"truncated.pt": good.read_bytes()[: good.stat().st_size // 2]}
    (d / "truncated.pt").write_bytes(files["truncated.pt"])
    torch.save({"state_dict": model.state_dict(), "epoch": 3}, d / "foreign.pt")  # another program's checkpoint
    torch.save({"format": "ampyolo", "model": _Evil(d), "yaml": {}}, d / "evil.pt")
    tag = f"!!python/object/apply:os.system ['touch {d}/PWNED']"
    data = tiny_data.read_text()
    (d / "evil_data.yaml").write_text(data.replace("train: images/train", f"train: {tag}"))
    (d / "evil_model.yaml").write_text(f"nc: {tag}\n")
    (d / "unknown_module.yaml").write_text(
        (REPO / "models" / "yolov5n.yaml").read_text().replace(", SPPF,", ", os.system,"))
    (d / "outside.yaml").write_text(data.replace("train: images/train", "train: /root/nonexistent/images"))
    (d / "not_a_folder.yaml").write_text(data.replace("train: images/train", f"train: {d / 'good.pt'}"))
    return {p.name: p for p in d.iterdir()}


class _Evil:
    def __init__(self, d: Path):
        self.d = d

    def __reduce__(self):
        return (os.system, (f"touch {self.d}/PWNED",))
