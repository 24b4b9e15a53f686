"""What a party sends in training, defended at its privacy level (``privacy`` / ``exchange-privacy``:
off / standard / strict, linkage/protection.py), without a calibration run first; shared by
FedSim (strategies/vfl/) and Entity Augmentation (strategies/entity_aug/).

- The primary's gradients: each record's share clipped at :class:`AutoClip` (the median
  per-record norm it clipped at its previous step) plus Gaussian noise :data:`GRAD_NOISE` x the
  clip (strategies/vfl/defences.py ``defended_block``; :func:`defended_rows` for one row per record).
- A secondary's embeddings: :class:`RowShield` (a calibrated clip and each record's own fixed
  noise of about :data:`EMBED_NOISE` x the clip).

Every draw comes from a secret of the party that draws it (:func:`party_secret`);
``$FEDSIM_PARTY_SEED`` (a party's own environment, never the run config) makes a party's draws
reproducible for tests and twin oracles: a guessable seed lets the others undo the noise.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass

import torch

GRAD_NOISE = {"off": 0.0, "standard": 4.0, "strict": 8.0}  # a level's gradient noise, in units of the clip
# a level's embedding noise: its norm per row / the clip. 2.5 clips at standard: the primary's
# inversion of frog's and game's features erred by 0.40-0.51 of the mean's error with one, under
# the 0.5 docs/privacy.md sets; with two, 0.63-0.80 under each set's hand-chosen recipe, but frog's
# reference-code recipe (the default since) 0.47-0.59 (mean 0.53, 24 runs); with 2.5, 0.61-0.67
# (tests/test_exchange_defaults.py; the attack decided it, not a test metric)
EMBED_NOISE = {"off": 0.0, "standard": 2.5, "strict": 4.0}
# Entity Augmentation's activations: a row is its party's whole representation of a record (no K
# neighbours averaging the noise); the standard level's shield cost 12 points of validation
# accuracy on digits (docs/privacy.md), so it is strict's only
EA_EMBED_NOISE = {"off": 0.0, "standard": 0.0, "strict": 2.0}
PARTY_SEED_ENV = "FEDSIM_PARTY_SEED"


def party_secret(purpose: str) -> int:
    """A 63-bit secret of this party for ``purpose``: from the OS's CSPRNG, or, where the
    party's own environment sets ``$FEDSIM_PARTY_SEED``, from that seed and ``purpose`` (two
    purposes never share a stream)."""
    raw = os.environ.get(PARTY_SEED_ENV, "").strip()
    if not raw:
        return secrets.randbits(63)
    return int.from_bytes(hashlib.sha256(f"{raw}/{purpose}".encode()).digest()[:8], "little") >> 1


def seed_environment(party: str) -> dict[str, str]:
    """The environment a launcher gives a party's processes: where its own environment sets
    ``$FEDSIM_PARTY_SEED`` (tests, the lab), a seed of that party's own derived from it (two
    parties never share one); else nothing (each party's secrets from the OS)."""
    raw = os.environ.get(PARTY_SEED_ENV, "").strip()
    return {PARTY_SEED_ENV: f"{raw}/{party}"} if raw else {}


def secret_generator(device: torch.device, purpose: str = "") -> torch.Generator:
    """A torch generator on ``device`` seeded with :func:`party_secret` of ``purpose``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(party_secret(purpose))
    return gen


@dataclass
class AutoClip:
    """A clip calibrated within the run, without an undefended run first: the median L2 norm of
    the rows the party clipped at its previous step (at its first step, its own). The clip
    depends on earlier steps' data, so an accountant's epsilon over it is approximate
    (docs/privacy.md). ``last`` stays on the device: no host sync per step."""

    last: torch.Tensor | None = None

    def take(self, norms: torch.Tensor) -> torch.Tensor:
        """The clip for rows of ``norms`` (R,): the previous step's median; this step's is kept."""
        median = norms.detach().median()
        clip = median if self.last is None else self.last
        self.last = median
        return clip

    @property
    def value(self) -> float:
        """The clip the next step will use (0 before any step)."""
        return float(self.last) if self.last is not None else 0.0


class RowShield:
    """A secondary's level defence of the embeddings it sends (its features, against the
    primary's inversion): each row clipped to a clip calibrated in the run, the median norm of
    the party's embeddings of all its records (at its first send, then after every
    :data:`RECALIBRATE` training steps), plus its record's own noise, N(0, (noise * clip)^2 / c)
    per entry (a row's noise norm ~ noise x the clip). The noise is fixed per record, drawn
    once from the party's secret ``seed``: sending a record again never gives a fresh draw to
    average, and a prediction sees what the evaluation saw. :meth:`state` is what the party
    keeps to rebuild it (checkpoint, kept model, message state). The one-process twin
    (strategies/vfl/twin.py) calibrates at the same steps, so it sees the same values."""

    RECALIBRATE = 50

    def __init__(self, noise: float, n_rows: int, like: torch.Tensor, seed: int) -> None:
        self.noise, self.seed, self.n_rows, self.like = noise, seed, n_rows, like  # like: (0, c) device, dtype
        self._mask: torch.Tensor | None = None  # (n, c) drawn at the first send (a message's state rebuilds it)
        self.clip: torch.Tensor | None = None  # None until :meth:`calibrate`

    @property
    def mask(self) -> torch.Tensor:
        """(n, c) each record's noise direction, N(0, 1 / c) per entry, from the party's secret."""
        if self._mask is None:
            width, like = self.like.shape[1], self.like
            gen = torch.Generator(device=like.device).manual_seed(self.seed)
            self._mask = torch.randn(self.n_rows, width, generator=gen, device=like.device, dtype=like.dtype)
            self._mask /= width**0.5
        return self._mask

    @torch.no_grad()
    def calibrate(self, every) -> None:
        """The clip from ``every()``, (n, c) embeddings of all the party's records: their median norm."""
        self.clip = every().norm(dim=1).median()

    def ready(self, every) -> "RowShield":
        """This shield with a clip: calibrated on ``every()`` at the first need."""
        if self.clip is None:
            self.calibrate(every)
        return self

    def stepped(self, applied: int, every) -> None:
        """After the party's ``applied``-th training step: recalibrated every :data:`RECALIBRATE`."""
        if applied % self.RECALIBRATE == 0:
            self.calibrate(every)

    def send(self, out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """(R, c) embeddings of rows ``rows`` (R,) as sent: clipped and given their noise."""
        return self.clipped(out) + self.mask[rows] * (self.noise * self.clip)

    def clipped(self, out: torch.Tensor) -> torch.Tensor:
        """(R, c) rows clipped to the clip (differentiable: a backward's fresh forward)."""
        return out * (self.clip / out.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)[:, None]

    def state(self) -> dict:
        """Plain numbers (a message state's ConfigRecord, a kept file): clip -1 before calibration."""
        return {"noise": self.noise, "seed": self.seed, "clip": -1.0 if self.clip is None else float(self.clip)}

    @classmethod
    def from_state(cls, state: dict, n_rows: int, like: torch.Tensor) -> "RowShield":
        shield = cls(float(state["noise"]), n_rows, like, int(state["seed"]))
        clip = float(state["clip"])
        shield.clip = None if clip < 0 else torch.tensor(clip, device=like.device, dtype=like.dtype)
        return shield


def gaussian(shape, std: float, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """N(0, std^2) of ``shape`` in ``like``'s device and dtype, drawn from ``gen``."""
    return torch.randn(shape, generator=gen, device=like.device, dtype=like.dtype) * std


def with_shield(model_state: dict, shield: RowShield | None) -> dict[str, torch.Tensor]:
    """A party's kept state: its model's ``model_state`` and its shield's (seed and clip as
    tensors, under "shield."), so a prediction sends what the evaluation sent."""
    if shield is None:
        return dict(model_state)
    state = shield.state()
    return {
        **model_state,
        "shield.noise": torch.tensor(state["noise"], dtype=torch.float64),
        "shield.seed": torch.tensor(state["seed"], dtype=torch.int64),  # 63 bits: exact
        "shield.clip": torch.tensor(state["clip"], dtype=torch.float64),
    }


def split_shield(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """:func:`with_shield`'s inverse: (the model's state, the shield's numbers; {} without one)."""
    shield = {k.removeprefix("shield."): v.item() for k, v in state.items() if k.startswith("shield.")}
    return {k: v for k, v in state.items() if not k.startswith("shield.")}, shield


def reloaded(shield: RowShield | None, state: dict) -> RowShield | None:
    """``shield`` as ``state`` (:meth:`RowShield.state`: a message state, a kept state) left it;
    as it is without either."""
    return RowShield.from_state(state, shield.n_rows, shield.like) if shield is not None and state else shield


class Shielded:
    """A secondary's kept state with its shield, in both modes: its ``model`` and its
    ``row_shield`` (a RowShield, or None) as one state dict (:func:`with_shield`), and back."""

    model: torch.nn.Module
    row_shield: RowShield | None

    def shield_state(self) -> dict:
        return self.row_shield.state() if self.row_shield is not None else {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Its model's state and its shield's (what it keeps: a prediction sends what evaluation sent)."""
        return with_shield(self.model.state_dict(), self.row_shield)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """:meth:`state_dict`'s inverse (a state without a shield: the model's alone)."""
        model, shield = split_shield(state)
        self.model.load_state_dict(model)
        self.load_shield_state(shield)

    def load_shield_state(self, state: dict) -> None:
        self.row_shield = reloaded(self.row_shield, state)


def level_shield(
    level: str, explicit: bool, n_rows: int, like: torch.Tensor, party: str, noise_of: dict = EMBED_NOISE
) -> RowShield | None:
    """Secondary ``party``'s embedding defence at privacy ``level`` (None where ``noise_of`` the
    level is 0 or where it set an ``explicit`` embedding clip), its noise from the party's secret;
    ``like`` (0, c) gives the embeddings' width, device and dtype."""
    noise = noise_of[level]
    if explicit or noise == 0:
        return None
    return RowShield(noise, n_rows, like, party_secret(f"embedding-mask/{party}"))


def clip_records(per: torch.Tensor, clip_for) -> tuple[torch.Tensor, torch.Tensor | float]:
    """(B, ...) one tensor per record, each clipped to L2 norm ``clip_for(norms)`` (norms (B,));
    returns the clipped tensors and the clip."""
    norms = per.flatten(1).norm(dim=1)  # (B,)
    clip = clip_for(norms)
    scale = (clip / norms.clamp_min(1e-12)).clamp(max=1.0)  # (B,)
    return per * scale.view(-1, *([1] * (per.dim() - 1))), clip


def defended_rows(grad: torch.Tensor, clip: AutoClip, noise: float, gen: torch.Generator) -> torch.Tensor:
    """(B, c) the gradient of a batch-mean loss w.r.t. one row per record, as sent: each row
    times B (its own loss's scale) clipped at ``clip``, N(0, (noise x clip)^2) added per entry,
    divided by B again."""
    b = len(grad)
    per, value = clip_records(grad * b, clip.take)
    return (per + gaussian(per.shape, 1.0, per, gen) * (noise * value)) / b
