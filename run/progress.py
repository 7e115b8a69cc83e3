"""Progress within an epoch: clu's ReportProgress, plus a bar on a terminal.

clu's `ReportProgress` logs a line (steps/s, percentage, ETA) every
`progress_every_secs` and writes `steps_per_sec` summaries, whatever the
output is: that is what CI and log files get. When stderr, where absl logs,
is a terminal, a one-line bar rewritten after each dispatch shows the epoch's
steps, steps/s, images/s and ETA as well; it steps aside while
ReportProgress logs, so that log lines do not land inside it (clu's default
writer logs from a thread of its own: the bar waits for it to finish).
"""

import sys
import time
import typing
from typing import TextIO

import ml_collections

if typing.TYPE_CHECKING:  # clu's writers import TensorFlow: see `create`.
  from clu import metric_writers
  from clu import periodic_actions

WIDTH = 20  # Characters of the bar itself.
CLEAR_LINE = '\r\x1b[K'


class EpochProgress:
  """The `on_steps` callback of `train.train_epoch`, for one epoch at a time."""

  def __init__(
      self,
      report_progress: 'periodic_actions.ReportProgress',
      steps_per_epoch: int,
      batch_size: int,
      num_epochs: int,
      writer: 'metric_writers.MetricWriter | None' = None,
      stream: TextIO | None = None,
  ):
    self._report = report_progress
    self._writer = writer
    self._steps_per_epoch = steps_per_epoch
    self._batch_size = batch_size
    self._num_epochs = num_epochs
    self._stream = stream or sys.stderr
    self.bar = self._stream.isatty()
    self._epoch, self._first, self._start = 0, 0, 0.0
    self._last, self._last_time = 0, 0.0

  @classmethod
  def create(
      cls,
      config: ml_collections.ConfigDict,
      steps_per_epoch: int,
      writer: 'metric_writers.MetricWriter',
  ) -> 'EpochProgress':
    """With clu's ReportProgress every `config.progress_every_secs`.

    Its module imports TensorFlow, through clu's writers: here, where the
    run has a writer, not with this module.
    """
    from clu import periodic_actions  # pylint: disable=g-import-not-at-top

    report_progress = periodic_actions.ReportProgress(
        num_train_steps=config.num_epochs * steps_per_epoch,
        writer=writer,
        every_secs=config.progress_every_secs,
    )
    return cls(
        report_progress,
        steps_per_epoch,
        config.batch_size,
        config.num_epochs,
        writer,
    )

  def start(self, epoch: int, step: int | None = None) -> None:
    """Starts timing `epoch` (from 1) at global `step` (its first, if None).

    A resumed run starts an epoch in its middle.
    """
    first = (epoch - 1) * self._steps_per_epoch
    self._epoch, self._first = epoch, first if step is None else step
    self._start = time.perf_counter()

  def __call__(self, step: int) -> None:
    """Reports the run's global `step` reached, in the current epoch."""
    self._last, self._last_time = step, time.perf_counter()
    if self.bar:
      self._stream.write(CLEAR_LINE)
    reported = self._report(step)
    if self.bar:
      if reported and self._writer:
        self._writer.flush()  # Its log lines, before the bar is redrawn.
      seconds = time.perf_counter() - self._start
      in_epoch = step - (self._epoch - 1) * self._steps_per_epoch
      self._stream.write(
          '\r' + self.line(in_epoch, seconds, step - self._first)
      )
      self._stream.flush()

  @property
  def images_per_sec(self) -> float:
    """Training images a second, from the epoch's start to the last report."""
    seconds = self._last_time - self._start
    return (self._last - self._first) * self._batch_size / seconds

  def end(self) -> None:
    """Leaves the epoch's last bar on its own line."""
    if self.bar:
      self._stream.write('\n')
      self._stream.flush()

  def line(self, steps: int, seconds: float, timed: int | None = None) -> str:
    """The bar after `steps` of the epoch, `timed` of them (all if None) in `seconds`."""
    total = self._steps_per_epoch
    filled = WIDTH * steps // total
    timed = steps if timed is None else timed
    rate = timed / seconds if seconds > 0 else 0.0
    eta = (total - steps) / rate if rate else 0.0
    return (
        f'epoch {self._epoch}/{self._num_epochs} '
        f'[{"#" * filled}{"." * (WIDTH - filled)}] {steps}/{total} '
        f'{rate:.1f} steps/s {rate * self._batch_size:.0f} images/s '
        f'ETA {int(eta) // 60}:{int(eta) % 60:02d}'
    )
