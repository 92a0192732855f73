"""pytest-xdist workers and memory: how many workers ``-n auto`` starts when tfmem is asked to
fit them into the memory limit (``--tfmem-workers=fit``), the warning when an explicit ``-n N``
does not fit, and tfmem's account of a worker that was killed (by the OOM killer) mid-test."""
