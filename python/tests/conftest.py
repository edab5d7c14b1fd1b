"""Shared fixtures: a coordinator started from Python, and a cfx_run helper."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import conflux

RANKS = Path(__file__).resolve().parent / "ranks"


@pytest.fixture(scope="module")
def coord():
    """A conflux-coord for the module's tests (loopback, fresh token)."""
    with conflux.Coordinator() as c:
        yield c


@pytest.fixture
def ctx(coord):
    with conflux.Context(coord=coord.address, token=coord.token, timeout=20,
                         transports="shm,tcp") as c:
        yield c


def run_ranks(n, script, *args, timeout=180, env=None, transport=None):
    """Run tests/ranks/<script> as n ranks under the package's cfx_run; fail with their output."""
    cmd = [sys.executable, str(RANKS / script), *args]
    p = conflux.cfx_run(n, cmd, timeout=timeout, env=env, transport=transport)
    if p.returncode != 0:
        pytest.fail(f"cfx_run -n {n} {script} {' '.join(args)} exited {p.returncode}\n"
                    f"--- stdout\n{p.stdout[-6000:]}\n--- stderr\n{p.stderr[-6000:]}")
    for r in range(n):
        assert f"[{r}] rank {r}: ok" in p.stdout, p.stdout[-3000:]
    return p


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False
