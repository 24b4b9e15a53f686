"""A party's optimiser state as Flower records, kept in ``context.state`` between messages
(both modes: a FedSim secondary, an Entity Augmentation secondary)."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord


def optimizer_state_records(optimizer: torch.optim.Optimizer) -> tuple[ArrayRecord, ConfigRecord]:
    """Per-parameter optimiser state as arrays + scalars (no pickling; cheap per message).
    Hyperparameters (param_groups) are not stored: they come from the run config."""
    arrays, scalars = {}, {}
    for i, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                arrays[f"{i}/{key}"] = value.detach().cpu()
            else:
                scalars[f"{i}/{key}"] = float(value)
    return ArrayRecord(arrays), ConfigRecord(scalars)


def load_optimizer_state(optimizer: torch.optim.Optimizer, arrays: ArrayRecord, scalars: ConfigRecord) -> None:
    state: dict[int, dict] = {}
    for name, tensor in arrays.to_torch_state_dict().items():
        i, key = name.split("/", 1)
        state.setdefault(int(i), {})[key] = tensor
    for name, value in scalars.items():
        i, key = name.split("/", 1)
        state.setdefault(int(i), {})[key] = int(value) if key == "step" and float(value).is_integer() else value
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
