"""The collector and training (app/heap.py): the objects alive when training starts are left out
of the collector's passes while it runs, and are the collector's again after it, however it ends;
both engines' training loops run inside it."""

import gc
import weakref

import pytest

from app import modes
from app.config import RunConfig
from app.entity_aug import server as ea_server
from app.heap import frozen_heap
from app.vfl import server as vfl_server

TINY = dict(dataset="synthetic", n_rows=300, epochs=1, batch_size=64)


class Cycle:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_the_heap_is_frozen_inside_and_nothing_stays_frozen_after():
    before = gc.get_freeze_count()
    old = Cycle()
    with frozen_heap():
        assert gc.get_freeze_count() > before
        with frozen_heap():  # a run inside a run (a member): the outer block keeps it frozen
            pass
        assert gc.get_freeze_count() > before
        young = Cycle()
        probe_old, probe_young = weakref.ref(old), weakref.ref(young)
        del old, young
        gc.collect()
        assert probe_young() is None  # what the steps make is still collected
        assert probe_old() is not None  # what was there at the start is not visited
    assert gc.get_freeze_count() == before
    gc.collect()
    assert probe_old() is None


def test_a_failure_inside_unfreezes():
    before = gc.get_freeze_count()
    with pytest.raises(RuntimeError, match="boom"), frozen_heap():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == before


@pytest.mark.parametrize(
    "module, loop, values",
    [
        (vfl_server, "fit", dict(TINY)),
        (ea_server, "fit_ea", dict(TINY, mode="entity-aug", batch_size=32)),
    ],
    ids=["vfl", "entity-aug"],
)
def test_each_training_loop_runs_frozen(module, loop, values, tmp_path, monkeypatch):
    seen, real = [], getattr(module, loop)

    def spy(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, loop, spy)
    before = gc.get_freeze_count()
    modes.run_experiment(RunConfig.of(**values, out_dir=str(tmp_path)), tmp_path / "run")
    assert len(seen) == 1 and seen[0] > before
    assert gc.get_freeze_count() == before
