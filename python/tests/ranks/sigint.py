"""Ctrl-C for the interrupt tests: SIGINT this process from inside a call."""
import os
import signal
import sys
import threading


def sigint_inside(qualname):
    """Send this process SIGINT once its main thread has entered the extension's
    ``qualname`` (``"Group.allreduce"``, ``"Request.wait"``).

    A profile hook sees the call begin and wakes a thread that sends the
    signal; between the hook and the call no Python code runs on the main
    thread, so the signal is taken by the call itself, not by the code
    before it.  No sleep: the call either ends with KeyboardInterrupt or,
    ignoring the signal, runs to its deadline (the harness's timeout then
    fails the test first).
    """
    r, w = os.pipe()

    def hook(frame, event, arg):
        if event == "c_call" and getattr(arg, "__qualname__", "") == qualname:
            sys.setprofile(None)
            os.write(w, b"!")

    def send():
        os.read(r, 1)
        os.close(r)
        os.close(w)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=send, daemon=True).start()
    sys.setprofile(hook)


def interrupted(qualname, call, *args, **kw):
    """call(*args, **kw), sent SIGINT once inside ``qualname``: must end with
    KeyboardInterrupt."""
    sigint_inside(qualname)
    try:
        call(*args, **kw)
    except KeyboardInterrupt:
        return
    finally:
        sys.setprofile(None)
    sys.exit(f"{call.__qualname__}: it ended without KeyboardInterrupt")
