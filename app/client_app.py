"""ClientApp of a secondary party: one handler per protocol step, for both training modes
(FedSim: app/vfl/client.py; Entity Augmentation: app/entity_aug/client.py).

A deployed SuperNode runs every message in a fresh ClientApp process (Flower 1.42), so this
module imports what each message needs when it comes: the handshakes (app/vfl/handshake.py,
app/entity_aug/handshake.py) need no model and no torch; the others load their mode's handlers
(torch and the party's model) at their first message."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from app.entity_aug import handshake as ea_handshake
from app.vfl import handshake
from files.private import private_umask

Handler = Callable[[Message, Context], Message]


def private_files(msg: Message, context: Context, call_next) -> Message:
    """Every handler writes its party's models, checkpoints and caches 0600 in 0700 folders, whatever
    umask the SuperNode (or simulation) that runs this app was started with (files.private)."""
    private_umask()
    return call_next(msg, context)


def _vfl_client() -> ModuleType:
    from app.vfl import client  # lazy: torch and the party's model (~1.2 s a process), for these messages only

    return client


def _ea_client() -> ModuleType:
    from app.entity_aug import client  # lazy: as _vfl_client's

    return client


def on_first_message(load: Callable[[], ModuleType], name: str) -> Handler:
    """The handler ``name`` of the module ``load`` imports, imported when a message needs it."""

    def on_message(msg: Message, context: Context) -> Message:
        return getattr(load(), name)(msg, context)

    on_message.__name__ = on_message.__qualname__ = name
    return on_message


def _vfl(name: str) -> Handler:
    return on_first_message(_vfl_client, name)


def _ea(name: str) -> Handler:
    return on_first_message(_ea_client, name)


app = ClientApp(mods=[private_files])

# FedSim and its baselines (run-config mode = "vfl")
app.query("hello")(_vfl("hello"))
app.train("step")(_vfl("step"))
app.query("finish")(_vfl("finish"))
app.query("restore")(_vfl("restore"))
app.query("ping")(handshake.ping)
app.query("direct_open")(handshake.direct_open)
app.query("keep")(_vfl("keep"))
app.query("predict_hello")(handshake.predict_hello)
app.query("embed_kept")(_vfl("embed_kept"))

# Entity Augmentation (run-config mode = "entity-aug")
app.query("ea_ids")(_ea("ids"))
app.query("ea_hello")(_ea("hello"))
app.train("ea_step")(_ea("step"))
app.query("ea_embed")(_ea("embed"))
app.query("ea_finish")(_ea("finish"))
app.query("ea_keep")(_ea("keep"))
app.query("ea_predict_hello")(ea_handshake.predict_hello)
app.query("ea_embed_kept")(_ea("embed_kept"))
app.query("ea_direct_open")(ea_handshake.direct_open)
