"""Bars in and out of a store, and every writer of bar stores: input discovery, CSV/Parquet/Qlib/DataFrame
readers (DataFrames in: from_frames.py), dates, columns, checks, corporate actions, bars and panels, the full ingest,
append and revisions, resample (a bar store from a bar store), export (exporter.py: a store out as Parquet/CSV or a
Qlib provider directory; DataFrames out are the store's own, store/to_frames.py).

May import: kline_store.errors, kline_store.progress, kline_store.store. Importing this package is light (no
polars, no torch): the modules load what they need.
"""
