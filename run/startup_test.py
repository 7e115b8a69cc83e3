"""Tests of the start-up: TensorFlow imported without its start-up lines."""

import os
import platform
import subprocess
import sys

import pytest
from run import startup

# Not in the quick tier (pytest -m "not slow"): TensorFlow's processes.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIABLES = ('TF_ENABLE_ONEDNN_OPTS', 'TF_CPP_MIN_LOG_LEVEL')
# What TensorFlow prints where oneDNN is on (by default on CPUs with AVX-512
# VNNI or bf16, AVX-VNNI or AMX), before absl's logging is set up.
ONEDNN_LINE = 'oneDNN custom operations are on'


def _import_tensorflow(argv: list[str], then_import=True, **environment: str):
  """A fresh Python: `quiet(argv)`, then TensorFlow imported.

  Its environment is this one's without the variables that quiet sets (as
  in a user's shell), plus `environment`. Prints the two variables as
  TensorFlow would find them (`then_import=False`: seconds fewer).
  """
  env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
  env.update(environment)
  script = (
      'import os, sys; from run import startup; '
      'startup.quiet(sys.argv); '
      f'print([os.environ.get(k) for k in {VARIABLES!r}])'
  ) + ('; import tensorflow' if then_import else '')
  return subprocess.run(
      [sys.executable, '-c', script, *argv],
      capture_output=True,
      text=True,
      cwd=ROOT,
      env=env,
      timeout=120,
  )


@pytest.mark.parametrize(
    'argv, level',
    [([], 0), (['--verbosity=1'], 1), (['-v', '2'], 2), (['--v=-1'], -1)],
)
def test_verbosity_is_read_as_absl_reads_it(argv, level):
  assert (
      startup.early_flags(['prog', '--config=c.py', *argv]).verbosity == level
  )


def test_verbosity_that_absl_will_refuse_is_left_to_absl():
  assert startup.early_flags(['prog', '--verbosity=loud']).verbosity == 0


def test_tensorflow_starts_quietly():
  result = _import_tensorflow([])
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "['0', '1']"
  assert result.stderr == ''


def test_a_users_own_setting_is_kept():
  result = _import_tensorflow([], False, TF_CPP_MIN_LOG_LEVEL='0')
  assert result.stdout.strip() == "['0', '0']"


def test_verbosity_1_shows_what_tensorflow_prints():
  result = _import_tensorflow(['--verbosity=1'], False)
  assert result.stdout.strip() == '[None, None]'


@pytest.mark.skipif(
    platform.machine() not in ('x86_64', 'AMD64'),
    reason='TensorFlow has oneDNN custom operations on x86 only',
)
def test_onednn_turned_on_prints_its_line_on_every_x86_cpu():
  """What an AVX-512 VNNI/bf16 or AMX CPU does by default, on any x86 CPU.

  The line that `quiet` keeps from the user wherever TensorFlow turns oneDNN
  on itself; a user who turns it on sees it.
  """
  result = _import_tensorflow([], TF_ENABLE_ONEDNN_OPTS='1')
  assert result.returncode == 0, result.stderr
  assert ONEDNN_LINE in result.stderr
