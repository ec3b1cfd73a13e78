"""Weights from a checkpoint into a model built for new data (fine-tuning): what transferred, and why the rest did
not, said in one line."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from models.yolo import build_model, model_name


@dataclass(frozen=True)
class Transfer:
    """What `transfer_weights` did. `fresh` names the model's tensors that start from their initialisation."""

    source: str  # the weights file
    source_model: str  # its architecture's name (models.yolo.model_name)
    target_model: str
    source_nc: int
    target_nc: int
    n_tensors: int
    fresh: frozenset[str]
    share: float  # the share of the model's tensors that came from the file (the recipe's input: utils/engine/optim)

    def describe(self) -> str:
        """One line: how many tensors transferred, and why the others did not."""
        done = f"{self.n_tensors - len(self.fresh)}/{self.n_tensors} tensors transferred"
        if not self.fresh:
            return f"{self.source} ({self.source_model}, {self.source_nc} classes): all {self.n_tensors} tensors transferred"
        if self.source_model != self.target_model:
            return (f"{self.source} holds {self.source_model}, the model trained here is {self.target_model}: "
                    f"{done}; the other {len(self.fresh)} differ in shape between the two models and start from "
                    f"scratch (to fine-tune {self.source_model}, pass its --cfg or drop --cfg)")
        why = (f"the Detect head's class outputs: {self.source_nc} classes in the weights, {self.target_nc} in the data"
               if self.source_nc != self.target_nc else "their shapes differ")
        return f"{self.source} ({self.source_model}): {done}; {len(self.fresh)} re-initialised ({why})"


def transfer_weights(model: nn.Module, ckpt: dict, source: str | Path) -> Transfer:
    """Load every tensor of the checkpoint whose name and shape fit `model` (in place) and say what happened."""
    pretrained = build_model(ckpt, source=source).state_dict()
    own = model.state_dict()
    fits = {k: v for k, v in pretrained.items() if k in own and v.shape == own[k].shape}
    model.load_state_dict(fits, strict=False)
    return Transfer(str(source), model_name(ckpt["yaml"]), model_name(model.yaml), int(ckpt["nc"]),
                    int(model.yaml["nc"]), len(own), frozenset(own.keys() - fits.keys()), len(fits) / max(len(own), 1))
