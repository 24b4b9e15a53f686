"""The `fedsim` command line: one entry point for the whole lifecycle (link -> train ->
predict -> report), over the project's packages. A tool layer: no product package imports it."""
