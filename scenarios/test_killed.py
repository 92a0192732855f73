"""Scenario 5: a job heading past the machine's memory is stopped at kill_at and explained."""

from __future__ import annotations

import pytest

from pytest_tfmem.isolate import KilledAtLimit

from . import killed

pytestmark = pytest.mark.scenario("5. killed")
# The job heads for 2 GB; its isolated process is stopped at 1 GB, long before the machine runs dry.
isolated = pytest.mark.tfmem(kill_at="1GB", budget="500MB")


@pytest.mark.variant("problem", "keeps every chunk (heads for 2 GB)")
@isolated
@pytest.mark.xfail(strict=True, raises=KilledAtLimit, reason="stopped by tfmem's watchdog at kill_at")
def test_problem_hold_everything():
    killed.problem_hold_everything()


@pytest.mark.variant("fix", "one 50 MB chunk at a time")
@isolated
def test_fix_one_chunk_at_a_time():
    killed.fix_one_chunk_at_a_time()
