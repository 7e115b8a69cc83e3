"""A run's workdir: where each thing a run writes goes, and who holds it.

<workdir>/events.out.tfevents.*      summaries
<workdir>/checkpoints/<step>/        checkpoints
<workdir>/damaged_checkpoints/       checkpoints that could not be restored
<workdir>/export/<model name>/<n>/   SavedModel versions
<workdir>/run.lock                   the running process, while it runs
"""

import contextlib
import os
import pathlib
import socket
import time

from absl import logging
import filelock
from run import errors

LOCK_FILE = 'run.lock'


class WorkdirError(errors.UserError):
  """The workdir cannot be used as it is; the message is one line for the user."""


def checkpoints_dir(workdir: str) -> str:
  return os.path.join(workdir, 'checkpoints')


def damaged_checkpoint_dir(workdir: str, step: int) -> str:
  """Where the checkpoint of `step` that cannot be restored goes, by the time."""
  now = time.strftime('%Y%m%d-%H%M%S')
  return os.path.join(workdir, 'damaged_checkpoints', f'{step}-{now}')


def export_dir(workdir: str, model_name: str) -> str:
  """The model directory that TF Serving watches: its versions go under it."""
  return os.path.join(workdir, 'export', model_name)


def prepare(workdir: str) -> None:
  """Creates `workdir` if need be; WorkdirError if files cannot be written."""
  probe = os.path.join(workdir, f'.write_test.{os.getpid()}')
  try:
    os.makedirs(workdir, exist_ok=True)
    with open(probe, 'w'):
      pass
    os.remove(probe)
  except OSError as e:
    # os names the directory it could not create; a file in the way of it
    # is what the user has to move.
    path = pathlib.Path(workdir)
    nearest = next(p for p in (path, *path.parents) if p.exists())
    cause = f'{e.filename}: {e.strerror}'
    if not nearest.is_dir():
      cause = f'{nearest} is not a directory'
    raise WorkdirError(
        f'cannot create or write the workdir {workdir} ({cause}): '
        'choose a --workdir that can be created and written'
    ) from None


@contextlib.contextmanager
def exclusive(workdir: str, hold: bool = True):
  """Holds `workdir` for this process, or raises WorkdirError naming its holder.

  filelock's lock, which the system releases however the process ends. The
  file names the holder while it runs and is removed when it ends: a file
  found with a name in it is a killed run's. Nothing is held on remote file
  systems (gs://), or without `hold`.
  """
  if not hold or '://' in workdir:
    yield
    return
  prepare(workdir)
  path = os.path.join(workdir, LOCK_FILE)
  lock = filelock.FileLock(path, timeout=0)
  try:
    lock.acquire()
  except filelock.Timeout:
    with open(path) as f:
      holder = f.read().strip() or 'a run'
    raise WorkdirError(
        f'the workdir {workdir} is in use by {holder} (it holds {path}): '
        'wait for it to end, or use another --workdir'
    ) from None
  try:
    with open(path, 'r+') as f:
      if killed := f.read().strip():
        logging.warning(
            'Taking over %s from %s, which ended without releasing it.',
            path,
            killed,
        )
      f.seek(0)
      f.truncate()
      f.write(f'process {os.getpid()} on {socket.gethostname()}\n')
    yield
  finally:
    os.remove(path)  # Before the lock is released: the process ended it.
    lock.release()
