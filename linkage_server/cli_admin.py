"""The admin's commands of the service's command line (linkage_server/cli.py): ``create-job``
(a job for named parties, each party's secret written to a file of its own) and ``cancel``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from files.private import create_secret, private_dir
from linkage_server.cli_party import read_secret, verify


def cmd_create_job(args) -> None:
    import httpx

    from linkage_server.client import create_job  # lazy: httpx, for the commands that call the service

    token = read_secret(_token_when_written(args), "FEDSIM_LINKAGE_ADMIN_TOKEN", "--admin-token-file")
    folder = Path(args.secrets_dir)  # usable before the job is made: its secrets are handed out once
    made = [f for f in (folder, *folder.parents) if not f.exists()]  # deepest first: what a refusal takes back
    try:
        private_dir(folder)
        usable = folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)
    except OSError:
        usable = False
    if not usable:
        raise ValueError(
            f"--secrets-dir {folder} is not a folder this user can write the job's secrets to; no job was made"
        )
    deadline = time.monotonic() + args.wait_for_service
    while True:  # a service that has just written its token may not listen yet
        try:
            out = create_job(
                args.url, token, args.primary, args.secondary, duplicates=args.duplicates, verify=verify(args)
            )
            break
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                _remove_empty(made)
                raise
            time.sleep(0.3)
        except BaseException:  # refused: no job, so no folder made for its secrets
            _remove_empty(made)
            raise
    for party, secret in out["secrets"].items():  # 0600 from the first byte; never over an existing file
        create_secret(folder / f"{out['job']}-{party}.secret", secret, "party secret")
    print(json.dumps({"job": out["job"], "secret_files": sorted(str(p) for p in folder.glob(f"{out['job']}-*"))}))


def _remove_empty(folders: list) -> None:
    """The folders this command made (deepest first), each while it is still empty."""
    for f in folders:
        try:
            f.rmdir()
        except OSError:
            return


def _token_when_written(args) -> str | None:
    """--admin-token-file once it exists: `serve` writes it as it starts, so a `create-job` run right
    after `serve &` waits for it (--wait-for-service seconds at most), then says what is missing."""
    path, deadline = args.admin_token_file, time.monotonic() + args.wait_for_service

    def written() -> bool:  # `serve` creates the file, then writes the token into it
        return Path(path).exists() and bool(Path(path).read_text().strip())

    while path and not written() and time.monotonic() < deadline:
        time.sleep(0.2)
    if path and not Path(path).exists():
        raise FileNotFoundError(
            f"--admin-token-file {path}: no such file after {args.wait_for_service:g} s; `fedsim serve "
            "--data-dir DIR` writes DIR/admin-token when it starts: is the service running, with that folder?"
        )
    return path


def cmd_cancel(args) -> None:
    from linkage_server.client import cancel_job  # lazy: httpx, for the commands that call the service

    if args.admin_token_file:
        token = read_secret(args.admin_token_file, "FEDSIM_LINKAGE_ADMIN_TOKEN")
    else:
        token = read_secret(args.secret_file, "FEDSIM_LINKAGE_SECRET")
    st = cancel_job(args.url, args.job, token, verify=verify(args))
    print(json.dumps({"job": st["job"], "state": st["state"], "error": st["error"]}))
