"""Getting samples to the device: the epoch order (sampling), batches and buffers, prefetch threads, worker
processes over a shared-memory ring, pinned and device placement, collate, and the loader that drives them.

May import: kline_store.errors, kline_store.progress, kline_store.store. It knows samples only through the
typed BatchSource protocol (feed/loader.py), so it never imports kline_store.samples.
"""
