"""Caps glibc's malloc arenas at one a CPU core, for a smaller peak memory.

glibc gives each new thread an arena of its own, up to eight a core, and
memory freed in one arena serves only its threads. A run has dozens of
threads (TensorFlow's, XLA's, orbax's, clu's), and each arena keeps what its
threads freed: capped, the peak resident memory is lower, in the same time
(figures in docs/speed.md).

Only glibc has arenas to cap; elsewhere (macOS, Windows, musl) `limit` does
nothing. A `MALLOC_ARENA_MAX` that the user set is left as it is: glibc read
it as the process started. `main.py` and `mnist_benchmark.py` call `limit`
first, before their imports start threads: a thread keeps its arena.
"""

import ctypes
import os
import platform

M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h.


def is_glibc() -> bool:
  """Whether this Python runs on glibc, whose malloc has arenas."""
  return platform.libc_ver()[0] == 'glibc'


def limit(arenas: int | None = None) -> bool:
  """Caps the arenas at `arenas` (default: the cores this process may use).

  True where it did; False where the C library is not glibc or
  `MALLOC_ARENA_MAX` is set.
  """
  if 'MALLOC_ARENA_MAX' in os.environ or not is_glibc():
    return False
  arenas = arenas or len(os.sched_getaffinity(0))
  return bool(ctypes.CDLL(None).mallopt(M_ARENA_MAX, arenas))
