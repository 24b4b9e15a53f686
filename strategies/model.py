"""The primary party's model: its local MLP, the aggregation MLP over (record, neighbour)
pairs, and the weight / sort / merge gates, switched by :class:`ModelConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from strategies.gates import CNNMerge, MLPMerge, WeightGate, mlp, sort_by_similarity, weighted_average

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
    weight_gate: bool = True
    sort_gate: bool = True


def local_model(d_in: int, cfg: ModelConfig) -> nn.Sequential:
    """A party's local model: d_in -> hidden -> cut_dim, no activation at the cut layer."""
    return mlp(d_in, cfg.local_hidden, cfg.cut_dim)


def build_seeded(seed: int, build):
    """Build a module with parameters drawn from ``seed`` without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


class SimilarityModel(nn.Module):
    """FedSim's primary-side model.

    forward(x (B, d_P), emb {party: (B, K, c)}, sims (B, K)) -> (B, d_out) raw outputs.
    The primary's local model runs once per record and is broadcast over its K pairs.
    With no secondary party (Solo) it is local MLP -> aggregation MLP -> output.
    """

    def __init__(self, d_primary: int, secondary_cuts: dict[str, int], k: int, d_out: int, cfg: ModelConfig,
                 squash_pairs: bool) -> None:
        super().__init__()
        self.parties = sorted(secondary_cuts)
        self.cfg = cfg
        self.local = local_model(d_primary, cfg)
        d_cat = cfg.cut_dim + sum(secondary_cuts.values())
        if not self.parties:
            self.agg = mlp(d_cat, cfg.agg_hidden, d_out)
            return
        if cfg.merge == "avg" and cfg.r != d_out:
            raise ValueError(f"merge='avg' needs r == output dim ({d_out}), got r={cfg.r}")
        self.agg = mlp(d_cat, cfg.agg_hidden, cfg.r)
        self.squash_pairs = squash_pairs  # sigmoid on pair outputs (binary/regression), as the reference
        self.weight_gate = WeightGate() if cfg.weight_gate else None
        if cfg.merge == "cnn":
            self.merge = CNNMerge(k, cfg.r, d_out, cfg.k_conv, cfg.channels, cfg.merge_hidden, cfg.dropout)
        elif cfg.merge == "mlp":
            self.merge = MLPMerge(k, cfg.r, d_out)
        else:
            self.merge = None

    def forward(self, x: torch.Tensor, emb: dict[str, torch.Tensor], sims: torch.Tensor | None) -> torch.Tensor:
        h = self.local(x)  # (B, c_P)
        if not self.parties:
            return self.agg(h)
        b, k = sims.shape
        parts = [h.unsqueeze(1).expand(b, k, h.shape[1])] + [emb[p] for p in self.parties]
        pairs = self.agg(torch.cat(parts, dim=-1))  # (B, K, r)
        if self.squash_pairs:
            pairs = torch.sigmoid(pairs)
        if self.cfg.sort_gate:
            sims, pairs = sort_by_similarity(sims, pairs)
        weights = self.weight_gate(sims) if self.weight_gate is not None else sims  # (B, K)
        if self.merge is None:
            return weighted_average(pairs, weights)
        return self.merge(pairs * weights.unsqueeze(-1))
