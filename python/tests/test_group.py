"""Group collectives under cfx_run: every op and dtype checked byte for byte in the ranks."""
import subprocess
import sys

import pytest

from conftest import have_torch, run_ranks


def test_python_m_conflux_is_the_launcher():
    """``python -m conflux`` runs the package's cfx_run: its usage, and a job of 2 ranks."""
    m = [sys.executable, "-m", "conflux"]
    p = subprocess.run(m + ["--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "usage: cfx_run -n N" in p.stdout + p.stderr, p
    prog = "import os; print('rank', os.environ['CFX_RANK'], 'of', os.environ['CFX_WORLD_SIZE'])"
    p = subprocess.run(m + ["-n", "2", sys.executable, "-c", prog], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p
    for r in range(2):
        assert f"[{r}] rank {r} of 2" in p.stdout, p.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_numpy(n):
    run_ranks(n, "coll_ranks.py")


@pytest.mark.skipif(not have_torch(), reason="torch is not installed")
def test_collectives_torch():
    run_ranks(3, "coll_ranks.py", "--torch")


def test_parameter_server():
    run_ranks(3, "ps_ranks.py")


def test_group_errors():
    run_ranks(2, "err_ranks.py")


def test_algorithm_mismatch():
    run_ranks(2, "algo_ranks.py")


def test_call_refused_in_python_takes_its_turn():
    run_ranks(2, "refused_ranks.py")


def test_ctrl_c_ends_waits():
    """KeyboardInterrupt in a Work's and a get_nb request's wait, a group's creation, a
    blocking allreduce (also one waiting behind a Work's), send, recv and get
    (ranks/interrupt_ranks.py).
    The waits' deadlines are 60 s: the harness's 45 s timeout fails a wait that ignores
    Ctrl-C."""
    run_ranks(2, "interrupt_ranks.py", timeout=45)


def test_ctrl_c_ends_a_parameter_server_call():
    """KeyboardInterrupt in a blocking pushpull that waits for the other worker; the op is
    canceled (ranks/ps_interrupt_ranks.py).  Deadlines of 60 s, the harness's timeout 45 s."""
    run_ranks(3, "ps_interrupt_ranks.py", timeout=45)
