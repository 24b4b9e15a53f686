"""The training methods of mode "vfl", registered once: FedSim, FedSim with attention, and the
paper's baselines (Sec. 6 / App. E), each a switch of the one model. What a method is:

- ``links``: the linkage job it asks for (linkage.job.KINDS): "topk" (the K most similar
  records), "exact" (neighbours at distance 0 only; unmatched records get the secondary's mean
  features), "known" (the true row, synthetic sets only), or None: it links nothing and trains
  the primary alone (Solo);
- ``model``: the ModelConfig fields it sets (strategies/vfl/model.py), which win over the run config;
- ``one_neighbour``: it trains with K = 1;
- ``paper``: the reference's per-dataset hyperparameters for it (run-config hparams = "paper";
  ../shared/docs/fedsim-reference.md, "Baselines: layers, lr, weight decay, batch, epochs");
- ``no_predict``: why predicting with a kept federation of it is refused ("" = it predicts).

Adding a method: one entry in :data:`REGISTRY`; the run config, `fedsim train --method` and
the runs read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Method:
    name: str
    summary: str  # one line for the command line's help
    links: str | None = "topk"
    model: dict = field(default_factory=dict)
    one_neighbour: bool = False
    paper: dict[str, dict] = field(default_factory=dict)  # dataset -> lr, weight_decay, batch_size, agg_hidden
    no_predict: str = ""

    @property
    def federated(self) -> bool:
        """It links the parties and trains with the secondaries (every method but Solo)."""
        return self.links is not None

    @property
    def per_party_linkage(self) -> bool:
        """Its linkage pairs each party with the primary alone (no chain of parties)."""
        return self.links in ("exact", "known")


# The baselines' switches of the model: uniform weights over the neighbours, averaged pairs.
BASELINE_MODEL = dict(merge="avg", uniform_weights=True, sort_gate=False, weight_gate=False)
_TOP1 = dict(batch_size=4096)

REGISTRY: dict[str, Method] = {
    m.name: m
    for m in (
        Method("fedsim", "the paper's model: K neighbours, similarity gates, CNN merge"),
        Method(
            "fedsim_attn",
            "FedSim plus attention over the neighbours and a null slot (docs/fedsim-attn.md)",
            model={"attention": True},
        ),
        Method(
            "solo",
            "the primary's features alone: no linkage, no secondaries",
            links=None,
            paper={
                "house": _TOP1 | dict(lr=3e-3, weight_decay=1e-5),
                "hdb": _TOP1 | dict(lr=1e-2, weight_decay=1e-5),
                "game": _TOP1 | dict(lr=3e-3, weight_decay=1e-5),
                "synthetic": _TOP1 | dict(lr=1e-3, weight_decay=1e-5),
                "frog": _TOP1 | dict(lr=3e-2, weight_decay=1e-3),
            },
        ),
        Method(
            "top1sim",
            "the most similar neighbour only",
            model=BASELINE_MODEL,
            one_neighbour=True,
            paper={
                "house": _TOP1 | dict(lr=3e-3, weight_decay=1e-5),
                "hdb": _TOP1 | dict(lr=1e-2, weight_decay=1e-5),
                "game": _TOP1 | dict(lr=1e-3, weight_decay=1e-5, agg_hidden=(400,)),
                "synthetic": _TOP1 | dict(lr=3e-3, weight_decay=1e-4),
                "frog": _TOP1 | dict(lr=3e-2, weight_decay=1e-3),
            },
        ),
        Method(
            "avgsim",
            "the mean of the K pair outputs",
            model=BASELINE_MODEL,
            paper={
                "house": dict(lr=3e-3, weight_decay=1e-5, batch_size=128),
                "hdb": dict(lr=1e-3, weight_decay=1e-5, batch_size=128, agg_hidden=(400,)),
                "game": dict(lr=1e-3, weight_decay=1e-5, batch_size=128, agg_hidden=(400,)),
                "synthetic": dict(lr=1e-3, weight_decay=1e-4, batch_size=32),
                "frog": dict(lr=3e-3, weight_decay=1e-3, batch_size=32),
            },
        ),
        Method(
            "featuresim",
            "avgsim with the similarity as a feature of every pair",
            model=BASELINE_MODEL | {"sim_feature": True},
            paper={
                "house": dict(lr=3e-3, weight_decay=1e-5, batch_size=128),
                "hdb": dict(lr=1e-3, weight_decay=1e-5, batch_size=128),
                "game": dict(lr=1e-3, weight_decay=1e-5, batch_size=128),
                "synthetic": dict(lr=1e-3, weight_decay=1e-4, batch_size=32),
                "frog": dict(lr=3e-3, weight_decay=1e-3, batch_size=32),
            },
        ),
        Method(
            "exact",
            "neighbours at distance 0 only; unmatched records get the secondary's mean features",
            links="exact",
            model=BASELINE_MODEL,
            one_neighbour=True,
            paper={"game": _TOP1 | dict(lr=1e-3, agg_hidden=(400,))},
            no_predict="links by exact identifiers",
        ),
        Method(
            "combine",
            "the true row (synthetic sets only): the upper bound",
            links="known",
            model=BASELINE_MODEL,
            one_neighbour=True,
            no_predict="uses the true rows of synthetic data",
        ),
    )
}
NAMES = tuple(REGISTRY)


class UnknownMethod(ValueError):
    """A method name the registry does not hold."""


def method(name: str) -> Method:
    """The registered method ``name``; refused by name, listing the registered ones."""
    if name not in REGISTRY:
        raise UnknownMethod(f"run-config 'method' must be one of {NAMES}, got {name!r}")
    return REGISTRY[name]
