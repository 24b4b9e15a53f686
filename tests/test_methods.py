"""The method registry (strategies/vfl/methods.py) is the one list of mode "vfl"'s methods: each
registered method builds a model that runs, and the run config and `fedsim train --help` offer
exactly the registered ones; an unknown name is refused with the list."""

import pytest
import torch

from app.config import ConfigError, RunConfig
from strategies.optim import build_seeded
from strategies.vfl.methods import NAMES, REGISTRY, UnknownMethod, method
from strategies.vfl.model import SimilarityModel


@pytest.mark.parametrize("name", NAMES)
def test_every_registered_method_builds_a_model_that_runs(name):
    cfg = RunConfig.of(dataset="synthetic", method=name)
    cfg.validate()
    settings, m = cfg.resolve(), REGISTRY[name]
    assert all(getattr(settings.model, key) == value for key, value in m.model.items())  # its switches win
    assert (settings.k == 1) if m.one_neighbour else settings.k > 1
    parties = {"s": settings.model.cut_dim} if m.federated else {}
    model = build_seeded(0, lambda: SimilarityModel(5, parties, settings.k, 1, settings.model, True))
    b, u = 6, 4
    index = {"s": torch.randint(0, u, (b, settings.k))}
    emb = {"s": torch.randn(u, settings.model.cut_dim)}
    sims = {"all": torch.rand(b, settings.k)} if m.federated else None
    out = model.eval()(torch.randn(b, 5), emb if m.federated else {}, index if m.federated else {}, sims)
    assert out.shape == (b, 1) and torch.isfinite(out).all()


def test_what_each_method_links():
    assert {n: m.links for n, m in REGISTRY.items()} == {
        "fedsim": "topk",
        "fedsim_attn": "topk",
        "solo": None,
        "top1sim": "topk",
        "avgsim": "topk",
        "featuresim": "topk",
        "exact": "exact",
        "combine": "known",
    }
    assert [n for n, m in REGISTRY.items() if not m.federated] == ["solo"]


def test_the_config_accepts_exactly_the_registered_methods():
    for name in NAMES:
        RunConfig.of(method=name).validate()
    with pytest.raises(ConfigError, match=r"run-config 'method' must be one of \('fedsim', 'fedsim_attn'.*'magic'"):
        RunConfig.of(method="magic").validate()
    with pytest.raises(UnknownMethod, match="must be one of"):
        method("magic")
    paper = RunConfig.of(dataset="hdb", method="avgsim", hparams="paper").resolve()
    assert (paper.lr, paper.batch_size, paper.model.agg_hidden) == (1e-3, 128, (400,))  # App. E, from the registry


def test_fedsim_train_help_lists_the_registered_methods():
    from fedsim.cli import parser

    train = parser()._subparsers._group_actions[0].choices["train"]
    action = next(a for a in train._actions if "--method" in a.option_strings)
    assert all(f"{name}:" in action.help for name in NAMES)
    # unset: the run config's default method, or on own parties the recipe search's choice
    from app.config_groups import TrainOptions

    assert action.default is None and TrainOptions().method in REGISTRY and "recipe search" in action.help
