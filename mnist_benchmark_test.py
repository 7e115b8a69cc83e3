"""Tests of the benchmark's parsing and output, on a tiny run."""

import json
import os
import subprocess
import sys
import types

import mnist_benchmark
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

# Not in the quick tier (pytest -m "not slow"): the benchmark trains.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.abspath(__file__))


def _events(scalars: dict):
  """TensorBoard's reading of `scalars`, tag -> epoch -> (value, wall time)."""
  return types.SimpleNamespace(
      Tensors=lambda tag: [
          event_accumulator.TensorEvent(
              t, epoch, tensor_util.make_tensor_proto(v)
          )
          for epoch, (v, t) in scalars[tag].items()
      ]
  )


def test_summarize_takes_medians_after_the_first_epoch():
  events = _events(
      {
          'test_accuracy': {
              1: (0.97, 100.0),
              2: (0.985, 130.0),
              3: (0.99, 150.0),
              4: (0.992, 190.0),
          },
          'train_images_per_sec': {
              1: (100.0, 0),
              2: (300.0, 0),
              3: (200.0, 0),
              4: (250.0, 0),
          },
      }
  )
  seconds = {'startup': 4.0, 'compile': 3.5, 'train': 120.0, 'evaluation': 8.0}
  result = mnist_benchmark.summarize(
      events, wall_time_s=200.0, peak_rss_mb=512.0, seconds=seconds
  )
  assert result['seconds'] == {
      'startup': 4.0,
      'compile': 3.5,
      'train': 120.0,
      'evaluation': 8.0,
  }
  assert result['epochs'] == 4
  assert result['seconds_per_epoch'] == 30.0  # median of 30, 20 and 40
  assert result['train_images_per_sec'] == 250.0  # median of 300, 200, 250
  # As the summaries hold them, in float32.
  assert result['final_test_accuracy'] == pytest.approx(0.992)
  assert result['best_test_accuracy'] == pytest.approx(0.992)


def test_tiny_run_prints_json_and_fails_on_low_accuracy(
    mnist_data_dir, tmp_path
):
  result = subprocess.run(
      [
          sys.executable,
          os.path.join(ROOT, 'mnist_benchmark.py'),
          f'--workdir={tmp_path}',
          '--config=configs/default.py',
          '--config.num_epochs=2',
          f'--config.data_dir={mnist_data_dir}',
          '--config.train_split=train[:256]',
          '--config.test_split=test[:100]',
          '--config.matmul_precision=bfloat16',  # On any CPU.
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=600,
  )
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report['epochs'] == 2
  assert report['seconds_per_epoch'] > 0
  assert report['train_images_per_sec'] > 0
  assert report['peak_rss_mb'] > 100
  phases = {'startup', 'compile', 'data', 'train', 'evaluation'}
  phases |= {'summaries', 'checkpoint', 'export'}
  assert set(report['seconds']) == phases
  assert all(report['seconds'][p] > 0 for p in phases)
  # Compilation happens within training and evaluation; the rest adds up.
  del report['seconds']['compile']
  assert report['wall_time_s'] > sum(report['seconds'].values())
  assert report['config']['num_epochs'] == 2
  assert report['matmul_precision'] == (
      'bfloat16 operands, float32 accumulation (matmul_precision=bfloat16)'
  )
  # Two steps of training cannot reach 99%: the benchmark says so and fails.
  assert report['final_test_accuracy'] < 0.99
  assert result.returncode == 1
  assert 'is outside [0.99, 1.0]' in result.stderr.strip().splitlines()[-1]
