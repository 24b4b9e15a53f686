"""When training stops, one value for both modes' plans (strategies/vfl/protocol.py and
strategies/entity_aug/model.py TrainPlan), built once from the run config (app/config.py
``RunConfig.stop_rule``) and read by the rules of strategies/records.py. A new stopping key is
a field here, its run-config field and its rule there."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    epochs: int  # the maximum
    patience: int = 0  # > 0: stop after this many epochs without a better validation value; 0 = fixed epochs
    max_steps: int = 0  # > 0: stop after this many steps (tests); 0 = no limit
    max_minutes: float = 0.0  # > 0: stop after the epoch in which the records' seconds reached it
