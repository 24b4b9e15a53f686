"""The linkage service's per-job secret: the only source of a job's randomness.

Token permutations, similarity noise and the order of noisy pool candidates protect the
secondaries from the primary (and the noise protects their identifiers, paper Theorem 2). They
are drawn from a generator keyed by this secret (:func:`linkage.pipeline.rng_from_secret`),
which the service draws from the OS's CSPRNG when a job is created, keeps 0600 beside the job
and never returns from any endpoint. It survives restarts, so a job recomputed after a restart
gives byte-identical results.

An operator who wants reproducible experiments may fix the randomness with an operator seed
(the environment variable :data:`OPERATOR_SEED_ENV` of the process that links, or
``serve --operator-seed``); each job's secret is then derived from the seed and the job's
content. It is the service's setting: no party sets it through a job, and no endpoint or
result file shows it. It is for experiments only: a primary that guesses a small seed can
replay the draws (bench/seed_attack.py's attacker tries small seeds).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from files.private import private_dir

OPERATOR_SEED_ENV = "FEDSIM_LINKAGE_OPERATOR_SEED"
SECRET_BYTES = 32


class SecretError(RuntimeError):
    """A job secret that is missing, unreadable or malformed."""


def new_secret() -> bytes:
    """32 bytes from the OS's CSPRNG."""
    return secrets.token_bytes(SECRET_BYTES)


def operator_secret(operator_seed: int, content_id: str) -> bytes:
    """The secret of a job under an operator seed: from the seed and the job's content id
    (:func:`linkage.job.job_id_of`: identifiers, training rows, K, tau, metric), so
    two different jobs never share their noise (which would let a party difference it away)."""
    return hashlib.sha256(f"fedsim-linkage-operator-seed|{int(operator_seed)}|{content_id}".encode()).digest()


def operator_seed_from_env(environ: dict | None = None) -> int | None:
    """The operator seed named by the environment, refused by name if it is not an integer."""
    raw = (os.environ if environ is None else environ).get(OPERATOR_SEED_ENV, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise SecretError(f"{OPERATOR_SEED_ENV}={raw!r} is not an integer") from None


def _staged(path: Path, secret: bytes) -> Path:
    """The secret in a fresh 0600 file beside `path`, flushed to disk."""
    private_dir(path.parent)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def write_secret(path: Path, secret: bytes) -> None:
    """Write the secret readable by the service's user only (0600), atomically."""
    os.replace(_staged(path, secret), path)


def read_secret(path: Path) -> bytes:
    try:
        secret = Path(path).read_bytes()
    except FileNotFoundError:
        raise SecretError(f"the job's secret {path} is missing: the job cannot be computed") from None
    if len(secret) != SECRET_BYTES:
        raise SecretError(f"the job's secret {path} is malformed ({len(secret)} bytes, want {SECRET_BYTES})")
    return secret


def secret_for(path: Path) -> bytes:
    """The secret stored at ``path``, created there first if there is none yet. Two processes
    creating it at once agree: the first link wins, the other reads the winner's secret."""
    path = Path(path)
    if not path.exists():
        tmp = _staged(path, new_secret())
        try:
            os.link(tmp, path)  # atomic, and fails if another process got there first
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return read_secret(path)
