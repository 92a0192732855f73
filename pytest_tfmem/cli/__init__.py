"""The ``tfmem`` command: show, compare and plot results and baselines, and ``tfmem last``."""
