"""Conflux for Python: objects, group collectives and a parameter server.

    import conflux, numpy as np
    with conflux.Context() as ctx:            # CFX_COORD / CFX_TOKEN from cfx_run
        g = conflux.Group(ctx)
        x = np.ones(1 << 20, np.float32)
        g.allreduce(x)                        # in place, GIL released while it runs

Errors are conflux.Error subclasses, one per status (conflux.TimeoutError,
conflux.PeerFailedError, ...), with .status, .name and .detail
(cfx_last_error()).  docs/PYTHON.md has the whole API.
"""
from __future__ import annotations

from . import _conflux
from ._conflux import Error, ArenaBuffer, LIB_VERSION
from ._api import Context, Group, ObjectId, ParameterServer, Work
from ._dtypes import dtype_code
from .launch import Coordinator, bin_path, cfx_run

__version__ = "0.1.0"

# Every status's class, named for type checkers (the "X as X" form re-exports
# it under mypy --strict too); the loop below makes them from the status table.
from ._conflux import (  # noqa: F401,E402
    AgainError as AgainError, AuthError as AuthError, BusyError as BusyError,
    CanceledError as CanceledError, ClosedError as ClosedError, ConnectError as ConnectError,
    ExistsError as ExistsError, InternalError as InternalError, InvalidError as InvalidError,
    IoError as IoError, MemlockError as MemlockError, NoDeviceError as NoDeviceError,
    NoResourceError as NoResourceError, NomemError as NomemError,
    NotFoundError as NotFoundError, PeerFailedError as PeerFailedError,
    ProtoError as ProtoError, TimeoutError as TimeoutError, TooBigError as TooBigError,
    TruncatedError as TruncatedError, UnsupportedError as UnsupportedError,
    VersionError as VersionError)

# One exception class per status of include/conflux/status.h.
_errors = {n: getattr(_conflux, n) for n in dir(_conflux)
           if n.endswith("Error") and isinstance(getattr(_conflux, n), type)}
globals().update(_errors)


def reduce_local(dst, src, op: str = "sum") -> None:
    """dst op= src element-wise on this host, with the library's kernels (bf16/f16 as NCCL rounds)."""
    from ._dtypes import as_array, op_code
    d, code, _ = as_array(dst, writable=True)
    s, code2, _ = as_array(src)
    if code is None or code != code2:
        raise TypeError("reduce_local: both arrays need the same reducible dtype")
    _conflux.reduce(d, s, code, op_code(op))


__all__ = ["Context", "Group", "ObjectId", "ParameterServer", "Work", "Coordinator", "Error",
           "ArenaBuffer", "bin_path", "cfx_run", "dtype_code", "reduce_local", "LIB_VERSION",
           *_errors]
