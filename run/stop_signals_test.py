"""Tests of stop_signals in processes of their own, where the signals are real.

main_test.py stops main.py itself, at each phase; these take the one case
that a run meets only by chance: a signal handled inside a finalizer.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
from run import stop_signals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A finalizer that signals its own process and runs Python code, where the
# handler then runs, while the main thread is inside a `try` that main.py's
# workdir lock would be in; main.py sends the reports of other dropped
# exceptions to a hook of its own, as here.
IN_A_FINALIZER = """
import os, signal, sys, time
from run import stop_signals

signals = stop_signals.install()
signals.report_unraisable = lambda unraisable: print('reported', flush=True)


class SignalsItself:

  def __del__(self):
    os.kill(os.getpid(), signal.{name})
    deadline = time.monotonic() + 2 * stop_signals.GRACE_SECS
    while time.monotonic() < deadline:
      pass


try:
  SignalsItself()  # Dropped at once: its finalizer runs here.
  time.sleep(2 * stop_signals.GRACE_SECS)
finally:
  print('finally ran', flush=True)
"""


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_a_finalizer_still_ends_the_process_through_finally(
    signum,
):
  began = time.monotonic()
  process = subprocess.run(
      [sys.executable, '-c', IN_A_FINALIZER.format(name=signum.name)],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=60,
  )
  assert time.monotonic() - began < stop_signals.GRACE_SECS
  assert process.returncode == 128 + signum
  assert process.stdout == 'finally ran\n'  # And nothing reported.
  assert process.stderr == (
      f'{signum.name} while starting up: stopped, with nothing to save yet; '
      'rerun the same command to continue\n'
  )
