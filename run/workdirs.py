"""A run's workdir: where each thing a run writes goes, and who holds it.

<workdir>/events.out.tfevents.*      summaries
<workdir>/checkpoints/<step>/        checkpoints
<workdir>/damaged_checkpoints/       checkpoints that could not be restored
<workdir>/export/<model name>/<n>/   SavedModel versions
<workdir>/run.lock                   locked by the run that holds the workdir
"""

import contextlib
import os

import filelock
from run import errors

LOCK_FILE = 'run.lock'


@contextlib.contextmanager
def exclusive(workdir: str, hold: bool = True):
  """Holds `workdir`, created if need be, for this process (unless remote), by
  filelock's lock, which the system releases however the process ends."""
  if not hold or '://' in workdir:
    yield
    return
  lock = filelock.FileLock(os.path.join(workdir, LOCK_FILE), timeout=0)
  try:
    os.makedirs(workdir, exist_ok=True)
    lock.acquire()
  except filelock.Timeout as e:
    raise errors.UserError(
        f'the workdir {workdir} is in use by another run ({e}): wait for it '
        'to end, or use another --workdir'
    ) from None
  except OSError as e:
    raise errors.UserError(
        f'cannot create or write the workdir {workdir} ({e.filename}: '
        f'{e.strerror}): choose a --workdir that can be created and written'
    ) from None
  try:
    yield
  finally:
    os.remove(lock.lock_file)  # Before the release: nothing is left behind.
    lock.release()
