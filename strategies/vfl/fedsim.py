"""The primary party's strategy: owns its model, optimiser, labels and linkage view, and
turns secondaries' embeddings into a loss, a step, and gradients for each secondary."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from linkage.contracts import PrimaryLinkage
from strategies.heads import TaskHead
from strategies.optim import make_optimizer
from strategies.vfl.model import SimilarityModel


@dataclass(frozen=True)
class GradBlock:
    """The gradient of one step's loss w.r.t. the embeddings of exactly these tokens."""

    tokens: np.ndarray  # (U,) int64
    grad: np.ndarray  # (U, c) float


class FedSimStrategy:
    """Primary-side logic, independent of transport. Secondaries are reached through a
    channel by :mod:`strategies.vfl.protocol`; this class never sees their rows or features."""

    def __init__(
        self,
        model: SimilarityModel,
        head: TaskHead,
        linkage: PrimaryLinkage | None,
        x: np.ndarray,
        y: np.ndarray,
        lr: float,
        weight_decay: float,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.model = model.to(device=device, dtype=dtype)
        self.head = head
        self.linkage = linkage
        self.parties = list(model.parties)
        self.x = torch.as_tensor(x, device=device, dtype=dtype)  # (m, d_P)
        self.y = y
        self.device, self.dtype = device, dtype
        self.optimizer = make_optimizer(self.model.parameters(), lr, weight_decay)
        self.sims: dict[str, np.ndarray] = {}  # (m, K) per path of the model
        if self.parties:
            self.sims = {"all": linkage.sims} if model.shared_sims else {p: linkage.links[p].sims for p in self.parties}

    def needs(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Distinct tokens per party that the records ``rows`` are linked to."""
        return {p: np.unique(self.linkage.tokens[p][rows]) for p in self.parties}

    def _inputs(self, rows: np.ndarray, tokens: dict[str, np.ndarray]):
        """Per party the (B, K) index of each pair into ``tokens[p]`` (sorted distinct tokens),
        and the (B, K) similarities: one shared entry "all", or one per independently linked party."""
        index = {
            p: torch.as_tensor(np.searchsorted(tokens[p], self.linkage.tokens[p][rows]), device=self.device)
            for p in self.parties
        }
        sims = {name: torch.as_tensor(s[rows], device=self.device, dtype=self.dtype) for name, s in self.sims.items()}
        return index, sims

    def train_step(
        self, rows: np.ndarray, tokens: dict[str, np.ndarray], emb: dict[str, np.ndarray]
    ) -> tuple[float, dict[str, GradBlock]]:
        """One step on the batch ``rows``; emb[p] (U, c) are the embeddings of tokens[p]."""
        self.model.train()
        leaves = {
            p: torch.as_tensor(emb[p], device=self.device, dtype=self.dtype).requires_grad_(True) for p in self.parties
        }
        index, sims = self._inputs(rows, tokens)
        out = self.model(self.x[rows], leaves, index, sims)
        loss = self.head.loss(out, self.head.target(self.y[rows], self.device, self.dtype))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        grads = {p: GradBlock(tokens[p], leaves[p].grad.detach().cpu().numpy()) for p in self.parties}
        return float(loss.detach()), grads

    @torch.no_grad()
    def outputs(self, rows: np.ndarray, lookup: dict[str, tuple[np.ndarray, np.ndarray]]) -> torch.Tensor:
        """The model's raw outputs (B, d_out) for ``rows``; lookup[p] = (sorted tokens (T,),
        embeddings (T, c))."""
        self.model.eval()
        return self.model(self.x[rows], *self._looked_up(rows, lookup))

    @torch.no_grad()
    def attention(self, rows: np.ndarray, lookup: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        """fedsim_attn, per secondary (B, K + 1): the attention's weights on the linked records of
        ``rows`` (the linkage's order) and on the null slot (last)."""
        self.model.eval()
        weights = self.model.attention_weights(self.x[rows], *self._looked_up(rows, lookup))
        return {p: w.cpu().numpy() for p, w in weights.items()}

    def attention_by_rank(
        self, rows: np.ndarray, lookup: dict[str, tuple[np.ndarray, np.ndarray]]
    ) -> dict[str, list[float]]:
        """fedsim_attn, per secondary: the mean weight over ``rows`` of the neighbour of each
        similarity rank (1 .. K, most similar first) and of the null slot (last), K + 1 numbers
        summing to 1; {} for the other methods (no attention)."""
        if not self.model.cfg.attention or not len(rows):
            return {}
        out = {}
        for p, w in self.attention(rows, lookup).items():  # (B, K + 1), the linkage's order
            order = np.argsort(-self.sims["all" if "all" in self.sims else p][rows], axis=1, kind="stable")  # (B, K)
            ranked = np.concatenate([np.take_along_axis(w[:, :-1], order, 1), w[:, -1:]], axis=1)  # (B, K + 1)
            out[p] = [round(float(v), 6) for v in ranked.mean(axis=0)]
        return out

    def _looked_up(self, rows: np.ndarray, lookup: dict[str, tuple[np.ndarray, np.ndarray]]):
        """(emb, index, sims) of ``rows`` with each party's embeddings taken from ``lookup``."""
        tokens = self.needs(rows)
        emb = {
            p: torch.as_tensor(
                lookup[p][1][np.searchsorted(lookup[p][0], tokens[p])], device=self.device, dtype=self.dtype
            )
            for p in self.parties
        }
        return (emb, *self._inputs(rows, tokens))

    def predict(self, rows: np.ndarray, lookup: dict[str, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """Predictions for ``rows`` in the label's units (strategies.heads.TaskHead.predict)."""
        return self.head.predict(self.outputs(rows, lookup))
