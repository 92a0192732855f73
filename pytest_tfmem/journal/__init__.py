"""The crash-safe journal: which test is running and its last memory readings, on disk, so a
session killed by memory explains itself (``tfmem last``). ``format`` (the file, no pytest hooks)
is what the ``tfmem`` command reads with."""
