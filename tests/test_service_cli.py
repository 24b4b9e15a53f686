"""The linkage CLI as parties use it: CSVs in, private (keyed Bloom) mode, results out, Delta printed."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd

from linkage.job_secret import operator_secret
from linkage.store import load_primary, load_secondary
from tests.test_service import ADMIN, free_port, service


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "linkage_server", *args], capture_output=True, text=True, timeout=120)
    if check and out.returncode != 0:
        raise AssertionError(f"linkage_server {args[0]} failed:\n{out.stdout}\n{out.stderr}")
    return out


TITLES = ["the witcher 3 wild hunt", "portal 2", "half-life 2", "stardew valley", "hollow knight", "celeste",
          "dark souls iii", "hades", "terraria", "factorio", "rimworld", "slay the spire"]


def test_two_parties_link_titles_privately_through_the_cli(tmp_path):
    rng = np.random.default_rng(0)
    games = pd.DataFrame({"title": TITLES, "price": rng.uniform(5, 60, len(TITLES))})
    # the secondary spells titles differently and in another order
    perm = rng.permutation(len(TITLES))
    other = pd.DataFrame({"name": [TITLES[i].replace(" ", "  ").upper() + ("!" if i % 2 else "") for i in perm],
                          "hours": rng.uniform(1, 100, len(TITLES))})
    games.to_csv(tmp_path / "primary.csv", index=False)
    other.to_csv(tmp_path / "secondary.csv", index=False)
    (tmp_path / "bad.csv").write_text("name,hours\nportal,3\n,4\n")
    key = tmp_path / "parties.key"  # shared by the two parties, never sent to the service
    key.write_text(json.dumps({"secret": "a secret the service never sees"}))

    with service(tmp_path / "svc", free_port()) as url:
        (tmp_path / "admin.token").write_text(ADMIN)
        made = json.loads(cli("create-job", "--url", url, "--admin-token-file", str(tmp_path / "admin.token"),
                              "--primary", "shop", "--secondary", "hltb", "--secrets-dir", str(tmp_path)).stdout)
        job = made["job"]

        def party(name: str, *args: str, check: bool = True):
            return cli(*args, "--url", url, "--job", job, "--party", name, "--secret-file",
                       str(tmp_path / f"{job}-{name}.secret"), check=check)

        bad = party("hltb", "link", "--csv", str(tmp_path / "bad.csv"), "--columns", "name", "--kind", "strings",
                    check=False)
        assert bad.returncode != 0 and "1 row(s) have a missing identifier in ['name']" in bad.stderr
        wrong = party("hltb", "link", "--csv", str(tmp_path / "secondary.csv"), "--columns", "title", check=False)
        assert wrong.returncode != 0 and "no column(s) ['title']" in wrong.stderr

        party("hltb", "link", "--csv", str(tmp_path / "secondary.csv"), "--columns", "name", "--kind", "strings",
              "--key-file", str(key))
        party("shop", "link", "--csv", str(tmp_path / "primary.csv"), "--columns", "title", "--kind", "strings",
              "--key-file", str(key), "--start", "--metric", "hamming", "--k", "3", "--fetch", str(tmp_path / "out"))
        party("hltb", "fetch", "--out", str(tmp_path / "out"))
        status = json.loads(party("hltb", "status").stdout)
        assert status["state"] == "done" and status["params"]["metric"] == "hamming"

    # the service only ever held bits
    uploads = list((tmp_path / "svc" / "jobs" / job / "uploads").glob("*.npy"))
    assert uploads and all(np.load(p).dtype == np.uint8 for p in uploads)
    # every title's most similar record is its re-spelt copy
    p, s = load_primary(tmp_path / "out"), load_secondary(tmp_path / "out", "hltb")
    top1_rows = s.row_of_token[p.tokens["hltb"][:, 0]]
    np.testing.assert_array_equal(perm[top1_rows], np.arange(len(TITLES)))
    delta = cli("delta", "--linkage-dir", str(tmp_path / "out")).stdout
    assert "hltb: K=3 Delta(Top1Sim)=" in delta and "Delta(AvgSim, K=3)=" in delta


def test_the_cli_names_a_missing_secret():
    out = cli("status", "--job", "0123456789abcdef", "--party", "p", check=False)
    assert out.returncode != 0 and "--secret-file" in out.stderr


def test_private_numbers_link_through_a_made_key(tmp_path):
    """make-key fits FEDERAL parameters; both parties encode with it; Hamming finds the planted copies."""
    rng = np.random.default_rng(1)
    base = rng.uniform(0, 50, (400, 2))
    perm = rng.permutation(400)
    pd.DataFrame(base, columns=["x", "y"]).to_csv(tmp_path / "s.csv", index=False)
    pd.DataFrame(base[perm] + rng.normal(0, 0.01, (400, 2)), columns=["lat", "lon"]).to_csv(tmp_path / "p.csv",
                                                                                          index=False)
    cli("make-key", "--out", str(tmp_path / "k.json"), "--csv", str(tmp_path / "s.csv"), "--columns", "x,y",
        "--k", "10")
    key = json.loads((tmp_path / "k.json").read_text())
    assert set(key["federal"]) == {"bits_per_dim", "t", "lo", "hi"} and len(key["secret"]) > 20
    for name, cols in (("s", "x,y"), ("p", "lat,lon")):
        cli("encode", "--csv", str(tmp_path / f"{name}.csv"), "--columns", cols, "--key-file", str(tmp_path / "k.json"),
            "--out", str(tmp_path / f"{name}.npy"))
    from linkage.pipeline import link

    p_bits, s_bits = np.load(tmp_path / "p.npy"), np.load(tmp_path / "s.npy")
    assert p_bits.dtype == np.uint8 and p_bits.shape == (400, 256)
    res = link(p_bits, {"s": s_bits}, k=5, tau=1.0, secret=operator_secret(0, "test"), metric="hamming")
    top1 = res.secondaries["s"].row_of_token[res.primary.tokens["s"][:, 0]]
    assert (top1 == perm).mean() > 0.95
