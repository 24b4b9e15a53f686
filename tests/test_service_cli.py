"""The linkage CLI as parties use it: CSVs in, private (keyed Bloom) mode, results out, Delta printed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd

from linkage.job_secret import operator_secret
from linkage.store import load_primary, load_secondary
from tests.test_service import ADMIN, free_port, service


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m linkage_server ARGS` run by its main in this process: the same exit status,
    stdout and stderr (a SystemExit's text goes to stderr with status 1, as Python's exit prints
    it), without a Python start and the client's imports (~1 s of CPU) for each of the suite's
    many commands; the process's umask put back (main sets 077). :func:`cli_process` runs the
    module itself, as a user does."""
    from contextlib import redirect_stderr, redirect_stdout

    from linkage_server.cli import main

    out, err, umask = io.StringIO(), io.StringIO(), os.umask(0o077)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            err.write(e.code + "\n")
    finally:
        os.umask(umask)
    done = subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"linkage_server {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done


def cli_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m linkage_server ARGS` as a process of its own."""
    return subprocess.run([sys.executable, "-m", "linkage_server", *args], capture_output=True, text=True, timeout=120)


TITLES = [
    "the witcher 3 wild hunt",
    "portal 2",
    "half-life 2",
    "stardew valley",
    "hollow knight",
    "celeste",
    "dark souls iii",
    "hades",
    "terraria",
    "factorio",
    "rimworld",
    "slay the spire",
]


def test_two_parties_link_titles_privately_through_the_cli(tmp_path):
    rng = np.random.default_rng(0)
    games = pd.DataFrame({"title": TITLES, "price": rng.uniform(5, 60, len(TITLES))})
    # the secondary spells titles differently and in another order
    perm = rng.permutation(len(TITLES))
    other = pd.DataFrame(
        {
            "name": [TITLES[i].replace(" ", "  ").upper() + ("!" if i % 2 else "") for i in perm],
            "hours": rng.uniform(1, 100, len(TITLES)),
        }
    )
    games.to_csv(tmp_path / "primary.csv", index=False)
    other.to_csv(tmp_path / "secondary.csv", index=False)
    (tmp_path / "bad.csv").write_text("name,hours\nportal,3\n,4\n")
    key = tmp_path / "parties.key"  # shared by the two parties, never sent to the service
    key.write_text(json.dumps({"secret": "a secret the service never sees"}))

    with service(tmp_path / "svc", free_port()) as url:
        (tmp_path / "admin.token").write_text(ADMIN)
        made = json.loads(
            cli(
                "create-job",
                "--url",
                url,
                "--admin-token-file",
                str(tmp_path / "admin.token"),
                "--primary",
                "shop",
                "--secondary",
                "hltb",
                "--secrets-dir",
                str(tmp_path),
            ).stdout
        )
        job = made["job"]

        def party(name: str, *args: str, check: bool = True):
            return cli(
                *args,
                *(("--privacy", "off") if args[0] == "link" else ()),  # exact releases compared
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

        bad = party(
            "hltb", "link", "--csv", str(tmp_path / "bad.csv"), "--columns", "name", "--kind", "strings", check=False
        )
        assert bad.returncode != 0 and "1 row(s) have a missing identifier in ['name']" in bad.stderr
        wrong = party("hltb", "link", "--csv", str(tmp_path / "secondary.csv"), "--columns", "title", check=False)
        assert wrong.returncode != 0 and "no column(s) ['title']" in wrong.stderr

        party(
            "hltb",
            "link",
            "--csv",
            str(tmp_path / "secondary.csv"),
            "--columns",
            "name",
            "--kind",
            "strings",
            "--key-file",
            str(key),
        )
        started = party(
            "shop",
            "link",
            "--csv",
            str(tmp_path / "primary.csv"),
            "--columns",
            "title",
            "--kind",
            "strings",
            "--key-file",
            str(key),
            "--start",
            "--k",
            "3",
            "--fetch",
            str(tmp_path / "out"),
        )
        assert "metric: hamming (inferred from the uploaded bits" in started.stderr  # no --metric given
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
    out = cli_process("status", "--job", "0123456789abcdef", "--party", "p")  # the module itself, once
    assert out.returncode != 0 and "--secret-file" in out.stderr


def test_private_numbers_link_through_a_made_key(tmp_path):
    """make-key fits FEDERAL parameters; both parties encode with it; Hamming finds the planted copies."""
    rng = np.random.default_rng(1)
    base = rng.uniform(0, 50, (400, 2))
    perm = rng.permutation(400)
    pd.DataFrame(base, columns=["x", "y"]).to_csv(tmp_path / "s.csv", index=False)
    pd.DataFrame(base[perm] + rng.normal(0, 0.01, (400, 2)), columns=["lat", "lon"]).to_csv(
        tmp_path / "p.csv", index=False
    )
    cli(
        "make-key", "--out", str(tmp_path / "k.json"), "--csv", str(tmp_path / "s.csv"), "--columns", "x,y", "--k", "10"
    )
    key = json.loads((tmp_path / "k.json").read_text())
    assert set(key["federal"]) == {"bits_per_dim", "t", "lo", "hi"} and len(key["secret"]) > 20
    for name, cols in (("s", "x,y"), ("p", "lat,lon")):
        cli(
            "encode",
            "--csv",
            str(tmp_path / f"{name}.csv"),
            "--columns",
            cols,
            "--key-file",
            str(tmp_path / "k.json"),
            "--out",
            str(tmp_path / f"{name}.npy"),
        )
    from linkage.pipeline import link

    p_bits, s_bits = np.load(tmp_path / "p.npy"), np.load(tmp_path / "s.npy")
    assert p_bits.dtype == np.uint8 and p_bits.shape == (400, 256)
    res = link(p_bits, {"s": s_bits}, k=5, tau=1.0, secret=operator_secret(0, "test"), metric="hamming")
    top1 = res.secondaries["s"].row_of_token[res.primary.tokens["s"][:, 0]]
    assert (top1 == perm).mean() > 0.95


def write_people(folder) -> tuple[list, np.ndarray]:
    """Name + address: the primary's p.csv, and the secondary's s.csv respelt and shuffled
    (row perm[i] of s is record i of p). Returns (people, perm)."""
    people = [
        ("Anna Smith", "12 Main Street"),
        ("Anna Smith", "7 Park Lane"),
        ("Bob Lee", "12 Main Street"),
        ("Zoe Kim", "3 Hill Road"),
        ("Lee Bob", "9 River Walk"),
        ("Kim Park", "1 Bay Road"),
    ]
    perm = np.random.default_rng(5).permutation(len(people))
    pd.DataFrame(people, columns=["name", "address"]).to_csv(folder / "p.csv", index=False)
    spelt = [(people[i][0].replace("Smith", "Smyth"), people[i][1].replace("Street", "St")) for i in perm]
    pd.DataFrame(spelt, columns=["full_name", "street"]).to_csv(folder / "s.csv", index=False)
    return people, perm


def test_two_string_columns_primary_first_then_start_with_the_default_scorer(tmp_path):
    """Name + address over two columns; the primary uploads before the secondary, starts once it has
    (no second upload), and the metric comes from the upload: strings -> the default scorer."""
    from linkage.contracts import DEFAULT_STRING_METRIC

    people, perm = write_people(tmp_path)
    out = tmp_path / "out"
    with service(tmp_path / "svc", free_port()) as url:
        (tmp_path / "admin.token").write_text(ADMIN)
        job = json.loads(
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
        )["job"]

        def party(name: str, *args: str, check: bool = True):
            return cli(
                *args,
                *(("--privacy", "off") if args[0] == "link" else ()),  # exact releases compared
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

        party(
            "p",
            "link",
            "--csv",
            str(tmp_path / "p.csv"),
            "--columns",
            "name,address",
            "--kind",
            "strings",
            "--record",
            str(out),
        )
        early = party("p", "start", "--k", "2", check=False)
        assert early.returncode == 1 and "waiting for uploads from ['s']" in early.stderr
        assert "`start` command (no need to upload again)" in early.stderr and "Traceback" not in early.stderr
        party("s", "link", "--csv", str(tmp_path / "s.csv"), "--columns", "full_name,street", "--kind", "strings")
        started = party("p", "start", "--k", "2", "--fetch", str(out))
        assert f"metric: {DEFAULT_STRING_METRIC} (inferred from the uploaded strings" in started.stderr
        party("s", "fetch", "--out", str(out))
        assert json.loads(party("s", "status").stdout)["params"]["metric"] == DEFAULT_STRING_METRIC
    p, s = load_primary(out), load_secondary(out, "s")
    np.testing.assert_array_equal(perm[s.row_of_token[p.tokens["s"][:, 0]]], np.arange(len(people)))


def test_command_line_mistakes_are_named_never_a_traceback(tmp_path):
    pd.DataFrame({"title": ["portal", "celeste"], "year": [2011, 2018]}).to_csv(tmp_path / "t.csv", index=False)
    ids = ("--csv", str(tmp_path / "t.csv"))
    no_columns = cli("encode", *ids, "--out", str(tmp_path / "x.npy"), check=False)
    assert no_columns.returncode == 2 and "--columns is required with --csv" in no_columns.stderr
    text = cli("encode", *ids, "--columns", "title,year", "--out", str(tmp_path / "x.npy"), check=False)
    assert text.returncode == 2 and "column 'title': 'portal' is not a number" in text.stderr  # the user's input
    assert "use --kind strings" in text.stderr
    both = cli("encode", *ids, "--columns", "title,year", "--kind", "strings", "--out", str(tmp_path / "x.npy"))
    assert "(2, 2) <U7" in both.stdout  # two string columns, normalised
    gone = cli("encode", "--csv", str(tmp_path / "none.csv"), "--columns", "a", "--out", "x", check=False)
    assert gone.returncode == 2 and "none.csv" in gone.stderr and "Traceback" not in gone.stderr
    (tmp_path / "p.secret").write_text("s")
    down = cli(
        "status",
        "--url",
        f"http://127.0.0.1:{free_port()}",
        "--job",
        "j",
        "--party",
        "p",
        "--secret-file",
        str(tmp_path / "p.secret"),
        check=False,
    )
    assert down.returncode == 1 and "cannot reach the linkage service at http://127.0.0.1:" in down.stderr


def test_every_option_shows_its_default_and_main_returns_on_success(tmp_path, capsys):
    from linkage_server.cli import HelpFormatter, main, parser

    commands = parser()._subparsers._group_actions[0].choices
    assert {"serve", "create-job", "make-key", "encode", "link", "start", "status", "fetch", "query", "delta"} <= set(
        commands
    )
    for name, sub in commands.items():
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                text = HelpFormatter(name)._get_help_string(action)
                assert "default" in text or "required" in text, (name, action.option_strings, text)
    assert main(["make-key", "--out", str(tmp_path / "k.json")]) is None
    assert "key written to" in capsys.readouterr().out


def test_progress_bars_are_drawn_on_a_terminal_only(monkeypatch, capsys):
    from linkage_server import progress

    def run() -> str:
        with progress.Bar("upload", bytes=True) as bar:
            bar.update(1 << 20, 4 << 20)
        with progress.Bar("job") as bar:
            bar.job({"state": "created", "progress": {"done": 0, "total": 0}})
            bar.job({"state": "running", "progress": {"done": 3, "total": 8}})
        return capsys.readouterr().err

    assert run() == ""  # pytest's stderr is not a terminal: nothing is drawn
    monkeypatch.setattr(progress, "shown", lambda: True)
    drawn = run()
    assert "upload" in drawn and "1.0/4.2 MB" in drawn and "job running" in drawn and "3/8" in drawn


def test_create_job_refuses_a_secrets_folder_it_cannot_write_before_the_service_makes_the_job(
    tmp_path, monkeypatch, capsys
):
    """The job was made first and its secrets (handed out once) written after: a --secrets-dir
    that is a file left a job on the service whose secrets nobody held, with a bare
    NotADirectoryError (exit 1) that named no job to cancel."""
    import pytest

    from linkage_server import cli as service_cli
    from linkage_server import client

    made = []
    monkeypatch.setattr(client, "create_job", lambda *a, **k: made.append(a) or {"job": "j", "secrets": {"p": "x"}})
    (tmp_path / "admin.token").write_text(ADMIN)
    (tmp_path / "notadir").write_text("a file")
    argv = ["create-job", "--url", "http://127.0.0.1:1", "--admin-token-file", str(tmp_path / "admin.token")]
    argv += ["--primary", "p", "--secondary", "s", "--secrets-dir", str(tmp_path / "notadir")]
    with pytest.raises(SystemExit) as done:
        service_cli.main(argv)
    assert done.value.code == 2 and "--secrets-dir" in capsys.readouterr().err
    assert made == []  # no job on the service


def test_a_refused_create_job_leaves_no_secrets_folder_it_made(tmp_path, monkeypatch):
    """The folder was made before the service was asked: a job the service refused (a wrong
    admin token, an unknown party) left an empty secrets folder behind as if it held a job's."""
    import pytest

    from linkage_server import cli as service_cli
    from linkage_server import client

    def refused(*a, **k):
        raise client.ServiceError(401, "wrong admin token")

    monkeypatch.setattr(client, "create_job", refused)
    (tmp_path / "admin.token").write_text(ADMIN)
    argv = ["create-job", "--url", "http://127.0.0.1:1", "--admin-token-file", str(tmp_path / "admin.token")]
    argv += ["--primary", "p", "--secondary", "s"]
    with pytest.raises(SystemExit):
        service_cli.main([*argv, "--secrets-dir", str(tmp_path / "new" / "secrets")])
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(SystemExit):
        service_cli.main([*argv, "--secrets-dir", str(tmp_path / "kept")])
    assert (tmp_path / "kept").is_dir()  # a folder that was there stays
