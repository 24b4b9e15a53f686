"""ServerApp of the primary party (labels): reads the run config and drives the strategy."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from app.config import RunConfig
from app.entity_aug.server import run_ea_host
from app.vfl.server import run_primary

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = RunConfig.from_flower(context.run_config)
    if cfg.mode == "entity-aug":
        run_ea_host(grid, cfg)
    else:
        run_primary(grid, cfg)
