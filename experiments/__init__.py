"""The experiment runner (sweeps of runs, resumable) and the report that generates
docs/results.md. Reads run records (app/run_record.py); nothing in the product imports it."""
