"""The event trace: one schema (schema.py) and a chunked Parquet recorder (recorder.py)."""
