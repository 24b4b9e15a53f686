"""Entity Augmentation's predict over Flower (run-config ``mode = "entity-aug"`` plus
``predict-run``, ``predict-input``, ``predict-output``, ``predict-id-column``), for a run trained
over Flower, whose secondaries (the EA paper's guests) each kept their own state
(app/entity_aug/kept.py).

The primary (ServerApp) reads the entity ids (``predict-input``, a CSV; column ``predict-id-column``,
default ``entity``), checks them and its own kept states as in-process predict does
(app/entity_aug/predict.py: finished run, entities every party holds, the primary's own block
unchanged), asks each secondary for the activations of the ids from the state it kept
(``query.ea_embed_kept``; each secondary checks that its own features did not change) in evaluation's
chunks, and runs its kept model: the evaluation's code. The CSV (id column, ``prediction``,
``p_<class>``) is written whole or not at all, and an older file at the output is removed first.

`fedsim predict` drives it for such a run (fedsim/predict_ea.py): `flwr run` on a local
simulation with the training's run config plus the predict-* keys, one SuperNode per secondary.
"""

from __future__ import annotations

import time
from logging import INFO

from flwr.common.logger import log
from flwr.serverapp import Grid

from app.config import RunConfig
from app.entity_aug import id_exchange
from app.entity_aug.channel import FlowerChannel
from app.entity_aug.kept import PRIMARY_MODEL, read_manifest, state_name
from app.entity_aug.parties import ea_plan, ea_settings
from app.entity_aug.predict import check_ids, check_parties, predicted, read_ids, rebuild, table, user_entities
from app.entity_aug.predict_ids import id_column
from app.kept import KEPT, KeptError, kept_attempt, load_states, predict_mode_files, write_csv
from app.run_status import require_finished
from app.transport import handshake
from datasets.cells import column_text
from datasets.overlap import PRIMARY_BLOCK

SAME = ("dataset", "data_dir", "n_rows", "seed", "mode", "ea_variant", "overlap", "dtype")  # what rebuilds the parties


def run_ea_predict(grid: Grid, cfg: RunConfig) -> dict:
    """Predictions for the ids in ``predict-input`` into ``predict-output``; returns what was
    done and the seconds of each phase (prepare, connect, embed, forward)."""
    src, out = predict_mode_files(cfg)
    t0 = time.perf_counter()
    run_dir = cfg.out_path() / cfg.predict.run
    require_finished(run_dir, kept=True)
    attempt = kept_attempt(run_dir)  # with the manifest, once: a rerun under the name later is another attempt
    meta = read_manifest(run_dir)
    if meta["secondary_states"] != "parties":
        raise KeptError(
            f"run {cfg.predict.run!r} was trained in process and keeps every party's state in its "
            "folder: predict it in process (fedsim predict, or python -m app.entity_aug.predict)"
        )
    trained = RunConfig.of(**meta["run"])
    _same_parties(cfg, trained)
    data = id_exchange.run_data(trained, run_dir)  # guests met by their ids: their files are not read here
    column = id_column(cfg.predict.id_column, trained)
    raw = read_ids(src, column, data.entity_ids is not None)
    ids = user_entities(raw, data)
    local = [PRIMARY_BLOCK] if PRIMARY_BLOCK in data.parties else []
    check_parties(meta, data, local)  # each secondary checks its own
    check_ids(ids, trained, data)
    states = load_states(run_dir / KEPT, [PRIMARY_MODEL, *map(state_name, local)])
    primary, own = rebuild(trained, data, meta, states, local)
    seconds = {"prepare": time.perf_counter() - t0, "connect": 0.0, "embed": 0.0, "forward": 0.0}
    t1 = time.perf_counter()
    nodes = handshake(grid, data.secondaries, "", cfg.runtime.node_timeout, action="ea_predict_hello")
    seconds["connect"] = time.perf_counter() - t1
    channel = FlowerChannel(grid, nodes, cfg.runtime.node_timeout, own.members)
    pred = predicted(
        primary,
        lambda chunk: channel.embed_kept(cfg.predict.run, chunk, attempt),
        ids,
        ea_plan(trained, data, ea_settings(trained)).eval_batch,
        meta,
        seconds,
    )
    write_csv(table(column_text(src, column), column, pred), out)  # the ids as the file writes them
    log(
        INFO,
        "[primary] predict: %d entities with run %s (best epoch %d) in %.2f s: %s -> %s",
        len(ids),
        cfg.predict.run,
        pred.best_epoch,
        time.perf_counter() - t0,
        " ".join(f"{k}={v:.3f}" for k, v in seconds.items()),
        out,
    )
    return {"rows": len(ids), "best_epoch": pred.best_epoch, "seconds": seconds, "output": str(out)}


def _same_parties(cfg: RunConfig, trained: RunConfig) -> None:
    """The secondaries rebuild themselves from this run config: it must be the training's."""
    asked, kept = cfg.flat(), trained.flat()
    for key in SAME:
        if asked[key] != kept[key]:
            raise KeptError(
                f"run {cfg.predict.run!r} was trained with {key.replace('_', '-')} = "
                f"{kept[key]!r}, but this predict run says {asked[key]!r}; predict "
                "with the training's run config plus the predict-* keys"
            )
