"""Tests of the input pipeline on the real MNIST files."""

import os

from configs import default
import input_pipeline
import numpy as np
import pytest


def _config(**fields):
  config = default.get_config()
  config.update(fields)
  return config


def test_eval_batches_pad_and_mask_the_last_batch():
  arrays = {'image': np.ones((7, 28, 28, 1), np.float32), 'label': np.arange(7)}
  batches = input_pipeline.eval_batches(arrays, 5)
  assert batches['image'].shape == (2, 5, 28, 28, 1)
  np.testing.assert_array_equal(batches['mask'], [[True] * 5, [True] * 2 + [False] * 3])
  np.testing.assert_array_equal(batches['label'][1], [5, 6, 0, 0, 0])
  assert batches['image'][1, 2:].sum() == 0


def test_epoch_seed_depends_on_seed_and_epoch_only():
  seeds = {input_pipeline.epoch_seed(s, e) for s in range(3) for e in range(3)}
  assert len(seeds) == 9
  assert input_pipeline.epoch_seed(1, 2) == input_pipeline.epoch_seed(1, 2)


def test_epoch_order_is_a_reproducible_permutation_per_epoch():
  order = input_pipeline.epoch_order(seed=0, epoch=1, num_examples=1000, batch_size=128)
  assert order.shape == (7, 128) and order.dtype == np.int32
  assert len(np.unique(order)) == 7 * 128  # No example twice; 104 dropped.
  np.testing.assert_array_equal(order, input_pipeline.epoch_order(0, 1, 1000, 128))
  assert not np.array_equal(order, input_pipeline.epoch_order(0, 2, 1000, 128))
  assert not np.array_equal(order, input_pipeline.epoch_order(1, 1, 1000, 128))


def test_splits_are_normalised_images_and_integer_labels(mnist_data_dir):
  config = _config(
      data_dir=mnist_data_dir, train_split='train[:512]', test_split='test[:300]'
  )
  train, test = input_pipeline.load(config)
  assert (len(train['label']), len(test['label'])) == (512, 300)
  for arrays in (train, test):
    assert arrays['image'].shape[1:] == (28, 28, 1)
    assert arrays['image'].dtype == np.float32
    assert 0.0 == arrays['image'].min() and arrays['image'].max() == 1.0
    assert arrays['label'].dtype == np.int32
    assert set(np.unique(arrays['label'])) == set(range(10))
  # Exactly tf.data's normalisation of TFDS' uint8 pixels: k / 255.
  pixels = np.round(train['image'] * 255)
  np.testing.assert_array_equal(
      train['image'], pixels.astype(np.float32) / np.float32(255)
  )


def test_prepares_offline_from_the_manual_dir(mnist_data_dir):
  # The fixture prepared the data set from the original files, offline.
  config = _config(data_dir=mnist_data_dir)
  builder = input_pipeline.get_builder(config)
  assert builder.is_prepared()
  assert input_pipeline.num_examples(builder, 'train') == 60_000
  assert input_pipeline.num_examples(builder, 'test') == 10_000


def test_manual_dir_comes_from_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv(input_pipeline.MANUAL_DIR_ENV, str(tmp_path))
  config = _config(data_dir=str(tmp_path / 'tfds'))
  with pytest.raises(input_pipeline.DataError, match=str(tmp_path)):
    input_pipeline.get_builder(config)


def test_missing_file_names_directory_and_file(copy_of_mnist_files, tmp_path):
  os.remove(os.path.join(copy_of_mnist_files, 't10k-labels-idx1-ubyte.gz'))
  config = _config(data_dir=str(tmp_path / 'tfds'), manual_dir=copy_of_mnist_files)
  with pytest.raises(input_pipeline.DataError) as error:
    input_pipeline.get_builder(config)
  message = str(error.value)
  assert '\n' not in message
  assert message.startswith(f'{copy_of_mnist_files}: missing t10k-labels-idx1-ubyte.gz')


def test_corrupt_file_names_directory_and_file(copy_of_mnist_files, tmp_path):
  path = os.path.join(copy_of_mnist_files, 'train-labels-idx1-ubyte.gz')
  with open(path, 'r+b') as f:
    f.truncate(1000)
  config = _config(data_dir=str(tmp_path / 'tfds'), manual_dir=copy_of_mnist_files)
  with pytest.raises(input_pipeline.DataError) as error:
    input_pipeline.get_builder(config)
  message = str(error.value)
  assert '\n' not in message
  assert message.startswith(
      f'{copy_of_mnist_files}: train-labels-idx1-ubyte.gz does not match'
  )


def test_unknown_dataset_is_named(tmp_path):
  config = _config(data_dir=str(tmp_path), dataset='mnits')
  with pytest.raises(input_pipeline.DataError, match="unknown dataset 'mnits'"):
    input_pipeline.get_builder(config)
