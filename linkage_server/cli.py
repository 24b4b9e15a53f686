"""Command line: ``python -m linkage_server <command>``; see ``--help`` of each command.

  serve       run the service (one process; results persist under --data-dir)
  create-job  (admin) a job for named parties; writes each party's secret to a file
  make-key    (parties) a shared secret for private mode, with FEDERAL parameters for numbers
  encode      (party) identifiers from a CSV -> a .npy to upload (Bloom / FEDERAL private mode)
  link        (party) upload identifiers; the primary may also start the job; --wait, --fetch
  status      (party) the job's state and progress
  fetch       (party) download this party's result into a folder training reads
  query       (primary) new records' tokens and similarities from a finished job (predict)
  delta       the training-free improvement estimate of Definition 1 from a primary result
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

import numpy as np

DEFAULT_URL = "http://127.0.0.1:8471"


def _read_secret(path: str | None, env: str) -> str:
    if path:
        return Path(path).read_text().strip()
    if os.environ.get(env):
        return os.environ[env].strip()
    raise SystemExit(f"error: give --secret-file or set ${env}")


def _verify(args) -> bool | str:
    return args.ca_cert or True


# ----------------------------------------------------------------------------- identifiers


def read_identifiers(csv: str, columns: list[str], kind: str) -> np.ndarray:
    """One party's identifier columns from its CSV, checked: numbers (n, d) float64 or strings (n,)."""
    import pandas as pd

    from linkage.contracts import LinkageError

    df = pd.read_csv(csv)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise LinkageError(f"{csv}: no column(s) {missing}; columns are {list(df.columns)}")
    sub = df[columns]
    bad = sub.isna().any(axis=1).to_numpy()
    if bad.any():
        raise LinkageError(f"{csv}: {int(bad.sum())} row(s) have a missing identifier in {columns} "
                           f"(first rows: {np.flatnonzero(bad)[:5].tolist()})")
    if kind == "strings":
        if len(columns) != 1:
            raise LinkageError(f"string identifiers are one column; got {columns}")
        from linkage.strings import normalize_strings

        return np.array(normalize_strings(sub[columns[0]].astype(str).tolist()), dtype=str)
    try:
        return sub.to_numpy(dtype=np.float64)
    except ValueError as e:
        raise LinkageError(f"{csv}: numeric identifier columns {columns} hold non-numbers ({e})") from None


# ----------------------------------------------------------------------------- commands


def cmd_serve(args) -> None:
    import uvicorn

    from linkage_server.service import create_app

    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    token_file = Path(args.admin_token_file) if args.admin_token_file else data_dir / "admin-token"
    if not token_file.exists():
        token_file.write_text(secrets.token_urlsafe(32))
        token_file.chmod(0o600)
        print(f"admin token written to {token_file}", flush=True)
    from linkage.job_secret import OPERATOR_SEED_ENV, operator_seed_from_env

    operator_seed = args.operator_seed if args.operator_seed is not None else operator_seed_from_env()
    if operator_seed is not None:
        print(f"warning: an operator seed fixes every job's randomness (from the job's content): for "
              f"experiments only; a party who guesses it can undo the noise and the token shuffle. Prefer "
              f"${OPERATOR_SEED_ENV} to --operator-seed (a command line is visible to other users)",
              file=sys.stderr, flush=True)
    from linkage_server.queries import QueryLimits

    app = create_app(data_dir, token_file.read_text().strip(), max_upload_bytes=int(args.max_upload_mb * 2**20),
                     chunk_rows=args.chunk_rows, operator_seed=operator_seed, auth_failures=args.auth_failures,
                     auth_window_s=args.auth_window, query_limits=QueryLimits(args.query_budget, args.query_max_records))
    # proxy_headers=False: the client address (rate limits) is the TCP peer's, never a header's
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, proxy_headers=False,
                ssl_certfile=args.certfile, ssl_keyfile=args.keyfile)


def cmd_create_job(args) -> None:
    from linkage_server.client import create_job

    token = _read_secret(args.admin_token_file, "FEDSIM_LINKAGE_ADMIN_TOKEN")
    out = create_job(args.url, token, args.primary, args.secondary, duplicates=args.duplicates, verify=_verify(args))
    folder = Path(args.secrets_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for party, secret in out["secrets"].items():
        path = folder / f"{out['job']}-{party}.secret"
        path.write_text(secret)
        path.chmod(0o600)
    print(json.dumps({"job": out["job"], "secret_files": sorted(str(p) for p in folder.glob(f"{out['job']}-*"))}))


def _client(args):
    from linkage_server.client import LinkageClient

    secret = _read_secret(args.secret_file, "FEDSIM_LINKAGE_SECRET")
    return LinkageClient(args.url, args.job, args.party, secret, verify=_verify(args))


SOURCE = ".source.json"  # beside an encoded .npy (`encode`): the digest of the raw identifiers it came from


def _identifiers(args) -> tuple[np.ndarray, str]:
    """The identifiers to upload, and the digest of the raw identifiers they were encoded from
    ("" = they are raw): a run binds the linkage to its own raw identifiers by it."""
    from linkage.binding import identifier_digest

    if args.npy:
        source = Path(args.npy + SOURCE)
        raw = json.loads(source.read_text())["raw_sha256"] if source.exists() else ""
        ids = np.load(args.npy, allow_pickle=False)
        if not raw and ids.dtype == np.uint8:
            print(f"note: {args.npy} holds encoded identifiers but {source} is missing: the upload is recorded "
                  "as raw, so a run on this linkage will refuse it (raw identifier digest differs); encode with "
                  "`python -m linkage_server encode`, which writes that file", file=sys.stderr)
        return ids, raw
    ids = read_identifiers(args.csv, args.columns.split(","), args.kind)
    if args.key_file:  # private mode: the party encodes with the parties' shared key before uploading
        from linkage.encode import encode_with_key

        return encode_with_key(ids, json.loads(Path(args.key_file).read_text())), identifier_digest(ids)
    return ids, ""


def _fingerprint(args) -> str:
    """The encoding key's fingerprint (linkage.encode.key_fingerprint): from --key-file, or from
    the .source.json `encode` wrote beside --npy; "" for raw identifiers."""
    if args.key_file:
        from linkage.encode import key_fingerprint

        return key_fingerprint(json.loads(Path(args.key_file).read_text()))
    source = Path(f"{args.npy}{SOURCE}") if args.npy else None
    return json.loads(source.read_text()).get("key_fingerprint", "") if source and source.exists() else ""


def cmd_make_key(args) -> None:
    """A fresh shared secret for the parties; with --csv, FEDERAL parameters from that party's numbers."""
    key: dict = {"secret": secrets.token_urlsafe(32)}
    if args.csv:
        from linkage.encode import federal_key

        values = read_identifiers(args.csv, args.columns.split(","), "numbers")
        p = federal_key(values, k=args.k, bits_per_dim=args.bits_per_dim)
        key["federal"] = {n: p[n] for n in ("bits_per_dim", "t", "lo", "hi")}
        print(f"FEDERAL: {p['bytes_per_record']} bytes per record, ~{p['bits_at_kth']:.1f} bits at the "
              f"{args.k}-th neighbour (raise --bits-per-dim if below ~10)", file=sys.stderr)
    out = Path(args.out)
    out.write_text(json.dumps(key, indent=1))
    out.chmod(0o600)
    print(f"key written to {out}: share it with the other parties, never with the service")


def cmd_encode(args) -> None:
    from linkage.binding import identifier_digest

    ids, raw = _identifiers(args)
    out = args.out if args.out.endswith(".npy") else f"{args.out}.npy"  # as np.save names it
    np.save(out, ids, allow_pickle=False)
    Path(out + SOURCE).write_text(json.dumps({"raw_sha256": raw or identifier_digest(ids), "rows": len(ids),
                                              "key_fingerprint": _fingerprint(args)}))
    print(f"{out}: {ids.shape} {ids.dtype} (the raw identifiers' digest in {out + SOURCE}, read by `link --npy`)")


def _progress(st: dict) -> None:
    p = st["progress"]
    print(f"\r{st['state']}: {p['done']}/{p['total']} chunks", end="", file=sys.stderr, flush=True)


def cmd_link(args) -> None:
    with _client(args) as c:
        ids, raw_sha256 = _identifiers(args)
        print(json.dumps({"uploaded": c.upload(ids, raw_sha256, fingerprint=_fingerprint(args))}))
        if args.record:
            print(f"upload record {c.write_upload_record(Path(args.record))}")
        if args.train_rows:
            print(json.dumps(c.upload_train_rows(np.load(args.train_rows))))
        if args.start:
            st = c.start(args.metric, args.k, args.tau, args.pool, args.layout, args.anchor)
            print(json.dumps({"state": st["state"]}))
        if args.wait or args.fetch:
            st = c.wait(timeout=args.timeout, on_progress=_progress)
            print(file=sys.stderr)
            print(json.dumps({"state": st["state"], "seconds": st.get("seconds"), "stats": st.get("stats")}))  # primary
        if args.fetch:
            print(f"fetched {c.fetch(Path(args.fetch))}")


def cmd_status(args) -> None:
    with _client(args) as c:
        st = c.wait(timeout=args.timeout, on_progress=_progress) if args.wait else c.status()
        print(json.dumps(st, indent=1))


def cmd_fetch(args) -> None:
    from linkage.binding import RECORD

    with _client(args) as c:
        path = c.fetch(Path(args.out))
        print(f"fetched {path}")
        if path.name == "primary.npz" and not (path.parent / RECORD).exists():
            print(f"note: {path.parent} has no {RECORD}; a run refuses this linkage until the primary's upload is "
                  "recorded there (`link ... --record DIR` or `link ... --fetch DIR`)", file=sys.stderr)


def cmd_query(args) -> None:
    with _client(args) as c:
        ids, _ = _identifiers(args)
        got = c.query(ids, fingerprint=_fingerprint(args), out=Path(args.out))
        print(json.dumps({"out": args.out, "records": len(ids), "k": got.k, "parties": sorted(got.links),
                          "query_budget": c.query_budget}))


def cmd_delta(args) -> None:
    from linkage.quality import improvement_delta
    from linkage.store import load_primary

    p = load_primary(Path(args.linkage_dir))
    for party, link in p.links.items():
        k_avg = args.k_avg or p.k
        print(f"{party}: K={p.k} Delta(Top1Sim)={improvement_delta(link.sims, 1):.3f} "
              f"Delta(AvgSim, K={k_avg})={improvement_delta(link.sims, k_avg):.3f}")


def _conn(p, party=True) -> None:
    """The service address and, for a party, its job, name and secret."""
    p.add_argument("--url", default=os.environ.get("FEDSIM_LINKAGE_URL", DEFAULT_URL))
    p.add_argument("--ca-cert", help="CA certificate to verify an HTTPS service")
    if party:
        p.add_argument("--job", required=True)
        p.add_argument("--party", required=True)
        p.add_argument("--secret-file", help="this party's secret (or $FEDSIM_LINKAGE_SECRET)")


def _ids(p) -> None:
    """Where a party's identifiers come from (read by `_identifiers`)."""
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--csv", help="the party's CSV file")
    g.add_argument("--npy", help="identifiers already as a .npy array")
    p.add_argument("--columns", help="identifier column(s), comma-separated")
    p.add_argument("--kind", choices=["numbers", "strings"], default="numbers")
    p.add_argument("--key-file", help="private mode: JSON key shared by the parties (not the service)")


def _add_serve(sub) -> None:
    s = sub.add_parser("serve", help="run the linkage service")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8471)
    s.add_argument("--data-dir", required=True, help="jobs, uploads and results live here (survive restarts)")
    s.add_argument("--admin-token-file", help="default: <data-dir>/admin-token, created if absent")
    s.add_argument("--max-upload-mb", type=float, default=512)
    s.add_argument("--chunk-rows", type=int, default=20_000, help="primary rows per resumable search chunk")
    s.add_argument("--auth-failures", type=int, default=10,
                   help="failed authentications per client address (and per party) within --auth-window before "
                        "429; clients behind one address share it (default: %(default)s)")
    s.add_argument("--auth-window", type=float, default=60.0, help="seconds (default: %(default)s)")
    s.add_argument("--operator-seed", type=int, default=None,
                   help="operator only, for reproducible experiments: derive every job's randomness from this "
                        "seed and the job's content instead of a fresh secret per job (no party can set or read "
                        "it; a guessable seed lets the primary undo the noise). Default: $FEDSIM_LINKAGE_OPERATOR_SEED "
                        "if set, else none")
    s.add_argument("--query-budget", type=int, default=1_000_000,
                   help="records each job answers queries for, over all its queries (0 = no queries)")
    s.add_argument("--query-max-records", type=int, default=100_000, help="records per query")
    s.add_argument("--certfile", help="TLS certificate (PEM); with --keyfile the service speaks HTTPS")
    s.add_argument("--keyfile")
    s.add_argument("--log-level", default="warning")
    s.set_defaults(func=cmd_serve)


def _add_setup_commands(sub) -> None:
    """create-job (admin), make-key and encode (parties, offline)."""
    s = sub.add_parser("create-job", help="(admin) create a job and per-party secrets")
    _conn(s, party=False)
    s.add_argument("--admin-token-file")
    s.add_argument("--primary", required=True)
    s.add_argument("--secondary", action="append", required=True)
    s.add_argument("--duplicates", choices=["allow", "refuse"], default="allow")
    s.add_argument("--secrets-dir", default=".", help="where <job>-<party>.secret files are written")
    s.set_defaults(func=cmd_create_job)

    s = sub.add_parser("make-key", help="(parties) a shared secret (+ FEDERAL parameters) for private mode")
    s.add_argument("--out", required=True)
    s.add_argument("--csv", help="numeric identifiers to fit FEDERAL's t, lo, hi on (optional)")
    s.add_argument("--columns")
    s.add_argument("--k", type=int, default=100)
    s.add_argument("--bits-per-dim", type=int, default=1024)
    s.set_defaults(func=cmd_make_key)

    s = sub.add_parser("encode", help="(party) CSV identifiers -> .npy (Bloom/FEDERAL with --key-file)")
    _ids(s)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_encode)


def _add_link(sub) -> None:
    s = sub.add_parser("link", help="(party) upload identifiers; the primary may start the job")
    _conn(s)
    _ids(s)
    s.add_argument("--train-rows", help="(primary) .npy of training row numbers to standardise on")
    s.add_argument("--start", action="store_true", help="(primary) start the job after uploading")
    s.add_argument("--metric", choices=["euclidean", "edit", "hamming"], default="euclidean")
    s.add_argument("--k", type=int, default=100)
    s.add_argument("--tau", type=float, default=1.0)
    s.add_argument("--pool", type=int, default=0, help="candidates per record before noise (0 = K)")
    s.add_argument("--layout", choices=["independent", "chain"], default="independent",
                   help="several secondaries: each linked to the primary, or chained one-to-one (paper App. C)")
    s.add_argument("--anchor", default="", help="the chain's anchor secondary ('' = first by name)")
    s.add_argument("--wait", action="store_true")
    s.add_argument("--fetch", help="wait, then download this party's result into this folder (the primary: with "
                                   "its upload record, which binds the result to its identifiers)")
    s.add_argument("--record", help="(primary) write the upload record (job id, digests) into this folder now, "
                                    "to `fetch` the result into it later")
    s.add_argument("--timeout", type=float, default=3600)
    s.set_defaults(func=cmd_link)


def _add_result_commands(sub) -> None:
    """status and fetch (parties), delta (offline, on a fetched result)."""
    s = sub.add_parser("status", help="(party) job state and progress")
    _conn(s)
    s.add_argument("--wait", action="store_true")
    s.add_argument("--timeout", type=float, default=3600)
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("fetch", help="(party) download this party's result")
    _conn(s)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_fetch)

    s = sub.add_parser("query", help="(primary) new records' tokens and similarities from a finished job")
    _conn(s)
    _ids(s)
    s.add_argument("--out", required=True, help="the result file (primary.npz format), written atomically")
    s.set_defaults(func=cmd_query)

    s = sub.add_parser("delta", help="Definition 1's improvement estimate from a primary result")
    s.add_argument("--linkage-dir", required=True)
    s.add_argument("--k-avg", type=int, default=0, help="neighbours AvgSim averages (default: all K)")
    s.set_defaults(func=cmd_delta)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m linkage_server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    _add_setup_commands(sub)
    _add_link(sub)
    _add_result_commands(sub)
    return ap


def main(argv: list[str] | None = None) -> None:
    from linkage.contracts import LinkageError
    from linkage_server.client import ServiceError

    args = parser().parse_args(argv)
    try:
        args.func(args)
    except (ServiceError, LinkageError, TimeoutError) as e:
        raise SystemExit(f"error: {e}") from None
