"""Issue 28, item 8: smaller holes, each reproduced first.

- finite but huge identifiers (1e200) were accepted and failed the job with "internal error:
  IndexError": now refused at upload, by name;
- `deploy down` signalled whatever process a stale deploy.json's pid named, even after the pid
  was reused: now only a process with the recorded start time is signalled.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from deploy.processes import Proc, _alive, ours, start_time, stop
from linkage_server.jobs import JobStore
from linkage_server.uploads import UploadError, to_npy


@pytest.mark.parametrize("value", [1e200, -1e101])
def test_huge_finite_identifiers_are_refused_at_upload_by_name(tmp_path, value):
    store = JobStore(tmp_path)
    job, _ = store.create("p", ["s"])
    ids = np.random.default_rng(0).normal(size=(20, 2))
    ids[[3, 7], 1] = value
    with pytest.raises(
        UploadError, match=r"2 identifier row\(s\) hold a number beyond \+/-1e\+100 \(first rows: \[3, 7\]\)"
    ):
        store.upload(job, "p", to_npy(ids))
    assert store.meta(job)["uploads"] == {}  # nothing kept
    store.upload(job, "p", to_npy(ids.clip(-1e99, 1e99)))  # large but workable values pass


def test_down_never_signals_a_process_that_took_a_stale_pid(tmp_path):
    """A deploy.json from a deployment whose processes are gone; meanwhile the OS gave one of its
    pids to an unrelated process (played by a fresh `sleep`, whose start time differs from the
    recorded one). Failed before the fix: `down` killed the unrelated process's whole session."""
    from deploy.commands import Deployment, down

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        stale = Proc(bystander.pid, 1, str(tmp_path / "x.log"), started=start_time(bystander.pid) - 1)
        dep = Deployment(str(tmp_path), "house3", "", False, ["a"], superlink=stale, service=None, nodes={})
        dep.save()
        assert not ours(stale)
        assert down(tmp_path) == 0 and not stop(stale)
        time.sleep(0.5)  # a signal would have been delivered by now; the bystander is checked after
        assert bystander.poll() is None and _alive(bystander.pid)
        # an old deploy.json without start times names no process for certain: never signalled either
        raw = json.loads((tmp_path / "deploy.json").read_text())
        del raw["superlink"]["started"]
        (tmp_path / "deploy.json").write_text(json.dumps(raw))
        assert down(tmp_path) == 0 and bystander.poll() is None
        # the process that really is the recorded one is stopped
        assert stop(Proc(bystander.pid, 1, "", started=start_time(bystander.pid)))
        assert bystander.wait(timeout=30) is not None
    finally:
        bystander.kill()
        bystander.wait()


class Stop(BaseException):
    """The service's process ending mid-job (not an error the job handles)."""


def test_a_resumed_jobs_seconds_count_every_process_that_ran_it(tmp_path, monkeypatch):
    """job.json "seconds" after a resume showed only the last process's search. Here the first
    process's clock runs 1000 s a reading and it stops after its first chunk; the second's runs 1 s
    a reading. Failed before the fix: the search took under 100 s by the record."""
    import linkage_server.jobs as jobs
    from linkage_server.params import JobParams

    store = JobStore(tmp_path, chunk_rows=20)
    job, _ = store.create("p", ["s"])
    rng = np.random.default_rng(1)
    store.upload(job, "p", to_npy(rng.normal(size=(60, 2))))
    store.upload(job, "s", to_npy(rng.normal(size=(30, 2))))
    store.start(job, JobParams.parse({"metric": "euclidean", "k": 3}))

    def clock(step: float):
        readings = iter(range(1, 10_000))
        return lambda: step * next(readings)

    tick = JobStore.tick

    def stop_after_first(self, *args):
        tick(self, *args)
        raise Stop

    monkeypatch.setattr(jobs.time, "perf_counter", clock(1000.0))
    monkeypatch.setattr(JobStore, "tick", stop_after_first)
    with pytest.raises(Stop):
        store.run(job)
    first = store.meta(job)
    assert first["state"] == "running" and first["searched_seconds"] >= 1000
    monkeypatch.setattr(jobs.time, "perf_counter", clock(1.0))
    monkeypatch.setattr(JobStore, "tick", tick)
    store.run(job)  # the restarted service resumes it from its finished chunk
    meta = store.meta(job)
    assert meta["state"] == "done" and meta["seconds"]["search"] >= first["searched_seconds"]


SLOW_SUPERLINK = """#!PYTHON
import http.server, sys, threading, time
port = int(sys.argv[sys.argv.index("--port") + 1])
time.sleep(3)  # a SuperLink slow to come up, as on a loaded machine
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Health)
threading.Timer(60, server.shutdown).start()  # stops by itself
server.serve_forever()
"""


def test_the_local_superlink_is_given_longer_than_flowers_fixed_start_up_wait(tmp_path):
    """Under load `flwr run` failed with "Failed to start local SuperLink within 15s" (Flower's
    constant). deploy.localsim starts it with Flower's own launcher and its own wait: here a
    SuperLink that takes 3 s is refused with a 1 s wait (Flower's situation) and found with 30 s."""
    import os

    from deploy.localsim import free_port, start_superlink, stop_superlink

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "flower-superlink"
    fake.write_text(SLOW_SUPERLINK.replace("PYTHON", sys.executable, 1))
    fake.chmod(0o755)
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FLWR_HOME": str(tmp_path / "home"),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
    }
    try:
        with pytest.raises(RuntimeError, match="within 1s"):
            start_superlink(env, timeout=1.0)
        start_superlink(env, timeout=30.0)
        import httpx

        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).is_success
    finally:
        stop_superlink(port)
