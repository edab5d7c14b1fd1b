"""Ctrl-C for the interrupt tests: SIGINT this process from inside a call."""
import linecache
import os
import signal
import sys
import threading
import time
import types

from conflux import _conflux as _c


def sigint_inside(qualname):
    """Send this process SIGINT once its main thread is inside the extension's
    method ``qualname`` (``"Group.allreduce"``, ``"Request.wait"``), or, for a
    ``qualname`` no method of the extension has, inside the extension's call
    that the Python function ``qualname`` makes with ``super().``
    (``"Group.__init__"``).

    A profile hook sees the method called (``c_call``: the package's Python
    wrappers of the same name call it last) and wakes a thread that sends
    the signal once the main thread runs the call itself: its top frame is
    then the one that made the call (the call releases the GIL to wait,
    which lets this thread run; from the ``c_call`` event to the method no
    bytecode runs, where the GIL could change hands).  Sent while the main
    thread still ran Python code (the wrapper's own lines before the call,
    should the GIL change hands there), the signal would raise
    KeyboardInterrupt before the call began, and the call would never reach
    the library: its place in the group's sequence untaken, the other rank's
    next call would pair with another.  A Python function's ``super()``
    call of a type's method is no ``c_call``: for one, the signal goes once
    its frame is on that line.  The call either ends with KeyboardInterrupt
    or, ignoring the signal, runs to its deadline (the harness's timeout
    then fails the test first).
    """
    main = threading.main_thread().ident
    entered = threading.Event()
    caller = []
    cls, _, name = qualname.partition(".")
    of_c = isinstance(vars(getattr(_c, cls, object)).get(name), types.MethodDescriptorType)

    def hook(frame, event, arg):
        if ((of_c and event == "c_call" and getattr(arg, "__qualname__", "") == qualname) or
                (not of_c and event == "call" and frame.f_code.co_qualname == qualname)):
            sys.setprofile(None)
            caller.append(frame)
            entered.set()  # releases no GIL: the main thread goes on into the call

    def at_call(frame):
        return of_c or linecache.getline(frame.f_code.co_filename,
                                         frame.f_lineno).lstrip().startswith("super().")

    def send():
        entered.wait()
        while True:
            top = sys._current_frames().get(main)
            if top is caller[0] and at_call(top):
                break
            time.sleep(0.001)  # the main thread is still on its way into the call
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
