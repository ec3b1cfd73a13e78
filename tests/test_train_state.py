"""What last.pt holds for a resume goes through one table of parts (utils/engine/train_state.py): each part is saved,
checked and loaded through its entry, so that a new part is one entry."""
from __future__ import annotations

import pytest
import torch

import train
from utils.engine import train_state as ts
from utils.engine.checkpoint import load_checkpoint
from utils.engine.schema import SchemaError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def last_state(micro, tmp_path_factory) -> tuple[dict, dict]:
    """('train', 'model') of the last.pt of a run stopped after its first epoch, as load_checkpoint gives them."""
    out = train.run(data=str(micro), project=str(tmp_path_factory.mktemp("state")), epochs=2, imgsz=64, batch_size=4,
                    workers=0, noplots=True, noval=True, amp="off", seed=0, callbacks=_stop_after_first_epoch())
    ckpt = load_checkpoint(out.save_dir / "weights" / "last.pt")
    return ckpt["train"], ckpt["model"]


def _stop_after_first_epoch():
    from utils.engine.callbacks import Callbacks

    cb = Callbacks()

    def stop(t, *_):
        t.stops.requested = True  # as a signal whose KeyboardInterrupt was swallowed: the run stops after the epoch
    cb.register("on_epoch_end", stop)
    return cb


def test_last_pt_holds_exactly_the_tables_parts(last_state):
    state, _ = last_state
    assert list(state) == [p.key for p in ts.PARTS]
    assert state["completed_epoch"] == 0


@pytest.mark.parametrize("key", [p.key for p in ts.PARTS])
def test_each_part_is_checked_by_its_entry(key, last_state):
    state, model = last_state
    ts.check_train_state(state, model)  # as saved: sound
    damaged = {**state, key: "not what was saved"}
    with pytest.raises(SchemaError, match=f"'train.{key}"):
        ts.check_train_state(damaged, model)
    part = next(p for p in ts.PARTS if p.key == key)
    gone = {k: v for k, v in state.items() if k != key}
    if part.optional:  # files from before it have none
        ts.check_train_state(gone, model)
    else:
        with pytest.raises(SchemaError, match=f"'train.{key}.*missing"):
            ts.check_train_state(gone, model)


@pytest.mark.slow
def test_a_new_part_is_one_entry(micro, tmp_path, monkeypatch):
    """One more Part in the table is saved in last.pt, checked when the file is read and loaded on --resume, with no
    other edit."""
    seen = []
    part = ts.Part("extra", lambda t, epoch: {"epoch": epoch},
                   lambda v, _: ts.require(isinstance(v, dict), "train.extra", "a mapping", v),
                   lambda t, v: seen.append(v))
    monkeypatch.setattr(ts, "PARTS", (*ts.PARTS, part))
    out = train.run(data=str(micro), project=str(tmp_path), epochs=2, imgsz=64, batch_size=4, workers=0,
                    noplots=True, noval=True, amp="off", seed=0, callbacks=_stop_after_first_epoch())
    last = out.save_dir / "weights" / "last.pt"
    assert torch.load(last, weights_only=True)["train"]["extra"] == {"epoch": 0}
    state = load_checkpoint(last)["train"]  # checked through the new entry as the file is read
    with pytest.raises(SchemaError, match="'train.extra' must be a mapping"):
        ts.check_train_state({**state, "extra": 1}, load_checkpoint(last)["model"])
    train.run(resume=str(last))
    assert seen == [{"epoch": 0}]


def test_rewinding_drops_the_rows_after_the_epoch(tmp_path):
    for name in ts.EPOCH_FILES:
        (tmp_path / name).write_text("epoch,x\n0,1\n1,2\n2,3\n")
    ts.rewind_epoch_files(tmp_path, 0)
    for name in ts.EPOCH_FILES:
        assert (tmp_path / name).read_text().splitlines() == ["epoch,x", "0,1"]
