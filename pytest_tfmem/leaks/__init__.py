"""Leak checks: ``leak_check``/``assert_no_leak`` over repeated calls, the ``tfmem_leak`` marker,
and the diagnosis that names what grew and who holds it."""
