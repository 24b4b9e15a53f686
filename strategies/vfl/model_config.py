"""The switches of the primary's model (strategies/vfl/model.py), without torch: a run's
configuration (app/config.py) reads them in processes that build no model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Merge = Literal["cnn", "mlp", "avg"]


@dataclass(frozen=True)
class ModelConfig:
    local_hidden: tuple[int, ...] = (200,)
    cut_dim: int = 100
    agg_hidden: tuple[int, ...] = (100,)
    r: int = 10  # outputs per (record, neighbour) pair
    merge: Merge = "cnn"
    k_conv: int = 7
    channels: int = 8
    merge_hidden: int = 400
    dropout: float = 0.2
    weight_gate: bool = True  # False: the raw similarity is the weight (the reference's -dw)
    sort_gate: bool = True
    uniform_weights: bool = False  # every neighbour weighs the same (AvgSim, Top1Sim, Exact)
    sim_feature: bool = False  # the similarity enters the aggregation MLP as a feature (FeatureSim)
    attention: bool = False  # add attention over the neighbours and a null slot (fedsim_attn)
    attention_start: str = "top1"  # the branch starts at Top1Sim, or "silent": at the paper's FedSim
    attention_lr: float = 1.0  # the attention branch's learning rate, as a fraction of the model's
