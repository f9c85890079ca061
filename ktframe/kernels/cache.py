"""numba's cache of compiled functions, kept in ktframe's cache folder (:func:`cache_folder`)
for ktframe's own kernels only: numba's locators, which this leaves as they are for everyone else,
would write beside the installed sources or into numba's folder in the user's home, and stop the
import with an error where neither is writable. Imported with numba, at the first compilation.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from typing import Any

from numba.core.caching import CompileResultCacheImpl, FunctionCache, _CacheLocator

CACHE_ENV = "KTFRAME_CACHE_DIR"


def cache_root() -> str:
    """The folder of ktframe's caches, from the environment (it need not exist)."""
    explicit = os.environ.get(CACHE_ENV, "").strip()
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ktframe")


@functools.cache
def cache_folder() -> str | None:
    """Where this process caches compiled kernels, or None where that folder cannot be made or
    written (the kernels then compile in memory). Decided once, at the first compilation."""
    folder = os.path.join(cache_root(), "numba")
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return None
    return folder


@functools.cache
def _digest(path: str, mtime_ns: int, size: int) -> bytes:
    # Keyed by the file's mtime and size as well, so that a source changed while a process runs is read again.
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).digest()


class _Locator(_CacheLocator):
    """A module's compiled kernels under the cache folder, in a subfolder named after the folder
    of its source (two installs of ktframe never share entries), stamped with the source's content."""

    def __init__(self, py_func: Any, py_file: str, root: str) -> None:
        self._py_file = py_file  # numba's warnings name it
        self._lineno = py_func.__code__.co_firstlineno
        source = os.path.dirname(os.path.abspath(py_file))
        self._path = os.path.join(root, f"{os.path.basename(source)}_{hashlib.sha1(source.encode()).hexdigest()}")

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> _Locator | None:
        root = cache_folder()
        return None if root is None or not os.path.isfile(py_file) else cls(py_func, py_file, root)

    def ensure_cache_path(self) -> None:
        os.makedirs(self._path, exist_ok=True)

    def get_cache_path(self) -> str:
        return self._path

    def get_source_stamp(self) -> bytes:
        st = os.stat(self._py_file)
        return _digest(self._py_file, st.st_mtime_ns, st.st_size)

    def get_disambiguator(self) -> str:
        return str(self._lineno)


class _Impl(CompileResultCacheImpl):
    _locator_classes = [_Locator]


class KernelCache(FunctionCache):
    """numba's per-function cache in ktframe's folder; an entry that cannot be read is compiled
    instead, and one that cannot be written (a full disk, a folder made read-only since) is not kept."""

    _impl_class = _Impl

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            return super().load_overload(sig, target_context)
        except OSError:
            return None

    def save_overload(self, sig: Any, data: Any) -> None:
        try:
            super().save_overload(sig, data)
        except OSError:
            pass
