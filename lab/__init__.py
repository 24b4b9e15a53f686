"""The test lab: separate hosts on one machine (network namespaces, one OS user and 0700 home
each: hosts.py), a user-space WAN relay (wan_relay.py), and the lifecycles the slow tests and
benchmarks run across those hosts (linking, training, faults, the whole lifecycle). Test and
benchmark tooling, run from a checkout (root, `ip netns`); not part of the installed packages."""
