"""SIGTERM and Ctrl-C (SIGINT): a prompt stop that loses nothing.

Before training begins (imports, data, restore, compilation) there is
nothing to save: a signal raises SystemExit(128 + the signal) in the main
thread, after one line saying what it interrupted, so that every `finally`
runs (the workdir's lock, temporary files); a process not ended
`GRACE_SECS` later (in a long C++ call) ends then. A signal handled inside
a finalizer, where Python drops exceptions, is delivered again after it.
Once training has begun, a signal asks the loop to stop at its next
dispatch, with a checkpoint (`asked`). A second Ctrl-C exits at once, even
in a long computation: a thread reads the signals from Python's wakeup
file descriptor, written by the C handler at once, where Python's handlers
wait for the main thread to be back in Python.
"""

import atexit
import functools
import os
import signal
import socket
import sys
import threading

from absl import logging

GRACE_SECS = 5  # For a process interrupted before training to end itself.
AGAIN_SECS = 0.05  # Before a signal dropped in a finalizer is sent again.

# What the main thread is doing, by the innermost function of its stack in
# one of these modules.
PHASES = {
    'data.download': 'downloading the data set',
    'tensorflow_datasets': 'preparing the data set',
    'input_pipeline': 'reading the data',
    'data.sources': 'reading the data',
    'run.checkpoints': 'restoring the checkpoint',
    'serving.export': 'exporting the SavedModel',
    'train': 'setting up training (compiling)',
}


class Stopped(Exception):
  """The run stopped when asked to, after saving a checkpoint to resume from."""


def phase(frame) -> str:
  """What the stack from `frame` outwards is doing, for the user."""
  while frame is not None:
    module = frame.f_globals.get('__name__', '') + '.'
    if frame.f_code.co_name != '<module>':  # Module-level code: an import.
      for name, doing in PHASES.items():
        if module.startswith(name + '.'):
          return doing
    frame = frame.f_back
  return 'starting up'


class StopSignals:
  """Handles SIGTERM and SIGINT for the process (see the module's docstring).

  Training begins, for these signals, when the loop first calls `asked`.
  """

  def __init__(self):
    self.received = None
    self._training = False
    self._interrupted = None  # The signal that ended the process early.
    self._said = threading.Lock()  # Held once the interruption is told.
    self._again = threading.Semaphore(0)  # Signals sent again, to skip.
    self._read, self._write = socket.socketpair()
    self._write.setblocking(False)
    self.take_signals()
    threading.Thread(target=self._watch, daemon=True).start()
    atexit.register(self._exit_status)
    # Python's reports of the exceptions it drops go here, but ours.
    self.report_unraisable = sys.unraisablehook
    sys.unraisablehook = self._unraisable

  def take_signals(self) -> None:
    """Makes the signals this object's again (jax.distributed takes SIGTERM)."""
    signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
    for signum in (signal.SIGTERM, signal.SIGINT):
      signal.signal(signum, self._interrupt)

  def _interrupt(self, signum, frame) -> None:
    """Python's handler, in the main thread: before training, ends it there."""
    if not self._training:  # Else `_watch` has it.
      self._tell(signal.Signals(signum), frame)
      self._interrupted = signum
      raise SystemExit(128 + signum)

  def _unraisable(self, unraisable) -> None:
    """An exception Python dropped: our SystemExit is raised again, later."""
    if self._interrupted is None or unraisable.exc_type is not SystemExit:
      self.report_unraisable(unraisable)
    else:
      timer = threading.Timer(AGAIN_SECS, self._send, [self._interrupted])
      timer.daemon = True
      timer.start()

  def _send(self, signum: int) -> None:
    self._again.release()
    signal.pthread_kill(threading.main_thread().ident, signum)

  def _exit_status(self) -> None:
    """At exit: the status of an interruption, however the process ended."""
    if self._interrupted is not None:
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(128 + self._interrupted)

  def _tell(self, signum: signal.Signals, frame) -> None:
    """Prints, once, the line that says what `signum` interrupted."""
    if self._said.acquire(blocking=False):
      print(
          f'{signum.name} while {phase(frame)}: stopped, with nothing to '
          'save yet; rerun the same command to continue',
          file=sys.stderr,
          flush=True,
      )

  def _watch(self) -> None:
    while data := self._read.recv(64):
      for signum in map(signal.Signals, data):
        if self._again.acquire(blocking=False):
          continue  # Sent again by `_send`, not by the user.
        if self.received is None:
          self.received = signum
          if self._training:
            logging.warning(
                '%s: stopping at the next dispatch, with a checkpoint (Ctrl-C '
                'again to exit at once, without one).',
                signum.name,
            )
          else:
            timer = threading.Timer(GRACE_SECS, self._end, [signum])
            timer.daemon = True
            timer.start()
        elif signum == signal.SIGINT:
          logging.warning('SIGINT again: exiting now, without a checkpoint.')
          os._exit(128 + signal.SIGINT)

  def _end(self, signum: signal.Signals) -> None:
    """Ends a process that an interruption before training did not end."""
    if not self._training:
      main = sys._current_frames().get(threading.main_thread().ident)  # pylint: disable=protected-access
      self._tell(signum, main)
      os._exit(128 + signum)

  def asked(self) -> bool:
    """Whether a stop was asked for; the first call marks training begun."""
    self._training = True
    return self.received is not None

  def exit_status(self, stopped: Stopped) -> int:
    """Logs why the run `stopped`; returns 128 + the signal, as a shell does.

    Where another process was asked (a preempted job's host), SIGTERM's.
    """
    if self.received:
      logging.warning('%s: %s', self.received.name, stopped)
      return 128 + self.received
    logging.warning('another process was asked to stop: %s', stopped)
    return 128 + signal.SIGTERM


@functools.cache
def install() -> StopSignals:
  """The process's StopSignals, installed by the first call (main thread)."""
  return StopSignals()
