"""Files in and out: input discovery, CSV/Parquet/Qlib readers, dates, columns, checks, corporate actions,
bars and panels, the full ingest, append and revisions, resample, export (also to a Qlib provider directory).

May import: kline_store.errors, kline_store.progress, kline_store.store. Importing this package is light (no
polars, no torch): the modules load what they need.
"""
