"""Issue 31: strategies.lamb.Lamb (multi-tensor, no host sync) equals torch_optimizer.Lamb, the
optimiser it replaces, step for step in float64, zero-norm branches and skipped parameters
included; its state round-trips, and torch_optimizer.Lamb's checkpoints load into it."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch_optimizer
from torch import nn

import strategies.lamb as lamb_module
from strategies.lamb import Lamb
from strategies.optim import make_optimizer
from tests.fresh_python import imported_after

TOL = 1e-9


class Net(nn.Module):
    """A small MLP plus the corner cases: ``big`` (norm > 10: the clamp), ``zero_w`` (weight zero
    at first), ``dead`` (its gradient is always zero; zero itself without weight decay), ``unused``
    (no gradient: skipped)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
        self.big = nn.Parameter(torch.randn(16) * 5)  # ||big|| ~ 20 > clamp 10
        self.zero_w = nn.Parameter(torch.zeros(16))
        self.dead = nn.Parameter(torch.zeros(3))
        self.unused = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body[:2](x) * (1 + 0.01 * self.big) + self.zero_w  # (B, 16)
        return self.body[2:](h).squeeze(-1) + 0 * self.dead.sum()  # (B,)


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    net = Net().double()
    x = torch.randn(64, 6, dtype=torch.float64)
    y = torch.sin(x.sum(1)) + 0.1 * torch.randn(64, dtype=torch.float64)
    return net, x, y


def _train(net, opt, x, y, steps: int, offset: int = 0) -> list[list[torch.Tensor]]:
    """``steps`` full-batch steps on rotating mini-batches; the parameters after each step."""
    out = []
    for s in range(offset, offset + steps):
        i = torch.arange(16) + 16 * (s % 4)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(net(x[i]), y[i]).backward()
        opt.step()
        out.append([p.detach().clone() for p in net.parameters()])
    return out


def _max_diff(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> float:
    return max((pa - pb).abs().max().item() for sa, sb in zip(a, b) for pa, pb in zip(sa, sb))


def _pair(**kw):
    """The same model twice: under torch_optimizer.Lamb and under ours, same arguments."""
    net, x, y = _setup()
    twin = copy.deepcopy(net)
    return (net, torch_optimizer.Lamb(net.parameters(), **kw)), (twin, Lamb(twin.parameters(), **kw)), x, y


@pytest.mark.parametrize(
    "kw",
    [
        dict(lr=1e-2, weight_decay=1e-2),
        dict(lr=1e-2),
        dict(lr=1e-3, weight_decay=1e-4),
        dict(lr=1e-2, weight_decay=1e-3, debias=True),
        dict(lr=1e-2, adam=True),
    ],
    ids=["wd", "no-wd", "hdb", "debias", "adam"],
)
def test_equals_torch_optimizer_lamb_step_for_step(kw):
    (net_a, opt_a), (net_b, opt_b), x, y = _pair(**kw)
    ref, ours = _train(net_a, opt_a, x, y, 300), _train(net_b, opt_b, x, y, 300)
    diff = _max_diff(ref, ours)
    print(f"{kw}: max |torch_optimizer - ours| over 300 steps = {diff:.3e}")
    assert diff < TOL
    assert torch.equal(net_b.unused, torch.ones(4, dtype=torch.float64)) and net_b.unused not in opt_b.state
    for p_a, p_b in zip(net_a.parameters(), net_b.parameters()):
        if p_a in opt_a.state:
            assert opt_b.state[p_b]["step"] == opt_a.state[p_a]["step"] == 300
            for key in ("exp_avg", "exp_avg_sq"):
                assert (opt_a.state[p_a][key] - opt_b.state[p_b][key]).abs().max().item() < TOL


def _refuse_host_reads(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read back to the host")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("kw", [dict(weight_decay=1e-2), dict(debias=True), dict(adam=True)], ids=str)
def test_a_step_reads_no_tensor_back_to_the_host(monkeypatch, kw):
    """No .item(), no ``if tensor``: on a GPU, each would wait for the device (torch_optimizer's do)."""
    (net_a, opt_a), (net_b, opt_b), x, y = _pair(lr=1e-2, **kw)
    for net in (net_a, net_b):
        torch.nn.functional.mse_loss(net(x), y).backward()
    _refuse_host_reads(monkeypatch)
    opt_b.step()
    opt_b.step()
    with pytest.raises(AssertionError, match="host"):
        opt_a.step()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_step_never_synchronises_and_equals_torch_optimizer():
    (net_a, opt_a), (net_b, opt_b), x, y = _pair(lr=1e-2, weight_decay=1e-2)
    net_a, net_b, x, y = net_a.cuda(), net_b.cuda(), x.cuda(), y.cuda()  # in place: the optimisers keep them
    for s in range(100):
        i = torch.arange(16, device="cuda") + 16 * (s % 4)
        for net, opt in ((net_a, opt_a), (net_b, opt_b)):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(net(x[i]), y[i]).backward()
        opt_a.step()
        torch.cuda.set_sync_debug_mode("error")  # raises on any synchronising CUDA call
        try:
            opt_b.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert _max_diff([list(net_a.parameters())], [list(net_b.parameters())]) < TOL


def test_the_corner_cases_are_exercised():
    """The zero-norm branches and the clamp are taken (else the oracle above would not check them)."""
    (net, opt), _, x, y = _pair(lr=1e-2)
    _train(net, opt, x, y, 1)
    assert opt.state[net.zero_w]["weight_norm"] == 0  # step 1: weight zero, Adam step not
    assert opt.state[net.dead]["adam_norm"] == 0 and opt.state[net.dead]["weight_norm"] == 0
    assert opt.state[net.big]["weight_norm"] == 10
    assert torch.norm(net.big) > 10


def _wrong_clamp(w_norm, a_norm):
    return torch.where((w_norm == 0) | (a_norm == 0), 1.0, w_norm.clamp(0, 5) / a_norm)


def _wrong_zero_branch(w_norm, a_norm):
    return torch.where((w_norm == 0) | (a_norm == 0), 0.0, w_norm / a_norm)


def _eps_in_ratio(w_norm, a_norm):  # pytorch_optimizer's Lamb: w / (a + eps)
    return torch.where((w_norm == 0) | (a_norm == 0), 1.0, w_norm / (a_norm + 1e-6))


@pytest.mark.parametrize("mutant", [_wrong_clamp, _wrong_zero_branch, _eps_in_ratio])
def test_the_oracle_can_fail(monkeypatch, mutant):
    monkeypatch.setattr(lamb_module, "trust_ratio", mutant)
    (net_a, opt_a), (net_b, opt_b), x, y = _pair(lr=1e-2, weight_decay=1e-2)
    assert _max_diff(_train(net_a, opt_a, x, y, 50), _train(net_b, opt_b, x, y, 50)) > 1e-6


def test_a_wrong_clamp_value_is_caught():
    (net_a, opt_a), _, x, y = _pair(lr=1e-2)
    net_b = copy.deepcopy(_setup()[0])
    opt_b = Lamb(net_b.parameters(), lr=1e-2, clamp_value=100)
    assert _max_diff(_train(net_a, opt_a, x, y, 20), _train(net_b, opt_b, x, y, 20)) > 1e-6


def _reload(opt_from, opt_to) -> None:
    """Through bytes, as app/vfl/checkpoint.py saves and loads the optimiser's state_dict."""
    buf = io.BytesIO()
    torch.save(opt_from.state_dict(), buf)
    opt_to.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), map_location="cpu", weights_only=True))


@pytest.mark.parametrize("source", [Lamb, torch_optimizer.Lamb], ids=["ours", "torch_optimizer"])
def test_a_saved_state_continues_identically(source):
    """50 steps under ``source``, its state_dict loaded into ours on a copy; then both go on."""
    net, x, y = _setup()
    opt = source(net.parameters(), lr=1e-2, weight_decay=1e-2)
    _train(net, opt, x, y, 50)
    twin = copy.deepcopy(net)
    resumed = Lamb(twin.parameters(), lr=1e-2, weight_decay=1e-2)
    _reload(opt, resumed)
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in resumed.state.values())
    diff = _max_diff(_train(net, opt, x, y, 100, 50), _train(twin, resumed, x, y, 100, 50))
    assert diff == 0 if source is Lamb else diff < TOL


def test_our_state_loads_into_torch_optimizer_lamb():
    net, x, y = _setup()
    opt = Lamb(net.parameters(), lr=1e-2, weight_decay=1e-2)
    _train(net, opt, x, y, 50)
    twin = copy.deepcopy(net)
    old = torch_optimizer.Lamb(twin.parameters(), lr=1e-2, weight_decay=1e-2)
    _reload(opt, old)
    assert _max_diff(_train(net, opt, x, y, 50, 50), _train(twin, old, x, y, 50, 50)) < TOL


def test_the_state_round_trips_through_flower_records():
    """A secondary keeps its optimiser state in context.state between messages (app/party_state.py)."""
    from app.party_state import load_optimizer_state, optimizer_state_records

    net, x, y = _setup()
    opt = make_optimizer(net.parameters(), 1e-2, 1e-2)
    assert isinstance(opt, Lamb)
    _train(net, opt, x, y, 30)
    twin = copy.deepcopy(net)
    resumed = make_optimizer(twin.parameters(), 1e-2, 1e-2)
    load_optimizer_state(resumed, *optimizer_state_records(opt))
    assert all(isinstance(s["step"], int) for s in resumed.state.values())
    assert _max_diff(_train(net, opt, x, y, 30, 30), _train(twin, resumed, x, y, 30, 30)) == 0


def test_arguments_are_checked_as_torch_optimizer_does():
    p = [nn.Parameter(torch.zeros(2))]
    for kw in (
        dict(lr=0.0),
        dict(eps=-1.0),
        dict(betas=(1.0, 0.9)),
        dict(betas=(0.9, -0.1)),
        dict(weight_decay=-1.0),
        dict(clamp_value=-1.0),
    ):
        with pytest.raises(ValueError):
            Lamb(p, **kw)
        with pytest.raises(ValueError):
            torch_optimizer.Lamb(p, **kw)
    assert Lamb(p).defaults == torch_optimizer.Lamb(p).defaults
    p[0].grad = torch.zeros(2).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        Lamb(p).step()


def test_building_stepping_and_saving_lamb_does_not_import_torchs_compiler():
    """torch wraps Optimizer's add_param_group / zero_grad / state_dict / load_state_dict in
    torch._disable_dynamo, whose first call imports torch._dynamo (about 1 s of CPU) in every
    process that builds an optimiser: every party worker, ServerApp and run. Nothing here compiles
    an optimiser, so LAMB uses the unwrapped methods; checked in a fresh interpreter."""
    steps = (
        "import torch\nfrom strategies.optim import make_optimizer\nm = torch.nn.Linear(3, 2)\n"
        "o = make_optimizer(m.parameters(), 1e-3, 0.0)\n"
        "m(torch.ones(4, 3)).sum().backward(); o.step(); o.zero_grad(); o.load_state_dict(o.state_dict())\n"
        "assert len(o.state) == 2, o.state"
    )
    assert imported_after(steps, ("torch._dynamo",)) == []


def test_backward_from_gives_outs_own_backward_and_refuses_another_shape():
    """strategies/optim.py backward_from == out.backward(grad) to the bit (float64), without the
    import of sympy that autograd's explicit-gradient path makes (fresh interpreter)."""
    from strategies.optim import backward_from

    torch.manual_seed(0)
    model, x, grad = torch.nn.Linear(5, 3).double(), torch.randn(8, 5, dtype=torch.float64), torch.randn(8, 3)
    grad = grad.double()
    model(x).backward(grad)
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    backward_from(model(x), grad)
    assert all(torch.equal(a, p.grad) for a, p in zip(want, model.parameters()))
    with pytest.raises(ValueError, match=r"shape \(1, 3\) for an output of shape \(8, 3\)"):
        backward_from(model(x), grad[:1])  # would broadcast
    steps = (
        "import torch\nfrom strategies.optim import backward_from\nm = torch.nn.Linear(3, 2)\n"
        "backward_from(m(torch.ones(4, 3)), torch.ones(4, 2))\nassert m.weight.grad is not None"
    )
    assert imported_after(steps, ("sympy",)) == []


def test_entity_augmentations_adam_is_torchs_to_the_bit_without_its_compiler():
    """strategies/optim.py Adam (Entity Augmentation's optimiser) == torch.optim.Adam step for
    step, its state saved and loaded; built and stepped in a fresh interpreter it imports no
    torch._dynamo (torch's Adam does, in its constructor and in every step's wrapper)."""
    from strategies.optim import Adam

    def run(cls, steps=6):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
        opt = cls(model.parameters(), lr=1e-2, betas=(0.9, 0.999))
        x = torch.randn(16, 5, dtype=torch.float64)
        for i in range(steps):
            if i == 3:  # a checkpoint in the middle: saved, loaded into a fresh one
                fresh = cls(model.parameters(), lr=1e-2, betas=(0.9, 0.999))
                fresh.load_state_dict(opt.state_dict())
                opt = fresh
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run(Adam), run(torch.optim.Adam)))
    steps = (
        "import torch\nfrom strategies.optim import Adam\nm = torch.nn.Linear(3, 2)\no = Adam(m.parameters(), lr=1e-3)\n"
        "m(torch.ones(4, 3)).sum().backward(); o.step(); o.zero_grad(); o.load_state_dict(o.state_dict())"
    )
    assert imported_after(steps, ("torch._dynamo",)) == []
