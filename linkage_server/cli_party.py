"""The parties' commands of ``python -m linkage_server`` (registered in linkage_server.cli): read and
encode identifiers, upload them, start the job, wait, fetch, query."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import sys
from pathlib import Path

import numpy as np

from files.atomic import write_atomic
from files.private import create_secret, warn_if_exposed
from linkage.binding import RECORD, identifier_digest
from linkage.contracts import LinkageError
from linkage.encode import encode_with_key, federal_key, key_fingerprint
from linkage_server.csv_ids import TEXT_HINT, read_csv_identifiers, report, skipped_path, write_skipped
from linkage_server.params import JobParams
from linkage_server.progress import Bar
from linkage_server.uploads import METRIC_OF_KIND, to_npy

SOURCE = ".source.json"  # beside an encoded .npy (`encode`): the digest of the raw identifiers it came from


def read_secret(path: str | None, env: str, what: str = "--secret-file") -> str:
    if path:
        if not Path(path).is_file():
            raise FileNotFoundError(f"{what} {path}: no such file (the secret `create-job` wrote for this party)")
        warn_if_exposed(Path(path), "secret file")
        return Path(path).read_text().strip()
    if os.environ.get(env):
        return os.environ[env].strip()
    raise SystemExit(f"error: give --secret-file or set ${env}")


def verify(args) -> bool | str:
    return args.ca_cert or True


def read_identifiers(csv: str, columns: list[str], kind: str, missing: str = "refuse") -> np.ndarray:
    """One party's identifier columns from its CSV, checked: numbers (n, d) float64, or strings
    read as text and normalised (linkage.strings.normalize_strings): (n,) for one column, (n, c)
    for several. ``missing``: the rule for rows with a missing identifier (linkage_server.csv_ids)."""
    return read_csv_identifiers(csv, columns, kind, missing).ids


def client(args):
    from linkage_server.client import LinkageClient  # lazy: httpx and scipy, for the commands that call the service

    secret = read_secret(args.secret_file, "FEDSIM_LINKAGE_SECRET")
    return LinkageClient(args.url, args.job, args.party, secret, verify=verify(args))


def identifiers(args) -> tuple[np.ndarray, str]:
    """The identifiers to upload, and the digest of the raw identifiers they were encoded from
    ("" = they are raw): a run binds the linkage to its own raw identifiers by it. With
    --key-file every source is encoded (or refused): raw identifiers never leave in private mode."""
    key = _key(args)
    if args.npy:
        return _npy_identifiers(args.npy, key)
    rule, columns = getattr(args, "missing", "refuse"), args.columns.split(",")
    got = read_csv_identifiers(args.csv, columns, args.kind, rule)
    # private mode: the party encodes with the parties' shared key before uploading; a key that
    # cannot encode them is refused before the skipped rows' list replaces an earlier one
    made = (encode_with_key(got.ids, key), identifier_digest(got.ids)) if key is not None else (got.ids, "")
    args.skipped = _skipped_said(args, got, rule, columns)
    return made


def _skipped_said(args, got, rule: str, columns: list[str]) -> dict:
    """What --missing did, said on stderr, the skipped rows written to --skipped-out; returns
    {"csv_rows", "skipped", "skipped_rows_file"}."""
    out = (
        write_skipped(args.csv, got.skipped, skipped_path(args.csv, getattr(args, "skipped_out", None)))
        if len(got.skipped)
        else None
    )
    said = report(got, args.csv, columns, rule, out)
    if said:
        print(said, file=sys.stderr)
    return {"csv_rows": got.rows, "skipped": len(got.skipped), "skipped_rows_file": str(out or "")}


def _key(args) -> dict | None:
    """The parties' shared key (--key-file), or None for raw identifiers."""
    if not getattr(args, "key_file", None):
        return None
    warn_if_exposed(Path(args.key_file), "key file")
    return json.loads(Path(args.key_file).read_text())


def _npy_identifiers(npy: str, key: dict | None) -> tuple[np.ndarray, str]:
    """An .npy's identifiers: raw ones are encoded when a key is given; encoded ones (packed bits
    with the .source.json `encode` wrote) pass only if that record names this key."""
    source = Path(npy + SOURCE)
    record = json.loads(source.read_text()) if source.exists() else {}
    ids = np.load(npy, allow_pickle=False)
    if ids.dtype != np.uint8:  # raw identifiers
        if key is None:
            return ids, ""
        return encode_with_key(ids, key), identifier_digest(ids)
    if key is not None:
        if record.get("key_fingerprint") != key_fingerprint(key):
            why = "has no record of its encoding" if not record else "was encoded with another key or parameters"
            raise LinkageError(
                f"{npy} holds packed bits but {why} ({source}): refusing to upload them as this "
                "key's encoding; encode the raw identifiers with `encode --key-file`"
            )
    if not record.get("raw_sha256"):
        print(
            f"note: {npy} holds encoded identifiers but {source} is missing: the upload is recorded "
            "as raw, so a run on this linkage will refuse it (raw identifier digest differs); encode with "
            "`python -m linkage_server encode`, which writes that file",
            file=sys.stderr,
        )
    return ids, record.get("raw_sha256", "")


def fingerprint(args) -> str:
    """The encoding key's fingerprint (linkage.encode.key_fingerprint): from --key-file, or from
    the .source.json `encode` wrote beside --npy; "" for raw identifiers."""
    if args.key_file:
        return key_fingerprint(_key(args))
    source = Path(f"{args.npy}{SOURCE}") if args.npy else None
    return json.loads(source.read_text()).get("key_fingerprint", "") if source and source.exists() else ""


def cmd_make_key(args) -> None:
    """A fresh shared secret for the parties; with --csv, FEDERAL parameters from that party's numbers."""
    key: dict = {"secret": secrets.token_urlsafe(32)}
    if args.csv:
        try:  # a missing number does not move the range fitted: those rows are left out of the fit
            values = read_identifiers(args.csv, args.columns.split(","), "numbers", "skip")
        except LinkageError as e:  # its own advice: make-key has no --kind
            hint = "make-key --csv fits numbers (FEDERAL); text identifiers need no fitted key: run it without --csv"
            raise LinkageError(str(e).replace(TEXT_HINT, hint)) from None
        p = federal_key(values, k=args.k, bits_per_dim=args.bits_per_dim)
        key["federal"] = {n: p[n] for n in ("bits_per_dim", "t", "lo", "hi")}
        print(
            f"FEDERAL: {p['bytes_per_record']} bytes per record, ~{p['bits_at_kth']:.1f} bits at the "
            f"{args.k}-th neighbour (raise --bits-per-dim if below ~10)",
            file=sys.stderr,
        )
    out = create_secret(Path(args.out), json.dumps(key, indent=1), "key")  # 0600 from the first byte, never overwritten
    print(f"key written to {out}: share it with the other parties, never with the service")


def cmd_encode(args) -> None:
    out = args.out if args.out.endswith(".npy") else f"{args.out}.npy"  # as np.save names it
    if Path(args.out).is_dir() or Path(out).is_dir():  # else DIR.npy would appear beside the folder
        raise ValueError(f"--out {args.out} is a folder; name the file to write, e.g. {Path(args.out) / 'ids.npy'}")
    ids, raw = identifiers(args)
    write_atomic(Path(out), to_npy(ids))  # 0600: encoded or not, identifiers are the party's alone
    record = {
        "raw_sha256": raw or identifier_digest(ids),
        "rows": len(ids),
        "key_fingerprint": fingerprint(args),
        **getattr(args, "skipped", {}),
    }  # --csv: its rows, and those --missing skip left out
    write_atomic(Path(out + SOURCE), json.dumps(record).encode())
    print(f"{out}: {ids.shape} {ids.dtype} (the raw identifiers' digest in {out + SOURCE}, read by `link --npy`)")


def _start(c, args, kind: str | None = None) -> None:
    """Start the job with the command's parameters; the metric, unless given, from the primary's upload."""
    from linkage_server.client import ServiceError  # lazy: httpx and scipy, for the commands that call the service

    metric = args.metric
    if metric is None:
        kind = kind or (c.status().get("uploads", {}).get(c.party) or {}).get("kind")
        if kind is None:
            raise LinkageError(
                f"party {c.party!r} has not uploaded to job {c.job}: upload with `link` first, or give --metric"
            )
        metric = METRIC_OF_KIND[kind]
        print(f"metric: {metric} (inferred from the uploaded {kind}; --metric to choose)", file=sys.stderr)
    if args.train_rows:
        print(json.dumps(c.upload_train_rows(np.load(args.train_rows))))
    try:
        asked = {
            f.name: getattr(args, f.name) for f in dataclasses.fields(JobParams) if f.name not in ("metric", "tau")
        }
        st = c.start(JobParams(metric, tau=args.tau or 0.0, **asked))
    except ServiceError as e:
        if e.status == 409 and "waiting for uploads" in e.detail:
            raise ServiceError(
                409,
                f"{e.detail}. Your upload is kept: once they have uploaded, start the job "
                f"with the `start` command (no need to upload again)",
            ) from None
        raise
    print(json.dumps({"state": st["state"], "metric": metric}))


def _wait_and_fetch(c, args) -> None:
    if args.wait or args.fetch:
        with Bar("job") as bar:
            st = c.wait(timeout=args.timeout, on_progress=bar.job, until_started=True)
        print(json.dumps({"state": st["state"], "seconds": st.get("seconds"), "stats": st.get("stats")}))
    if args.fetch:
        _fetched(c.fetch(Path(args.fetch)))


def _fetched(path: Path) -> None:
    print(f"fetched {path}")
    if path.name == "primary.npz" and not (path.parent / RECORD).exists():
        print(
            f"note: {path.parent} has no {RECORD}; a run refuses this linkage until the primary's upload is "
            "recorded there (`link ... --record DIR` or `link ... --fetch DIR`)",
            file=sys.stderr,
        )


def _floor(c, args) -> None:
    """A secondary states its privacy floor before its identifiers leave it (linkage_server.floors)."""
    if c.status().get("role") != "secondary":
        return
    got = c.set_floor(args.privacy, noise=args.min_noise, draws=args.query_draws)
    print(json.dumps({"privacy_floor": got["level"], "effective": got["effective"]}))


def cmd_link(args) -> None:
    with client(args) as c:
        ids, raw_sha256 = identifiers(args)
        _floor(c, args)
        with Bar("upload", bytes=True) as bar:
            summary = c.upload(ids, raw_sha256, fingerprint=fingerprint(args), on_sent=bar.update)
        print(json.dumps({"uploaded": summary}))
        if args.record:
            print(f"upload record {c.write_upload_record(Path(args.record))}")
        if args.start:
            _start(c, args, summary.get("kind"))
        elif args.train_rows:
            print(json.dumps(c.upload_train_rows(np.load(args.train_rows))))
        _wait_and_fetch(c, args)


def cmd_start(args) -> None:
    with client(args) as c:
        _start(c, args)
        _wait_and_fetch(c, args)


def cmd_status(args) -> None:
    with client(args) as c:
        if args.wait:
            with Bar("job") as bar:
                st = c.wait(timeout=args.timeout, on_progress=bar.job, until_started=True)
        else:
            st = c.status()
        print(json.dumps(st, indent=1))


def cmd_fetch(args) -> None:
    with client(args) as c:
        _fetched(c.fetch(Path(args.out)))


def cmd_query(args) -> None:
    with client(args) as c:
        ids, _ = identifiers(args)
        got = c.query(ids, fingerprint=fingerprint(args), out=Path(args.out))
        print(
            json.dumps(
                {
                    "out": args.out,
                    "records": len(ids),
                    "k": got.k,
                    "parties": sorted(got.links),
                    "query_budget": c.query_budget,
                }
            )
        )
