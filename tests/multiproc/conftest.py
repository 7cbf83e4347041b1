"""Fixtures of the multi-process tests: a job's environment (`job`), and the jobs a
test started directly (`direct`), killed with whatever is left of them at the end."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import (JOB_ENV, LOGREG, MARKER_VAR, SCHEDULER, SERVER, TEST_WORKER, DirectJob, JobEnv,
                     kill_leftovers)


@pytest.fixture
def job() -> Iterator[JobEnv]:
    missing = [p for p in (TEST_WORKER, SCHEDULER, SERVER, LOGREG) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"not built: {', '.join(map(str, missing))} (build everything first, "
                    "or set HYBRIDPS_BUILD_DIR)")
    marker = uuid.uuid4().hex
    # Nothing of an outer job: HYBRIDPS_* of ours, SLURM_* (hybridrun would take a Slurm
    # allocation it runs in for its hosts).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYBRIDPS_", "SLURM_"))}
    env.update(JOB_ENV)
    env[MARKER_VAR] = marker
    try:
        yield JobEnv(marker, env)
    finally:
        kill_leftovers(marker)


@pytest.fixture
def direct(job: JobEnv, tmp_path: Path) -> Iterator[list[DirectJob]]:
    jobs: list[DirectJob] = []
    try:
        yield jobs
    finally:
        for j in jobs:
            j.kill()
