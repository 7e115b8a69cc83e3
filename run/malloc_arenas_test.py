"""Tests of malloc_arenas: threads share the capped arenas, on glibc only."""

import os
import subprocess
import sys

from run import malloc_arenas
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# In a fresh Python: `limit(argv[1])` unless it is 'none', then six threads
# alive at once each allocate from their arena; prints what `limit` returned
# and the number of arenas that glibc's malloc_info reports.
COUNT_ARENAS = """
import ctypes, sys, tempfile, threading
from run import malloc_arenas
capped = None if sys.argv[1] == 'none' else malloc_arenas.limit(int(sys.argv[1]))
barrier = threading.Barrier(7)
def allocate():
  buffer = bytearray(100_000)  # Under mmap's threshold: from an arena.
  barrier.wait()
  barrier.wait()
threads = [threading.Thread(target=allocate) for _ in range(6)]
for thread in threads:
  thread.start()
barrier.wait()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fclose.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
with tempfile.NamedTemporaryFile() as report:
  stream = libc.fopen(report.name.encode(), b'w')
  libc.malloc_info(0, stream)
  libc.fclose(stream)
  arenas = open(report.name).read().count('<heap nr=')
barrier.wait()
print(capped, arenas)
"""


def _arenas(cap: str, **environment: str) -> tuple[str, int]:
  """What `limit(cap)` returned ('None': not called) and the arenas after."""
  env = {k: v for k, v in os.environ.items() if k != 'MALLOC_ARENA_MAX'}
  env.update(environment)
  out = subprocess.run(
      [sys.executable, '-c', COUNT_ARENAS, cap],
      capture_output=True,
      text=True,
      check=True,
      cwd=ROOT,
      env=env,
      timeout=60,
  ).stdout.split()
  return out[0], int(out[1])


@pytest.fixture(autouse=True)
def _on_glibc():
  if not malloc_arenas.is_glibc():
    pytest.fail('These tests count glibc arenas: run them on Linux with glibc.')


def test_threads_get_an_arena_each_without_the_cap():
  assert _arenas('none') == ('None', 7)


def test_the_cap_makes_threads_share_arenas():
  assert _arenas('2') == ('True', 2)


def test_a_cap_the_user_set_is_left_as_it_is():
  assert _arenas('2', MALLOC_ARENA_MAX='3') == ('False', 3)


def test_nothing_is_done_where_the_c_library_is_not_glibc(monkeypatch):
  monkeypatch.delenv('MALLOC_ARENA_MAX', raising=False)
  monkeypatch.setattr(malloc_arenas, 'is_glibc', lambda: False)
  assert not malloc_arenas.limit()
