"""The Entity Augmentation run with every party in this process (the sweeps' engine), built
from a RunConfig exactly as the Flower apps build it."""

from __future__ import annotations

from pathlib import Path

from app import run_status
from app.config import RunConfig
from app.entity_aug.parties import build_party, ea_data
from app.entity_aug.server import run_ea
from strategies.entity_aug.channel import LocalChannel


def run_ea_in_process(cfg: RunConfig, out: Path) -> dict:
    """The run with every party in this process (threads only when a secondary timeout is set),
    recorded in <out>/status.json (app/run_status.py)."""
    with run_status.tracked(Path(out), "inprocess"):
        data = ea_data(cfg)
        channel = LocalChannel(
            {p: build_party(cfg, p, data) for p in data.parties}, threaded=cfg.ea.secondary_timeout > 0
        )
        try:
            return run_ea(cfg, data, channel, Path(out), "inprocess")
        finally:
            channel.close()
