"""A deployed SuperNode runs every message in a fresh ClientApp process (Flower 1.41), so what
the ClientApp imports is paid per message: it must not pull in the data stack (pandas, sklearn,
scipy: about 2 s of a 5 s import on this VM, bench/message_cost.py). The handlers that need
data import it when they load it."""

import json

from tests.fresh_python import fresh_python

HEAVY = ("pandas", "sklearn", "scipy")


def _heavy_modules_after(statements: str) -> tuple[list[str], list[str]]:
    """In a fresh interpreter: the heavy modules imported at the statements' first printed list,
    and at their end."""
    code = f"import json, sys\nHEAVY = {HEAVY!r}\n{statements}\nprint(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))"
    out = fresh_python(code)
    lists = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    return lists[0], lists[-1]


def test_the_clientapp_imports_no_data_stack_until_it_loads_data():
    before, after = _heavy_modules_after(
        "import app.client_app\nprint(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))\n"
        "from app.config import RunConfig\nfrom app.data import load_data\n"
        "print(load_data(RunConfig.of(dataset='synthetic', n_rows=200)).name)"
    )
    assert before == []
    assert after == ["pandas", "scipy", "sklearn"]  # the lazy imports are still there when needed


def test_the_clientapp_answers_a_handshake_without_torch_and_loads_it_for_a_step():
    """A deployed training run's only Flower message to a secondary on the direct transport is its
    handshake (`query.direct_open`), and predict's first is `query.predict_hello`: their process
    imports no torch (~1.2 s of CPU a message); a handler that needs the model still gets it."""
    code = (
        "import sys\nfrom flwr.app import Context, Message, RecordDict, ConfigRecord\n"
        "from flwr.supercore.task_identity import TaskIdentity\n"
        "TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 1, 0, 1  # as a ClientApp process's\n"
        "import app.client_app\nfrom app.vfl import handshake\n"
        "ctx = Context(run_id=1, node_id=1, node_config={'party': 'shops'}, state=RecordDict(), run_config={})\n"
        "msg = Message(RecordDict({'predict_hello': ConfigRecord({'job_id': 'j1'})}), dst_node_id=1, message_type='query.predict_hello')\n"
        "reply = handshake.predict_hello(msg, ctx)\n"
        "print(reply.content.config_records['predict_hello']['party'], 'torch' in sys.modules)\n"
        "from app.vfl import client\nprint('torch' in sys.modules)"
    )
    out = fresh_python(code)
    assert out.split() == ["shops", "False", "True"], out
