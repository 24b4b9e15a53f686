"""The run config's linkage and exchange groups (the keys that set what the parties reveal):
top-K and its privacy, how identifiers travel, and the training exchange's defences. The other
groups and the flat-key registry: app/config_groups.py."""

from __future__ import annotations

from dataclasses import dataclass

from app.config_fields import Need, nonnegative, opt
from linkage.protection import DEFAULT_LEVEL, LEVELS

LAYOUTS = ("independent", "chain")
ENCODINGS = ("raw", "bloom")


@dataclass(frozen=True)
class LinkOptions:
    """The linkage: top-K, its privacy (tau and the noise calibration), how identifiers travel."""

    k: int = opt(0, "neighbours per primary record (hdb: 50)")
    tau: float = opt(1.0, "attack-success bound of the noise the primary asks for; 1 = none asked beyond `privacy`")
    privacy: str = opt(
        DEFAULT_LEVEL,
        "off | standard | strict: the linkage floors and the exchange's defences, sized from the data (docs/privacy.md)",
        before="off",
    )
    encoding: str = opt("raw", "raw identifiers | bloom (Bloom / FEDERAL filters, linked by Hamming distance)")
    layout: str = opt(
        "independent", "several secondaries: independent (own sims and gates each) | chain (paper App. C)"
    )
    linkage_dir: str = opt(
        "", 'results fetched from the linkage service (absolute path); "" = link in the ServerApp', may_change=True
    )
    privacy_report: bool = opt(
        True, 'attack this run\'s linkage release and report the success (summary.json "privacy")'
    )
    privacy_radius: float = opt(
        0.0, "tau bounds guessing a distance within this radius (identifier units); 0 = half the secondary's spacing"
    )
    privacy_compose: bool = opt(
        False, "true: noise on a link scaled by sqrt(links of its secondary record) (docs/privacy.md)"
    )

    def check(self, need: Need) -> None:
        nonnegative(need, self, "k")
        need(0.0 < self.tau <= 1.0, f"run-config 'tau' must be in (0, 1], got {self.tau}")
        need(self.layout in LAYOUTS, f"run-config 'layout' must be one of {LAYOUTS}, got {self.layout!r}")
        need(self.encoding in ENCODINGS, f"run-config 'encoding' must be one of {ENCODINGS}, got {self.encoding!r}")
        need(
            0.0 <= self.privacy_radius < float("inf"),
            f"run-config 'privacy-radius' must be >= 0 (0: half the secondary's spacing), got {self.privacy_radius}",
        )
        need(self.privacy in LEVELS, f"run-config 'privacy' must be one of {list(LEVELS)}, got {self.privacy!r}")
        need(
            not (self.encoding == "bloom" and self.linkage_dir),
            "run-config encoding='bloom' encodes before linking here; with 'linkage-dir' the linkage service "
            "already linked (the parties encode for it with `python -m linkage_server.cli --key-file`)",
        )
        need(
            not ((self.privacy_compose or self.privacy_radius) and self.linkage_dir),
            "run-config 'privacy-radius' / 'privacy-compose' set the noise of a linkage linked here; with "
            "'linkage-dir' the linkage service already linked (pass --radius / --compose to its start command)",
        )


@dataclass(frozen=True)
class ExchangeOptions:
    """Defences of what training exchanges (strategies/vfl/defences.py, docs/privacy.md) and the
    report of the attacks on it (strategies/vfl/exchange_observer.py)."""

    grad_clip: float = opt(
        0.0,
        "> 0: the primary clips each record's cut-layer gradients to this L2 norm; 0 = the level's (docs/privacy.md)",
    )
    grad_noise: float = opt(
        0.0, "Gaussian noise on the gradients it sends, std grad-noise * grad-clip (an epsilon is reported)"
    )
    marvell: float = opt(
        0.0, "> 0, binary labels: Marvell's optimised noise on the gradients, power budget x |Delta|^2"
    )
    label_dp: float = opt(0.0, "> 0: train on labels randomised to this epsilon (label DP); 0 = the labels as they are")
    embedding_clip: float = opt(
        0.0, "> 0: each secondary clips each embedding it sends to this L2 norm; 0 = its level's"
    )
    embedding_noise: float = opt(0.0, "Gaussian noise on the embeddings it sends, std embedding-noise * embedding-clip")
    exchange_report: bool = opt(
        True, 'score label attacks on the exchanged gradients (summary.json "exchange_privacy")'
    )
    exchange_privacy: str = opt(
        "", 'the exchange\'s level where it differs from `privacy` ("" = the same; docs/privacy.md)', before="off"
    )

    def check(self, need: Need) -> None:
        need(
            self.exchange_privacy in ("", *LEVELS),
            f"run-config 'exchange-privacy' must be one of {['', *LEVELS]}, got {self.exchange_privacy!r}",
        )
        nonnegative(need, self, "grad_clip", "grad_noise", "marvell", "label_dp", "embedding_clip", "embedding_noise")
        for clip, noise in (("grad_clip", "grad_noise"), ("embedding_clip", "embedding_noise")):
            need(
                getattr(self, clip) > 0 or getattr(self, noise) == 0,
                f"run-config {noise.replace('_', '-')!r} is in units of {clip.replace('_', '-')!r}: set both",
            )
