"""The serving benchmark runs on a real export and prints its figures."""

import json
import os
import shutil
import subprocess
import sys

from PIL import Image

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


def test_the_cost_of_one_request_and_its_outcome(
    trained_export, tmp_path, costly_images
):
  """--request: a directory's files as one serving_bytes request."""
  rows = []
  for name in ('scans.jpg', 'png'):
    directory = tmp_path / name
    directory.mkdir()
    if name == 'png':
      for i in range(3):
        Image.new('L', (40, 30), 255 * (i % 2)).save(directory / f'{i}.png')
    else:
      shutil.copy(costly_images[name], directory)
    result = subprocess.run(
        [
            sys.executable,
            '-m',
            'tools.serving_benchmark',
            f'--model={trained_export}',
            f'--request={directory}',
            '--cost_calls=1',
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=True,
    )
    rows.append(json.loads(result.stdout.splitlines()[-1]))
  refused, classified = rows
  assert refused['images'] == 1
  assert refused['outcome'] == (
      'INVALID_ARGUMENT: assertion failed: [the JPEG holds 20006 scans; the '
      'model decodes JPEGs of at most 24 scans]'
  )
  assert classified['images'] == 3 and classified['outcome'] == 'classified'
  for row in rows:
    assert row['cpu_s'] > 0 and row['peak_mb'] >= 0 and row['bytes_sent'] > 0
