"""What a secondary could learn from the gradient blocks it receives, measured during training.

The primary sends every block, so it can score the secondaries' label attacks on its own side
(strategies/vfl/exchange_attacks.py) with the truth it holds, in any engine. :class:`ExchangeObserver`
sees each step's blocks as sent (after any defence) and the embeddings as received, and keeps per
secondary record the running mean of its standardised gradient norm and principal-direction
projection (classes: the sum of its unit gradient rows, for the cosine attack by centroids), the
last embedding of each record (for model completion), and a sample of single
observations with the number of the batch's links that mixed into them. Everything stays on the
step's device (no host sync per step); :meth:`ExchangeObserver.report` reads it once.
"""

from __future__ import annotations

import numpy as np
import torch

from strategies.torch_threads import torch_threads
from strategies.vfl import exchange_attacks as attacks

SAMPLE = 64  # single observations kept per step and secondary (the per-links scores)
MAX_EMBEDDINGS = 20_000_000  # floats of last embeddings kept per secondary (model completion)
MAX_SAMPLED_STEPS = 4096  # sampled steps kept per secondary (then thinned by half: 64 x 4096 x 4 float64, 8 MB)
LINK_BINS = ((1, 1), (2, 3), (4, 15), (16, 1 << 30))  # links per observation, as reported


def direction(grad: torch.Tensor, ref: torch.Tensor | None, iters: int = 4) -> torch.Tensor:
    """The top right-singular vector (c,) of ``grad`` (U, c) by power iteration from ``ref`` (the
    previous step's direction; the largest row at the first step), signed to agree with ``ref``:
    the direction keeps its meaning from step to step."""
    v = ref if ref is not None else grad[(grad * grad).sum(1).argmax()]
    v = v / v.norm().clamp_min(1e-30)
    for _ in range(iters):
        w = grad.T @ (grad @ v)
        v = w / w.norm().clamp_min(1e-30)
    return v if ref is None else torch.where(v @ ref < 0, -v, v)  # on the device: no host read


def _z(x: torch.Tensor) -> torch.Tensor:
    sd = x.std(unbiased=False) if len(x) > 1 else x.new_zeros(())
    return torch.where(sd > 0, (x - x.mean()) / sd.clamp_min(1e-30), torch.zeros_like(x))


class ExchangeObserver:
    def __init__(self, task: str, n_tokens: dict[str, int], cut_dim: int, device: torch.device, seed: int) -> None:
        self.task = task
        f64 = dict(device=device, dtype=torch.float64)
        self.norm = {p: torch.zeros(n, **f64) for p, n in n_tokens.items()}  # (n,) sums of z-scored norms
        self.proj = {p: torch.zeros(n, **f64) for p, n in n_tokens.items()}  # (n,) sums of z-scored projections
        self.count = {p: torch.zeros(n, **f64) for p, n in n_tokens.items()}  # (n,) observations
        self.emb = {
            p: torch.zeros(n, cut_dim, device=device) if n * cut_dim <= MAX_EMBEDDINGS else None
            for p, n in n_tokens.items()
        }
        self.dirs = {  # (n, c) sums of unit gradient rows (classes only)
            p: torch.zeros(n, cut_dim, **f64) if task == "multiclass" and n * cut_dim <= MAX_EMBEDDINGS else None
            for p, n in n_tokens.items()
        }
        self.ref: dict[str, torch.Tensor | None] = {p: None for p in n_tokens}
        self.samples: dict[str, list[torch.Tensor]] = {p: [] for p in n_tokens}  # each (S, 4)
        self.steps, self.stride = 0, 1  # steps observed; one in ``stride`` is sampled
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)  # which observations are sampled: a measurement's choice, protects nothing

    @torch.no_grad()
    def observe(self, index: dict[str, torch.Tensor], target: torch.Tensor, emb: dict, blocks: dict) -> None:
        """One step: ``index[p]`` (B, K) each pair's row in the block, ``target`` (B,) the head's
        target, ``emb[p]`` (U, c) the embeddings received, ``blocks[p]`` the GradBlock sent."""
        with torch_threads(1):  # a small block a step: threads only wait at barriers (strategies/torch_threads.py)
            self._observe(index, target, emb, blocks)

    def _observe(self, index: dict[str, torch.Tensor], target: torch.Tensor, emb: dict, blocks: dict) -> None:
        for p, block in blocks.items():
            g = torch.as_tensor(block.grad, device=self.norm[p].device, dtype=torch.float64)  # (U, c)
            t = torch.as_tensor(block.tokens, device=g.device)  # (U,)
            self.ref[p] = direction(g, self.ref[p])
            norms = g.norm(dim=1)  # (U,)
            zn, zp = _z(norms), _z(g @ self.ref[p])  # (U,), (U,)
            self.norm[p].index_add_(0, t, zn)
            self.proj[p].index_add_(0, t, zp)
            self.count[p].index_add_(0, t, torch.ones_like(zn))
            if self.dirs[p] is not None:
                self.dirs[p].index_add_(0, t, g / norms.clamp_min(1e-30).unsqueeze(1))
            if self.emb[p] is not None:
                self.emb[p][t] = torch.as_tensor(emb[p], device=g.device, dtype=self.emb[p].dtype)
            if self.steps % self.stride == 0:
                self._sample(p, index[p], target, zn, zp)
        self.steps += 1
        if len(next(iter(self.samples.values()), [])) >= MAX_SAMPLED_STEPS:  # bounded memory: every
            self.samples = {p: s[::2] for p, s in self.samples.items()}  # other sampled step is dropped
            self.stride *= 2  # and later steps sampled half as often: spread over the whole run

    def _sample(self, p: str, index: torch.Tensor, target: torch.Tensor, zn: torch.Tensor, zp: torch.Tensor) -> None:
        """A random :data:`SAMPLE` of this step's observations: (links, mixed label, z-norm, z-projection)."""
        flat = index.reshape(-1)  # (B * K,)
        weights = target.to(torch.float64).reshape(-1).repeat_interleave(index.shape[1])  # (B * K,)
        links = zn.new_zeros(len(zn)).index_add_(0, flat, torch.ones_like(weights))  # (U,); bincount reads
        mixed = zn.new_zeros(len(zn)).index_add_(0, flat, weights)  # its size back to the host, this does not
        pick = torch.randperm(len(zn), generator=self.gen, device=zn.device)[:SAMPLE]
        self.samples[p].append(torch.stack([links[pick], mixed[pick] / links[pick], zn[pick], zp[pick]], 1))

    def report(self, tokens: dict[str, np.ndarray], labels: np.ndarray, n_classes: int, seed: int) -> dict:
        """Per secondary the attacks' success on its records: ``tokens[p]`` (m, K) the training primary
        records' links, ``labels`` (m,) their targets as the head trains on them."""
        return {p: self._party(p, tokens[p], labels, n_classes, seed) for p in self.norm}

    def _party(self, p: str, tokens: np.ndarray, labels: np.ndarray, n_classes: int, seed: int) -> dict:
        task, count = self.task, self.count[p].cpu().numpy()
        truth = np.where(count > 0, attacks.record_truth(tokens, labels, len(count), task), np.nan)
        known = attacks.known_rows(truth, task, np.random.default_rng(seed), n_classes)
        rest = np.setdiff1d(np.flatnonzero(~np.isnan(truth)), known)
        out = {
            "records_scored": int(len(rest)),
            "known_labels": int(len(known)),
            "observations": int(count.sum()),
            "chance": attacks.chance(truth[rest], task),
        }
        if task != "multiclass":
            seen = np.maximum(count, 1)
            for name, sums in (("norm", self.norm[p]), ("direction", self.proj[p])):
                scores = sums.cpu().numpy() / seen
                sign = attacks.orientation(scores, truth, known, task)
                out[name] = _round(attacks.score(sign * scores[rest], truth[rest], task))
            out["direction_by_links"] = self._by_links(p, sign)  # the direction's sign
        elif self.dirs[p] is not None and len(known):
            pred = attacks.class_direction(self.dirs[p].cpu().numpy(), truth, known)
            out["direction"] = _round(attacks.score(pred[rest], truth[rest], task))
        if self.samples[p]:
            out["links_per_observation"] = round(float(torch.cat(self.samples[p])[:, 0].mean()), 3)
        if self.emb[p] is not None:
            out["completion"] = _round(attacks.completion(self.emb[p].cpu().numpy(), truth, known, task))
        return out

    def _by_links(self, p: str, sign: float) -> dict[str, float]:
        """The direction attack on single observations, by how many batch links mixed into each."""
        if not self.samples[p]:
            return {}
        links, mixed, _, zp = torch.cat(self.samples[p]).cpu().numpy().T
        truth = mixed if self.task == "regression" else np.where(mixed > 0.5, 1.0, np.where(mixed < 0.5, 0.0, np.nan))
        out = {}
        for lo, hi in LINK_BINS:
            keep = (links >= lo) & (links <= hi) & ~np.isnan(truth)
            if keep.sum() >= 20:
                name = str(lo) if lo == hi else f"{lo}+" if hi > 1 << 20 else f"{lo}-{hi}"
                out[name] = _round(attacks.score(sign * zp[keep], truth[keep], self.task))
        return out


def _round(x: float) -> float | None:
    return round(float(x), 4) if np.isfinite(x) else None


def leaks(report: dict) -> bool:
    """An attack well above chance (AUC 0.7, Spearman 0.3, or 1.5x the majority share)."""
    for r in (report.get("attacks") or {}).values():
        best = [r.get(k) for k in ("norm", "direction", "completion") if r.get(k) is not None]
        if best and max(best) >= (0.7 if r["chance"] == 0.5 else 0.3 if r["chance"] == 0 else 1.5 * r["chance"]):
            return True
    return any(r["ratio"] < 0.5 for r in (report.get("inversion") or {}).values())  # half the error or less


def report_lines(report: dict) -> list[str]:
    """The report as `fedsim report` and the run's log say it."""
    d = report["defences"]
    on = [f"{k}={v}" for k, v in d.items() if v and k != "grad_epsilon" and d.get(k) != "off"]
    eps = d.get("grad_epsilon")
    out = [
        "exchange privacy: defences "
        + (", ".join(on) if on else "none (privacy off)")
        + (
            f"; gradient noise epsilon {eps['epsilon']} at delta {eps['delta']:.1e} (per secondary, DP-SGD "
            "accounting of the sent blocks, not end to end: docs/privacy.md)"
            if eps
            else ""
        )
    ]
    for p, r in (report.get("attacks") or {}).items():
        metric = {0.5: "AUC", 0.0: "Spearman"}.get(r["chance"], "accuracy")
        scores = ", ".join(f"{k} {r[k]}" for k in ("norm", "direction", "completion") if r.get(k) is not None)
        out.append(
            f"exchange privacy: {p}'s label attacks ({metric}; chance {r['chance']:.3g}; {r['known_labels']} "
            f"known labels; {r['records_scored']} records scored): {scores or 'none scored'}"
        )
    for p, r in (report.get("inversion") or {}).items():
        out.append(
            f"exchange privacy: the primary's inversion of {p}'s features from its embeddings: error "
            f"{r['ratio']:.3g} x predicting the mean ({r['auxiliary_records']} records' features known; 1 = nothing learnt)"
        )
    return out
