"""fedsim_attn's function class contains the paper's FedSim, Top1Sim and Exact: each is a setting
of its weights (planted here by hand), so the trained model has no structural reason to lose to
them. Its twin oracle is in tests/test_equivalence.py."""

import pytest
import torch

from strategies.optim import build_seeded
from strategies.vfl.attention import RATE
from strategies.vfl.model import ModelConfig, SimilarityModel

B, K, D_P, C_S = 6, 5, 4, 7  # records, neighbours, primary features, secondary cut width
CFG = ModelConfig(
    local_hidden=(8,), cut_dim=6, agg_hidden=(9,), r=3, merge="cnn", k_conv=3, channels=2, merge_hidden=12, dropout=0.0
)


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, emb = (
        torch.randn(B, D_P, generator=g, dtype=torch.float64),
        torch.randn(10, C_S, generator=g, dtype=torch.float64),
    )
    index = torch.randint(0, 10, (B, K), generator=g)
    sims = torch.randn(B, K, generator=g, dtype=torch.float64)
    return x, {"s": emb}, {"s": index}, sims


def _model(cfg: ModelConfig, k: int = K) -> SimilarityModel:
    return build_seeded(1, lambda: SimilarityModel(D_P, {"s": C_S}, k, 1, cfg, squash_pairs=True)).double()


def _attention_only(model: SimilarityModel) -> None:
    """Silence the paper's path (its merge's last layer) and the content / similarity scores."""
    path = model.paths["all"]
    with torch.no_grad():
        path.merge.head[-1].weight.zero_()
        path.merge.head[-1].bias.zero_()
        path.attention.score_pair.weight.zero_()
        path.attention.score_sim[-1].weight.zero_()
        path.attention.score_sim[-1].bias.zero_()
        path.attention.score_rank.zero_()  # (it starts at Top1Sim: undone here, planted below)


def test_a_silent_attention_branch_is_the_papers_fedsim():
    x, emb, index, sims = _inputs()
    attn = _model(ModelConfig(**{**CFG.__dict__, "attention": True}))
    paper = _model(CFG)
    paper.load_state_dict({k: v for k, v in attn.state_dict().items() if ".attention." not in k})
    live = attn(x, emb, index, {"all": sims})
    assert (live - paper(x, emb, index, {"all": sims})).abs().max() > 1e-3  # the branch counts until silenced
    with torch.no_grad():
        attn.paths["all"].attention.pair[-1].weight.zero_()
        attn.paths["all"].attention.pair[-1].bias.zero_()
    torch.testing.assert_close(
        attn(x, emb, index, {"all": sims}), paper(x, emb, index, {"all": sims}), rtol=0, atol=1e-12
    )


def test_all_weight_on_rank_one_is_top1sim():
    x, emb, index, sims = _inputs()
    attn = _model(ModelConfig(**{**CFG.__dict__, "attention": True}))
    _attention_only(attn)
    with torch.no_grad():
        attn.paths["all"].attention.score_rank[0] = 60.0 / RATE
    top1 = _model(
        ModelConfig(
            **{**CFG.__dict__, "merge": "avg", "uniform_weights": True, "sort_gate": False, "weight_gate": False}
        ),
        k=1,
    )
    top1.local.load_state_dict(attn.local.state_dict())
    top1.paths["all"].agg.load_state_dict(attn.paths["all"].attention.pair.state_dict())
    best = sims.argmax(dim=1, keepdim=True)  # (B, 1): the service's top-1
    want = top1(x, emb, {"s": index["s"].gather(1, best)}, {"all": sims.gather(1, best)})
    torch.testing.assert_close(attn(x, emb, index, {"all": sims}), want, rtol=0, atol=1e-12)


def test_weight_on_exact_twins_else_the_null_slot_is_exact():
    """Exact: a record's neighbour at distance 0 (similarity s0) if it has one, else the
    secondary's mean-imputed row, which the null slot's learned embedding stands for."""
    x, emb, index, sims = _inputs()
    s0 = 3.0  # the standardised similarity of distance 0
    sims[:3, 2] = s0  # records 0-2 have an exact twin (at rank 3 before sorting); 3-5 none
    imputed = torch.randn(C_S, dtype=torch.float64)
    attn = _model(ModelConfig(**{**CFG.__dict__, "attention": True}))
    _attention_only(attn)
    a = attn.paths["all"].attention
    with torch.no_grad():  # score = 60 * relu(s - s0 + 0.5) / 0.5 on a neighbour, 30 on the null slot
        a.score_sim[0].weight.zero_()
        a.score_sim[0].bias.zero_()
        a.score_sim[0].weight[0, 0] = 1.0
        a.score_sim[0].bias[0] = -(s0 - 0.5)
        a.score_sim[-1].weight[0, 0] = 120.0
        a.score_rank[-1] = 30.0 / RATE
        a.null["s"].copy_(imputed)
    exact = _model(
        ModelConfig(
            **{**CFG.__dict__, "merge": "avg", "uniform_weights": True, "sort_gate": False, "weight_gate": False}
        ),
        k=1,
    )
    exact.local.load_state_dict(attn.local.state_dict())
    exact.paths["all"].agg.load_state_dict(a.pair.state_dict())
    rows = torch.cat([emb["s"], imputed[None]])  # the secondary's rows, then its imputed row (link_exact)
    twin = torch.where(torch.arange(B)[:, None] < 3, index["s"][:, 2:3], torch.full((B, 1), 10))
    want = exact(x, {"s": rows}, {"s": twin}, {"all": torch.zeros(B, 1, dtype=torch.float64)})
    torch.testing.assert_close(attn(x, emb, index, {"all": sims}), want, rtol=0, atol=1e-9)


def test_it_starts_at_top1sim_and_can_leave_it():
    """At initialisation rank 1 holds nearly all the weight among 50 neighbours (the validated
    start); the rank biases are parameters, so training can spread it."""
    x, emb, index, sims = _inputs()
    model = _model(ModelConfig(**{**CFG.__dict__, "attention": True}), k=50)
    index50 = {"s": torch.randint(0, 10, (B, 50), generator=torch.Generator().manual_seed(3))}
    sims50 = torch.randn(B, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    w = model.paths["all"].attend(model.local(x), emb, index50, sims50)[1]  # (B, 51)
    assert w.shape == (B, 51) and (w[:, 0] > 0.9).all()
    assert model.paths["all"].attention.score_rank.requires_grad


def test_the_explained_weights_follow_the_linkage_order_and_sum_to_one():
    """The weights `--explain` reports (SimilarityModel.attention_weights) belong to the neighbour
    in the column they are written in: shuffling a record's neighbours shuffles its weights the
    same way, and with all weight on rank 1 it sits on each record's most similar neighbour."""
    x, emb, index, sims = _inputs()
    model = _model(ModelConfig(**{**CFG.__dict__, "attention": True}))
    w = model.attention_weights(x, emb, index, {"all": sims})["s"]  # (B, K + 1)
    torch.testing.assert_close(w.sum(dim=1), torch.ones(B, dtype=torch.float64), rtol=0, atol=1e-12)
    perm = torch.randperm(K, generator=torch.Generator().manual_seed(5))
    shuffled = model.attention_weights(x, emb, {"s": index["s"][:, perm]}, {"all": sims[:, perm]})["s"]
    torch.testing.assert_close(shuffled, torch.cat([w[:, :K][:, perm], w[:, K:]], dim=1), rtol=0, atol=1e-12)
    _attention_only(model)
    with torch.no_grad():
        model.paths["all"].attention.score_rank[0] = 60.0 / RATE
    w = model.attention_weights(x, emb, index, {"all": sims})["s"]
    assert (w[:, :K].argmax(dim=1) == sims.argmax(dim=1)).all() and (w.max(dim=1).values > 1 - 1e-9).all()


def test_a_silent_start_is_the_papers_fedsim_drawn_from_the_same_seed():
    """``attention_start = "silent"``: built from the same seed, the model's first output is the
    paper's FedSim's with the same weights (the paper's path is drawn first either way), and one
    gradient step gives the branch's last layer a gradient (it can leave FedSim)."""
    x, emb, index, sims = _inputs()
    silent = _model(ModelConfig(**{**CFG.__dict__, "attention": True, "attention_start": "silent"}))
    paper = _model(CFG)
    for name, value in paper.state_dict().items():
        assert torch.equal(silent.state_dict()[name], value), name
    out = silent(x, emb, index, {"all": sims})
    torch.testing.assert_close(out, paper(x, emb, index, {"all": sims}), rtol=0, atol=0)
    out.sum().backward()
    assert silent.paths["all"].attention.pair[-1].weight.grad.abs().max() > 0


def test_each_dataset_starts_its_attention_at_top1_unless_asked_otherwise():
    """Every dataset starts at Top1Sim; the run config overrides it, and so does the recipe chosen by
    hand (hparams "dataset": house on 5 seeds to convergence on validation, game on 10, silent); the
    run records which and why."""
    from app.config import RunConfig

    def start(**flat):
        row = RunConfig.from_flower(flat).hyperparameters()["attention_start"]
        model = RunConfig.from_flower(flat).resolve().model
        assert model.attention_start == row["value"]  # what is built is what is recorded
        return row["value"], row["source"].split(" (")[0]

    for dataset in ("house", "game"):
        assert start(dataset=dataset, hparams="dataset") == ("silent", 'hparams "dataset"')
        assert start(dataset=dataset, hparams="dataset", **{"attention-start": "top1"}) == ("top1", "run config")
    for dataset in ("hdb", "frog", "synthetic", "house3", "house", "game"):
        assert start(dataset=dataset) == ("top1", "default")
    assert start(dataset="frog", **{"attention-start": "silent"}) == ("silent", "run config")
    assert "attention_start" not in RunConfig.from_flower({"dataset": "house", "method": "fedsim"}).hyperparameters()


def test_the_attention_branch_learns_at_its_own_fraction_of_the_rate():
    """``attention-lr``: the primary's optimiser puts the attention branch's parameters in a group
    at that fraction of the learning rate, through a schedule too; everything else, and every
    parameter when it is 1, stays at the rate itself (one group, as before the option)."""
    from app.config import ConfigError, RunConfig
    from strategies.optim import make_optimizer, set_lr

    model = _model(ModelConfig(**{**CFG.__dict__, "attention": True, "attention_lr": 0.1}))
    opt = make_optimizer(model.optimizer_groups(), 1e-3, 0.0)
    attention = {id(q) for q in model.paths["all"].attention.parameters()}
    for factor in (1.0, 0.5):  # the schedule's scale multiplies both groups
        set_lr(opt, 1e-3 * factor)
        for group in opt.param_groups:
            want = 1e-4 * factor if all(id(q) in attention for q in group["params"]) else 1e-3 * factor
            assert group["lr"] == pytest.approx(want)
    seen = [id(q) for group in opt.param_groups for q in group["params"]]
    assert sorted(seen) == sorted(id(q) for q in model.parameters())  # each parameter once
    assert {id(q) for q in opt.param_groups[1]["params"]} == attention
    same = _model(ModelConfig(**{**CFG.__dict__, "attention": True}))
    assert [id(q) for q in same.optimizer_groups()[0]["params"]] == [id(q) for q in same.parameters()]
    assert len(same.optimizer_groups()) == 1
    rows = {
        flat.get("attention-lr", 0.0): RunConfig.from_flower(
            {"dataset": "house", "hparams": "dataset", **flat}
        ).hyperparameters()["attention_lr"]
        for flat in ({}, {"attention-lr": 1.0})
    }  # house's hand-chosen rate (5 seeds on validation: conf/sweeps/attn_lr_house*.toml), and the override
    assert rows[0.0] == {
        "value": 0.3,
        "source": 'hparams "dataset" (house, chosen by hand on its validation: docs/fedsim-attn.md)',
    }
    assert rows[1.0] == {"value": 1.0, "source": "run config"}
    assert RunConfig.from_flower({"dataset": "house"}).resolve().model.attention_lr == 1.0
    with pytest.raises(ConfigError, match="attention-lr"):
        RunConfig.from_flower({"dataset": "house", "attention-lr": 1.5})
