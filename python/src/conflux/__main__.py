"""``python -m conflux -n N [options] PROGRAM [ARGS...]``: run PROGRAM as the
N ranks of a job with the launcher shipped inside the package (``cfx_run``;
``python -m conflux --help`` lists its options)."""
import os
import sys

from .launch import bin_path


def main() -> None:
    tool = bin_path("cfx_run")
    os.execv(tool, [tool, *sys.argv[1:]])


if __name__ == "__main__":
    main()
