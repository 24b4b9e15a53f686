"""What every ClientApp handler reads first: the run config with the node's own overrides, and
the folders the party reads and writes, which come from its own configuration only.

A deployed party (node config "party") uses its node config's "data-dir", "linkage-dir",
"cache-dir", "checkpoint-dir" and "model-dir", or a default under its own working folder; the
run config's paths (set by whoever starts the run: the primary) are not used. In simulation one
operator plays every party and the run config's paths are its own. Messages name at most a run
or a linkage job (plain names checked by app/messages.py), never a folder."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context

from app.config import ConfigError, RunConfig
from app.messages import ProtocolError
from linkage.protection import DEFAULT_LEVEL, LEVELS

DEFENCE_KEYS = ("embedding-clip", "embedding-noise")  # node config: the secondary's own embedding defence
DEFAULT_DIRS = {"linkage-dir": "linkage", "checkpoint-dir": "checkpoints"}  # under the party's working folder


def deployed(context: Context) -> bool:
    return "party" in context.node_config


def node_run_config(context: Context) -> RunConfig:
    """The run's config; a deployed party's paths are its own (node config "data-dir", else "":
    the loaders' default), never the run config's."""
    kept = getattr(context, "live_config", None)  # a party worker's, resolved at its first message
    if kept is not None:
        return kept
    cfg = with_node_paths(RunConfig.from_flower(context.run_config), context)
    if hasattr(context, "live_config"):
        context.live_config = cfg
    return cfg


def with_node_paths(cfg: RunConfig, context: Context) -> RunConfig:
    """``cfg`` with this node's own paths (see :func:`node_run_config`) and its own embedding
    defence (:func:`own_defence`)."""
    cfg = own_defence(cfg, context)
    data_dir = str(context.node_config.get("data-dir", ""))
    if deployed(context):
        return cfg.replace(data_dir=data_dir, linkage_dir="", out_dir="")
    return cfg.replace(data_dir=data_dir) if data_dir else cfg


def own_defence(cfg: RunConfig, context: Context) -> RunConfig:
    """A secondary protects its features itself, never as the primary's run config says: its
    node config's "embedding-clip" and "embedding-noise" (strategies/vfl/defences.py), else its
    "privacy" level (a deployed party that states none gets the default level, whatever the run
    config asks). In a simulation (no node "party") one user plays every party: the run config's."""
    own = {k: context.node_config[k] for k in DEFENCE_KEYS if k in context.node_config}
    level = str(context.node_config.get("privacy", DEFAULT_LEVEL if deployed(context) else cfg.exchange_level()))
    if level not in LEVELS:
        raise ConfigError(f"node config 'privacy' must be one of {list(LEVELS)}, got {level!r}")
    cfg = cfg.replace(exchange_privacy=level)
    if not own:
        return cfg
    values = {"embedding_clip": 0.0, "embedding_noise": 0.0} | {k.replace("-", "_"): float(v) for k, v in own.items()}
    out = cfg.replace(**values)
    out.validate()  # noise without a clip: refused by name
    return out


def own_dir(context: Context, key: str) -> Path:
    """A deployed party's folder ``key``: its node config's, else <working folder>/<default>."""
    value = str(context.node_config.get(key, ""))
    return Path(value) if value else Path.cwd() / DEFAULT_DIRS[key]


def simulated_linkage_dir(cfg: RunConfig, job_id: str) -> Path:
    """Where a simulation's in-process linkage keeps a job (app/vfl/parties.py:linkage_job)."""
    return cfg.out_path() / "linkage" / job_id


def linkage_dir(cfg: RunConfig, context: Context, job_id: str) -> Path:
    """The folder holding this party's secondary-<party>.npz of linkage job ``job_id``."""
    if deployed(context):
        return own_dir(context, "linkage-dir")
    return Path(cfg.link.linkage_dir).resolve() if cfg.link.linkage_dir else simulated_linkage_dir(cfg, job_id)


MAX_RUNS = 32  # run folders a deployed party keeps for the primary in each of its folders (node config max-runs)


def bounded_run_dir(root: Path, run: str, context: Context) -> Path:
    """<root>/<run>, refused when it would be one run folder more than the party keeps (its node
    config ``max-runs``, default MAX_RUNS): every run name a primary sends (a checkpoint, a kept
    model, a final model) is a folder on this party's disk, so their count is bounded."""
    cap = int(context.node_config.get("max-runs", MAX_RUNS))
    folder = root / run
    if not folder.exists() and root.is_dir() and sum(1 for p in root.iterdir() if p.is_dir()) >= cap:
        raise ProtocolError(
            f"the primary asked for run folder {run!r}, but {root} already holds {cap} runs' folders, "
            "the most this party keeps for others (node config max-runs): remove finished runs' folders "
            "or raise max-runs"
        )
    return folder


def checkpoint_dir(cfg: RunConfig, context: Context, run: str, party: str) -> Path:
    """Deployed: <checkpoint-dir>/<run>/<party>; simulation: <out-dir>/<run>/checkpoint/<party>."""
    if deployed(context):
        return bounded_run_dir(own_dir(context, "checkpoint-dir"), run, context) / party
    return cfg.out_path() / run / "checkpoint" / party


def model_dir(cfg: RunConfig, context: Context, run: str, party: str) -> Path:
    """Where the final state (app/kept.py party_model_file) goes. Deployed:
    <model-dir>/<run>/<party> (without "model-dir": the checkpoint folder's root); simulation:
    <out-dir>/<run>/<party>, beside the primary's."""
    if not deployed(context):
        return cfg.out_path() / run / party
    key = "model-dir" if context.node_config.get("model-dir") else "checkpoint-dir"
    return bounded_run_dir(own_dir(context, key), run, context) / party
