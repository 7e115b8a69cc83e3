"""Tests of the in-epoch progress display, on a terminal and off it."""

import io

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
  display = progress.EpochProgress(report, 10, 128, 3, report, stream=stream)
  display.start(epoch)
  for step in (14, 18, 20):  # Steps of the run: epoch 2 starts after 10.
    display(step)
  display.end()
  return display, report, stream.getvalue()


def test_on_a_terminal_a_bar_is_redrawn_after_each_dispatch():
  display, report, out = _run_epoch(tty=True)
  assert display.bar
  assert report.steps == [14, 18, 20]  # Steps of the run, for ReportProgress.
  # The bar steps aside for the log lines and is redrawn after them.
  assert out.count(progress.CLEAR_LINE + 'log 14\nsteps_per_sec 14\n') == 1
  assert out.count(progress.CLEAR_LINE + 'log ') == 3
  parts = out.split('\r')
  bars = [p.split('\n')[0] for p in parts if p.startswith('epoch')]
  assert len(bars) == 3
  assert bars[0].startswith('epoch 2/3 [########............] 4/10 ')
  assert bars[2].startswith('epoch 2/3 [####################] 10/10 ')
  for bar in bars:
    assert ' steps/s ' in bar and ' images/s ETA ' in bar
  assert out.endswith('\n')


def test_off_a_terminal_only_the_periodic_log_lines():
  display, report, out = _run_epoch(tty=False)
  assert not display.bar
  assert report.steps == [14, 18, 20]
  # Nothing waits for the writer: its lines come when they come.
  assert out == 'log 14\nlog 18\nlog 20\n'


def test_the_bar_reports_rates_and_time_left():
  display = progress.EpochProgress(None, 100, 128, 10, stream=FakeStream(True))
  display.start(1)
  assert display.line(25, 5.0) == (
      'epoch 1/10 [#####...............] 25/100 5.0 steps/s 640 images/s ETA 0:15'
  )
