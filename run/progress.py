"""Progress: clu's ReportProgress logs steps/s, percentage and ETA (what CI
and log files get); on a terminal, tqdm's bar shows the epoch too, cleared
while ReportProgress logs. The phases' seconds go to JAX's monitoring.
"""

import contextlib
import functools
import time

import jax
from run import parallel

EVENT = '/mnist/phase/'  # + the phase's name.


def position(step: int, steps_per_epoch: int) -> str:
  """Global `step` for the user: 'step 32, end of epoch 2', 'step 37, in epoch 3'."""
  epoch, step_in_epoch = divmod(step, steps_per_epoch)
  if not step_in_epoch:
    return f'step {step}, end of epoch {epoch}'
  return f'step {step}, in epoch {epoch + 1}'


@contextlib.contextmanager
def timed(phase: str):
  """Records the block's seconds as event EVENT + phase, beside JAX's own."""
  start = time.perf_counter()
  try:
    yield
  finally:
    jax.monitoring.record_event_duration_secs(
        EVENT + phase, time.perf_counter() - start
    )


class EpochProgress:
  """The `on_steps` callback of `train.train_epoch`, within `epoch(...)`: it
  reports the steps, and says whether to stop (`stop()` on any process)."""

  def __init__(
      self, config, steps_per_epoch, writer, stop, report=None, stream=None
  ):
    # Here: clu imports TensorFlow; train.py's steps need neither it nor tqdm.
    from clu import periodic_actions  # pylint: disable=g-import-not-at-top
    import tqdm  # pylint: disable=g-import-not-at-top

    self._report = report or periodic_actions.ReportProgress(
        num_train_steps=config.num_epochs * steps_per_epoch,
        writer=writer,
        every_secs=config.progress_every_secs,
    )
    self._new_bar = functools.partial(
        tqdm.tqdm,
        total=steps_per_epoch,
        unit='step',
        file=stream,  # None: stderr.
        disable=None,  # Off a terminal.
        dynamic_ncols=True,
    )
    self._config, self._writer, self._stop = config, writer, stop
    self._steps_per_epoch = steps_per_epoch

  @contextlib.contextmanager
  def epoch(self, epoch: int, step: int):
    """`epoch` (from 1), from the run's global `step`; its bar left after."""
    desc = f'epoch {epoch}/{self._config.num_epochs}'
    initial = step - (epoch - 1) * self._steps_per_epoch
    self._bar = self._new_bar(desc=desc, initial=initial)
    self._first = self._last = step
    self._start = self._last_time = time.perf_counter()
    try:
      yield
    finally:
      self._bar.close()

  def __call__(self, step: int) -> bool:
    """Reports the run's global `step` reached; whether to stop there."""
    self._bar.clear()  # A no-op off a terminal.
    if self._report(step) and self._writer and not self._bar.disable:
      self._writer.flush()  # Its log lines, before the bar is redrawn.
    self._bar.update(step - self._last)
    self._last, self._last_time = step, time.perf_counter()
    self._bar.set_postfix_str(f'{self.images_per_sec:.0f} images/s')
    return parallel.any_process(self._stop())

  @property
  def images_per_sec(self) -> float:
    """Training images a second, from the epoch's start to the last report."""
    seconds = self._last_time - self._start
    return (self._last - self._first) * self._config.batch_size / seconds
