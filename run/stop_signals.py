"""SIGTERM and Ctrl-C (SIGINT): a prompt stop that loses nothing.

Before training begins (imports, data preparation or download, checkpoint
restore, compilation), there is nothing to save: a signal ends the process
where it is, with one line saying what it interrupted, and exit status 128 +
the signal (143 for SIGTERM, a preempted job; 130 for Ctrl-C). It raises
SystemExit in the main thread, so that every `finally` on the way runs (the
array cache's temporary file, the workdir's lock); if the process has not
ended `GRACE_SECS` later (a long C++ call, or threads that its exit waits
for, such as a download's), it ends then. Python drops an exception raised
in a finalizer (`__del__`, a weakref's callback), where a handler can run
too: the signal is then delivered again once the finalizer has returned, and
however the process ends, its exit status is the signal's. Nothing is
half-written where a later run would trust it: files are written under
temporary names and renamed when whole.

Once training has begun, a signal asks the loop to stop at its next
dispatch, which saves a checkpoint there (`asked`). A second Ctrl-C ends the
process at once, without one, even in the middle of a long computation: the
signals are also read by a thread from Python's wakeup file descriptor,
which the C handler writes to at once, whereas Python handlers wait for the
main thread to be back in Python.
"""

import atexit
import functools
import os
import signal
import socket
import sys
import threading

from absl import logging

# Seconds that a process interrupted before training has to end by itself.
GRACE_SECS = 5

# Seconds after an interruption dropped in a finalizer that it is delivered
# again, for the finalizer to return (dropped again, it is delivered again).
AGAIN_SECS = 0.05

# What the main thread is doing, by the innermost function of its stack that
# is in one of these modules (module-level code is an import: not counted);
# 'starting up' otherwise (imports, flags, JAX's set-up).
PHASES = {
    'data.download': 'downloading the data set',
    'tensorflow_datasets': 'preparing the data set',
    'input_pipeline': 'reading the data',
    'data.sources': 'reading the data',
    'run.checkpoints': 'restoring the checkpoint',
    'serving.export': 'exporting the SavedModel',
    'train': 'setting up training (compiling)',
}


def phase(frame) -> str:
  """What the stack from `frame` outwards is doing, for the user."""
  while frame is not None:
    module = frame.f_globals.get('__name__', '')
    for name, doing in PHASES.items():
      in_module = module == name or module.startswith(name + '.')
      if in_module and frame.f_code.co_name != '<module>':
        return doing
    frame = frame.f_back
  return 'starting up'


class Stopped(Exception):
  """The run stopped when asked to, after saving a checkpoint to resume from."""


class StopSignals:
  """Handles SIGTERM and SIGINT for the process; see the module's docstring.

  Training begins, for these signals, when the loop first calls `asked`.
  """

  def __init__(self):
    self.received = None
    self._training = False
    self._interrupted = None  # The signal that ended the process early.
    self._said = threading.Lock()  # Held once the interruption is told.
    # Released once for each signal delivered again, whose byte on the
    # wakeup file descriptor `_watch` then skips.
    self._again = threading.Semaphore(0)
    self._read, self._write = socket.socketpair()
    self._write.setblocking(False)
    self.take_signals()
    threading.Thread(target=self._watch, daemon=True).start()
    atexit.register(self._exit_status)
    # Where Python's reports of the exceptions it dropped go, but ours.
    self.report_unraisable = sys.unraisablehook
    sys.unraisablehook = self._unraisable

  def take_signals(self) -> None:
    """Makes SIGTERM and SIGINT this object's, again if another took them.

    jax.distributed.initialize does: its preemption notifier takes SIGTERM
    in C++.
    """
    signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
    for signum in (signal.SIGTERM, signal.SIGINT):
      signal.signal(signum, self._interrupt)

  def _interrupt(self, signum, frame) -> None:
    """Python's handler, in the main thread: before training, ends it there."""
    if not self._training:
      self._tell(signal.Signals(signum), frame)
      self._interrupted = signum
      raise SystemExit(128 + signum)

  def _unraisable(self, unraisable) -> None:
    """Python's report of an exception it dropped: ours is raised again."""
    if self._interrupted is None or unraisable.exc_type is not SystemExit:
      self.report_unraisable(unraisable)
    else:
      again = threading.Timer(AGAIN_SECS, self._deliver, [self._interrupted])
      again.daemon = True
      again.start()

  def _deliver(self, signum: int) -> None:
    """Sends `signum` to the main thread again, to wake it if it waits."""
    self._again.release()
    signal.pthread_kill(threading.main_thread().ident, signum)

  def _exit_status(self) -> None:
    """At exit (atexit): the status of an interruption, however it ended."""
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
          continue  # Delivered again by `_deliver`, not sent.
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

  def exit_status(self, stopped: Stopped) -> int:
    """Logs why the run `stopped`; returns 128 + the signal, as a shell does.

    Where another process was asked (a preempted job's host), SIGTERM's.
    """
    if self.received:
      received, cause = self.received, self.received.name
    else:
      received, cause = signal.SIGTERM, 'another process was asked to stop'
    logging.warning('%s: %s', cause, stopped)
    return 128 + received

  def asked(self) -> bool:
    """Whether a stop was asked for; the first call marks training begun."""
    self._training = True
    return self.received is not None


@functools.cache
def install() -> StopSignals:
  """The process's StopSignals, installed by the first call (main thread)."""
  return StopSignals()
