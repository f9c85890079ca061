"""numba kernels compiled on first use, and cached in a folder of the user's.

A function decorated with :func:`kernel` stays a plain Python function until some kernel is first
called: importing a module of kernels imports no numba, compiles nothing and reads or writes no
file. That first call imports numba and turns every kernel declared so far into a numba
dispatcher, bound in its module in place of the declaration (and numba's ``prange`` in place of
this module's :data:`prange`), so that a kernel that calls another, or inlines it
(``inline="always"``), finds a dispatcher there, as numba requires. Of numba's own settings only
its threading layer is chosen here, where the user has not chosen one (:func:`load_numba`).

Compiled kernels are cached under ``numba/`` in ``$KTFRAME_CACHE_DIR`` if set, else in
``$XDG_CACHE_HOME/ktframe`` if that is an absolute path, else in ``~/.cache/ktframe``, as the
environment says at that first call; never beside the installed sources, which may be read-only or shared. Where that folder cannot be made
or written, the kernels compile in memory, in every process anew; a cache file that cannot be read
or written is likewise compiled instead (:mod:`ktframe.kernels.cache`).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from ktframe.core import host

# Work on fewer numbers than this (the tensors a kernel would take, together) runs on PyTorch's
# (or NumPy's) own operations, never on a kernel: importing numba and loading the kernels, or
# compiling them the first time (a minute or more), costs more than such work can gain, and a
# small problem is not kept waiting for either. A few thousand points of a few coordinates are
# below it (2 000 points in 2-D, k = 5: the token stream holds about 20 000 numbers).
MIN_NUMBERS = 1 << 16


class _NumbaName:
    """A module's name for one of numba's objects (``prange``), bound to numba's own when the
    module's kernels are compiled; until then it is ``range``, as numba's is to Python."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: int) -> range:
        return range(*args)


prange = _NumbaName("prange")


class Kernel:
    """A kernel not yet compiled: :attr:`py_func` and the options for ``numba.njit``. Calling it
    compiles every pending kernel (:func:`compile_pending`), then calls its dispatcher."""

    def __init__(self, py_func: Callable, options: dict[str, Any]) -> None:
        self.py_func = py_func
        self.options = options
        self.dispatcher: Callable | None = None
        functools.update_wrapper(self, py_func)

    def __call__(self, *args: Any) -> Any:
        if self.dispatcher is None:
            compile_pending()
        return self.dispatcher(*args)


_pending: list[Kernel] = []
_lock = threading.Lock()
_ours: set[Callable] = set()  # every kernel's Python function
_first_compile: list[Callable[[str | None], None]] = []


def on_first_compile(callback: Callable[[str | None], None]) -> None:
    """Have ``callback(folder)`` called once, as this process starts to compile a kernel for the
    first time (a kernel loaded from the cache is not compiled), with the folder that will cache
    it (None: none can). For a command line to say why it waits; nothing is said by default."""
    _first_compile.append(callback)
    if load_numba.cache_info().currsize:  # numba is loaded: kernels may compile from now on
        _listen()


@functools.cache
def _listen() -> None:
    """numba's compile event told to the callbacks of :func:`on_first_compile`, once, for a kernel of ours."""
    from numba.core import event

    class FirstCompile(event.Listener):
        def on_start(self, started: event.Event) -> None:
            if _first_compile and getattr(started.data.get("dispatcher"), "py_func", None) in _ours:
                from ktframe.kernels.cache import cache_folder

                callbacks = list(_first_compile)
                _first_compile.clear()
                for callback in callbacks:
                    callback(cache_folder())

        def on_end(self, ended: event.Event) -> None:
            pass

    event.register("numba:compile", FirstCompile())


def kernel(**options: Any) -> Callable[[Callable], Kernel]:
    """Declare a numba kernel: ``@kernel(parallel=True, nogil=True)`` is ``@numba.njit(...)``
    compiled on first use and cached as the module says (``cache=`` is decided here)."""
    if "cache" in options:
        raise TypeError("kernel() decides caching itself; drop cache=")

    def declare(py_func: Callable) -> Kernel:
        declared = Kernel(py_func, options)
        with _lock:
            _pending.append(declared)
            _ours.add(py_func)
        return declared

    return declare


# Intel TBB's library as numba's tbb layer asks the loader for it, by name (numba 0.68's own list).
_TBB_LIBRARY = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib", "win32": "tbb12.dll"}


def _load_tbb() -> bool:
    """Whether Intel TBB's library, from the ``tbb`` distribution, is loaded into the process.

    pip puts it in the environment's ``lib`` folder, where the loader does not look when numba's
    tbb layer asks for it by name (outside conda); loaded once by its path, it is found by that
    name from then on."""
    name = _TBB_LIBRARY.get(sys.platform)
    try:
        files = importlib.metadata.files("tbb") or []
    except importlib.metadata.PackageNotFoundError:
        return False
    for file in files:
        if file.name == name:
            try:
                ctypes.CDLL(str(file.locate()), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                return False
            return True
    return False


def _shared_openmp() -> bool:
    """Whether an OpenMP runtime is in the process's global scope, where numba's omp layer, loaded
    after it, binds its OpenMP calls (on Linux, whose loader searches that scope first; PyTorch
    puts its bundled libgomp there as it is imported)."""
    if sys.platform != "linux":
        return False
    try:
        return hasattr(ctypes.CDLL(None), "GOMP_parallel")
    except OSError:
        return False


@functools.cache
def load_numba() -> ModuleType:
    """numba, imported on first use, its threading layer chosen unless the user chose one
    (``NUMBA_THREADING_LAYER``) or the host's own numba code has started one already.

    The first of these that numba can start is taken. Its OpenMP layer, where PyTorch's runtime is
    in the global scope (Linux): its calls into OpenMP bind there, so the kernels' loops run on
    PyTorch's own pool of threads, which waits on the cores between launches, and no second pool
    contends with it. (numba also loads the system's libgomp, which it links by file name, not by
    soname; of that copy it calls only ``omp_get_supported_active_levels``, which starts no thread.)
    numba ends a process forked after such a pool started at that child's first kernel, so in such a
    child the kernels are not used (:func:`ktframe.kernels.cpu.eligible`). Else the tbb layer
    (``tbb`` is a dependency where it has wheels): it launches a loop in microseconds, as OpenMP
    does, from several threads at once, with a pool of its own beside PyTorch's, whose workers join
    a launch late where other threads spin on the cores. Else numba's own pool, ``workqueue``: it
    launches a loop in tens of microseconds and takes one launch at a time, which
    :func:`ktframe.kernels.cpu._using` keeps to. Where numba cannot load a layer (the system's
    libgomp missing, a TBB older than numba supports), the next is tried."""
    import numba

    global _openmp_pool_owner
    try:
        numba.threading_layer()  # started by the host's own numba code, as it chose
    except ValueError:  # no layer started yet
        _start_layer(numba)
    layer = numba.threading_layer()
    if layer == "omp":
        _openmp_pool_owner = os.getpid()
    host.kernels_run_on_own_pool(layer != "omp" or not _shared_openmp())
    return numba


def _start_layer(numba: ModuleType) -> None:
    """Start ktframe's choice of threading layer (:func:`load_numba`), or the user's."""
    budget = torch.get_num_threads()
    if numba.config.THREADING_LAYER == "default":
        for layer, available in (("omp", _shared_openmp), ("tbb", _load_tbb), ("workqueue", lambda: True)):
            if available():
                numba.config.THREADING_LAYER = layer
                try:
                    numba.get_num_threads()  # starts the layer
                    break
                except ValueError:  # numba could not load it
                    continue
    else:  # the user's choice: where numba cannot load it, the first kernel says so
        if numba.config.THREADING_LAYER == "tbb":
            _load_tbb()  # found where pip put it
        numba.get_num_threads()
    torch.set_num_threads(budget)  # an OpenMP layer sets its own count in PyTorch's runtime as it starts


# The process in which ktframe's kernels first found numba's OpenMP layer started.
_openmp_pool_owner: int | None = None


def forked_from_openmp_pool() -> bool:
    """Whether this process was forked from one whose kernels started numba's OpenMP layer:
    numba ends such a child at its first parallel kernel (GNU OpenMP's pool does not survive a
    fork), so it takes PyTorch's operations instead."""
    return _openmp_pool_owner is not None and _openmp_pool_owner != os.getpid()


def compile_pending() -> None:
    """Turn every kernel declared so far into a numba dispatcher, bound in its module."""
    with _lock:
        if not _pending:
            return
        numba = load_numba()
        from ktframe.kernels.cache import KernelCache, cache_folder  # with numba, which it imports

        if _first_compile:
            _listen()

        caching = cache_folder() is not None
        dispatchers = []
        for declared in _pending:
            dispatcher = numba.njit(**declared.options)(declared.py_func)
            if caching and hasattr(dispatcher, "enable_caching"):  # not with NUMBA_DISABLE_JIT
                dispatcher._cache = KernelCache(declared.py_func)  # what enable_caching() does, in ktframe's folder
            dispatchers.append(dispatcher)
        for declared, dispatcher in zip(_pending, dispatchers):
            namespace = declared.py_func.__globals__
            if namespace.get(declared.__name__) is declared:
                namespace[declared.__name__] = dispatcher
            for name, value in list(namespace.items()):
                if isinstance(value, _NumbaName):
                    namespace[name] = getattr(numba, value.name)
        # Only now, with every module's names bound, may a caller skip compile_pending().
        for declared, dispatcher in zip(_pending, dispatchers):
            declared.dispatcher = dispatcher
        _pending.clear()
