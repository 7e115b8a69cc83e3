"""Tests of the in-epoch progress display, on a terminal and off it."""

import io
import re

import jax
import ml_collections
import pytest
from run import progress


class FakeStream(io.StringIO):
  """A stream that says whether it is a terminal as told."""

  def __init__(self, tty: bool):
    super().__init__()
    self.tty = tty

  def isatty(self) -> bool:
    return self.tty


class FakeReport:
  """Stands in for clu's ReportProgress and its metric writer.

  It reports every step given: logs a line to the stream at once, and leaves
  the writer's line pending, as clu's asynchronous writer does, until flushed.
  """

  def __init__(self, stream):
    self.stream, self.steps = stream, []
    self.pending = []

  def __call__(self, step):
    self.steps.append(step)
    self.stream.write(f'log {step}\n')
    self.pending.append(f'steps_per_sec {step}\n')
    return True

  def flush(self):
    self.stream.write(''.join(self.pending))
    self.pending = []


def _run_epoch(tty: bool, epoch: int = 2):
  stream = FakeStream(tty)
  report = FakeReport(stream)
  config = ml_collections.ConfigDict({'num_epochs': 3, 'batch_size': 128})
  display = progress.EpochProgress(
      config, 10, report, lambda: False, report=report, stream=stream
  )
  with display.epoch(epoch, 10 * (epoch - 1)):
    for step in (14, 18, 20):  # Steps of the run: epoch 2 starts after 10.
      assert display(step) is False
  return display, report, stream.getvalue()


def test_on_a_terminal_a_bar_is_redrawn_after_each_dispatch():
  display, report, out = _run_epoch(tty=True)
  assert report.steps == [14, 18, 20]  # Steps of the run, for ReportProgress.
  # The bar steps aside for the log lines and is redrawn after them: each
  # log line, and the writer's, is a line of its own.
  segments = re.split(r'[\r\n]', out)
  for step in (14, 18, 20):
    assert f'log {step}' in segments
    assert f'steps_per_sec {step}' in segments
  bars = [s for s in segments if s.startswith('epoch 2/3:')]
  for done in ('4/10', '8/10', '10/10'):
    bar = next(b for b in bars if f' {done} ' in b)
    assert 'step/s' in bar and 'images/s' in bar
  assert display.images_per_sec > 0
  assert out.endswith('\n')


def test_off_a_terminal_only_the_periodic_log_lines():
  _, report, out = _run_epoch(tty=False)
  assert report.steps == [14, 18, 20]
  # Nothing waits for the writer: its lines come when they come.
  assert out == 'log 14\nlog 18\nlog 20\n'


def test_a_phase_s_seconds_are_a_jax_monitoring_event():
  events = []
  listener = lambda event, seconds, **kwargs: events.append((event, seconds))
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    with pytest.raises(ValueError):
      with progress.timed('evaluation'):
        raise ValueError  # Timed however the block ends.
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  phases = [(e, s) for e, s in events if e.startswith(progress.EVENT)]
  assert [e for e, _ in phases] == ['/mnist/phase/evaluation']
  assert phases[0][1] >= 0
