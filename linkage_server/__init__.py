"""The linkage service: a thin FastAPI shell (auth, uploads, jobs on disk, rate limits) around
the pure linkage library in :mod:`linkage`; its client and its command line
(``python -m linkage_server``)."""
