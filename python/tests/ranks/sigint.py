"""Ctrl-C for the interrupt tests: SIGINT this process from inside a call."""
import os
import signal
import sys
import threading
import time


def sigint_inside(qualname):
    """Send this process SIGINT once its main thread is inside the extension's
    ``qualname`` (``"Group.allreduce"``, ``"Request.wait"``), or inside the
    extension's call that the Python function ``qualname`` makes
    (``"Group.__init__"``).

    A profile hook sees the call begin and wakes a thread that sends the
    signal once the main thread runs the call itself: its top frame is then
    the one that made the call (the call releases the GIL to wait, which
    lets this thread run).  Sent while the main thread still ran Python code
    (the hook's own last lines, should the GIL change hands there), the
    signal would raise KeyboardInterrupt before the call began, and the
    call would never reach the library.  The call either ends with
    KeyboardInterrupt or, ignoring the signal, runs to its deadline (the
    harness's timeout then fails the test first).
    """
    main = threading.main_thread().ident
    entered = threading.Event()
    caller = []

    def hook(frame, event, arg):
        # a method of the extension, or a Python function around one (a type's
        # __init__ called through super() is no c_call)
        if ((event == "c_call" and getattr(arg, "__qualname__", "") == qualname) or
                (event == "call" and frame.f_code.co_qualname == qualname)):
            sys.setprofile(None)
            caller.append(frame)
            entered.set()  # releases no GIL: the main thread goes on into the call

    def send():
        entered.wait()
        while sys._current_frames().get(main) is not caller[0]:
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
