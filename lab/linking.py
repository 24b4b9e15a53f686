"""Linking through the linkage service across separate hosts, on a ``lab.hosts.Lab``.

The service runs on its own host as its own user; each party (the primary and every secondary)
runs the same ``fedsim`` commands docs/reference.md "The linkage service" gives, on its own host, as its own
user, against the service's address over HTTPS. Every step is a command an operator would type
on that host; every file that goes from one organisation to another is a ``Lab.transfer``
(recorded), and nothing else is shared:

    service:   python -m deploy.certs creds --parties "" --host <service address>   (its CA + certificate)
    service:   python -m linkage_server serve --host <address> --port P --certfile ... --keyfile ...
    service -> each party:  creds/ca.crt as service-ca.crt    (public: to verify the service)
    service:   fedsim create-job --primary primary --secondary a ... --secrets-dir secrets
    service -> each party:  secrets/<job>-<party>.secret      (that party's only)
    party:     fedsim link --url https://<service>:P --ca-cert service-ca.crt --job J --party a --csv a.csv ...
    primary:   fedsim link ... --start --k K --wait --fetch linkage
    party:     fedsim fetch ... --out linkage

    python -m lab.linking --base /tmp/lab --secondaries a,b,c     # the whole of it, then teardown
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.hosts import Lab

REPO = Path(__file__).resolve().parents[1]
SERVICE, PRIMARY = "service", "primary"
PORT = 8471
ENV = {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class Planted:
    """Each secondary holds the primary's records, shuffled, at a little noise: the truth is known."""

    primary: np.ndarray  # (n, 2) the primary's coordinates
    secondaries: dict[str, np.ndarray]  # (n, 2) per party
    row_of: dict[str, np.ndarray]  # (n,) per party: the primary's record i is the party's row row_of[p][i]


def planted(secondaries: list[str], n: int = 300, seed: int = 0) -> Planted:
    rng = np.random.default_rng(seed)
    pts = rng.uniform(0, 100, (n, 2))  # (n, 2), ~5 apart on average: noise 0.01 keeps the partner first
    held, row_of = {}, {}
    for p in secondaries:
        perm = rng.permutation(n)  # party row j holds primary record perm[j]
        held[p] = pts[perm] + rng.normal(0, 0.01, (n, 2))
        row_of[p] = np.argsort(perm)
    return Planted(pts, held, row_of)


def _csv(path: Path, xy: np.ndarray) -> Path:
    np.savetxt(path, xy, delimiter=",", header="lat,lon", comments="", fmt="%.6f")
    return path


def place_own_data(lab: Lab, data: Planted, tmp: Path) -> None:
    """Each organisation's operator puts its own CSV (and nothing else) in its home."""
    lab.copy_in(lab.hosts[PRIMARY], _csv(tmp / f"{PRIMARY}.csv", data.primary), f"{PRIMARY}.csv")
    for p, xy in data.secondaries.items():
        lab.copy_in(lab.hosts[p], _csv(tmp / f"{p}.csv", xy), f"{p}.csv")


def fedsim(lab: Lab, host: str, *args: str, timeout: float = 300.0) -> str:
    """``python -m fedsim ARGS`` on ``host`` as its user; its stdout, or RuntimeError naming the host."""
    r = lab.run(lab.hosts[host], [sys.executable, "-m", "fedsim", *args], env=ENV, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{host}: fedsim {args[0]} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def start_service(lab: Lab, logs: Path, port: int = PORT):
    """The service operator's certificate (for its address) and the service (its log in ``logs``,
    the harness's, outside every home); returns (url, process)."""
    svc = lab.hosts[SERVICE]
    creds = [sys.executable, "-m", "deploy.certs", "creds", "--parties", "", "--host", svc.address]
    r = lab.run(svc, creds, env=ENV, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"service: deploy.certs failed:\n{r.stderr[-2000:]}")
    serve = [sys.executable, "-m", "linkage_server", "serve", "--host", svc.address, "--port", str(port)]
    serve += ["--data-dir", "linkage-data", "--admin-token-file", "admin.token"]
    serve += ["--certfile", "creds/server.crt", "--keyfile", "creds/server.key"]
    proc = lab.start(svc, serve, logs / "service.log", env=ENV)
    url = f"https://{svc.address}:{port}"
    for party in (PRIMARY, *(h for h in lab.hosts if h not in (SERVICE, PRIMARY))):
        lab.transfer(svc, lab.hosts[party], svc.home / "creds" / "ca.crt", "service-ca.crt", mode=0o644)
    _wait_ready(lab, url)
    return url, proc


def _wait_ready(lab: Lab, url: str, timeout: float = 120.0) -> None:
    """Until the service answers over HTTPS, asked from the primary's host with its CA copy."""
    probe = (
        "import sys, time, httpx\n"
        "end = time.monotonic() + float(sys.argv[2])\n"
        "while True:\n"
        "    try:\n"
        "        httpx.get(sys.argv[1] + '/health', verify='service-ca.crt', timeout=5); break\n"
        "    except httpx.TransportError:\n"
        "        if time.monotonic() > end: raise\n"
        "        time.sleep(0.3)\n"
    )
    r = lab.run(lab.hosts[PRIMARY], [sys.executable, "-c", probe, url, str(timeout)], env=ENV, timeout=timeout + 30)
    if r.returncode != 0:
        raise RuntimeError(f"the linkage service at {url} did not answer the primary:\n{r.stderr[-2000:]}")


def create_job(lab: Lab, url: str, secondaries: list[str]) -> str:
    """The service operator creates the job and sends each party its own secret only."""
    svc = lab.hosts[SERVICE]
    args = ["create-job", "--url", url, "--ca-cert", "creds/ca.crt", "--admin-token-file", "admin.token"]
    args += ["--primary", PRIMARY, *(a for p in secondaries for a in ("--secondary", p)), "--secrets-dir", "secrets"]
    job = json.loads(fedsim(lab, SERVICE, *args))["job"]
    for party in (PRIMARY, *secondaries):
        lab.transfer(svc, lab.hosts[party], svc.home / "secrets" / f"{job}-{party}.secret", "job.secret")
    return job


def party_args(url: str, job: str, party: str) -> list[str]:
    return ["--url", url, "--ca-cert", "service-ca.crt", "--job", job, "--party", party, "--secret-file", "job.secret"]


def link_all(lab: Lab, url: str, job: str, secondaries: list[str], k: int, data: str = "") -> None:
    """Every secondary uploads from its host; the primary uploads, starts, waits and fetches; then
    every secondary fetches its own token -> row map into its own home. ``data``: the folder of
    each party's ``<party>.csv`` in its home ("" = the home)."""
    for p in secondaries:
        fedsim(lab, p, "link", *party_args(url, job, p), "--csv", f"{data}{p}.csv", "--columns", "lat,lon")
    own = ["--csv", f"{data}{PRIMARY}.csv", "--columns", "lat,lon", "--start", "--k", str(k), "--wait"]
    own += ["--fetch", "linkage"]
    fedsim(lab, PRIMARY, "link", *party_args(url, job, PRIMARY), *own)
    for p in secondaries:
        fedsim(lab, p, "fetch", *party_args(url, job, p), "--out", "linkage")


def run(base: Path, secondaries: list[str], k: int = 5) -> dict:
    """Bring the lab up, link, and return what an operator would check (then tear it all down)."""
    with Lab(base, [SERVICE, PRIMARY, *secondaries]) as lab, tempfile.TemporaryDirectory() as tmp:
        data = planted(secondaries)
        place_own_data(lab, data, Path(tmp))
        url, service = start_service(lab, Path(tmp))
        try:
            job = create_job(lab, url, secondaries)
            link_all(lab, url, job, secondaries, k)
        finally:
            service.stop()
        return {"job": job, "url": url, "transfers": [t.__dict__ for t in lab.transfers]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="where the hosts' homes go (not under a 0700 folder)")
    ap.add_argument("--secondaries", default="party_a,party_b,party_c")
    ap.add_argument("--k", type=int, default=5)
    args = ap.parse_args(argv)
    print(json.dumps(run(args.base, args.secondaries.split(","), args.k), indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
