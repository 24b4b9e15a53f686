"""A label column is refused before anything runs where training could not use it (named with the
file's lines): missing, not a number, not finite as float32, one value for a classification."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("bad", ["inf", "-inf", "5e38"])
def test_a_regression_label_that_is_not_finite_as_trained_is_refused_naming_its_lines(bad):
    """inf, or a value past float32's largest (the labels' training dtype), trained until a gradient
    was refused naming a party, not the label."""
    import pandas as pd

    from datasets.base import DatasetError
    from datasets.csv_parties import labels_of

    values = pd.to_numeric(pd.Series(["1.5", "2", bad, "3", bad]))  # as read_csv reads a numeric column
    with pytest.raises(DatasetError, match=r"p\.csv: 2 label\(s\) not finite.*\[4, 6\]"):
        labels_of(values, "regression", "p.csv")


def test_a_multiclass_label_with_one_value_is_refused():
    import pandas as pd

    from datasets.base import DatasetError
    from datasets.csv_parties import labels_of

    with pytest.raises(DatasetError, match=r"p\.csv: task 'multiclass' needs at least 2 label values, got 1"):
        labels_of(pd.Series(["a", "a", "a"]), "multiclass", "p.csv")
