"""Exception families. The CLI turns each into one line on stderr and a non-zero exit."""


class KlineStoreError(Exception):
    """Base of every error kline-store raises on purpose."""


class InputError(KlineStoreError):
    """Bad input files or arguments: names the file, line or symbol and date, and what is wrong."""


class StoreError(KlineStoreError):
    """A store that is missing, damaged, or cannot be written."""


class StoreLockedError(StoreError):
    """Another writer holds the store's lock."""
