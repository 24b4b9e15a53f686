"""The linkage library's error, apart so that its lightest modules (linkage.metrics) raise it
without importing the contract that re-exports it (linkage.contracts)."""


class LinkageError(ValueError):
    """Bad linkage input or parameters; the message names the problem."""
