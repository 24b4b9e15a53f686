"""The key a party's modules and parameters are kept under in torch's dicts (nn.ModuleDict,
nn.ParameterDict): its name, unless torch would refuse it (a name with ".", or one a dict
already has as an attribute, such as "values" or "keys"), then "party:" and the name with its
dots as colons. Names torch takes keep their keys, so models kept before load as they were."""

from __future__ import annotations

from torch import nn

PREFIX = "party:"


def party_key(name: str) -> str:
    taken = hasattr(nn.ModuleDict, name) or hasattr(nn.ParameterDict, name) or hasattr(nn.Module(), name)
    if name and "." not in name and not name.startswith(PREFIX) and not taken:
        return name
    return PREFIX + name.replace(".", ":")
