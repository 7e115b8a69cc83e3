"""The step benchmark runs where only JAX, Flax and optax are installed."""

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
