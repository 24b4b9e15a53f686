"""The primary's model and gates: shapes, the sort order, and the factored aggregation."""

import numpy as np
import pytest
import torch

from strategies.heads import TaskHead
from strategies.optim import build_seeded
from strategies.vfl.gates import (
    CNNMerge,
    SeededDropout,
    WeightGate,
    gather_rows,
    seed_dropout,
    sort_by_similarity,
)
from strategies.vfl.model import ModelConfig, SimilarityModel


def test_sort_gate_orders_pairs_by_similarity_most_similar_first():
    sims = torch.tensor([[0.25, 0.75, -1.0], [2.0, 0.0, 1.0]])  # (B=2, K=3)
    pairs = torch.arange(6, dtype=torch.float32).view(2, 3, 1)  # (B, K, r=1)
    s, p = sort_by_similarity(sims, pairs)
    assert s.tolist() == [[0.75, 0.25, -1.0], [2.0, 1.0, 0.0]]
    assert p.squeeze(-1).tolist() == [[1.0, 0.0, 2.0], [3.0, 5.0, 4.0]]


def test_weight_gate_maps_each_similarity_to_a_positive_weight():
    gate = WeightGate()
    w = gate(torch.linspace(-3, 3, 12).view(3, 4))
    assert w.shape == (3, 4) and (w > 0).all() and (w <= 1 + 1e-6).all()
    # elementwise: a similarity's weight does not depend on its neighbours
    assert torch.allclose(gate(torch.tensor([[0.5, 2.0]]))[0, 0], gate(torch.tensor([[0.5, -7.0]]))[0, 0])


def test_cnn_merge_shape():
    merge = CNNMerge(k=5, r=3, d_out=2, k_conv=3, channels=4, hidden=16, dropout=0.0)
    assert merge(torch.randn(7, 5, 3)).shape == (7, 2)


@pytest.mark.parametrize("k, k_conv", [(5, 3), (50, 7), (1, 7), (2, 1)])
def test_cnn_merge_equals_its_conv2d_with_the_same_gradients(k, k_conv):
    """The merge runs its Conv2d as a banded matmul (gates.banded): the same outputs and the same
    gradients for input, kernel and bias as the Conv2d itself (float64: only summation order differs)."""
    torch.manual_seed(0)
    merge = CNNMerge(k=k, r=3, d_out=2, k_conv=k_conv, channels=4, hidden=16, dropout=0.0).double()
    x = torch.randn(7, k, 3, dtype=torch.float64, requires_grad=True)
    conv_out = torch.relu(merge.conv(x.unsqueeze(1)))  # (B, C, K + k_conv - 1, r), the Conv2d itself
    expect = merge.head(conv_out.flatten(1))
    g_expect = torch.autograd.grad(expect.sum(), [x, merge.conv.weight, merge.conv.bias])
    got = merge(x)
    g_got = torch.autograd.grad(got.sum(), [x, merge.conv.weight, merge.conv.bias])
    assert torch.allclose(got, expect, rtol=0, atol=1e-12)
    for a, b in zip(g_got, g_expect):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_gather_rows_is_advanced_indexing_with_its_gradient():
    table = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([[0, 5, 5], [2, 0, 5]])  # (B, K), repeated rows
    upstream = torch.randn(2, 3, 4, dtype=torch.float64)
    got = gather_rows(table, index)
    (g_got,) = torch.autograd.grad(got, table, upstream)
    (g_expect,) = torch.autograd.grad(table[index], table, upstream)
    assert torch.equal(got, table[index]) and torch.allclose(g_got, g_expect, rtol=0, atol=1e-14)


def test_factored_aggregation_equals_the_mlp_on_concatenated_pairs():
    cfg = ModelConfig(local_hidden=(8,), cut_dim=6, agg_hidden=(5,), r=4, merge="avg", dropout=0.0)
    model = build_seeded(0, lambda: SimilarityModel(3, {"s": 7}, k=4, d_out=4, cfg=cfg, squash_pairs=False))
    h = torch.randn(2, 6)  # (B, c_P)
    emb = torch.randn(5, 7)  # (U, c_S)
    index = torch.tensor([[0, 1, 1, 4], [3, 3, 2, 0]])  # (B, K)
    cat = torch.cat([h.unsqueeze(1).expand(2, 4, 6), emb[index]], dim=-1)  # (B, K, 13)
    path = model.paths["all"]
    torch.testing.assert_close(path.aggregate(h, {"s": emb}, {"s": index}), path.agg(cat), rtol=1e-5, atol=1e-6)


def test_seeded_model_and_dropout_repeat_without_global_rng():
    cfg = ModelConfig(dropout=0.5)
    make = lambda: build_seeded(3, lambda: SimilarityModel(4, {"s": 100}, 6, 1, cfg, True))  # noqa: E731
    a, b = make(), make()
    for m in (a, b):
        seed_dropout(m, 9, torch.device("cpu"))
    torch.manual_seed(123)
    x, emb, idx, sims = (
        torch.randn(3, 4),
        {"s": torch.randn(5, 100)},
        {"s": torch.randint(0, 5, (3, 6))},
        torch.randn(3, 6),
    )
    torch.manual_seed(456)  # global RNG state must not matter
    out_a = a(x, emb, idx, {"all": sims})
    out_b = b(x, emb, idx, {"all": sims})
    torch.testing.assert_close(out_a, out_b)
    with pytest.raises(RuntimeError, match="seed_dropout"):
        SeededDropout(0.5).train()(torch.ones(2))


def test_regression_head_reports_original_units():
    head = TaskHead.fit("regression", np.array([100.0, 300.0]), 1)
    out = torch.tensor([[0.0]])  # sigmoid(0) = 0.5 -> 200
    assert head.predict(out).tolist() == [200.0]
    m = head.metrics(np.array([200.0, 250.0]), np.array([200.0, 150.0]))
    assert m["rmse"] == pytest.approx(np.sqrt(5000.0))


@pytest.mark.parametrize("merge", ["avg", "cnn", "mlp"])
def test_binary_output_is_a_logit_that_can_predict_both_classes(merge):
    """Regression test: the average merge once averaged sigmoid outputs and the head applied
    a sigmoid again, so every prediction was > 0.5."""
    cfg = ModelConfig(
        local_hidden=(8,),
        cut_dim=4,
        agg_hidden=(8,),
        r=1,
        merge=merge,
        k_conv=3,
        channels=2,
        merge_hidden=8,
        dropout=0.0,
    )
    model = build_seeded(0, lambda: SimilarityModel(2, {"s": 4}, 5, 1, cfg, squash_pairs=True))
    head = TaskHead("binary", 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.005)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, generator=g)
    y = (x[:, 0] > 0).float()  # planted: the label is the sign of a primary feature
    emb, idx, sims = (
        {"s": torch.randn(10, 4, generator=g)},
        {"s": torch.randint(0, 10, (64, 5), generator=g)},
        torch.randn(64, 5, generator=g),
    )
    for _ in range(150):
        opt.zero_grad()
        head.loss(model(x, emb, idx, {"all": sims}), y).backward()
        opt.step()
    with torch.no_grad():
        pred = head.predict(model(x, emb, idx, {"all": sims}))
    assert ((pred > 0.5) == (y == 1).numpy()).mean() > 0.9
