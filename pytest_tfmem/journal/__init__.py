"""The crash-safe journal: which test is running and its last memory readings, on disk, so a
session killed by memory explains itself (``tfmem last``)."""
