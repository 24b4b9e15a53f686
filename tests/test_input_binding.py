"""Silent wrong input (issue 13, item 6): a fetched linkage is bound to the run by job id and the
digests of the primary's identifiers; non-finite features are refused; what feature preparation
dropped or imputed is reported."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from app.config import RunConfig
from datasets import load_dataset
from datasets.base import DatasetError
from tests.test_byo import SPEC, write_parties

# ---------------------------------------------------------------------------- features


def test_an_inf_feature_is_refused_naming_party_column_and_rows(tmp_path):
    write_parties(tmp_path)
    shops = pd.read_csv(tmp_path / "shops.csv")
    shops.loc[[7, 30], "rent"] = [np.inf, -np.inf]
    shops.to_csv(tmp_path / "shops.csv", index=False)
    with pytest.raises(
        DatasetError, match=r"party 'shops'.*line 9, column 'rent': inf is not a finite number.*lines \[9, 32\]"
    ):
        load_dataset("csv", tmp_path)
    from app.vfl.parties import (
        secondary_features,  # a deployed party reading its own CSV refuses it too
    )

    with pytest.raises(DatasetError, match=r"party 'shops'.*'rent'.*not a finite number"):
        secondary_features(RunConfig.of(dataset="csv", data_dir=str(tmp_path)), "shops")


def test_a_feature_or_identifier_beyond_the_numbers_bound_is_refused_naming_it(tmp_path):
    """1e300 is finite: a run with it trained an epoch, then failed on a statistic it overflowed
    (naming no file), or finished exit 0 on the one recipe that survived it; as an identifier it
    broke the in-process linkage. Refused as the service refuses an upload beyond 1e100."""
    write_parties(tmp_path)
    shops = pd.read_csv(tmp_path / "shops.csv")
    shops.loc[3, "rent"] = 1e300
    shops.to_csv(tmp_path / "shops.csv", index=False)
    with pytest.raises(DatasetError, match=r"party 'shops'.*line 5, column 'rent': 1e\+300 is beyond ±1e\+100"):
        load_dataset("csv", tmp_path)
    write_parties(tmp_path)
    sales = pd.read_csv(tmp_path / "sales.csv")
    sales.loc[0, "lat"] = -1e200
    sales.to_csv(tmp_path / "sales.csv", index=False)
    with pytest.raises(DatasetError, match=r"line 2, column 'lat': -1e\+200 is beyond ±1e\+100"):
        load_dataset("csv", tmp_path)


def test_a_non_number_in_a_numeric_feature_is_refused_not_imputed(tmp_path):
    write_parties(tmp_path)
    shops = pd.read_csv(tmp_path / "shops.csv").astype({"rent": object})
    shops.loc[4, "rent"] = "about 50"
    shops.to_csv(tmp_path / "shops.csv", index=False)
    with pytest.raises(
        DatasetError, match=r"party 'shops'.*line 6, column 'rent': 'about 50' is not a number.*lines \[6\]"
    ):
        load_dataset("csv", tmp_path)


def test_a_party_left_without_features_is_refused_by_name(tmp_path):
    write_parties(tmp_path)
    shops = pd.read_csv(tmp_path / "shops.csv")
    shops["rent"] = 50.0  # its only feature column is constant
    shops.to_csv(tmp_path / "shops.csv", index=False)
    with pytest.raises(DatasetError, match=r"party 'shops'.*no feature column left.*'rent'.*constant"):
        load_dataset("csv", tmp_path)


def test_a_party_with_only_identifier_columns_is_refused_by_name(tmp_path):
    write_parties(tmp_path, SPEC.replace('numeric = ["rent"]\n', ""))
    with pytest.raises(DatasetError, match=r"party 'shops'.*no feature column"):
        load_dataset("csv", tmp_path)


def test_dropped_columns_and_imputed_nans_are_reported_in_the_summary(tmp_path):
    from app.modes import run_experiment

    spec = SPEC.replace('numeric = ["rent"]', 'numeric = ["rent", "floor", "vacant"]')
    write_parties(tmp_path, spec)
    shops = pd.read_csv(tmp_path / "shops.csv")
    shops["floor"], shops["vacant"] = 2.0, np.nan  # one constant column, one with no value at all
    shops.loc[[1, 2, 5, 9, 11], "rent"] = np.nan
    shops.to_csv(tmp_path / "shops.csv", index=False)
    sales = pd.read_csv(tmp_path / "sales.csv")
    sales["rooms"] = sales["rooms"].astype(float)
    sales.loc[[0, 3, 4], "rooms"] = np.nan
    sales.to_csv(tmp_path / "sales.csv", index=False)

    ds = load_dataset("csv", tmp_path)
    want = {
        "primary": {"dropped_constant": [], "dropped_empty": [], "nan_imputed": {"rooms": 3}, "nan_imputed_total": 3},
        "secondaries": {
            "shops": {
                "dropped_constant": ["floor"],
                "dropped_empty": ["vacant"],
                "nan_imputed": {"rent": 5},
                "nan_imputed_total": 5,
            }
        },
    }
    assert ds.preprocessing == want
    assert ds.secondaries["shops"].feature_names == ("rent",)
    cfg = RunConfig.of(
        dataset="csv",
        data_dir=str(tmp_path),
        method="fedsim",
        k=3,
        epochs=1,
        max_steps=2,
        batch_size=32,
        out_dir=str(tmp_path / "runs"),
    )
    run_experiment(cfg, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["preprocessing"] == want


# ---------------------------------------------------------------------------- linkage binding


def _link_through_service(url: str, folder, primary_ids, shops_ids, k: int = 3) -> str:
    """One job on the service: the secondary and the primary upload, the primary starts it,
    each fetches its own result into ``folder``; returns the job id."""
    from linkage_server.client import LinkageClient, create_job
    from linkage_server.params import JobParams
    from tests.test_service import ADMIN

    made = create_job(url, ADMIN, "primary", ["shops"])
    job, keys = made["job"], made["secrets"]
    with LinkageClient(url, job, "shops", keys["shops"]) as s:
        s.upload(shops_ids)
    with LinkageClient(url, job, "primary", keys["primary"]) as p:
        p.upload(primary_ids)
        p.start(JobParams("euclidean", k))
        p.wait(timeout=60)
        p.fetch(folder)
    with LinkageClient(url, job, "shops", keys["shops"]) as s:
        s.fetch(folder)
    return job


def _mixed(src, dst, name: str, other):
    """A copy of folder ``src`` whose file ``name`` comes from folder ``other``."""
    import shutil

    shutil.copytree(src, dst)
    shutil.copy(other / name, dst / name)
    return dst


def test_a_linkage_from_another_job_with_the_same_sizes_is_refused(tmp_path):
    """Two jobs of the same sizes (K, parties, rows): only the one linked from this run's
    primary identifiers is accepted; a mixed folder is refused naming both jobs."""
    from app.vfl.inprocess import run_in_process
    from linkage.contracts import LinkageError
    from linkage_server.local import free_port
    from tests.test_service import service

    data = tmp_path / "data"
    data.mkdir()
    write_parties(data)
    cfg = RunConfig.of(
        dataset="csv", data_dir=str(data), k=3, epochs=1, max_steps=2, batch_size=32, out_dir=str(tmp_path / "runs")
    )
    ds = load_dataset("csv", data)
    shops = ds.secondaries["shops"].identifiers
    with service(tmp_path / "svc", free_port()) as url:
        job_a = _link_through_service(url, tmp_path / "a", ds.primary.identifiers, shops)
        job_b = _link_through_service(url, tmp_path / "b", ds.primary.identifiers + 0.5, shops)  # same sizes

    def run(folder):

        return run_in_process(cfg.replace(linkage_dir=str(folder)))

    # job B's whole folder: linked from other primary identifiers than this run's
    with pytest.raises(LinkageError, match=rf"linkage job {job_b} .*raw identifier digest differs"):
        run(tmp_path / "b")
    # job B's primary.npz beside job A's upload record
    mixed = _mixed(tmp_path / "a", tmp_path / "mixed", "primary.npz", tmp_path / "b")
    with pytest.raises(LinkageError, match=rf"primary.npz is from linkage job {job_b}.*upload.*job {job_a}"):
        run(mixed)
    # job A's primary file with job B's token -> row map for the secondary
    other_rows = _mixed(tmp_path / "a", tmp_path / "rows", "secondary-shops.npz", tmp_path / "b")
    with pytest.raises(LinkageError, match=rf"party 'shops'.*job '{job_a}'.*job '{job_b}'"):
        run(other_rows)
    # no record of what the primary uploaded: nothing to bind the file to
    (tmp_path / "a" / "upload-record.json").rename(tmp_path / "record.json")
    with pytest.raises(LinkageError, match="no upload-record.json"):
        run(tmp_path / "a")
    (tmp_path / "record.json").rename(tmp_path / "a" / "upload-record.json")
    assert len(run(tmp_path / "a").losses) == 2  # job A, untouched: accepted


def test_a_private_upload_is_bound_to_the_raw_identifiers_it_was_encoded_from(tmp_path):
    """Private mode through the CLI: the primary encodes (`encode`), uploads the filters, starts
    and fetches; its record holds the digest of the raw identifiers, which a run on the same
    CSV matches and a run on other rows (n-rows) does not."""

    from app.data import load_data
    from app.vfl.linking import linkage_job
    from linkage.contracts import LinkageError
    from linkage_server.cli import (
        main as cli,  # in this process: the service is the only other one
    )
    from linkage_server.local import free_port
    from tests.test_service import ADMIN, service

    data, out, key = tmp_path / "data", tmp_path / "out", tmp_path / "parties.key"
    data.mkdir()
    write_parties(data)
    cli(["make-key", "--out", str(key), "--csv", str(data / "shops.csv"), "--columns", "y,x", "--k", "3"])
    cli(
        [
            "encode",
            "--csv",
            str(data / "sales.csv"),
            "--columns",
            "lat,lon",
            "--key-file",
            str(key),
            "--out",
            str(tmp_path / "sales-filters.npy"),
        ]
    )
    with service(tmp_path / "svc", free_port()) as url:
        (tmp_path / "admin.token").write_text(ADMIN)
        cli(
            [
                "create-job",
                "--url",
                url,
                "--admin-token-file",
                str(tmp_path / "admin.token"),
                "--primary",
                "primary",
                "--secondary",
                "shops",
                "--secrets-dir",
                str(tmp_path),
            ]
        )
        job = next(tmp_path.glob("*-primary.secret")).name.removesuffix("-primary.secret")

        def party(name: str, *args: str):
            cli(
                [
                    *args,
                    "--url",
                    url,
                    "--job",
                    job,
                    "--party",
                    name,
                    "--secret-file",
                    str(tmp_path / f"{job}-{name}.secret"),
                ]
            )

        party("shops", "link", "--csv", str(data / "shops.csv"), "--columns", "y,x", "--key-file", str(key))
        party(
            "primary",
            "link",
            "--npy",
            str(tmp_path / "sales-filters.npy"),
            "--start",
            "--metric",
            "hamming",
            "--k",
            "3",
            "--fetch",
            str(out),
        )
        party("shops", "fetch", "--out", str(out))
    assert sorted(f.name for f in out.iterdir()) == [
        "primary.npz",
        "privacy.json",
        "secondary-shops.npz",
        "upload-record.json",
    ]
    cfg = RunConfig.of(dataset="csv", data_dir=str(data), k=3, linkage_dir=str(out), out_dir=str(tmp_path / "runs"))
    linkage, _ = linkage_job(load_data(cfg), cfg, cfg.resolve())
    assert linkage.job_id == job and linkage.metric == "hamming"
    fewer = cfg.replace(n_rows=300)
    with pytest.raises(LinkageError, match=rf"linkage job {job} .*raw identifier digest differs"):
        linkage_job(load_data(fewer), fewer, fewer.resolve())


def test_the_identifier_digest_tells_string_lists_apart():
    from linkage.binding import identifier_digest

    assert identifier_digest(["a\x1fb", "c"]) != identifier_digest(["a", "b\x1fc"])
    assert identifier_digest(np.array([[1, 2]])) == identifier_digest(np.array([[1.0, 2.0]]))
