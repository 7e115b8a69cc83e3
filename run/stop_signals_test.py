"""Tests of stop_signals in processes of their own, where the signals are real.

main_test.py stops main.py itself, in each part of a run; this takes the one
case that a run meets only by chance: a signal handled inside a finalizer,
where Python drops the SystemExit, so the grace period ends the process.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
from run import stop_signals

# Not in the quick tier (pytest -m "not slow"): processes of their own.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A finalizer that signals its own process and runs Python code, where the
# handler then runs; the main thread would sleep far past the grace period.
# Python's report of the dropped exception goes where main.py sends it.
IN_A_FINALIZER = """
import os, signal, time
from run import startup, stop_signals

stop_signals.install()
startup.quiet_logs()


class SignalsItself:

  def __del__(self):
    os.kill(os.getpid(), signal.{name})
    time.sleep(0.5)


SignalsItself()  # Dropped at once: its finalizer runs here.
time.sleep(10 * stop_signals.GRACE_SECS)
"""


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_a_finalizer_still_ends_the_process(signum):
  began = time.monotonic()
  process = subprocess.run(
      [sys.executable, '-c', IN_A_FINALIZER.format(name=signum.name)],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=60,
  )
  assert time.monotonic() - began < stop_signals.GRACE_SECS + 2
  assert process.returncode == 128 + signum
  assert process.stderr == (
      f'{signum.name}: stopped before training began, with nothing to save; '
      'rerun the same command to continue\n'
  )
