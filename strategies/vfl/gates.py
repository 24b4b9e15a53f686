"""FedSim's gates: small modules composed by :class:`strategies.vfl.model.SimilarityModel`.

Shapes: B primary records, K neighbours, r outputs per (record, neighbour) pair.
"""

from __future__ import annotations

import functools

import torch
from torch import nn


def mlp(d_in: int, hidden: tuple[int, ...], d_out: int) -> nn.Sequential:
    """Linear layers with ReLU between them and no activation on the output."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(d_in, h), nn.ReLU()]
        d_in = h
    layers.append(nn.Linear(d_in, d_out))
    return nn.Sequential(*layers)


def factored_first_layer(
    first: nn.Linear,
    cuts: dict[str, int],
    h: torch.Tensor,
    emb: dict[str, torch.Tensor],
    index: dict[str, torch.Tensor],
) -> torch.Tensor:
    """The first linear layer of a pair model on every (record, neighbour) pair's concatenated
    cut layers, (B, K, h1). It is linear in the concatenation, W [h; e] = W_P h + W_S e, so each
    block is multiplied once per distinct record and broadcast over the K pairs instead of being
    copied K times. cuts: "primary" first, then the parties; h (B, c_P); emb[p] (U_p, c);
    index[p] (B, K) into emb[p]."""
    w = torch.split(first.weight, list(cuts.values()), dim=1)  # one (h1, c) block per party
    z = (h @ w[0].T + first.bias).unsqueeze(1)  # (B, 1, h1)
    for p, w_p in zip([p for p in cuts if p != "primary"], w[1:]):
        z = z + gather_rows(emb[p] @ w_p.T, index[p])  # (U, h1) gathered to (B, K, h1)
    return z


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table[index] for a (U, h) table and a (B, K) index -> (B, K, h), through index_select: its
    backward is an index_add over the rows, not advanced indexing's sorting accumulate under
    deterministic algorithms (about 3x faster at hdb's shape on a CPU; the same sums)."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, table.shape[-1])


class SeededDropout(nn.Module):
    """Dropout drawing its masks from its own generator, so runs repeat without global RNG."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.generator is None or self.generator.device != x.device:
            raise RuntimeError("SeededDropout needs seed_dropout(model, seed) before training")
        keep = torch.rand(x.shape, generator=self.generator, device=x.device) >= self.p
        return x * keep / (1.0 - self.p)


def concrete_device(device: torch.device | str) -> torch.device:
    """'cuda' -> 'cuda:N' (the current device): tensors report an index, and a generator made for
    'cuda' would not compare equal to their device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def seed_dropout(model: nn.Module, seed: int, device: torch.device) -> None:
    device = concrete_device(device)
    for i, m in enumerate(m for m in model.modules() if isinstance(m, SeededDropout)):
        m.generator = torch.Generator(device=device).manual_seed(seed * 1000 + i)


class WeightGate(nn.Module):
    """Similarity -> weight: MLP 1 -> 10 -> 1 with a sigmoid, applied to each similarity."""

    def __init__(self, hidden: int = 10) -> None:
        super().__init__()
        self.net = mlp(1, (hidden,), 1)

    def forward(self, sims: torch.Tensor) -> torch.Tensor:  # (B, K) -> (B, K)
        return torch.sigmoid(self.net(sims.unsqueeze(-1))).squeeze(-1) + 1e-7


def sort_by_similarity(sims: torch.Tensor, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort gate: order the K pairs of each record by similarity, most similar first."""
    order = torch.argsort(sims, dim=1, descending=True, stable=True)  # (B, K)
    return sims.gather(1, order), pairs.gather(1, order.unsqueeze(-1).expand_as(pairs))


class CNNMerge(nn.Module):
    """Merge gate: Conv2d(1 -> C, k_conv x 1, full padding) over the K axis, then an MLP head.

    The convolution runs as one matmul with its banded matrix (:func:`banded`): with one input
    channel and a kernel along K it is linear in each (K,) column, and a matmul's backward is
    cheaper on a CPU than mkldnn's convolution backward. The parameters stay the Conv2d's
    (checkpoints unchanged); tests/test_model.py holds the two equal."""

    def __init__(self, k: int, r: int, d_out: int, k_conv: int, channels: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, channels, kernel_size=(k_conv, 1), padding=(k_conv - 1, 0))
        self.head = nn.Sequential(
            SeededDropout(dropout),
            nn.Linear(channels * (k + k_conv - 1) * r, hidden),
            nn.ReLU(),
            SeededDropout(dropout),
            nn.Linear(hidden, d_out),
        )

    def forward(self, weighted: torch.Tensor) -> torch.Tensor:  # (B, K, r) -> (B, d_out)
        b, k, r = weighted.shape
        conv = (banded(self.conv.weight, k) @ weighted).view(
            b, self.conv.out_channels, -1, r
        )  # (B, C, K + k_conv - 1, r)
        h = torch.relu(conv + self.conv.bias.view(1, -1, 1, 1))
        return self.head(h.flatten(1))


def banded(weight: torch.Tensor, k: int) -> torch.Tensor:
    """A (C, 1, k_conv, 1) kernel, full padding along K, as the convolution's matrix
    (C (K + k_conv - 1), K): output row i of a channel takes input k through tap k - i + k_conv - 1."""
    c, taps = weight.shape[0], weight.shape[2]
    tap, inside = _taps(k, taps, weight.device)
    band = torch.where(inside, weight.view(c, taps)[:, tap], 0.0)  # (C, K + k_conv - 1, K)
    return band.view(-1, k)


@functools.lru_cache(maxsize=16)
def _taps(k: int, taps: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The band's (K + k_conv - 1, K) tap per entry (clamped into the kernel) and whether it is inside."""
    i = torch.arange(k + taps - 1, device=device).unsqueeze(1)  # (K + k_conv - 1, 1)
    tap = torch.arange(k, device=device).unsqueeze(0) - i + taps - 1  # (K + k_conv - 1, K)
    return tap.clamp(0, taps - 1), (tap >= 0) & (tap < taps)


class MLPMerge(nn.Module):
    """Ablation "FedSim with MLP merge": flatten the K weighted pair outputs into an MLP."""

    def __init__(self, k: int, r: int, d_out: int, hidden: tuple[int, ...] = (1600, 1000, 400)) -> None:
        super().__init__()
        self.net = mlp(k * r, hidden, d_out)

    def forward(self, weighted: torch.Tensor) -> torch.Tensor:  # (B, K, r) -> (B, d_out)
        return self.net(weighted.flatten(1))


def weighted_average(pairs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The reference's use_conv=False merge: weights normalised over K, then a weighted sum."""
    w = weights / weights.sum(dim=1, keepdim=True)  # (B, K)
    return (pairs * w.unsqueeze(-1)).sum(dim=1)  # (B, r)
