"""The step benchmark runs where only JAX, Flax and optax are installed."""

import json
import os
import subprocess
import sys

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
sys.argv = ['step_benchmark', *sys.argv[1:]]
runpy.run_module('tools.step_benchmark', run_name='__main__')
"""


def test_the_steps_time_without_tensorflow_tfds_clu_or_orbax():
  for variant in (
      'example: nnx.jit per step',
      'ours, no dropout (configs/fast.py)',
  ):
    result = subprocess.run(
        [sys.executable, '-c', SCRIPT, f'--variant={variant}', '--steps=2'],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.strip().splitlines()[-1]) > 0


def test_in_process_variants_alternate_in_one_process():
  result = subprocess.run(
      [
          sys.executable,
          '-c',
          SCRIPT,
          '--in_process',
          '--variants=levers',
          '--steps=2',
          '--rounds=2',
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'variants timed: one process' in result.stdout
  timed = json.loads(result.stdout.strip().splitlines()[-1])
  assert timed['in_process'] is True
  runs = {k: v['runs'] for k, v in timed.items() if isinstance(v, dict)}
  assert len(runs) == 4, runs  # Each of bf16 and narrow bits on and off.
  assert all(len(r) == 2 and min(r) > 0 for r in runs.values()), runs


def test_in_process_with_taskset_is_one_line_before_any_work():
  result = subprocess.run(
      [sys.executable, '-c', SCRIPT, '--in_process', '--taskset=1'],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=300,
  )
  assert result.returncode == 1
  assert result.stdout == ''
  assert result.stderr.strip().splitlines() == [
      '--taskset=1 pins fresh processes; with --in_process, run the whole'
      ' command under taskset -c 1 instead.'
  ]
