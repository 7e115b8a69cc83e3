"""Tests for tools/compare_runs.py, with small Python programs as commands."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tools import compare_runs


def _trainer(seconds_per_epoch: float, epochs: int = 2) -> list[str]:
  """A command that makes {workdir} (it must not exist) and prints epochs."""
  program = (
      'import os, sys, time\n'
      'os.mkdir(sys.argv[1])\n'
      f'for epoch in range(1, {epochs} + 1):\n'
      f'  time.sleep({seconds_per_epoch})\n'
      "  print(f'epoch: {epoch:2d}, train_loss: 0.1, test_loss: 0.1, '\n"
      "        f'test_accuracy: {98 + epoch / 4:.2f}')\n"
  )
  return [sys.executable, '-c', program, '{workdir}']


def test_parse_runs_names_each_command():
  runs = compare_runs.parse_runs(['a=python main.py --x=1', 'b b=ls -l'])
  assert runs == {'a': ['python', 'main.py', '--x=1'], 'b b': ['ls', '-l']}


@pytest.mark.parametrize(
    'specs, message',
    [
        ([], 'no --run given'),
        (['main.py'], "--run='main.py': expected NAME=COMMAND"),
        (['a= '], "--run='a= ': expected NAME=COMMAND"),
        (['a=ls', 'a=pwd'], "--run='a=pwd': the name 'a' is taken"),
    ],
)
def test_parse_runs_rejects(specs, message):
  with pytest.raises(ValueError, match='^' + re.escape(message)):
    compare_runs.parse_runs(specs)


def test_compare_times_the_epoch_between_its_line_and_the_one_before():
  runs = {'slow': _trainer(0.6, 3), 'fast': _trainer(0.1)}
  summary = compare_runs.compare(runs, rounds=2, epoch=2)
  slow, fast = summary['slow'], summary['fast']
  assert summary['timed'] == 'epoch 2'
  assert all(0.6 <= s < 3 for s in slow['runs']), slow
  assert all(0.1 <= s < 0.6 for s in fast['runs']), fast
  assert slow['pairs'] == [1.0, 1.0]
  assert all(p > 1.5 for p in fast['pairs']), fast
  assert slow['test_accuracy'] == fast['test_accuracy'] == [98.5, 98.5]
  assert all(gb > 0 for gb in fast['peak_rss_gb'])


def test_the_command_line_reports_each_command_s_peak_rss():
  program = "b = b'x' * 300_000_000; print('epoch: 1, test_accuracy: 9.5')"
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'tools.compare_runs',
          '--rounds=1',
          '--epoch=0',
          f'--run=big={shlex.join([sys.executable, "-c", program])}',
      ],
      capture_output=True,
      text=True,
      check=True,
  ).stdout
  big = json.loads(out.splitlines()[-1])['big']
  # 300 MB, Python's own, and this tool's from before the command's exec.
  assert 0.29 < big['peak_rss_gb'][0] < 0.4, big
  assert big['test_accuracy'] == [9.5]


def test_compare_times_whole_commands_with_epoch_0():
  summary = compare_runs.compare({'one': _trainer(0.1, 3)}, rounds=1, epoch=0)
  assert summary['timed'] == 'whole command'
  assert 0.3 <= summary['one']['seconds'] < 5
  assert summary['one']['test_accuracy'] == [98.75]  # The last epoch's.


def test_each_run_gets_a_new_workdir_removed_after(tmp_path):
  record = tmp_path / 'workdirs'
  program = (
      'import os, sys\n'
      'os.mkdir(sys.argv[1])\n'
      f'open({str(record)!r}, "a").write(sys.argv[1] + "\\n")\n'
      "print('epoch: 1, test_accuracy: 99.00')\n"
  )
  runs = {'a': [sys.executable, '-c', program, '{workdir}']}
  compare_runs.compare(runs, rounds=2, epoch=1)
  workdirs = record.read_text().split()
  assert len(set(workdirs)) == 2
  assert not any(os.path.exists(w) for w in workdirs)


@pytest.mark.parametrize(
    'argv, why',
    [
        ([sys.executable, '-c', 'import sys; sys.exit(3)'], 'exited with 3'),
        (_trainer(0, epochs=1), 'printed no epoch line for epoch 2'),
    ],
)
def test_a_failed_command_is_an_error_naming_it(argv, why, capsys):
  with pytest.raises(RuntimeError) as error:
    compare_runs.compare({'bad': argv}, rounds=1, epoch=2)
  assert str(error.value).startswith("'bad' (" + shlex.join(argv[:1]))
  assert str(error.value).endswith(why)
  if argv[-1] == '{workdir}':  # Its output, for the reason.
    assert 'epoch:  1' in capsys.readouterr().err


def test_stolen_seconds_reads_the_eighth_count_of_the_cpu_line(tmp_path):
  ticks = os.sysconf('SC_CLK_TCK')
  stat = tmp_path / 'stat'
  stat.write_text(f'cpu  10 0 5 900 1 0 2 {3 * ticks} 0 0\ncpu0 1 2 3\n')
  assert compare_runs.stolen_seconds(str(stat)) == 3.0
  stat.write_text('cpu  10 0 5 900\n')  # A kernel without the count.
  assert compare_runs.stolen_seconds(str(stat)) is None
  assert compare_runs.stolen_seconds(str(tmp_path / 'missing')) is None


def test_compare_reports_the_seconds_stolen_during_each_run():
  summary = compare_runs.compare({'a': _trainer(0.1)}, rounds=1, epoch=2)
  (stolen,) = summary['a']['stolen_seconds']
  if compare_runs.stolen_seconds() is None:
    assert stolen is None
  else:
    assert stolen >= 0
