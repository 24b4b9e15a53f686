"""Entity Augmentation on parties that each hold only their own CSV (dataset csv whose
parties.toml declares ``entity_id``): the guests' ids meet the label holder's in a private set
intersection (linkage/psi.py), never in one process, and each guest gets its plan (its rows of
the run's entities, its batch schedule) from the label holder. No party reads another's file.

    exchanged(cfg) -> bool                                 a run whose guests are met this way
    check(cfg) -> [secondary]                              fedsim train's check, with the files at hand
  the label holder (app/entity_aug/server.py):
    Exchange.start(cfg); exchange.request                  its ids blinded: what every guest is asked
    exchange.matches(answers {party: content})             -> ({party: (n_p,) its row of each of the
                                                              label holder's rows, -1 none}, {party: width})
    matched_data(cfg, matches, widths) -> EntityData       the run's entities, as ea_data would give them
    plan_content(cfg, data, party) -> RecordDict           a guest's entities, its rows of them, its schedule
    save_matches(run_dir, ...) / run_data(cfg, run_dir)    the matches kept in its run: predict's entities
  a guest (app/entity_aug/client.py):
    answer(cfg, party, content) -> (RecordDict, asked)     its ids blinded, the label holder's reblinded
    plan_inputs(cfg, party, plan, asked) -> PartyInputs    its block and schedule from the plan and its CSV
    store_plan / stored_plan / replan_inputs               the plan kept with its state, its inputs at predict

Messages: ``query.ea_ids`` (request: points (n_p, 32); answer: ``ea_ids`` {party, width} and points
``own`` (n_g, 32), ``theirs`` (n_p, 32)), then ``query.ea_hello`` carrying the plan (:data:`PLAN`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from app import probes
from app.config import RunConfig
from app.entity_aug.parties import (
    PartyInputs,
    batch_schedule,
    ea_check,
    ea_data,
    ea_settings,
    order_seed,
    require_classification,
)
from app.messages import ProtocolError, expect_fields, peer_integer
from app.run_files import ID_MATCHES
from files.atomic import write_atomic
from linkage.psi import POINT, Blinder, PsiError
from linkage.psi import matches as psi_matches
from strategies.entity_aug.model import BatchSchedule

PLAN = ("entities_total", "order_seed", "batch_size", "steps_per_epoch")  # the plan's ConfigRecord fields
MAX_WIDTH = 1_000_000  # the most features a guest may declare (the label holder's bound on a peer's value)


def _spec(cfg: RunConfig) -> dict:
    from datasets.csv_parties import data_folder, read_spec  # lazy: pandas, off the ClientApp's per-message imports

    return read_spec(data_folder(cfg.data.data_dir or None))


def exchanged(cfg: RunConfig) -> bool:
    """Entity Augmentation over Flower on CSV parties that declare entity ids: each party reads only its own file."""
    return exchanged_secondaries(cfg) is not None


def exchanged_secondaries(cfg: RunConfig) -> list[str] | None:
    """:func:`secondaries` where the ids are exchanged (:func:`exchanged`), else None: parties.toml
    read once (a ClientApp asks on every message)."""
    if cfg.train.mode != "entity-aug" or cfg.data.dataset != "csv":
        return None
    spec = _spec(cfg)
    return _names(cfg, spec) if "entity_id" in spec["primary"] else None


def secondaries(cfg: RunConfig) -> list[str]:
    """The guests by name (sorted), from parties.toml alone."""
    return _names(cfg, _spec(cfg))


def _names(cfg: RunConfig, spec: dict) -> list[str]:
    return sorted(cfg.party_subset()) if cfg.party_subset() else sorted(spec["secondaries"])


def check(cfg: RunConfig) -> list[str]:
    """`fedsim train`'s check before Flower (the secondaries, by name): ea_check where this host
    holds every party's file; a label holder holding only its own (the guests' on their hosts)
    checks what its own file tells (its ids, the task), and the rest is checked at the exchange."""
    from app.data import dataset_options  # lazy: the loaders, as app.data's
    from datasets.csv_views import primary_entity_ids  # lazy: pandas

    if not exchanged(cfg):
        return ea_check(cfg).secondaries
    if cfg.party_subset():
        raise ValueError(
            f"run-config 'parties' = {cfg.party_subset()}: with entity ids every secondary of parties.toml takes "
            "part (the split is drawn from every party's ids)"
        )
    from datasets.csv_parties import data_folder  # lazy: pandas

    spec, folder = _spec(cfg), data_folder(cfg.data.data_dir or None)
    if all((folder / p["file"]).exists() for p in spec["secondaries"].values()):
        return ea_check(cfg).secondaries
    require_classification(spec["task"], "csv")
    primary_entity_ids(cfg.data.data_dir or None, dataset_options(cfg))
    return secondaries(cfg)


# ---------------------------------------------------------------------------- the label holder


@dataclass(frozen=True)
class Exchange:
    ids: np.ndarray  # (n_p,) the label holder's entity ids, row for row
    blinder: Blinder  # its secret for this run
    request: RecordDict  # query.ea_ids's content, the same for every guest

    @classmethod
    def start(cls, cfg: RunConfig) -> "Exchange":
        from app.data import dataset_options  # lazy: the loaders, as app.data's
        from datasets.csv_views import primary_entity_ids  # lazy: pandas

        ids = primary_entity_ids(cfg.data.data_dir or None, dataset_options(cfg))
        blinder = Blinder()
        points = ArrayRecord({"points": Array(blinder.blind(ids))})
        return cls(ids, blinder, RecordDict({"ea_ids": ConfigRecord({}), "ea_ids_points": points}))

    def matches(self, answers: dict[str, RecordDict]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """Each guest's row of each of the label holder's rows (-1 none), and its feature count;
        a malformed answer is refused naming the guest."""
        rows, widths = {}, {}
        for party, content in sorted(answers.items()):
            who = f"secondary {party!r}"
            rec, points = content.config_records.get("ea_ids"), content.array_records.get("ea_ids_points")
            if rec is None or points is None or set(points) != {"own", "theirs"}:
                raise ProtocolError(f"{who}: its query.ea_ids answer lacks its blinded ids")
            expect_fields(rec, {"party", "width"}, f"{who}'s query.ea_ids answer")
            width = peer_integer(rec.get("width", 0))
            if width is None:
                raise ProtocolError(f"{who}: declared width {rec.get('width')!r}, not an integer")
            if not 1 <= width <= MAX_WIDTH:
                raise ProtocolError(f"{who}: declared {width} features (1..{MAX_WIDTH} accepted)")
            theirs = points["theirs"].numpy()  # the label holder's ids, blinded by both: compared as they are
            if theirs.dtype != np.uint8 or theirs.shape != (len(self.ids), POINT):
                raise ProtocolError(
                    f"{who}: reblinded {theirs.dtype} {theirs.shape} ids, was sent ({len(self.ids)}, {POINT})"
                )
            try:
                rows[party] = psi_matches(theirs, self.blinder.reblind(points["own"].numpy(), who))
            except PsiError as err:
                raise ProtocolError(f"{who}: {err}") from None
            widths[party] = width
        return rows, widths


def matched_data(cfg: RunConfig, matches: dict[str, np.ndarray], widths: dict[str, int]):
    """The run's EntityData from the label holder's own file and the exchange's matches: the
    entities, split and schedules ea_data draws from every party's file; each guest's block a
    read-only zero view of its width (its features stay on its node)."""
    from app.data import matched_primary_data  # lazy: the loaders, as app.data's
    from datasets.overlap import entity_data  # lazy: pandas

    ds = matched_primary_data(cfg, matches)
    require_classification(ds.task, ds.name)
    return entity_data(ds, widths)


def save_matches(run_dir: Path, matches: dict[str, np.ndarray], widths: dict[str, int]) -> None:
    """The exchange's result, the label holder's alone (0600), for predict (:func:`run_data`)."""
    buf = io.BytesIO()
    np.savez(
        buf, **{f"rows:{p}": r for p, r in matches.items()}, **{f"width:{p}": np.int64(w) for p, w in widths.items()}
    )
    write_atomic(Path(run_dir) / ID_MATCHES, buf.getvalue())


def run_data(cfg: RunConfig, run_dir: Path):
    """A finished run's EntityData as its label holder had it: from the matches it kept when its
    guests met by their ids (their files never read), else ea_data."""
    path = Path(run_dir) / ID_MATCHES
    if not exchanged(cfg) or not path.exists():
        return ea_data(cfg)
    with np.load(path) as z:
        rows = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("rows:")}
        widths = {k.split(":", 1)[1]: int(z[k]) for k in z.files if k.startswith("width:")}
    return matched_data(cfg, rows, widths)


def plan_content(cfg: RunConfig, data, party: str) -> RecordDict:
    """query.ea_hello for ``party``: the entities it holds, its row of each, its batch schedule."""
    sched = batch_schedule(cfg, data, ea_settings(cfg), party)
    entities = np.flatnonzero(data.held[party])  # (m,)
    arrays = {
        "entities": entities,
        "rows": data.party_rows[party][entities],
        "records": np.asarray(sched.records, dtype=np.int64),
    }
    fields = {
        "entities_total": int(len(data.labels)),
        "order_seed": int(sched.order_seed),
        "batch_size": int(sched.batch_size),
        "steps_per_epoch": int(sched.steps_per_epoch),
    }
    return RecordDict(
        {
            "ea_hello": ConfigRecord(fields),
            "ea_plan": ArrayRecord({k: Array(np.ascontiguousarray(v, dtype=np.int64)) for k, v in arrays.items()}),
        }
    )


# ---------------------------------------------------------------------------- a guest


def own_table(cfg: RunConfig, party: str):
    """(its PartyTable, its entity ids (n_g,)) from its own CSV alone."""
    from datasets.csv_views import load_secondary_with_ids  # lazy: pandas

    return load_secondary_with_ids(cfg.data.data_dir or None, party, cfg.data.scale)


def answer(cfg: RunConfig, party: str, content: RecordDict) -> tuple[RecordDict, int]:
    """query.ea_ids's answer (its own ids blinded in its file's order, the label holder's
    reblinded in theirs) and how many ids the label holder sent."""
    expect_fields(content.config_records["ea_ids"], set(), "query.ea_ids")
    points = content.array_records["ea_ids_points"]
    expect_fields(points, {"points"}, "query.ea_ids")
    table, ids = own_table(cfg, party)
    blinder = Blinder()
    theirs = blinder.reblind(points["points"].numpy(), "the label holder")
    reply = RecordDict(
        {
            "ea_ids": ConfigRecord({"party": party, "width": int(table.n_features)}),
            "ea_ids_points": ArrayRecord({"own": Array(blinder.blind(ids)), "theirs": Array(theirs)}),
        }
    )
    return reply, len(theirs)


@dataclass(frozen=True)
class Plan:
    """A guest's part of the run: ``rows[i]`` of its file is entity ``entities[i]`` of ``total``."""

    total: int
    entities: np.ndarray  # (m,) int64
    rows: np.ndarray  # (m,) int64

    def block(self, features: np.ndarray) -> np.ndarray:
        """(total, d) float32: its features by entity, zeros where it holds none (never sent)."""
        x = np.zeros((self.total, features.shape[1]), dtype=np.float32)
        x[self.entities] = features[self.rows]
        return x


def read_plan(content: RecordDict, n_rows: int, asked: int, own: dict) -> tuple[Plan, dict, np.ndarray]:
    """(the plan, the schedule's fields, its records) of a query.ea_hello, each value checked as
    int64 against what this guest knows: entities < the ids it was sent, rows < its own rows, the
    batch size and order seed its own run config gives (``own``), and no more steps an epoch than
    the run's entities fill (each epoch draws a stream of steps x batch ids)."""
    rec, arrays = content.config_records.get("ea_hello"), content.array_records.get("ea_plan")
    if rec is None or arrays is None or set(arrays) != {"entities", "rows", "records"} or set(rec) != set(PLAN):
        raise ProtocolError("query.ea_hello: a guest met by its ids needs the label holder's plan")
    expect_fields(rec, set(PLAN), "query.ea_hello")
    fields = {k: peer_integer(rec[k]) for k in PLAN}
    for k, v in fields.items():
        _require(v is not None, f"{k} {rec[k]!r}, not an integer")
    ent, rows, records = (np.asarray(arrays[k].numpy()).astype(np.int64) for k in ("entities", "rows", "records"))
    _require(records.ndim == 1 and len(records) > 0, f"records of shape {records.shape}, expected (n,) with n > 0")
    _require(0 < fields["entities_total"] <= asked, f"{fields['entities_total']} entities, {asked} ids sent")
    _require(
        fields["batch_size"] == own["batch_size"], f"batch size {fields['batch_size']}, its run's {own['batch_size']}"
    )
    _require(fields["order_seed"] == own["order_seed"], "an order seed its run config does not give")
    steps, total = fields["steps_per_epoch"], fields["entities_total"]
    _require(1 <= steps and (steps - 1) * fields["batch_size"] < total, f"{steps} steps per epoch for {total} entities")
    _require(ent.ndim == rows.ndim == 1 and len(ent) == len(rows), f"{len(ent)} entities for {len(rows)} rows")
    _require(_unique_in(ent, fields["entities_total"]), "entities repeated or outside the run's")
    _require(_unique_in(rows, n_rows), f"rows repeated or outside this party's {n_rows}")
    _require(bool(np.isin(records, ent).all()), "training records this party does not hold")
    return Plan(fields["entities_total"], ent, rows), fields, records


def plan_inputs(cfg: RunConfig, party: str, content: RecordDict, asked: int) -> tuple[PartyInputs, Plan]:
    """The guest's PartyInputs from the label holder's plan and its own CSV (and the plan, kept with its state)."""
    table, _ = own_table(cfg, party)
    own = {"batch_size": ea_settings(cfg).batch_size, "order_seed": order_seed(cfg, party)}
    plan, fields, records = read_plan(content, len(table.features), asked, own)
    schedule = BatchSchedule(records, fields["order_seed"], fields["batch_size"], fields["steps_per_epoch"])
    delay = probes.secondary_delay() if party == secondaries(cfg)[0] else 0.0  # as party_inputs
    return PartyInputs(plan.block(table.features), schedule, delay), plan


def store_plan(content: RecordDict, state: RecordDict) -> None:
    """Keep the plan of a query.ea_hello in the guest's ``state`` (to be kept with its best state)."""
    state.config_records["ea_plan_fields"] = ConfigRecord({k: int(content.config_records["ea_hello"][k]) for k in PLAN})
    state.array_records["ea_plan"] = content.array_records["ea_plan"]


def stored_plan(state: RecordDict) -> dict | None:
    """{field: int, array: (m,) int64} of the stored plan; None for a party that met the run by its data."""
    if "ea_plan" not in state.array_records:
        return None
    arrays = state.array_records["ea_plan"]
    fields = state.config_records["ea_plan_fields"]  # one name per record in a RecordDict
    return {**{k: int(v) for k, v in fields.items()}, **{k: arrays[k].numpy() for k in arrays}}


def replan_inputs(cfg: RunConfig, party: str, kept: dict) -> PartyInputs:
    """The guest's inputs at predict from the plan it kept (:func:`stored_plan`) and its own CSV, as its hello built them."""
    arrays = {k: Array(np.ascontiguousarray(kept[k], dtype=np.int64)) for k in ("entities", "rows", "records")}
    content = RecordDict({"ea_hello": ConfigRecord({k: int(kept[k]) for k in PLAN}), "ea_plan": ArrayRecord(arrays)})
    return plan_inputs(cfg, party, content, int(kept["entities_total"]))[0]


def _unique_in(values: np.ndarray, n: int) -> bool:
    return bool(len(values) == 0 or (values.min() >= 0 and values.max() < n and len(np.unique(values)) == len(values)))


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ProtocolError(f"query.ea_hello: the label holder's plan is not this party's ({what})")
