"""The serving benchmark runs on a real export and prints its figures."""

import json
import os
import subprocess
import sys

from PIL import Image
import pytest

# Not in the quick tier (pytest -m "not slow"): an export, processes.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_prints_latency_and_throughput_per_signature(
    trained_export, mnist_data_dir
):
  result = subprocess.run(
      [
          sys.executable,
          '-m',
          'tools.serving_benchmark',
          f'--model={os.path.dirname(trained_export)}',
          f'--config.data_dir={mnist_data_dir}',
          '--calls=10',
          '--batch=8',
          '--batch_calls=2',
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=300,
      check=True,
  )
  rows = [json.loads(l) for l in result.stdout.splitlines() if l[:1] == '{']
  assert [r.get('signature') for r in rows[:2]] == [
      'serving_default',
      'serving_bytes',
  ]
  for row in rows[:2]:
    assert 0 < row['latency_ms_p50'] <= row['latency_ms_p99']
    assert (row['calls'], row['batch']) == (10, 8)
    assert row['images_per_sec'] > 0
  assert rows[2]['saved_model'] == trained_export


def test_a_directory_without_a_model_is_one_line(tmp_path, mnist_data_dir):
  result = subprocess.run(
      [
          sys.executable,
          '-m',
          'tools.serving_benchmark',
          f'--model={tmp_path}',
          f'--config.data_dir={mnist_data_dir}',
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=300,
  )
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f'error: --model={tmp_path}: no saved_model.pb in it nor in an integer '
      'version directory under it'
  )


def test_the_cost_of_one_request(trained_export, tmp_path):
  """--request: a directory's files as one serving_bytes request."""
  for i in range(3):
    Image.new('L', (40, 30), 255 * (i % 2)).save(tmp_path / f'{i}.png')
  result = subprocess.run(
      [
          sys.executable,
          '-m',
          'tools.serving_benchmark',
          f'--model={trained_export}',
          f'--request={tmp_path}',
          '--cost_calls=1',
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=300,
      check=True,
  )
  row = json.loads(result.stdout.splitlines()[-1])
  assert (row['images'], row['outcome']) == (3, 'classified')
  assert row['bytes_sent'] == sum(p.stat().st_size for p in tmp_path.iterdir())
  assert row['cpu_s'] > 0 and row['peak_mb'] >= 0
