"""Tests of the command line."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))


def _main(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, os.path.join(ROOT, 'main.py'), *args],
      capture_output=True, text=True, cwd=ROOT, timeout=300,
  )


def test_workdir_is_required():
  result = _main('--config=configs/default.py')
  assert result.returncode != 0
  assert 'Flag --workdir must have a value other than None' in result.stderr


def test_config_is_required(tmp_path):
  result = _main(f'--workdir={tmp_path}')
  assert result.returncode != 0
  assert 'Flag --config must have a value other than None' in result.stderr


def test_unknown_config_field_is_rejected(tmp_path):
  result = _main(
      f'--workdir={tmp_path}', '--config=configs/default.py',
      '--config.learning_rat=0.05',
  )
  assert result.returncode != 0
  assert 'learning_rat' in result.stderr
  assert not os.listdir(tmp_path)


def test_missing_data_is_one_line_error(tmp_path):
  result = _main(
      f'--workdir={tmp_path / "w"}', '--config=configs/default.py',
      f'--config.data_dir={tmp_path / "tfds"}',
      f'--config.manual_dir={tmp_path / "empty"}',
  )
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f'error: {tmp_path / "empty"}: missing t10k-images')
  assert 'Traceback' not in result.stderr
