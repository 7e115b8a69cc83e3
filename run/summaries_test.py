"""Tests of the summary images and texts, written and read back."""

import ml_collections
import numpy as np
from run import summaries
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf


def _digits(n: int) -> np.ndarray:
  """`n` 28x28 images, each a grey square, distinct from the black background."""
  images = np.zeros((n, 28, 28, 1), np.uint8)
  images[:, 4:24, 4:24] = 128
  return images


def test_misclassified_grid_shows_the_mistakes_in_order():
  labels = np.arange(20) % 10
  predicted = labels.copy()
  predicted[[3, 7, 11]] = 0
  grid = summaries.misclassified_grid(_digits(20), labels, predicted)
  assert grid.shape == (1020, 840, 3) and grid.dtype == np.uint8
  cell = 28 * summaries.SCALE
  top = summaries.HEADER
  digits = [grid[top : top + cell, n * cell : (n + 1) * cell] for n in range(4)]
  assert [d.max() for d in digits] == [128, 128, 128, 0]
  caption = grid[top + cell : top + cell + summaries.CAPTION, :cell]
  assert caption.any()  # 'pred 0', 'true 3' drawn under the first.


def test_confusion_matrix_counts_true_by_predicted():
  labels = np.array([0, 0, 1, 9, 9, 9])
  predicted = np.array([0, 1, 1, 9, 9, 4])
  matrix = summaries.confusion_matrix(labels, predicted)
  assert matrix.sum() == 6 and np.trace(matrix) == 4
  assert matrix[0, 1] == 1 and matrix[9, 4] == 1 and matrix[9, 9] == 2


def test_summaries_are_written_and_read_back(tmp_path):
  workdir = str(tmp_path)
  config = ml_collections.ConfigDict({'learning_rate': 0.1, 'seed': 3})
  params = {'w': np.zeros((3, 4)), 'b': np.zeros(4)}
  writer = summaries.create_writer(workdir, config, params)
  labels = np.arange(10)
  predicted = (labels + 1) % 10
  test = {'image': _digits(10), 'label': labels}
  summaries.write_epoch(
      writer, 1, {'test_loss': 0.5}, test, predicted, last=False
  )
  summaries.write_epoch(
      writer, 2, {'test_loss': 0.25}, test, predicted, last=True
  )

  events = event_accumulator.EventAccumulator(
      workdir, {event_accumulator.TENSORS: 0}  # All of them.
  ).Reload()
  # tag -> step -> the value's array; an image's is (width, height, PNG).
  values = lambda tag: {
      e.step: tf.make_ndarray(e.tensor_proto) for e in events.Tensors(tag)
  }
  grids = values('misclassified')
  assert sorted(grids) == [1, 2]
  for _, _, png in grids.values():
    assert tf.image.decode_png(png).shape == (1020, 840, 3)
  matrix = values('confusion_matrix')
  assert list(matrix) == [2]
  assert tf.image.decode_png(matrix[2][2]).shape == (600, 600, 3)
  assert values('test_loss') == {1: 0.5, 2: 0.25}
  assert values('num_params')[0] == b'16 parameters'
  assert b'learning_rate: 0.1' in values('config')[0].item()
