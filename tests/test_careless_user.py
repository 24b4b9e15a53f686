"""What a new user does by mistake costs them nothing (docs/own-data.md "Refusals you may meet"):
refused by name before any work, exit 2 for their input, and a good earlier result kept."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.test_cli import fedsim

REPO = Path(__file__).resolve().parents[1]


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def test_k_over_a_secondarys_rows_is_refused_before_flower_and_the_finished_run_keeps_every_file(tmp_path):
    """housing's listings have 400 rows: -c k=1000 over a finished run of that name exits 2 at once,
    naming the party and its rows, and the finished run's files are byte for byte as they were."""
    common = ("--dataset", "csv", "--data-dir", str(REPO / "examples" / "housing"), "--out-dir", str(tmp_path))
    # any finished run will do: no recipe search, no yardstick (the refusal is the test)
    given = ("--recipe", "given", "--no-yardstick")
    done = fedsim(
        "train", *common, *given, "--engine", "inprocess", "--run-name", "housing", "-c", "epochs=1", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "housing"
    before = _digests(run)
    refused = fedsim("train", *common, "--run-name", "housing", "-c", "k=1000", cwd=tmp_path, timeout=120)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "k = 1000 is more than secondary 'listings''s 400 rows" in refused.stderr
    assert "Traceback" not in refused.stderr and "Exit Code" not in refused.stdout + refused.stderr
    assert _digests(run) == before  # nothing touched


def test_the_readmes_service_block_works_as_pasted_create_job_waits_for_serve(tmp_path):
    """`fedsim serve ... &` then at once `fedsim create-job`: it waits for the token and the port."""
    import subprocess

    from linkage_server.local import free_port
    from tests.test_cli import FEDSIM

    port = free_port()
    serve = subprocess.Popen(
        [FEDSIM, "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path / "svc")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        made = fedsim(
            "create-job", "--url", f"http://127.0.0.1:{port}", "--admin-token-file", str(tmp_path / "svc" / "admin-token"),
            "--primary", "sales", "--secondary", "listings", "--secrets-dir", str(tmp_path / "secrets"),
            cwd=tmp_path, timeout=120,
        )  # fmt: skip
        assert made.returncode == 0 and '"job"' in made.stdout, made.stderr
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    late = fedsim(
        "create-job", "--admin-token-file", str(tmp_path / "nowhere" / "admin-token"), "--wait-for-service", "0.5",
        "--primary", "a", "--secondary", "b", cwd=tmp_path,
    )  # fmt: skip
    assert late.returncode == 2 and "is the service running" in late.stderr and "Traceback" not in late.stderr


def test_input_mistakes_are_named_and_exit_2(tmp_path):
    (tmp_path / "d").mkdir()
    for name in ("parties.toml", "listings.csv"):
        (tmp_path / "d" / name).write_bytes((REPO / "examples" / "housing" / name).read_bytes())
    data = ("--dataset", "csv", "--data-dir", str(tmp_path / "d"), "--engine", "inprocess", "--out-dir", str(tmp_path))
    (tmp_path / "d" / "sales.csv").write_text("")
    empty = fedsim("train", *data, cwd=tmp_path)
    assert empty.returncode == 2 and "sales.csv is empty (no header line, no rows)" in empty.stderr, empty.stderr
    (tmp_path / "d" / "sales.csv").write_text((REPO / "examples/housing/sales.csv").read_text().splitlines()[0] + "\n")
    header_only = fedsim("train", *data, cwd=tmp_path)
    assert header_only.returncode == 2 and "sales.csv has a header line but no rows" in header_only.stderr
    nowhere = fedsim("predict", str(tmp_path / "runs" / "nope"), str(REPO / "examples/housing/sales.csv"), "--out",
                     str(tmp_path / "p.csv"), cwd=tmp_path)  # fmt: skip
    assert nowhere.returncode == 2 and "no run folder" in nowhere.stderr
    run = tmp_path / "runs" / "r"
    (run / "kept").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    for out in (run / "summary.json", run / "kept" / "primary.pt", run / "p.csv"):  # --out inside the run
        inside = fedsim("predict", str(run), str(REPO / "examples/housing/sales.csv"), "--out", str(out), cwd=tmp_path)
        assert inside.returncode == 2 and "inside the run folder" in inside.stderr, inside.stderr
    assert (run / "summary.json").read_text() == "{}" and not (run / "p.csv").exists()
    (run / "config.json").write_text(json.dumps({"run": {"data_dir": str(tmp_path / "d")}}))
    own = tmp_path / "d" / "listings.csv"  # a file of the run's data: predict would replace it
    kept_bytes = own.read_bytes()
    data_out = fedsim("predict", str(run), str(REPO / "examples/housing/sales.csv"), "--out", str(own), cwd=tmp_path)
    assert data_out.returncode == 2 and "a file of the run's data" in data_out.stderr, data_out.stderr
    assert own.read_bytes() == kept_bytes
    extra = fedsim("report", str(run), "--bogus", "runs/other", cwd=tmp_path)  # were ignored, exit 0
    assert extra.returncode == 2 and "report takes one RUN; unexpected ['--bogus', 'runs/other']" in extra.stderr
    secret = fedsim("link", "--url", "http://127.0.0.1:1", "--job", "0123456789abcdef", "--party", "p", "--secret-file",
                    "nope.secret", "--csv", str(REPO / "examples/housing/sales.csv"), "--columns", "lat,lon", cwd=tmp_path)  # fmt: skip
    assert secret.returncode == 2 and "--secret-file nope.secret: no such file" in secret.stderr, secret.stderr
    (tmp_path / "d" / "sales.csv").write_bytes((REPO / "examples/housing/sales.csv").read_bytes())
    (tmp_path / "afile").write_text("mine")  # an --out-dir (or a folder above it) that is a file
    for out in (tmp_path / "afile", tmp_path / "afile" / "runs"):
        filed = fedsim("train", *data[:-1], str(out), cwd=tmp_path)
        assert filed.returncode == 2 and f"--out-dir {out}: {tmp_path / 'afile'} is a file" in filed.stderr, (
            filed.stderr
        )
    assert (tmp_path / "afile").read_text() == "mine"
    assert not any("Traceback" in r.stderr for r in (empty, header_only, nowhere, secret, filed))
