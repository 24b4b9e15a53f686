"""Predict through Flower (run-config ``predict-run``): the primary's ServerApp reads new
records, links them, asks each secondary for the embeddings of its tokens from the model that
party kept for the run (``query.embed_kept``, answered from the party's own folders), and
forwards them through its own kept model, gates and head: the evaluation's code
(app/vfl/predict.py). The output is a CSV written whole or not at all; an older file at the
output path is removed first, so a failed predict never leaves one that looks current (`flwr
run` exits 0 even when the ServerApp fails). `fedsim predict` and `python -m deploy predict`
check the input before they start Flower and give it a fresh output name, renamed over --out
only when whole, so there a failed predict keeps the older file (app/predict_files.py).

Linkage: ``predict-linkage`` names the linkage service's answer to the primary's query
(``python -m linkage_server query``; deployment); without it the run's in-process service links
them (simulation), with the job's own secret, as it linked the training records.
"""

from __future__ import annotations

import time
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

from app.config import RunConfig
from app.kept import KeptError, predict_mode_files, write_csv
from app.transport import handshake
from app.vfl.channel import FlowerChannel
from app.vfl.linking import unsorted
from app.vfl.predict import KeptRun, Prediction, check_new, forward, link_here, open_kept
from app.vfl.predict_csv import NewRecords, read_input, table
from linkage.binding import identifier_digest, queried_raw_digest
from linkage.store import read_primary
from strategies.wire_checks import Expect, check_block


def run_predict(grid: Grid, cfg: RunConfig) -> dict:
    """Predictions for ``predict-input`` into ``predict-output``; returns what was done and the
    seconds of each phase (prepare, query, embed, forward)."""
    src, out = predict_mode_files(cfg)
    t0 = time.perf_counter()
    run_dir = cfg.out_path() / cfg.predict.run
    kept = open_kept(run_dir, check=("primary",))  # each secondary checks its own data
    _same_parties(cfg, kept)
    keys, features, ids, report = read_input(run_dir, NewRecords(src, cfg.predict.id_column, cfg.predict.unknown))
    check_new(features, ids, kept.meta)
    seconds = {"prepare": time.perf_counter() - t0, "query": 0.0, "connect": 0.0, "embed": 0.0}
    linkage, lookup = None, {}
    if kept.cfg.training_method.federated:
        linkage = _linkage(cfg, kept, ids, seconds)
        lookup = _embed_remote(grid, cfg, kept, linkage, seconds)
    t1 = time.perf_counter()
    values, proba, weights, attention = forward(kept, features, linkage, lookup, explain=cfg.predict.explain)
    seconds["forward"] = time.perf_counter() - t1
    pred = Prediction(values, proba, linkage, weights, kept.meta["best_epoch"], seconds, attention)
    write_csv(table(keys, cfg.predict.id_column, pred, cfg.predict.explain), out)
    for what, counts in report.items():
        if counts:
            log(INFO, "[primary] predict note: %s: %s", what.replace("_", " "), counts)
    log(
        INFO,
        "[primary] predict: %d records with run %s (best epoch %d) in %.2f s: %s -> %s",
        len(keys),
        cfg.predict.run,
        pred.best_epoch,
        time.perf_counter() - t0,
        " ".join(f"{k}={v:.3f}" for k, v in seconds.items()),
        out,
    )
    return {"rows": len(keys), "best_epoch": pred.best_epoch, "seconds": seconds, "output": str(out)}


def _same_parties(cfg: RunConfig, kept: KeptRun) -> None:
    """In simulation the secondaries name themselves from the run config: it must be the run's."""
    asked, trained = cfg.flat(), kept.cfg.flat()
    for key in ("dataset", "parties", "mode"):
        if asked[key] != trained[key]:
            raise KeptError(
                f"run {cfg.predict.run!r} was trained with {key} = {trained[key]!r}, but this "
                f"predict run says {asked[key]!r}; predict with the training's run config plus "
                "the predict-* keys"
            )


def _linkage(cfg: RunConfig, kept: KeptRun, ids: np.ndarray, seconds: dict[str, float]):
    """The new records' linkage: the service's answer to the query (``predict-linkage``), which
    must be the run's job and these identifiers, or linked here as the run's job was."""
    if not cfg.predict.linkage:
        return link_here(kept, ids, seconds)
    t0 = time.perf_counter()
    path = Path(cfg.predict.linkage).expanduser().resolve()
    if not path.exists():
        raise KeptError(f"run-config 'predict-linkage': no linkage answer at {path}")
    linkage = read_primary(path)
    job = kept.meta["job_id"]
    if linkage.job_id != job:
        raise KeptError(
            f"predict-linkage {path} answers linkage job {linkage.job_id}, but run {cfg.predict.run!r} "
            f"was trained on job {job}; query that job"
        )
    if queried_raw_digest(path, linkage) != identifier_digest(ids):
        raise KeptError(
            f"predict-linkage {path} was queried with other identifiers than the {len(ids)} records of "
            f"{cfg.predict.input} (digest differs); query the service with this input"
        )
    if set(linkage.links) != set(kept.meta["secondaries"]):
        raise KeptError(
            f"predict-linkage {path} links {sorted(linkage.links)}, the run {sorted(kept.meta['secondaries'])}"
        )
    seconds["query"] = time.perf_counter() - t0
    return linkage if kept.settings.model.sort_gate else unsorted(linkage, kept.cfg.train.seed)


def _embed_remote(grid: Grid, cfg: RunConfig, kept: KeptRun, linkage, seconds: dict[str, float]) -> dict:
    """Each secondary's embeddings (T, c) of its sorted tokens (T,), from its kept model.
    ``connect``: the handshake, which in simulation includes starting the ClientApps."""
    t0 = time.perf_counter()
    nodes = handshake(
        grid, sorted(linkage.links), kept.meta["job_id"], cfg.runtime.node_timeout, action="predict_hello"
    )
    seconds["connect"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    channel = FlowerChannel(grid, nodes, cfg.runtime.node_timeout, kept.meta["job_id"])
    tokens = {p: np.unique(link.tokens) for p, link in linkage.links.items()}
    emb = channel.embed_kept(cfg.predict.run, tokens, kept.attempt)
    c, dtype = kept.settings.model.cut_dim, kept.cfg.torch_dtype()
    for p, e in emb.items():  # as training held them: (T, c) in the run's dtype, finite, within the bound
        check_block(e, Expect(f"party {p!r}", "embeddings", "query.embed_kept", (len(tokens[p]), c), dtype))
    seconds["embed"] = time.perf_counter() - t0
    return {p: (tokens[p], emb[p]) for p in tokens}
