"""The model thread: where a photo command's detection and embedding run when they are called
from the main thread (issue 47, "Start-up").

Why. torch's CPU build runs each operation's intra-op work on an OpenMP (libgomp) team of
``torch.get_num_threads()`` threads, one team per calling thread. Between operations libgomp's
threads spin before they sleep: about 300,000 turns (a few ms) at each barrier, unless the
process holds more libgomp threads than CPUs, when it spins about 100 turns only. A process
whose only team is the main thread's spins the long way; on a busy machine (a 2-core VM with a
load of ~5) the spinning teammate takes the core the thread holding the work needs, and every
small operation waits a time slice: MTCNN on one 250x250 photo took 1.6 s on the main thread,
0.03 s on a second thread (and 0.03 s with one intra-op thread). ``embed``/``search`` were fast
because their decoding threads detect: their teams and the main thread's (made when the model
was read) make more threads than CPUs. ``align``/``verify`` detected and embedded on the main
thread. Measured: docs/benchmarks.md, "Start-up of the photo commands".

What. :func:`on_model_thread` runs a call on one long-lived worker thread when it is called
from the main thread (and directly anywhere else: the decoding threads of ``embed``, a user's
own threads, the model thread itself), so ``align`` and ``verify`` run as ``embed`` does.

Why this and not fewer threads. The team of the model thread has as many threads as the
caller's (``torch.get_num_threads()`` is carried over at each call), so an operation is split
the same way and its result is the same bit for bit; a many-core machine keeps all its
intra-op threads for a large batch. What changes is libgomp's spinning only, which the extra
team shortens: a sleeping teammate is woken through the kernel (tens of microseconds per
operation) instead of spinning, as already in ``embed``. Setting one intra-op thread would cut
a many-core machine's batches to one core; ``OMP_WAIT_POLICY`` must be set before torch is
imported, which a library cannot do. The thread is made at the first call (no import-time
side effect) and waits idle until the process ends; a process forked
from this one makes its own at its first call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["on_model_thread"]

T = TypeVar("T")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_pid: int | None = None  # the process that made _executor: a forked child makes its own


def _model_executor() -> ThreadPoolExecutor:
    global _executor, _pid
    with _lock:
        if _executor is None or _pid != os.getpid():  # a fork copies no threads
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="marginface-model")
            _pid = os.getpid()
        return _executor


def _with_threads(threads: int, function: Callable[..., T], args: Any, kwargs: Any) -> T:
    import torch

    if torch.get_num_threads() != threads:  # the caller's setting, made after this thread's
        torch.set_num_threads(threads)
    return function(*args, **kwargs)


def on_model_thread(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)``, run on the model thread when called from the main thread
    (waiting for it), else run here; its result returned, its exception raised here.

    The model thread's intra-op thread count is set to the caller's
    (``torch.get_num_threads()``) before each call, so the work is split as it would be on
    the caller's thread and its results are equal bit for bit. Calls from the main thread
    are run one at a time, in order.

    Args:
        function: any callable (e.g. a detector's ``detect``, a model's forward).
        *args, **kwargs: passed to it.

    Raises:
        TypeError: ``function`` is not callable.
    """
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__}")
    if threading.current_thread() is not threading.main_thread():
        return function(*args, **kwargs)
    import torch

    threads = torch.get_num_threads()
    return _model_executor().submit(_with_threads, threads, function, args, kwargs).result()
