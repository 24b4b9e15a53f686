"""Command line: ``python -m linkage_server <command>`` (also ``fedsim <command>``); see ``--help``
of each command. A typical job: the admin creates it, every party uploads (`link`), the primary
starts it (`start`, or `link --start` when the others uploaded first), each party fetches.

  serve       run the service (one process; results persist under --data-dir)
  create-job  (admin) a job for named parties; writes each party's secret to a file
  make-key    (parties) a shared secret for private mode, with FEDERAL parameters for numbers
  encode      (party) identifiers from a CSV -> a .npy to upload (Bloom / FEDERAL private mode)
  link        (party) upload identifiers; the primary may also start the job; --wait, --fetch
  start       (primary) start the job once every party has uploaded; --wait, --fetch
  status      (party) the job's state and progress
  fetch       (party) download this party's result into a folder training reads
  query       (primary) new records' tokens and similarities from a finished job (predict)
  cancel      (primary or admin) cancel a queued or running job
  estimate    the training-free improvement estimate of Definition 1 from a primary result, with
              what it means (alias: delta)

Exit status: 0 when the command did what it says; 2 when the input was refused (a bad option,
file, identifier or value, or a request the service refused as such: 400-422), naming it; 1 when
something failed (the service or the network, a job that failed, a timeout, a limit to retry
after); the reason is on stderr.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

from files.private import create_secret, private_dir, private_umask, warn_if_exposed
from files.source_tree import inside_source
from linkage.contracts import LinkageError
from linkage.job_secret import OPERATOR_SEED_ENV, operator_seed_from_env
from linkage.quality import delta_verdict, improvement_delta
from linkage_server import requestlog
from linkage_server.cli_admin import cmd_cancel, cmd_create_job
from linkage_server.cli_options import (
    HelpFormatter,
    command,
    connection,
    floor_options,
    identifier_options,
    job_options,
    serve_options,
    wait_options,
)
from linkage_server.cli_party import (
    cmd_encode,
    cmd_fetch,
    cmd_link,
    cmd_make_key,
    cmd_query,
    cmd_start,
    cmd_status,
    read_identifiers,
)
from linkage_server.connections import ConnectionLimits, guarded_h11
from linkage_server.floors import Floors
from linkage_server.limits import Limits, QueryLimits
from linkage_server.uploads import UploadError

__all__ = ["main", "parser", "read_identifiers"]


# ----------------------------------------------------------------------------- commands


def cmd_serve(args) -> None:
    import uvicorn

    from linkage_server.service import ServiceOptions, create_app  # lazy: fastapi and uvicorn, for `serve` only

    data_dir = private_dir(Path(args.data_dir))
    os.chmod(data_dir, 0o700)  # the service's own folder: uploads, searches, results, secrets
    token_file = Path(args.admin_token_file) if args.admin_token_file else data_dir / "admin-token"
    created = not token_file.exists()
    if created:
        create_secret(token_file, secrets.token_urlsafe(32), "admin token")
    else:
        warn_if_exposed(token_file, "admin token file")
    operator_seed = args.operator_seed if args.operator_seed is not None else operator_seed_from_env()
    if operator_seed is not None:
        print(
            f"warning: an operator seed fixes every job's randomness (from the job's content): for "
            f"experiments only; a party who guesses it can undo the noise and the token shuffle. Prefer "
            f"${OPERATOR_SEED_ENV} to --operator-seed (a command line is visible to other users)",
            file=sys.stderr,
            flush=True,
        )
    limits = Limits(args.max_k, args.max_cells, args.chunk_cells, args.max_uploads_per_party, args.small_job_cells)
    options = ServiceOptions(
        max_upload_bytes=int(args.max_upload_mb * 2**20),
        chunk_rows=args.chunk_rows,
        operator_seed=operator_seed,
        auth_failures=args.auth_failures,
        auth_window_s=args.auth_window,
        query_limits=QueryLimits(args.query_budget, args.query_max_records, max_cells=args.query_max_cells),
        ray=args.ray,
        limits=limits,
        floors=Floors(args.privacy_floor),
    )
    app = create_app(data_dir, token_file.read_text().strip(), options)
    # proxy_headers=False: the client address (rate limits) is the TCP peer's, never a header's
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        proxy_headers=False,
        ssl_certfile=args.certfile,
        ssl_keyfile=args.keyfile,
        # no client holds a connection without sending a request head (linkage_server.connections)
        http=guarded_h11(ConnectionLimits(args.header_timeout, args.max_connections_per_address, args.max_connections)),
    )
    sock = config.bind_socket()  # bound here: the URL printed is the real one (also for --port 0)
    requestlog.enable()
    host = f"[{args.host}]" if ":" in args.host else args.host
    requestlog.banner(
        f"{'https' if args.certfile else 'http'}://{host}:{sock.getsockname()[1]}", data_dir, token_file, created
    )
    uvicorn.Server(config).run(sockets=[sock])


def cmd_delta(args) -> None:
    from linkage.store import load_primary  # lazy: looked up per call (tests stand in for the stored linkage)

    p = load_primary(Path(args.linkage_dir))
    k_avg = args.k_avg or p.k  # 0: all K
    if not 1 <= k_avg <= p.k:
        raise ValueError(f"--k-avg {k_avg}: AvgSim averages 1 to K = {p.k} neighbours of this linkage (0: all K)")
    for party, link in p.links.items():
        try:
            top1, avg = improvement_delta(link.sims, 1), improvement_delta(link.sims, k_avg)
        except LinkageError as e:
            raise LinkageError(f"party {party!r}: {e}") from None
        print(f"{party}: K={p.k} Delta(Top1Sim)={top1:.3f} Delta(AvgSim, K={k_avg})={avg:.3f}")
        print("\n".join(f"  {line}" for line in delta_verdict(top1, avg, p.k, k_avg)))


# ----------------------------------------------------------------------------- commands' parsers


def _add_serve(sub) -> None:
    serve_options(command(sub, "serve", cmd_serve, "run the linkage service"))


def _add_setup_commands(sub) -> None:
    """create-job (admin), make-key and encode (parties, offline)."""
    s = command(sub, "create-job", cmd_create_job, "(admin) create a job and per-party secrets")
    connection(s, party=False)
    s.add_argument("--admin-token-file", help="the admin token (default: $FEDSIM_LINKAGE_ADMIN_TOKEN)")
    s.add_argument("--primary", required=True, help="the primary party's name")
    s.add_argument("--secondary", action="append", required=True, help="a secondary party's name (repeat for more)")
    s.add_argument(
        "--duplicates", choices=["allow", "refuse"], default="allow", help="duplicate identifiers in an upload"
    )
    s.add_argument("--secrets-dir", default=".", help="where <job>-<party>.secret files are written")
    s.add_argument(
        "--wait-for-service",
        type=float,
        default=30.0,
        help="seconds to wait for --admin-token-file to appear (a `serve &` just started writes it)",
    )

    s = command(sub, "make-key", cmd_make_key, "(parties) a shared secret (+ FEDERAL parameters) for private mode")
    s.add_argument("--out", required=True, help="the key file to write")
    s.add_argument("--csv", help="numeric identifiers to fit FEDERAL's t, lo, hi on (with --columns)")
    s.add_argument("--columns", help="numeric column(s) of --csv, comma-separated (required with --csv)")
    s.add_argument("--k", type=int, default=100, help="the job's K, which FEDERAL's t is fitted for")
    s.add_argument("--bits-per-dim", type=int, default=1024, help="FEDERAL filter bits per dimension")

    s = command(sub, "encode", cmd_encode, "(party) CSV identifiers -> .npy (Bloom/FEDERAL with --key-file)")
    identifier_options(s)
    s.add_argument("--out", required=True, help="the .npy to write")


def _add_party_commands(sub) -> None:
    """link and start (the job), status and fetch (its result)."""
    s = command(sub, "link", cmd_link, "(party) upload identifiers; the primary may start the job too")
    connection(s)
    identifier_options(s)
    s.add_argument(
        "--start",
        action="store_true",
        help="(primary) start the job after uploading (every other party must have uploaded; else use `start` later)",
    )
    job_options(s)
    floor_options(s)
    wait_options(s)
    s.add_argument(
        "--record",
        help="(primary) write the upload record (job id, digests) into this folder now, "
        "to `fetch` the result into it later (default: none)",
    )

    s = command(sub, "start", cmd_start, "(primary) start the job once every party has uploaded")
    connection(s)
    job_options(s)
    wait_options(s)

    s = command(sub, "status", cmd_status, "(party) job state and progress")
    connection(s)
    s.add_argument("--wait", action="store_true", help="wait until the job is done")
    s.add_argument("--timeout", type=float, default=3600, help="seconds to wait")

    s = command(sub, "fetch", cmd_fetch, "(party) download this party's result")
    connection(s)
    s.add_argument("--out", required=True, help="the folder to write the result into")


def _add_result_commands(sub) -> None:
    """query (the primary, after the job) and delta (offline, on a fetched result)."""
    s = command(sub, "query", cmd_query, "(primary) new records' tokens and similarities from a finished job")
    connection(s)
    identifier_options(s)
    s.add_argument("--out", required=True, help="the result file (primary.npz format), written atomically")

    s = command(sub, "cancel", cmd_cancel, "(primary or admin) cancel a queued or running job")
    connection(s, party=False)
    s.add_argument("--job", required=True, help="the job id (from create-job)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--secret-file", help="the primary's secret (default: $FEDSIM_LINKAGE_SECRET)")
    g.add_argument(
        "--admin-token-file", help="the service's admin token, instead of the primary's secret (default: none)"
    )
    s.add_argument("--party", help="the primary's name (optional: its secret says who cancels) (default: none)")

    s = command(
        sub,
        "estimate",
        cmd_delta,
        "Definition 1's improvement estimate from a primary result, and what "
        "it means for choosing FedSim over Top1Sim / AvgSim",
        aliases=["delta"],
    )
    s.add_argument("--linkage-dir", required=True, help="the folder holding primary.npz")
    s.add_argument("--k-avg", type=int, default=0, help="neighbours AvgSim averages (0 = all K)")


def parser(prog: str = "python -m linkage_server") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=HelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="command")
    _add_serve(sub)
    _add_setup_commands(sub)
    _add_party_commands(sub)
    _add_result_commands(sub)
    return ap


def _missing(args) -> str | None:
    """An option that is required only with another one, named."""
    if getattr(args, "csv", None) and not getattr(args, "columns", None):
        return "--columns is required with --csv (the identifier column(s), comma-separated)"
    return None


def _into_source(args) -> str | None:
    """A result, secret or the service's data aimed into the project's source tree, named."""
    if getattr(args, "missing", "refuse") != "refuse" and getattr(args, "csv", None) and not args.skipped_out:
        args.skipped_out = f"{Path(args.csv).stem}.skipped.csv"  # the default, checked like the others
    for name in ("out", "fetch", "data_dir", "secrets_dir", "record", "skipped_out"):
        target = getattr(args, name, None)
        why = inside_source(Path(target)) if target else None
        if why:
            return (
                f"--{name.replace('_', '-')} {target}: {why}; use a work folder outside the source "
                "(git ignores work/ and runs/)"
            )
    return None


READS = ("csv", "key_file", "npy", "secret_file", "admin_token_file", "train_rows", "ca_cert")  # files a command reads
WRITES = ("out", "skipped_out")  # files it writes (encode's --out also as it names it: .npy, .npy.source.json)


def _overwrites(args) -> str | None:
    """A file the command would write over one it reads, or over another it writes, named."""
    if getattr(args, "skipped_out", None) and Path(args.skipped_out).is_dir():
        return f"--skipped-out {args.skipped_out} is a folder; name the CSV file to write the skipped rows to"
    named: dict[Path, str] = {}
    for name in (*READS, *WRITES):
        value = getattr(args, name, None)
        paths = [value] if value else []
        if value and name == "out" and args.command == "encode":  # encode's own names for its --out
            npy = value if value.endswith(".npy") else f"{value}.npy"
            paths += [npy, npy + ".source.json"]
        for path in {Path(v).resolve() for v in paths}:
            if path in named and name in WRITES:
                return f"--{name.replace('_', '-')} {value} is also --{named[path].replace('_', '-')}: it would be written over; name another file"
            named.setdefault(path, name)
    return None


def main(argv: list[str] | None = None, prog: str = "python -m linkage_server") -> None:
    """Run one command. A bad command line exits 2 with the usage; a refused or failed operation
    raises SystemExit with "error: <reason>" (exit 1, the reason on stderr); success returns."""
    import httpx

    from linkage_server.client import ServiceError  # lazy: httpx, for the commands that call the service

    private_umask()  # uploads, searches, results, secrets, fetched linkage: 0600 files in 0700 folders
    args = parser(prog).parse_args(argv)
    problem = _missing(args) or _into_source(args) or _overwrites(args)
    if problem:
        args.parser.error(problem)
    try:
        args.func(args)
    except ServiceError as e:  # a request the service refused (4xx but a timeout, a conflict, a limit): the input's
        _exit(e, USER if 400 <= e.status < 500 and e.status not in (408, 409, 429) else FAILED)
    except (LinkageError, UploadError, ValueError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        _exit(e, USER)  # an identifier file, a key or a value the user gave
    except httpx.TransportError as e:
        _exit(f"cannot reach the linkage service at {getattr(args, 'url', '?')}: {e}", FAILED)
    except (TimeoutError, OSError) as e:
        _exit(e, FAILED)


USER, FAILED = 2, 1  # the exit status: 2 = the user's input (named), 1 = a failure (the service, the network, a job)


class CommandFailed(SystemExit):
    """A command's end with its exit status (module docstring); str() is the reason, as printed."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(status)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _exit(error, status: int) -> None:
    """The reason on stderr, and the exit status (module docstring)."""
    text = error if isinstance(error, str) else str(error)
    if isinstance(error, (OSError, ValueError)) and not isinstance(error, (LinkageError, UploadError)):
        text = f"{type(error).__name__}: {error}"
    print(f"error: {text}", file=sys.stderr)
    raise CommandFailed(f"error: {text}", status)
