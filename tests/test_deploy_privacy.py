"""A deployed secondary states its own privacy level: `fedsim deploy up --privacy` puts it in
that party's node config (its embedding defence, app/node.own_defence) and makes it the floor
the party states at `link`; the primary cannot lower either."""

import pytest

from deploy.deployment import Deployment, node_config, party_levels


def _dep(tmp_path, privacy=None):
    return Deployment(str(tmp_path), "house3", "", False, ["a", "b"], privacy=privacy or {})


def test_one_level_for_every_secondary_and_one_per_party():
    assert party_levels("strict", ["a", "b"]) == {"a": "strict", "b": "strict"}
    assert party_levels("a=off", ["a", "b"]) == {"a": "off", "b": "standard"}  # b stated none: the default
    assert party_levels("", ["a", "b"]) == {"a": "standard", "b": "standard"}


@pytest.mark.parametrize(
    "spec, named",
    [("loose", "'loose'"), ("a=loose", "'loose'"), ("c=strict", "'c'"), ("a=off,a=strict", "'a'")],
)
def test_a_bad_level_or_party_is_refused_by_name(spec, named):
    with pytest.raises(SystemExit, match=named):
        party_levels(spec, ["a", "b"])


def test_each_supernode_is_configured_with_its_own_level(tmp_path):
    dep = _dep(tmp_path, {"a": "strict", "b": "off"})
    assert 'privacy="strict"' in node_config(dep, "a") and 'privacy="off"' in node_config(dep, "b")
    assert 'privacy="standard"' in node_config(_dep(tmp_path), "a")  # a deploy.json from before: the default


def test_the_level_survives_the_deployment_record(tmp_path):
    dep = _dep(tmp_path, {"a": "strict", "b": "standard"})
    dep.save()
    assert Deployment.load(tmp_path).privacy == {"a": "strict", "b": "standard"}
