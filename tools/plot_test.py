"""Tests of tools/plot.py: a workdir's summaries become a PNG of the curves.

It runs in a process of its own: its flags are main.py's names.
"""

import os
import subprocess
import sys

from clu import metric_writers
import numpy as np
import pytest
import tensorflow as tf

# Not in the quick tier (pytest -m "not slow"): a process of its own.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _workdir_with_epochs(path, epochs: int) -> str:
  writer = metric_writers.create_default_writer(str(path))
  for epoch in range(1, epochs + 1):
    writer.write_scalars(
        epoch,
        {
            'train_loss': 1 / epoch,
            'train_accuracy': 1 - 0.1 / epoch,
            'test_loss': 1.2 / epoch,
            'test_accuracy': 1 - 0.12 / epoch,
        },
    )
  writer.flush()
  return str(path)


def test_plot_writes_a_png_of_the_curves(tmp_path):
  workdir = _workdir_with_epochs(tmp_path / 'run', 3)
  out = str(tmp_path / 'curves.png')
  subprocess.run(
      [
          sys.executable,
          '-m',
          'tools.plot',
          f'--workdir={workdir}',
          f'--out={out}',
      ],
      check=True,
      capture_output=True,
      cwd=ROOT,
      timeout=300,
  )
  image = tf.image.decode_png(tf.io.read_file(out)).numpy()
  assert image.shape == (400, 1000, 4)
  assert len(np.unique(image.reshape(-1, 4), axis=0)) > 10  # Drawn, not blank.
