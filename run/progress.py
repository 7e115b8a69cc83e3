"""Progress of a run: clu's ReportProgress, a tqdm bar, its phases' seconds.

clu's `ReportProgress` logs steps/s, percentage and ETA: what CI and log
files get. On a terminal, tqdm's bar shows the epoch too, cleared while
ReportProgress logs, so that log lines do not land inside it. `timed`
records a phase's seconds as JAX records its compilations, for
mnist_benchmark.py.
"""

import contextlib
import sys
import time
from typing import TextIO

import jax

EVENT = '/mnist/phase/'  # + the phase's name.


def position(step: int, steps_per_epoch: int) -> str:
  """Global `step` for the user: 'step 32, end of epoch 2', 'step 37, in epoch 3'."""
  epoch, step_in_epoch = divmod(step, steps_per_epoch)
  if not step_in_epoch:
    return f'step {step}, end of epoch {epoch}'
  return f'step {step}, in epoch {epoch + 1}'


@contextlib.contextmanager
def timed(phase: str):
  """Records the seconds of the block as the monitoring event EVENT + phase."""
  start = time.perf_counter()
  try:
    yield
  finally:
    jax.monitoring.record_event_duration_secs(
        EVENT + phase, time.perf_counter() - start
    )


class EpochProgress:
  """The `on_steps` callback of `train.train_epoch`, for one epoch at a time."""

  def __init__(
      self,
      report_progress,
      steps_per_epoch: int,
      batch_size: int,
      num_epochs: int,
      writer=None,
      stream: TextIO | None = None,
  ):
    self._report, self._writer = report_progress, writer
    self._steps_per_epoch, self._batch_size = steps_per_epoch, batch_size
    self._num_epochs, self._stream = num_epochs, stream or sys.stderr
    self._bar = None  # tqdm's, for the epoch begun.
    self._first = self._last = 0
    self._start = self._last_time = 0.0

  @classmethod
  def create(cls, config, steps_per_epoch: int, writer) -> 'EpochProgress':
    """With clu's ReportProgress (which imports TensorFlow: not on import)."""
    from clu import periodic_actions  # pylint: disable=g-import-not-at-top

    report = periodic_actions.ReportProgress(
        num_train_steps=config.num_epochs * steps_per_epoch,
        writer=writer,
        every_secs=config.progress_every_secs,
    )
    return cls(
        report, steps_per_epoch, config.batch_size, config.num_epochs, writer
    )

  def start(self, epoch: int, step: int | None = None) -> None:
    """Starts `epoch` (from 1) at the run's `step`: its first if None."""
    import tqdm  # pylint: disable=g-import-not-at-top  # Not where JAX alone is.

    first = (epoch - 1) * self._steps_per_epoch
    self._first = self._last = first if step is None else step
    self._bar = tqdm.tqdm(
        desc=f'epoch {epoch}/{self._num_epochs}',
        total=self._steps_per_epoch,
        initial=self._first - first,
        unit='step',
        file=self._stream,
        disable=not self._stream.isatty(),
        dynamic_ncols=True,
    )
    self._start = self._last_time = time.perf_counter()

  def __call__(self, step: int) -> None:
    """Reports the run's global `step` reached, in the current epoch."""
    self._bar.clear()  # A no-op off a terminal.
    if self._report(step) and self._writer and not self._bar.disable:
      self._writer.flush()  # Its log lines, before the bar is redrawn.
    self._bar.update(step - self._last)
    self._last, self._last_time = step, time.perf_counter()
    self._bar.set_postfix_str(f'{self.images_per_sec:.0f} images/s')

  @property
  def images_per_sec(self) -> float:
    """Training images a second, from the epoch's start to the last report."""
    seconds = self._last_time - self._start
    return (self._last - self._first) * self._batch_size / seconds

  def end(self) -> None:
    """Leaves the epoch's last bar on its own line."""
    self._bar.close()
