"""What every ClientApp handler reads first: the run config, with the node's own overrides."""

from __future__ import annotations

import dataclasses

from flwr.app import Context

from app.config import RunConfig


def node_run_config(context: Context) -> RunConfig:
    """The run's config; a deployed party's own data location (node config "data-dir") wins."""
    cfg = RunConfig.from_flower(context.run_config)
    data_dir = str(context.node_config.get("data-dir", ""))
    return dataclasses.replace(cfg, data_dir=data_dir) if data_dir else cfg
