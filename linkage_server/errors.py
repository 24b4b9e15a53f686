"""The linkage library's error: bad input or parameters, with a message naming the problem."""


class LinkageError(ValueError):
    """Bad linkage input or parameters; the message names the problem."""
