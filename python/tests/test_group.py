"""Group collectives under cfx_run: every op and dtype checked byte for byte in the ranks."""
import pytest

from conftest import have_torch, run_ranks


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
