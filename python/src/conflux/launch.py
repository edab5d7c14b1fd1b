"""Start a coordinator, or find the launcher, shipped inside the package."""
from __future__ import annotations

import math
import numbers
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

_BIN = Path(__file__).resolve().parent / "bin"


def bin_path(tool: str) -> str:
    """Path of a tool shipped with the package: "conflux-coord" or "cfx_run"."""
    p = _BIN / tool
    if not p.is_file():
        raise FileNotFoundError(f"{tool} is not in {_BIN}: the package was installed without it")
    return str(p)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(parent: int) -> Callable[[], None] | None:
    """On Linux, a preexec_fn that has the child sent SIGTERM when ``parent`` dies.

    The signal follows the thread that forked, not the process: so only a
    child started from the main thread gets it (one started from another
    thread would die when that thread ends).
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _stop_from(owner: int, proc: subprocess.Popen, tmpdir: str) -> None:
    """A Coordinator's finalizer: only in the process that started it (a
    forked child's copy of the object neither stops the parent's
    coordinator nor removes its directory)."""
    if os.getpid() != owner:
        return
    _stop(proc, 5.0)
    shutil.rmtree(tmpdir, ignore_errors=True)


def _stop(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; reaps the process."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


class Coordinator:
    """A conflux-coord process for a job, started from Python.

    ``address`` ("127.0.0.1:PORT") and ``token`` are what every member passes
    to Context(coord=..., token=...), or ``env()`` for child processes.  The
    token goes to the coordinator in a file readable only by this user, never
    on its command line, and the file is removed once the coordinator is up::

        with conflux.Coordinator() as coord:
            ctx = conflux.Context(coord=coord.address, token=coord.token)

    ``secure`` ("off", "integrity" or "encrypt") seals its connections after
    the token handshake (``conflux-coord --secure``); every member's
    Context(secure=...) or $CFX_SECURE must say the same.  ``timeout`` is how
    many seconds to wait for it to report ready (finite and >= 0, else
    ValueError; builtin TimeoutError when it passes).

    The coordinator does not outlive this process: it is stopped when the
    object is collected or the interpreter exits, and on Linux (started from
    the main thread) it is sent SIGTERM when this process dies by a signal.
    """

    def __init__(self, bind: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 timeout: float = 30.0, state_dir: str | None = None,
                 secure: str | None = None):
        # checked before anything starts: a NaN deadline never passed (a
        # coordinator that never got ready was waited for forever) and a
        # negative one started the coordinator only to stop it again
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(f"timeout is a number of seconds, not {type(timeout).__name__} "
                            f"{timeout!r}")
        if not timeout >= 0 or math.isinf(timeout):
            raise ValueError("timeout is in seconds and must be finite and >= 0, "
                             f"not {timeout!r}")
        self.token = token or secrets.token_hex(16)
        if not self.token.isprintable() or any(c.isspace() for c in self.token):
            # the coordinator reads one line of the file, members the whole string
            raise ValueError("token: printable characters without spaces or line breaks")
        self._owner = os.getpid()
        self._dir = tempfile.mkdtemp(prefix="conflux-coord-")
        tok = os.path.join(self._dir, "token")
        fd = os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token + "\n")
        cmd = [bin_path("conflux-coord"), "--bind", bind, "--port", str(port),
               "--token-file", tok]
        if state_dir:
            cmd += ["--state-dir", state_dir]
        if secure:  # else $CFX_SECURE, else off; members must run with the same
            cmd += ["--secure", secure]
        # Its output goes to a file: a pipe nobody drains would stall it.
        self.log_path = os.path.join(self._dir, "coord.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with(os.getpid()))
        # never stopped: at collection or interpreter exit, then its directory
        self._finalizer = weakref.finalize(self, _stop_from, self._owner, self.proc, self._dir)
        self.address = self._wait_ready(timeout)
        # read once, at its start: the secret leaves the disk now, so that
        # nothing of it stays behind should this process be killed (a
        # finalizer does not run then; the coordinator still stops with it)
        os.unlink(tok)

    def log(self) -> str:
        """What the coordinator has written so far."""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            for ln in self.log().splitlines():
                if ln.startswith("conflux-coord listening on "):
                    return ln.split()[-1]
            if self.proc.poll() is not None:
                err = self.log()[-2000:]
                self.stop()
                raise RuntimeError(f"conflux-coord exited with {self.proc.returncode} "
                                   f"before it was ready: {err.strip()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"conflux-coord did not report ready within {timeout} s")
            time.sleep(0.01)

    def env(self) -> dict[str, str]:
        """CFX_COORD and CFX_TOKEN for a child process's environment."""
        return {"CFX_COORD": self.address, "CFX_TOKEN": self.token}

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the coordinator (SIGTERM, then SIGKILL after ``timeout`` seconds).

        In a forked child it does nothing: the coordinator is the parent's.
        """
        if os.getpid() != self._owner:
            return
        _stop(self.proc, timeout)
        self._finalizer.detach()
        if not self._log.closed:
            self._log.close()
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "Coordinator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def cfx_run(n: int, cmd: list[str], *, timeout: float = 120.0, transport: str | None = None,
            env: dict[str, str] | None = None, capture: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` as ``n`` ranks under the shipped cfx_run (embedded coordinator, fresh token)."""
    args = [bin_path("cfx_run"), "-n", str(n), "--timeout", str(int(max(1, timeout)))]
    if transport:
        args += ["--transport", transport]
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run(args + list(cmd), env=e,
                          capture_output=capture, text=True, timeout=timeout + 30)
