"""Seconds spent in each phase of a run, for mnist_benchmark.py's report.

The functions that a run spends its time in (loading the data, training an
epoch, evaluating, writing summaries, saving a checkpoint, exporting) are
decorated with `timed(phase)`, which adds their seconds to `SECONDS[phase]`:
this process's count, which the benchmark clears before a run and reads
after it. The loop itself times nothing.
"""

import collections
import functools
import time

SECONDS = collections.Counter()


def timed(phase: str):
  """Decorates a function to add the seconds of each call to `SECONDS[phase]`."""

  def decorate(function):
    @functools.wraps(function)
    def timed_function(*args, **kwargs):
      start = time.perf_counter()
      try:
        return function(*args, **kwargs)
      finally:
        SECONDS[phase] += time.perf_counter() - start

    return timed_function

  return decorate
