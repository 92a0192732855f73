"""The core: options and ini values, the ``tfmem`` marker and fixture, the measurement of each
test's call phase, the test record, the budget check, the one re-run after a memory failure and
the terminal summary. Features plug into it through tfmem's hooks (``hookspecs.py``)."""
