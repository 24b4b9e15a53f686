"""The primary party's model: its local MLP, the aggregation MLP over (record, neighbour)
pairs, and the weight / sort / merge gates, switched by :class:`ModelConfig`."""

from __future__ import annotations

import torch
from torch import nn

from strategies.vfl.attention import NeighbourAttention, sort_index
from strategies.vfl.gates import (
    CNNMerge,
    MLPMerge,
    WeightGate,
    factored_first_layer,
    mlp,
    sort_by_similarity,
    weighted_average,
)
from strategies.vfl.model_config import ModelConfig
from strategies.vfl.party_keys import party_key


def local_model(d_in: int, cfg: ModelConfig) -> nn.Sequential:
    """A party's local model: d_in -> hidden -> cut_dim, no activation at the cut layer."""
    return mlp(d_in, cfg.local_hidden, cfg.cut_dim)


class PairPath(nn.Module):
    """Aggregation MLP over (record, neighbour) pairs, then the gates, for the parties whose
    k-th neighbours share one similarity (one party, or a chain of them; paper App. C).

    Its output is (B, d_out), before the head's activation."""

    def __init__(self, cuts: dict[str, int], k: int, d_out: int, cfg: ModelConfig, squash_pairs: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.cuts = cuts  # "primary" first, then the path's parties
        self.parties = [p for p in cuts if p != "primary"]
        r = d_out if cfg.merge == "avg" else cfg.r  # averaging merges the pairs' outputs themselves
        self.agg = mlp(sum(cuts.values()), cfg.agg_hidden, r)
        # sigmoid on pair outputs for binary/regression before a learned merge, as the reference;
        # the weighted average merges raw outputs, so the model's output stays pre-activation
        self.squash_pairs = squash_pairs and cfg.merge != "avg"
        self.weight_gate = WeightGate() if cfg.weight_gate and not cfg.uniform_weights else None
        # FeatureSim: a column of the aggregation's first layer for the similarity
        self.sim_weight = nn.Parameter(torch.zeros(self.agg[0].out_features)) if cfg.sim_feature else None
        if cfg.merge == "cnn":
            self.merge = CNNMerge(k, r, d_out, cfg.k_conv, cfg.channels, cfg.merge_hidden, cfg.dropout)
        elif cfg.merge == "mlp":
            self.merge = MLPMerge(k, r, d_out)
        else:
            self.merge = None
        # fedsim_attn: the paper's path plus attention pooling (strategies/vfl/attention.py); a
        # zero last layer in either branch leaves the other, so it contains FedSim and Top1Sim
        self.attention = (
            NeighbourAttention(cuts, k, cfg.agg_hidden, d_out, silent=cfg.attention_start == "silent")
            if cfg.attention
            else None
        )

    def forward(
        self, h: torch.Tensor, emb: dict[str, torch.Tensor], index: dict[str, torch.Tensor], sims: torch.Tensor
    ) -> torch.Tensor:
        """h (B, c_P); emb[p] (U_p, c); index[p] (B, K) into emb[p]; sims (B, K) -> (B, d_out)."""
        out = self.paper_path(h, emb, index, sims)  # (B, d_out)
        if self.attention is None:
            return out
        return out + self.attend(h, emb, index, sims)[0]

    def attend(
        self, h: torch.Tensor, emb: dict[str, torch.Tensor], index: dict[str, torch.Tensor], sims: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention branch on the neighbours sorted by similarity: its output (B, d_out) and
        its weights (B, K + 1) on the sorted neighbours and the null slot (last)."""
        sims, index = sort_index(sims, index)
        return self.attention(h, emb, index, sims)

    def attention_weights(
        self, h: torch.Tensor, emb: dict[str, torch.Tensor], index: dict[str, torch.Tensor], sims: torch.Tensor
    ) -> torch.Tensor:
        """(B, K + 1): the attention's weight on each neighbour in the order given (the linkage's),
        and on the null slot (last); each row sums to 1."""
        order = torch.argsort(sims, dim=1, descending=True, stable=True)  # (B, K), as sort_index
        w = self.attend(h, emb, index, sims)[1]  # (B, K + 1), sorted
        return torch.cat([torch.zeros_like(sims).scatter(1, order, w[:, :-1]), w[:, -1:]], dim=1)

    def paper_path(
        self, h: torch.Tensor, emb: dict[str, torch.Tensor], index: dict[str, torch.Tensor], sims: torch.Tensor
    ) -> torch.Tensor:
        """The paper's FedSim (and its baselines' switches): pairs, weight / sort / merge gates."""
        pairs = self.aggregate(h, emb, index, sims)  # (B, K, r)
        if self.squash_pairs:
            pairs = torch.sigmoid(pairs)
        if self.cfg.sort_gate:
            sims, pairs = sort_by_similarity(sims, pairs)
        weights = self.weights(sims)  # (B, K)
        if self.merge is None:
            return weighted_average(pairs, weights)
        return self.merge(pairs * weights.unsqueeze(-1))

    def weights(self, sims: torch.Tensor) -> torch.Tensor:
        """(B, K) similarities -> the (B, K) weights the pairs get: the weight gate's, the raw
        similarities without it, or ones (the averaging baselines)."""
        if self.cfg.uniform_weights:
            return torch.ones_like(sims)
        return self.weight_gate(sims) if self.weight_gate is not None else sims

    def aggregate(
        self,
        h: torch.Tensor,
        emb: dict[str, torch.Tensor],
        index: dict[str, torch.Tensor],
        sims: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The aggregation MLP on every (record, neighbour) pair's concatenated cut layers, its
        first layer factored per party (gates.factored_first_layer): the same function, far
        fewer FLOPs."""
        z = factored_first_layer(self.agg[0], self.cuts, h, emb, index)  # (B, K, h1)
        if self.sim_weight is not None:
            z = z + sims.unsqueeze(-1) * self.sim_weight  # (B, K, h1)
        return self.agg[1:](z)  # (B, K, r)


class SimilarityModel(nn.Module):
    """FedSim's primary-side model.

    The primary's local model runs once per record and is broadcast over its K pairs; a
    secondary's embedding enters once per distinct record.
    With no secondary party (Solo) it is local MLP -> aggregation MLP -> output. Parties that
    share similarities (one party, or an App. C chain) go through one :class:`PairPath`.
    Independently linked parties each get their own path (own weight / sort / merge gates),
    and a linear layer merges the paths' outputs.
    """

    def __init__(
        self,
        d_primary: int,
        secondary_cuts: dict[str, int],
        k: int,
        d_out: int,
        cfg: ModelConfig,
        squash_pairs: bool,
        shared_sims: bool = True,
    ) -> None:
        super().__init__()
        self.parties = sorted(secondary_cuts)
        self.cuts = dict(secondary_cuts)  # each secondary's embedding width c: what its replies must hold
        self.cfg = cfg
        self.shared_sims = shared_sims or len(self.parties) <= 1
        self.local = local_model(d_primary, cfg)
        if not self.parties:
            self.agg = mlp(cfg.cut_dim, cfg.agg_hidden, d_out)
            return
        if self.shared_sims:
            cuts = {"primary": cfg.cut_dim, **{p: secondary_cuts[p] for p in self.parties}}
            self.paths = nn.ModuleDict({"all": PairPath(cuts, k, d_out, cfg, squash_pairs)})
            return
        self.paths = nn.ModuleDict(
            {
                party_key(p): PairPath({"primary": cfg.cut_dim, p: secondary_cuts[p]}, k, d_out, cfg, squash_pairs)
                for p in self.parties
            }
        )
        self.combine = nn.Linear(len(self.parties) * d_out, d_out)

    def optimizer_groups(self) -> list[dict]:
        """The parameters in the optimiser's groups: the attention branches' at ``cfg.attention_lr``
        of the learning rate (``lr_factor``, strategies/optim.py), the rest at the rate itself; one
        group, in :meth:`parameters` order, when the two are the same."""
        paths = self.paths.values() if self.parties else []
        attention = [q for path in paths if path.attention is not None for q in path.attention.parameters()]
        if not attention or self.cfg.attention_lr == 1.0:
            return [{"params": list(self.parameters())}]
        ids = {id(q) for q in attention}
        rest = [q for q in self.parameters() if id(q) not in ids]
        return [{"params": rest}, {"params": attention, "lr_factor": self.cfg.attention_lr}]

    def forward(
        self,
        x: torch.Tensor,
        emb: dict[str, torch.Tensor],
        index: dict[str, torch.Tensor],
        sims: dict[str, torch.Tensor] | None,
    ) -> torch.Tensor:
        """x (B, d_P); emb[p] (U_p, c) one row per distinct secondary record; index[p] (B, K)
        into emb[p]; sims[p] (B, K) (one shared entry "all" when similarities are shared).
        Returns (B, d_out)."""
        h = self.local(x)  # (B, c_P)
        if not self.parties:
            return self.agg(h)
        if self.shared_sims:
            return self.paths["all"](h, emb, index, sims["all"])
        outs = [
            self.paths[party_key(p)](h, {p: emb[p]}, {p: index[p]}, sims[p]) for p in self.parties
        ]  # P x (B, d_out)
        return self.combine(torch.cat(outs, dim=1))

    def attention_weights(
        self,
        x: torch.Tensor,
        emb: dict[str, torch.Tensor],
        index: dict[str, torch.Tensor],
        sims: dict[str, torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """fedsim_attn, per secondary (B, K + 1): the attention's weight on each of its linked
        records, in the linkage's order, and on its null slot (last). Parties sharing one path
        share its weights."""
        h = self.local(x)  # (B, c_P)
        if self.shared_sims:
            w = self.paths["all"].attention_weights(h, emb, index, sims["all"])
            return {p: w for p in self.parties}
        return {
            p: self.paths[party_key(p)].attention_weights(h, {p: emb[p]}, {p: index[p]}, sims[p]) for p in self.parties
        }
