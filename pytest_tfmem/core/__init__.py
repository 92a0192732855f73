"""The core: options and ini values (one rule for paths), the ``tfmem`` marker and fixture, the
measurement of each test's call phase, the test record and the one way to update it, the budget
check, the one re-run after a memory failure, the terminal summary, and which process of the
session this is (main, pytest-xdist controller or worker, isolated test). Features plug into it
through tfmem's hooks (``hookspecs.py``)."""
