"""bench/builtin_csv.py: a built-in data set written as an own-data folder reads back as the same
parties (the rows' labels, identifiers and feature columns), so that scoring the default
on it scores the built-in task, not a mangled copy."""

import numpy as np

from bench.builtin_csv import write
from datasets.registry import DatasetOptions, load_dataset


def test_a_builtin_set_written_as_csv_reads_back_as_its_sampled_rows(tmp_path):
    data = load_dataset("synthetic", None, DatasetOptions(n_rows=300))
    write(data, tmp_path)
    back = load_dataset("csv", tmp_path, DatasetOptions())
    assert back.task == data.task and back.primary.n_rows == 300
    np.testing.assert_array_equal(back.labels, data.labels)
    np.testing.assert_allclose(back.primary.identifiers, data.primary.identifiers, rtol=1e-6)
    assert back.primary.features.shape[1] == data.primary.features.shape[1]
    (party,) = back.secondaries.values()
    (orig,) = data.secondaries.values()
    assert party.n_rows == orig.n_rows and party.features.shape[1] == orig.features.shape[1]
    np.testing.assert_allclose(party.identifiers, orig.identifiers, rtol=1e-6)
    # the features are the built-in's up to the csv path's own standard scaling: correlated 1:1
    for j in range(orig.features.shape[1]):
        if orig.features[:, j].std() > 0:
            assert np.corrcoef(party.features[:, j], orig.features[:, j])[0, 1] > 0.999
