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


def test_pad_batch_masks_the_padding():
  batch = {'image': np.ones((3, 28, 28, 1), np.float32), 'label': np.arange(3)}
  padded = input_pipeline.pad_batch(batch, 5)
  assert padded['image'].shape == (5, 28, 28, 1)
  np.testing.assert_array_equal(padded['mask'], [True] * 3 + [False] * 2)
  np.testing.assert_array_equal(padded['label'], [0, 1, 2, 0, 0])
  assert padded['image'][3:].sum() == 0


def test_epoch_seed_depends_on_seed_and_epoch_only():
  seeds = {input_pipeline.epoch_seed(s, e) for s in range(3) for e in range(3)}
  assert len(seeds) == 9
  assert input_pipeline.epoch_seed(1, 2) == input_pipeline.epoch_seed(1, 2)


def test_batches_are_normalised_images_and_integer_labels(mnist_data_dir):
  config = _config(data_dir=mnist_data_dir, train_split='train[:512]')
  data = input_pipeline.Datasets(input_pipeline.get_builder(config), config)
  assert (data.num_train, data.num_test) == (512, 10_000)
  batches = list(data.train_batches(epoch=1))
  assert len(batches) == data.steps_per_epoch == 4
  batch = batches[0]
  assert batch['image'].shape == (128, 28, 28, 1)
  assert batch['image'].dtype == np.float32
  assert 0.0 == batch['image'].min() and batch['image'].max() == 1.0
  assert batch['label'].dtype == np.int32
  assert set(np.unique(batch['label'])) <= set(range(10))


def test_epochs_have_their_own_reproducible_order(mnist_data_dir):
  config = _config(data_dir=mnist_data_dir, train_split='train[:512]')
  data = input_pipeline.Datasets(input_pipeline.get_builder(config), config)
  labels = lambda epoch: np.concatenate(
      [b['label'] for b in data.train_batches(epoch)]
  )
  np.testing.assert_array_equal(labels(1), labels(1))
  assert not np.array_equal(labels(1), labels(2))


def test_test_batches_cover_every_example_once(mnist_data_dir):
  config = _config(
      data_dir=mnist_data_dir, test_split='test[:1000]', eval_batch_size=128
  )
  data = input_pipeline.Datasets(input_pipeline.get_builder(config), config)
  batches = list(data.test_batches())
  assert len(batches) == 8  # 7 full batches and one of 104 examples.
  assert {b['image'].shape for b in batches} == {(128, 28, 28, 1)}
  assert sum(b['mask'].sum() for b in batches) == 1000


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
