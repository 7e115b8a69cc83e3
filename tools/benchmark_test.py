"""The benchmark: steps where only JAX, Flax and optax are installed, and
whole commands (small Python programs here) timed in turns."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from tools import benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a machine with JAX, Flax, optax, NumPy, absl and ml_collections alone
# lacks, among what the project installs.
ABSENT = (
    'tensorflow',
    'tensorflow_datasets',
    'clu',
    'orbax',
    'tqdm',
    'filelock',
    'PIL',
    'matplotlib',
    'grpc',
    'tensorflow_serving',
)
SCRIPT = f"""
import runpy, sys
for name in {ABSENT!r}:
  sys.modules[name] = None  # Its import fails, as where it is not installed.
sys.argv = ['benchmark', *sys.argv[1:]]
runpy.run_module('tools.benchmark', run_name='__main__')
"""


@pytest.mark.slow
def test_the_levers_time_in_turns_without_tensorflow_tfds_clu_or_orbax():
  result = subprocess.run(
      [sys.executable, '-c', SCRIPT, '--variants=levers', '--steps=2']
      + ['--rounds=2'],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  timed = json.loads(result.stdout.strip().splitlines()[-1])
  assert list(timed) == list(benchmark.LEVERS)
  for variant in timed.values():
    assert len(variant['ms_per_step']) == 2 and variant['median'] > 0
  assert timed['ours, float32, 32-bit dropout bits']['pairs'] == [1.0, 1.0]


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


def _timers(runs: dict, epoch: int) -> dict:
  return {
      name: lambda n=name, a=argv: benchmark.run_once(n, a, epoch)
      for name, argv in runs.items()
  }


def test_parse_runs_names_each_command():
  runs = benchmark.parse_runs(['a=python main.py --x=1', 'b b=ls -l'])
  assert runs == {'a': ['python', 'main.py', '--x=1'], 'b b': ['ls', '-l']}


@pytest.mark.parametrize(
    'specs, message',
    [
        (['main.py'], "--run='main.py': expected NAME=COMMAND"),
        (['a= '], "--run='a= ': expected NAME=COMMAND"),
        (['a=ls', 'a=pwd'], "--run='a=pwd': the name 'a' is taken"),
    ],
)
def test_parse_runs_rejects(specs, message):
  with pytest.raises(ValueError, match='^' + re.escape(message)):
    benchmark.parse_runs(specs)


def test_an_epoch_is_timed_from_the_line_before_its_own():
  runs = {'slow': _trainer(0.6, 3), 'fast': _trainer(0.1)}
  summary = benchmark.alternate(_timers(runs, 2), rounds=2, key='seconds')
  slow, fast = summary['slow'], summary['fast']
  assert all(0.6 <= s < 3 for s in slow['seconds']), slow
  assert all(0.1 <= s < 0.6 for s in fast['seconds']), fast
  assert slow['pairs'] == [1.0, 1.0]
  assert all(p > 1.5 for p in fast['pairs']), fast
  assert slow['test_accuracy'] == fast['test_accuracy'] == [98.5, 98.5]


def test_whole_commands_their_peak_rss_and_last_accuracy():
  program = "b = b'x' * 300_000_000; print('epoch: 3, test_accuracy: 9.5')"
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'tools.benchmark',
          '--rounds=1',
          '--epoch=0',
          f'--run=big={shlex.join([sys.executable, "-c", program])}',
      ],
      capture_output=True,
      text=True,
      check=True,
      cwd=ROOT,
  ).stdout
  big = json.loads(out.splitlines()[-1])['big']
  # 300 MB, Python's own, and this tool's from before the command's exec.
  assert 0.29 < big['peak_rss_gb'][0] < 0.5, big
  assert big['test_accuracy'] == [9.5] and big['seconds'][0] > 0


def test_each_run_gets_a_new_workdir_removed_after(tmp_path):
  record = tmp_path / 'workdirs'
  program = (
      'import os, sys\n'
      'os.mkdir(sys.argv[1])\n'
      f'open({str(record)!r}, "a").write(sys.argv[1] + "\\n")\n'
      "print('epoch: 1, test_accuracy: 99.00')\n"
  )
  runs = {'a': [sys.executable, '-c', program, '{workdir}']}
  benchmark.alternate(_timers(runs, 1), rounds=2, key='seconds')
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
    benchmark.run_once('bad', argv, 2)
  assert str(error.value).startswith("'bad' (" + shlex.join(argv[:1]))
  assert str(error.value).endswith(why)
  if argv[-1] == '{workdir}':  # Its output, for the reason.
    assert 'epoch:  1' in capsys.readouterr().err
