"""The options of ``python -m linkage_server``'s commands (linkage_server.cli registers the
commands): the help formatter, and the option groups several commands share.
"""

from __future__ import annotations

import argparse
import os

from linkage.contracts import DEFAULT_STRING_METRIC, METRICS
from linkage.protection import DEFAULT_LEVEL, LEVELS
from linkage_server.connections import ConnectionLimits
from linkage_server.limits import QUERY_MAX_CELLS, Limits

DEFAULT_URL = "http://127.0.0.1:8471"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default (or says it is required), unless it names one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or "default" in text:
            return text
        if action.required or "required" in text:
            return text if "required" in text else f"{text} (required)"
        shown = "none" if action.default is None else "off" if action.default is False else "%(default)s"
        return f"{text} (default: {shown})"


def command(sub, name: str, func, text: str, **extra) -> argparse.ArgumentParser:
    """A subcommand running ``func(args)``, its parser in ``args.parser``."""
    p = sub.add_parser(name, help=text, description=text, formatter_class=HelpFormatter, **extra)
    p.set_defaults(func=func, parser=p)
    return p


def connection(p, party=True) -> None:
    """The service address and, for a party, its job, name and secret."""
    p.add_argument(
        "--url",
        default=os.environ.get("FEDSIM_LINKAGE_URL", DEFAULT_URL),
        help="the linkage service (default: $FEDSIM_LINKAGE_URL, else %(default)s)",
    )
    p.add_argument("--ca-cert", help="CA certificate to verify an HTTPS service (default: the system's)")
    if party:
        p.add_argument("--job", required=True, help="the job id (from create-job)")
        p.add_argument("--party", required=True, help="this party's name in the job")
        p.add_argument("--secret-file", help="this party's secret (default: $FEDSIM_LINKAGE_SECRET)")


def identifier_options(p) -> None:
    """Where a party's identifiers come from (read by cli_party.identifiers)."""
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--csv", help="the party's CSV file (with --columns; one of --csv / --npy is required)")
    g.add_argument("--npy", help="identifiers already as a .npy array, e.g. from `encode` (default: none)")
    p.add_argument(
        "--columns",
        help="identifier column(s) of --csv, comma-separated; several string columns "
        "(name,address) are compared joined with a space (required with --csv)",
    )
    p.add_argument(
        "--kind",
        choices=["numbers", "strings"],
        default="numbers",
        help="numbers (Euclidean) or strings (names, titles, addresses)",
    )
    p.add_argument(
        "--key-file",
        help="private mode: JSON key shared by the parties, never the service; "
        "identifiers are encoded with it before upload (default: none, raw)",
    )
    p.add_argument(
        "--missing",
        choices=["refuse", "skip", "empty"],
        default="refuse",
        help="a --csv row with a missing (empty) identifier: refuse the file, skip the row (the linkage "
        "indexes the rows that remain, as if it were deleted), or (strings) read it as empty "
        "(a row with every identifier missing is skipped); docs/own-data.md",
    )
    p.add_argument(
        "--skipped-out",
        help="where skipped rows are written, with their line numbers "
        "(default: <csv stem>.skipped.csv in the working folder)",
    )


def job_options(p) -> None:
    """The job's parameters, as the primary starts it."""
    p.add_argument(
        "--metric",
        choices=METRICS,
        default=None,
        metavar="METRIC",
        help=f"one of {', '.join(METRICS)}; default: from the primary's upload: numbers -> euclidean, "
        f"Bloom/FEDERAL bits -> hamming, strings -> {DEFAULT_STRING_METRIC}. edit is raw Levenshtein; "
        "levenshtein_norm, jaro_winkler, token_sort, qgram_cosine are normalised to [0, 1]",
    )
    p.add_argument("--k", type=int, default=100, help="neighbours per record")
    noise_options(p)
    p.add_argument(
        "--search",
        choices=["exact", "hnsw", "ivf", "qgram", "auto"],
        default="exact",
        help="top-K search: exact; a faiss index (hnsw, ivf: euclidean, hamming); q-gram candidates "
        "reranked (qgram: strings); auto: approximate only where exact is slow",
    )
    p.add_argument(
        "--recall-floor",
        type=float,
        default=0.0,
        help="an approximate search under this tie-aware recall (on 1000 records) fails the job",
    )
    p.add_argument(
        "--width",
        type=int,
        default=0,
        help="how widely an approximate search looks: IVF cells probed (nprobe), the HNSW beam "
        "(ef_search) or q-gram candidates per record; 0 = linkage.approx's default",
    )
    p.add_argument(
        "--layout",
        choices=["independent", "chain"],
        default="independent",
        help="several secondaries: each linked to the primary, or chained one-to-one (paper App. C)",
    )
    p.add_argument("--anchor", default="", help="the chain's anchor secondary (default: '' = the first by name)")
    p.add_argument(
        "--train-rows", help="(primary) .npy of training row numbers to standardise on (default: none, all rows)"
    )


def noise_options(p) -> None:
    """The noise the primary asks for (raised to the secondaries' floors by the service)."""
    p.add_argument(
        "--tau",
        type=float,
        default=None,
        help="attack-success bound of the noise; 1 asks for an exact release, refused where a secondary's "
        "privacy floor forbids one (default: none asked, the secondaries' floors set the noise)",
    )
    p.add_argument(
        "--pool", type=int, default=0, help="candidates per record before noise (0 = K at tau 1, 4 K under noise)"
    )
    p.add_argument(
        "--radius",
        type=float,
        default=0.0,
        help="tau bounds guessing a distance within this radius, in identifier units; 0 = half of each "
        "secondary's nearest-neighbour spacing (docs/privacy.md)",
    )
    p.add_argument(
        "--compose",
        action="store_true",
        help="noise on each link scaled by sqrt(the links of its secondary record), also when no floor asks "
        "(docs/privacy.md)",
    )


def floor_options(p) -> None:
    """A secondary's privacy floor for its own records (linkage_server.floors), sent by `link`."""
    p.add_argument(
        "--privacy",
        choices=LEVELS,
        default=DEFAULT_LEVEL,
        help="(secondary) the least protection your records get, whatever the primary asks: off = an "
        "exact release allowed; standard = noise of one nearest-neighbour spacing on every distance, "
        "composed, queries may draw 1 x each record's links; strict = twice the noise, half the draws "
        "(docs/privacy.md). The service's operator may set a higher floor",
    )
    p.add_argument(
        "--min-noise",
        type=float,
        default=None,
        help="(secondary) also at least this noise on a distance, in your identifiers' units (default: the level's)",
    )
    p.add_argument(
        "--query-draws",
        type=float,
        default=None,
        help="(secondary) the query similarities a primary may draw against each of your records, in "
        "multiples of its links in the release (default: the level's)",
    )


def wait_options(p) -> None:
    p.add_argument("--wait", action="store_true", help="wait until the job is done")
    p.add_argument(
        "--fetch",
        help="wait, then download this party's result into this folder (the primary: with "
        "its upload record, which binds the result to its identifiers) (default: none)",
    )
    p.add_argument("--timeout", type=float, default=3600, help="seconds to wait")


def serve_options(s) -> None:
    """serve's: where it listens, keeps its data, and what it accepts."""
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int, default=8471, help="port to listen on")
    s.add_argument("--data-dir", required=True, help="jobs, uploads and results live here (survive restarts)")
    s.add_argument("--admin-token-file", help="default: <data-dir>/admin-token, created if absent")
    s.add_argument("--max-upload-mb", type=float, default=512, help="largest upload accepted, MiB")
    s.add_argument("--chunk-rows", type=int, default=20_000, help="primary rows per resumable search chunk")
    s.add_argument(
        "--ray",
        default="",
        metavar="ADDRESS",
        help="search the chunks on Ray: 'local' (a Ray in this machine) or a cluster's address "
        "(default: in the service's process)",
    )
    s.add_argument(
        "--auth-failures",
        type=int,
        default=10,
        help="failed authentications per client address (and per party) within --auth-window before "
        "429; clients behind one address share it",
    )
    s.add_argument("--auth-window", type=float, default=60.0, help="seconds")
    s.add_argument(
        "--operator-seed",
        type=int,
        default=None,
        help="operator only, for reproducible experiments: derive every job's randomness from this "
        "seed and the job's content instead of a fresh secret per job (no party can set or read "
        "it; a guessable seed lets the primary undo the noise) (default: $FEDSIM_LINKAGE_OPERATOR_SEED "
        "if set, else none)",
    )
    s.add_argument(
        "--query-budget",
        type=int,
        default=1_000_000,
        help="cells (records x K x secondaries) each job answers queries for, over all its queries (0 = no queries)",
    )
    s.add_argument("--query-max-records", type=int, default=100_000, help="records per query")
    s.add_argument(
        "--privacy-floor",
        choices=LEVELS,
        default=DEFAULT_LEVEL,
        help="the least protection every secondary's records get, whatever a party asks (off: a party may "
        "ask for an exact release; docs/privacy.md)",
    )
    limit_options(s)
    s.add_argument(
        "--certfile", help="TLS certificate (PEM); with --keyfile the service speaks HTTPS (default: none, plain HTTP)"
    )
    s.add_argument("--keyfile", help="TLS private key (PEM) (default: none)")
    s.add_argument("--log-level", default="warning", help="uvicorn's log level")


def connection_options(s) -> None:
    """What a client may hold before it authenticates (linkage_server.connections)."""
    d = ConnectionLimits()
    s.add_argument(
        "--header-timeout",
        type=float,
        default=d.header_timeout,
        help="seconds a connection has to send a request's head before it is closed",
    )
    s.add_argument(
        "--max-connections-per-address",
        type=int,
        default=d.per_address,
        help="connections open at once from one client address; more are closed at once",
    )
    s.add_argument("--max-connections", type=int, default=d.total, help="connections open at once in all")


def limit_options(s) -> None:
    """The operator's limits on what one party can make the service hold (linkage_server.limits)."""
    connection_options(s)
    d = Limits()
    s.add_argument("--query-max-cells", type=int, default=QUERY_MAX_CELLS, help="records x K x secondaries per query")
    s.add_argument("--max-k", type=int, default=d.max_k, help="largest K (and candidate pool) a job may ask for")
    s.add_argument(
        "--max-cells",
        type=int,
        default=d.max_cells,
        help="largest job: primary records x K x secondaries (its disk is about 28 bytes a cell)",
    )
    s.add_argument(
        "--chunk-cells",
        type=int,
        default=d.chunk_cells,
        help="primary rows x K of one search chunk (fewer rows at a large K): bounds a job's memory",
    )
    s.add_argument(
        "--max-uploads-per-party",
        type=int,
        default=d.max_uploads_per_party,
        help="concurrent uploads and queries per party; more are refused 429",
    )
    s.add_argument(
        "--small-job-cells",
        type=int,
        default=d.small_cells,
        help="jobs up to this many cells run in a lane of their own, never behind a large job",
    )
