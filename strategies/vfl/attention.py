"""Attention over a record's K neighbours plus a null slot: the branch that lets the improved
model (method ``fedsim_attn``) reduce to its special cases.

Shapes: B primary records, K neighbours (sorted, most similar first), h1 the pair model's hidden
width, d_out the head's width.

Each (record, neighbour) pair goes through a pair model, an MLP on [h; e_k] -> d_out: Top1Sim's
and AvgSim's own model. A softmax over K + 1 slots pools the pair outputs; the extra (null) slot
pairs the record with a learned embedding per party instead of a neighbour. Scores read the
neighbour's similarity, its gap to the record's best similarity, its rank, and the pair's hidden
features (does this neighbour fit this record). So the branch can put all weight on rank 1
(Top1Sim), spread it evenly (AvgSim), or keep only neighbours at the top similarity and the null
slot otherwise (Exact: a learned embedding stands for the mean-imputed row).
"""

from __future__ import annotations

import torch
from torch import nn

from strategies.vfl.gates import factored_first_layer, mlp
from strategies.vfl.party_keys import party_key

# The rank biases enter the scores times RATE: Adam moves a parameter about lr per step, so their
# logits move RATE x lr. With RATE 1 at lr 1e-3, rank 1 held 13% of the weight after 5 game epochs.
RATE = 20.0
# The attention starts at Top1Sim (a logit of TOP1_START on rank 1: 98% of the weight among 50
# neighbours) and learns to spread where other neighbours help. Chosen on validation (game, 6,000
# rows, 5 epochs, seed 0; docs/fedsim-attn.md): val accuracy 0.797 from uniform scores,
# 0.822 from Top1Sim.
TOP1_START = 8.0


class NeighbourAttention(nn.Module):
    """The branch for one path's parties (one party, or a chain sharing similarities)."""

    def __init__(
        self,
        cuts: dict[str, int],
        k: int,
        hidden: tuple[int, ...],
        d_out: int,
        score_hidden: int = 16,
        silent: bool = False,
    ) -> None:
        """``silent``: the pair model's last layer starts at zero, so the branch adds nothing at
        first and the model starts as the paper's FedSim (the other parameters drawn as ever)."""
        super().__init__()
        if not hidden:
            raise ValueError("neighbour attention needs a pair model with a hidden layer (agg_hidden)")
        self.cuts = cuts  # "primary" first, then the path's parties
        self.parties = [p for p in cuts if p != "primary"]
        self.pair = mlp(sum(cuts.values()), hidden, d_out)  # [h; e_k] -> d_out
        self.null = nn.ParameterDict({party_key(p): nn.Parameter(torch.zeros(cuts[p])) for p in self.parties})
        self.score_sim = mlp(2, (score_hidden,), 1)  # [s_k, s_1 - s_k] -> score
        start = torch.zeros(k + 1)
        start[0] = TOP1_START / RATE
        self.score_rank = nn.Parameter(start)  # a bias per rank (times RATE); the last is the null slot's
        self.score_pair = nn.Linear(hidden[-1], 1, bias=False)  # the pair's last hidden layer -> score
        if silent:
            nn.init.zeros_(self.pair[-1].weight)
            nn.init.zeros_(self.pair[-1].bias)

    def forward(
        self, h: torch.Tensor, emb: dict[str, torch.Tensor], index: dict[str, torch.Tensor], sims: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h (B, c_P); emb[p] (U_p, c); index[p] (B, K) sorted most similar first; sims (B, K)
        sorted likewise. Returns the pooled output (B, d_out) and the weights (B, K + 1)."""
        hidden = self._hidden(h, emb, index)  # (B, K + 1, h1)
        out = self.pair[-1](hidden)  # (B, K + 1, d_out)
        feats = torch.stack([sims, sims[:, :1] - sims], dim=-1)  # (B, K, 2)
        by_sim = nn.functional.pad(self.score_sim(feats).squeeze(-1), (0, 1))  # (B, K + 1), 0 for the null slot
        scores = self.score_pair(hidden).squeeze(-1) + RATE * self.score_rank + by_sim  # (B, K + 1)
        weights = torch.softmax(scores, dim=1)  # (B, K + 1)
        return (out * weights.unsqueeze(-1)).sum(dim=1), weights

    def _hidden(self, h: torch.Tensor, emb: dict[str, torch.Tensor], index: dict[str, torch.Tensor]) -> torch.Tensor:
        """The pair model up to its last hidden layer for the K pairs and the null slot, (B, K + 1, h1):
        each party's learned null embedding is one more row of its table, which every record's
        extra slot points at."""
        emb = {p: torch.cat([emb[p], self.null[party_key(p)].unsqueeze(0)]) for p in self.parties}  # (U_p + 1, c)
        index = {p: nn.functional.pad(index[p], (0, 1), value=len(emb[p]) - 1) for p in self.parties}  # (B, K + 1)
        return self.pair[1:-1](factored_first_layer(self.pair[0], self.cuts, h, emb, index))


def sort_index(sims: torch.Tensor, index: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Order each record's K neighbours by similarity, most similar first (stable on ties)."""
    order = torch.argsort(sims, dim=1, descending=True, stable=True)  # (B, K)
    return sims.gather(1, order), {p: i.gather(1, order) for p, i in index.items()}
