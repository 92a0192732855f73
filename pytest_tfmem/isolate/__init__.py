"""Isolation: a test run in a child process under a memory watchdog (``kill_at``), so a test that
blows memory becomes an explained failure instead of a "Killed" session; and the session limit
(``limit.py``): past it, the remaining tests run on in replacement processes forked from the same
template."""

from pytest_tfmem.errors import IsolatedTestDied, KilledAtLimit, KilledBySignal

__all__ = ["IsolatedTestDied", "KilledAtLimit", "KilledBySignal"]
