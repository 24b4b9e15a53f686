"""Issue 28, item 6: a stranger's wrong secrets never abort another party's commands.

Every party on one host reaches the service from 127.0.0.1, as parties behind one NAT or proxy
do. Before the fix, ten wrong secrets from an address locked that whole address, and the client
treated 429 as fatal, so the primary's `start --fetch` exited 1 while its job ran on.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from linkage_server import client as client_module
from linkage_server.client import LinkageClient, ServiceError
from linkage_server.local import free_port
from tests.test_service import ADMIN, planted, service
from tests.test_service_cli import cli


def test_wrong_secrets_from_the_same_address_do_not_lock_the_right_party_out(tmp_path):
    """Failed before the fix: `start --fetch` exited 1 with 'too many failed authentications'."""
    prim_ids, base = planted(m=60, n=30)
    np.save(tmp_path / "p.npy", prim_ids)
    np.save(tmp_path / "s.npy", base)
    (tmp_path / "admin.token").write_text(ADMIN)
    with service(tmp_path / "svc", free_port(), "--auth-failures", "3", "--auth-window", "60") as url:
        made = json.loads(
            cli(
                "create-job",
                "--url",
                url,
                "--admin-token-file",
                str(tmp_path / "admin.token"),
                "--primary",
                "p",
                "--secondary",
                "s",
                "--secrets-dir",
                str(tmp_path),
            ).stdout
        )
        job = made["job"]

        def party(name: str, *args: str, check: bool = True):
            return cli(
                *args,
                "--url",
                url,
                "--job",
                job,
                "--party",
                name,
                "--secret-file",
                str(tmp_path / f"{job}-{name}.secret"),
                check=check,
            )

        party("s", "link", "--npy", str(tmp_path / "s.npy"))
        party("p", "link", "--npy", str(tmp_path / "p.npy"))
        with httpx.Client(base_url=url) as stranger:  # same address as every party here: 127.0.0.1
            answers = [
                stranger.get(f"/jobs/{job}", headers={"Authorization": f"Bearer wrong-{i}"}).status_code
                for i in range(6)
            ]
        assert answers[:3] == [403] * 3 and set(answers[3:]) == {429}  # the stranger is limited ...
        started = party("p", "start", "--k", "3", "--fetch", str(tmp_path / "out"), check=False)
        assert started.returncode == 0, started.stderr  # ... the primary is not
        assert (tmp_path / "out" / "primary.npz").exists()
        assert party("s", "fetch", "--out", str(tmp_path / "out")).returncode == 0


def _client(answers: list[httpx.Response]) -> tuple[LinkageClient, list[str]]:
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return answers.pop(0)

    c = LinkageClient("http://service.test", "0123456789abcdef", "p", "secret")
    c._http = httpx.Client(base_url="http://service.test", transport=httpx.MockTransport(handler))
    return c, sent


def test_the_client_honours_retry_after_with_bounded_retries(monkeypatch):
    waits = []
    monkeypatch.setattr(client_module.time, "sleep", waits.append)
    limited = httpx.Response(429, headers={"Retry-After": "2"}, json={"detail": "too many failed authentications"})
    ok = httpx.Response(200, json={"state": "done"})
    c, sent = _client([limited, limited, ok])
    assert c.status() == {"state": "done"} and len(sent) == 3 and waits == [2.0, 2.0]
    # a 429 without Retry-After (a spent query budget) is final: not retried
    c, sent = _client([httpx.Response(429, json={"detail": "query budget"})])
    with pytest.raises(ServiceError, match="query budget"):
        c.status()
    assert len(sent) == 1
    # bounded: after RETRIES_429 waits the last answer is the error
    waits.clear()
    c, sent = _client([limited] * (client_module.RETRIES_429 + 1))
    with pytest.raises(ServiceError, match="429"):
        c.status()
    assert len(sent) == client_module.RETRIES_429 + 1 and len(waits) == client_module.RETRIES_429
    # a Retry-After that would keep a command waiting for long is cut to MAX_RETRY_WAIT
    waits.clear()
    c, _ = _client([httpx.Response(429, headers={"Retry-After": "86400"}), ok])
    c.status()
    assert waits == [client_module.MAX_RETRY_WAIT]
