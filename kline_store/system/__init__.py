"""system/: the machine and the process, shared by every wing (below them all, beside errors, progress and memory):
cores and thread priority (``cores``), background threads stopped before the interpreter exits (``background``),
page advice and read-ahead of mapped files (``pages``), the ranks' agreement on a value (``ranks``), the width of
index arrays (``indexes``). It imports nothing of the package but ``errors`` and ``memory``."""
