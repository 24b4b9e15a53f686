"""ServerApp of the primary party (labels): reads the run config once and runs its mode
(app/modes.py: FedSim and baselines in app/vfl/, Entity Augmentation in app/entity_aug/)."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from app import modes
from app.config import RunConfig
from files.private import private_umask

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    private_umask()  # the run's folder (models, linkage, metrics) is the primary's alone, whatever the SuperLink's umask
    modes.serve(grid, RunConfig.from_flower(context.run_config))
