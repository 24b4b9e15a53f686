"""ClientApp side of Entity Augmentation (``mode = "entity-aug"``): one secondary (the EA paper's
guest) per node.

The secondary's model, optimiser state and the ids of its last activation live in
``context.state`` between messages; registered in app/client_app.py as
``query.ea_hello``, ``train.ea_step``, ``query.ea_embed``, ``query.ea_keep`` (the state of a best
epoch into the secondary's own model folder) and ``query.ea_finish``; predict over Flower:
``query.ea_embed_kept`` (embeddings from the kept state). The messages that need no model
(``query.ea_direct_open``, ``query.ea_predict_hello``) are app/entity_aug/handshake.py's.

The training handlers are content handlers made ClientApp handlers by app.messages.flower; the
direct transport's party worker (app/party_worker.py) answers the same ones (:data:`DIRECT`)
over its own link, with the party in memory.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from app import messages, node, threads
from app.config import RunConfig
from app.entity_aug import id_exchange
from app.entity_aug.handshake import secondary_name
from app.entity_aug.parties import (
    PartyInputs,
    act_content,
    build_party,
    check_ids,
    read_ids,
    read_kept_request,
    read_request,
    reply_content,
)
from app.kept import ATTEMPT_KEYS, drop_other_attempts, party_kept_file, party_model_file
from app.node import node_run_config
from app.party_state import load_optimizer_state, optimizer_state_records
from app.party_worker import packed, records
from files.private import private_dir
from strategies.entity_aug.channel import StepReply, StepRequest
from strategies.entity_aug.model import BatchSchedule
from strategies.entity_aug.secondary import SecondaryParty
from strategies.torch_threads import torch_threads


def restore(cfg: RunConfig, context: Context) -> SecondaryParty:
    """The party as the last message left it: in memory in a direct transport's worker
    (app/party_worker.py:LiveContext), else rebuilt from ``context.state``."""
    live = getattr(context, "live_party", None)
    if live is not None:
        return live
    meta = context.state.config_records.get("ea_party")
    if meta is None:
        raise RuntimeError("this node has not been introduced: the primary must send query.ea_hello first")
    party = build_party(cfg, str(meta["party"]), inputs=_inputs(context))
    if "ea_model" in context.state.array_records:
        party.model.load_state_dict(context.state.array_records["ea_model"].to_torch_state_dict())
        load_optimizer_state(
            party.optimizer,
            context.state.array_records["ea_optim_arrays"],
            context.state.config_records["ea_optim_scalars"],
        )
        pending = context.state.array_records["ea_pending"]["ids"].numpy()
        party.pending = pending if bool(meta["has_pending"]) else None
        party.applied = int(meta.get("applied", 0))
    party.load_shield_state(dict(context.state.config_records.get("ea_shield", {})))
    return party


def _inputs(context: Context) -> PartyInputs:
    """The secondary's data and batch schedule as its hello stored them (:func:`persist`)."""
    arrays, sched = context.state.array_records["ea_inputs"], context.state.config_records["ea_schedule"]
    return PartyInputs(
        arrays["x"].numpy(),
        BatchSchedule(
            arrays["records"].numpy(), int(sched["order_seed"]), int(sched["batch_size"]), int(sched["steps_per_epoch"])
        ),
        float(sched["delay"]),
    )


def _persist_inputs(party: SecondaryParty, context: Context) -> None:
    """Once per run (the first persist): the feature block and the batch schedule, which never change."""
    if "ea_inputs" in context.state.array_records:
        return
    x = np.ascontiguousarray(party.x.cpu().numpy())
    context.state.array_records["ea_inputs"] = ArrayRecord(
        {"x": Array(x), "records": Array(np.ascontiguousarray(party.schedule.records, dtype=np.int64))}
    )
    context.state.config_records["ea_schedule"] = ConfigRecord(
        {
            "order_seed": int(party.schedule.order_seed),
            "batch_size": party.schedule.batch_size,
            "steps_per_epoch": party.schedule.steps_per_epoch,
            "delay": float(party.fault_delay),
        }
    )


def persist(party: SecondaryParty, context: Context) -> None:
    if hasattr(context, "live_party"):  # the worker outlives the message: nothing to copy
        context.live_party = party
        return
    _persist_inputs(party, context)
    context.state.config_records["ea_party"] = ConfigRecord(
        {"party": party.name, "has_pending": party.pending is not None, "applied": party.applied}
    )
    if party.row_shield is not None:
        context.state.config_records["ea_shield"] = ConfigRecord(party.shield_state())
    context.state.array_records["ea_model"] = ArrayRecord({k: v.cpu() for k, v in party.model.state_dict().items()})
    arrays, scalars = optimizer_state_records(party.optimizer)
    context.state.array_records["ea_optim_arrays"] = arrays
    context.state.config_records["ea_optim_scalars"] = scalars
    pending = party.pending if party.pending is not None else np.empty(0, dtype=np.int64)
    context.state.array_records["ea_pending"] = ArrayRecord(
        {"ids": Array(np.ascontiguousarray(pending, dtype=np.int64))}
    )


def _ids(content: RecordDict, context: Context) -> RecordDict:
    """The id exchange (app/entity_aug/id_exchange.py): this party's ids blinded, the label
    holder's reblinded; how many ids it was sent is kept to bound the plan."""
    cfg = node_run_config(context)
    reply, asked = id_exchange.answer(cfg, secondary_name(cfg, context), content)
    context.state.config_records["ea_ids"] = ConfigRecord({"asked": asked})
    return reply


def _hello(content: RecordDict, context: Context) -> RecordDict:
    """Build the party: from the run's data, or (parties that met by their ids) from the label
    holder's plan and this party's own CSV, the plan kept to rebuild its block at predict."""
    cfg = node_run_config(context)
    name = secondary_name(cfg, context)
    if id_exchange.exchanged(cfg):
        met = context.state.config_records.get("ea_ids")
        if met is None:
            raise messages.ProtocolError("query.ea_hello before query.ea_ids: this party meets the run by its ids")
        inputs, _ = id_exchange.plan_inputs(cfg, name, content, int(met["asked"]))
        party = build_party(cfg, name, inputs=inputs)
        id_exchange.store_plan(content, context.state)
    else:
        messages.expect_fields(content.config_records["ea_hello"], set(), "query.ea_hello")
        party = build_party(cfg, name)
    persist(party, context)
    return RecordDict({"ea_hello": ConfigRecord({"party": party.name, "records": int(len(party.schedule.records))})})


def _step(content: RecordDict, context: Context) -> RecordDict:
    return reply_content(_step_party(read_request(content), context))


def _step_packed(codec: tuple[dict, dict], context: Context) -> tuple[dict, dict]:
    """:func:`_step` over a direct link: the request and reply in their core codec."""
    return _step_party(StepRequest.decode(*codec), context).encode()


def _step_party(req: StepRequest, context: Context) -> StepReply:
    cfg = node_run_config(context)
    with torch_threads(threads.entity_aug_secondary(cfg.runtime.threads)):
        party = restore(cfg, context)
        reply = party.step(req)  # the party checks the gradient before applying it (its dtype, shape, bound)
        persist(party, context)
    return reply


def _embed(content: RecordDict, context: Context) -> RecordDict:
    party = restore(node_run_config(context), context)
    return act_content(party.embed(read_ids(content, party.x.shape[0], "query.ea_embed")))


def _finish(content: RecordDict, context: Context) -> RecordDict:
    """The secondary's final model into its own folder for the run (app/node.py:model_dir)."""
    cfg = node_run_config(context)
    got = messages.read_named(content, "ea_finish", "query.ea_finish", names=("run",), optional=ATTEMPT_KEYS)
    party = restore(cfg, context)
    folder = node.model_dir(cfg, context, got["run"], party.name)
    private_dir(folder)
    torch.save(party.model.state_dict(), folder / party_model_file(got["attempt"]))  # beside a finished run's
    drop_other_attempts(folder, {k: got[k] for k in ATTEMPT_KEYS})  # the run's other kept states go
    return RecordDict()


def _keep(content: RecordDict, context: Context) -> RecordDict:
    """The primary's evaluation of ``epoch`` was the best so far: this secondary's state as that
    evaluation used it into its own model folder for the run (app/entity_aug/kept.py)."""
    cfg = node_run_config(context)
    got = messages.read_named(
        content, "ea_keep", "query.ea_keep", names=("run", "attempt"), ints=("epoch",), optional=("previous",)
    )
    party = restore(cfg, context)
    from app.entity_aug.kept import save_secondary_state  # lazy: the kept state module loads the data stack

    folder = node.model_dir(cfg, context, got["run"], party.name)
    save_secondary_state(
        folder / party_kept_file(got["attempt"]),
        got["epoch"],
        party.state_dict(),  # its model's and its shield's
        party.x.cpu().numpy(),
        id_exchange.stored_plan(context.state),  # a party met by its ids: the plan that rebuilds its block
    )
    drop_other_attempts(folder, {k: got[k] for k in ATTEMPT_KEYS})  # bounded, whatever names come
    return RecordDict()


ids, hello, step, embed, finish, keep = map(messages.flower, (_ids, _hello, _step, _embed, _finish, _keep))

# what the party worker answers over the direct link: the same handlers, its own context
DIRECT = {
    "query.ea_ids": records(_ids),
    "query.ea_hello": records(_hello),
    "train.ea_step": packed(_step_packed, "train.ea_step"),  # every step: without Flower's records
    "query.ea_embed": records(_embed),
    "query.ea_keep": records(_keep),
    "query.ea_finish": records(_finish),
}


def embed_kept(msg: Message, context: Context) -> Message:
    """Predict: the entities' activations from the state this secondary kept for the run, over the
    features it was trained on (refused by name when they changed), as training evaluated."""
    cfg = node_run_config(context)
    kept_run, ids = read_kept_request(msg.content)
    with torch_threads(1):
        from app.entity_aug import kept  # lazy: the kept state module loads the data stack

        name = secondary_name(cfg, context)
        path = node.model_dir(cfg, context, kept_run["run"], name) / party_kept_file(kept_run["attempt"])
        plan = kept.secondary_plan(path, name) if id_exchange.exchanged(cfg) else None
        party = build_party(cfg, name, inputs=None if plan is None else id_exchange.replan_inputs(cfg, name, plan))
        _, state = kept.load_secondary_state(path, party.name, party.x.cpu().numpy())
        party.load_state_dict(state)
        act = party.embed(check_ids(ids, party.x.shape[0], "query.ea_embed_kept"))
    return Message(act_content(act), reply_to=msg)
