"""SIGTERM and Ctrl-C (SIGINT): a prompt stop that loses nothing.

Before training begins there is nothing to save: a signal raises SystemExit
(128 + the signal) in the main thread, after one line, so that every `finally`
runs (the workdir's lock, temporary files), or ends the process `GRACE_SECS`
later where Python drops it (a long C++ call, a finalizer). Once training has
begun, the loop stops at its next dispatch, with a checkpoint. A second Ctrl-C
exits at once, even in a long computation where Python's handlers would wait:
a thread reads the signals from the wakeup fd, written by the C handler.
"""

import functools
import os
import signal
import socket
import sys
import threading

from absl import logging

GRACE_SECS = 5  # For a process interrupted before training to end itself.


class Stopped(Exception):
  """The run stopped when asked to, after saving a checkpoint to resume from."""

  def __init__(self, at: str, directory):
    super().__init__(
        f'stopped ({at}) with a checkpoint in {directory}: rerun the same '
        'command to resume'
    )


class StopSignals:
  """SIGTERM and SIGINT for the process; training begins at the first `asked`."""

  def __init__(self):
    self.received = None
    self._training = False
    self._said = threading.Lock()  # Held once the interruption is told.
    self._read, self._write = socket.socketpair()
    self._write.setblocking(False)
    self.take_signals()
    threading.Thread(target=self._watch, daemon=True).start()

  def take_signals(self) -> None:
    """Makes the signals this object's again (jax.distributed takes SIGTERM)."""
    signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
    for signum in (signal.SIGTERM, signal.SIGINT):
      signal.signal(signum, self._interrupt)

  def _interrupt(self, signum, unused_frame) -> None:
    """Python's handler, in the main thread: before training, ends it there."""
    if not self._training:  # Else `_watch` has it.
      self._tell(signal.Signals(signum))
      raise SystemExit(128 + signum)

  def _tell(self, signum: signal.Signals) -> None:
    if self._said.acquire(blocking=False):
      print(
          f'{signum.name}: stopped before training began, with nothing to '
          'save; rerun the same command to continue',
          file=sys.stderr,
          flush=True,
      )

  def _watch(self) -> None:
    while data := self._read.recv(64):
      for signum in map(signal.Signals, data):
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
    if not self._training:
      self._tell(signum)
      sys.stderr.flush()
      os._exit(128 + signum)

  def asked(self) -> bool:
    """Whether a stop was asked for; the first call marks training begun."""
    self._training = True
    return self.received is not None

  def exit_status(self, stopped: Stopped) -> int:
    """Logs why the run `stopped`; returns 128 + the signal, as a shell does."""
    if self.received:
      logging.warning('%s: %s', self.received.name, stopped)
      return 128 + self.received
    logging.warning('another process was asked to stop: %s', stopped)
    return 128 + signal.SIGTERM  # Its host's preemption notice, as this one's.


@functools.cache
def install() -> StopSignals:
  """The process's StopSignals, installed by the first call (main thread)."""
  return StopSignals()
