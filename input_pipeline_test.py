"""Tests of the input pipeline on the real MNIST files: TFDS, splits, batches.

The other sources' own tests are in data_sources_test.py.
"""

import glob
import logging
import os
from run import errors
import shutil

from configs import default
from data import sources
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
  np.testing.assert_array_equal(
      batches['mask'], [[True] * 5, [True] * 2 + [False] * 3]
  )
  np.testing.assert_array_equal(batches['label'][1], [5, 6, 0, 0, 0])
  assert batches['image'][1, 2:].sum() == 0


def test_epoch_seed_depends_on_seed_and_epoch_only():
  seeds = {input_pipeline.epoch_seed(s, e) for s in range(3) for e in range(3)}
  assert len(seeds) == 9
  assert input_pipeline.epoch_seed(1, 2) == input_pipeline.epoch_seed(1, 2)


def test_epoch_order_is_a_reproducible_permutation_per_epoch():
  order = input_pipeline.epoch_order(
      seed=0, epoch=1, num_examples=1000, batch_size=128
  )
  assert order.shape == (7, 128) and order.dtype == np.int32
  assert len(np.unique(order)) == 7 * 128  # No example twice; 104 dropped.
  np.testing.assert_array_equal(
      order, input_pipeline.epoch_order(0, 1, 1000, 128)
  )
  assert not np.array_equal(order, input_pipeline.epoch_order(0, 2, 1000, 128))
  assert not np.array_equal(order, input_pipeline.epoch_order(1, 1, 1000, 128))


def test_splits_are_uint8_images_and_integer_labels(mnist_data_dir):
  config = _config(
      data_dir=mnist_data_dir,
      train_split='train[:512]',
      test_split='test[:300]',
  )
  train, test = input_pipeline.load(config)
  assert (len(train['label']), len(test['label'])) == (512, 300)
  for arrays in (train, test):
    assert arrays['image'].shape[1:] == (28, 28, 1)
    assert arrays['image'].dtype == np.uint8
    assert 0 == arrays['image'].min() and arrays['image'].max() == 255
    assert arrays['label'].dtype == np.int32
    assert set(np.unique(arrays['label'])) == set(range(10))


def test_prepares_offline_from_the_manual_dir(mnist_data_dir):
  # The fixture prepared the data set from the original files, offline.
  config = _config(data_dir=mnist_data_dir)
  builder = input_pipeline.get_builder(config)
  assert builder.is_prepared()
  assert builder.info.splits['train'].num_examples == 60_000
  assert builder.info.splits['test'].num_examples == 10_000


def _tfds_copy(mnist_data_dir, tmp_path) -> str:
  """A copy of the prepared TFDS directory, without cached arrays."""
  copy = str(tmp_path / 'tfds')
  shutil.copytree(mnist_data_dir, copy, ignore=shutil.ignore_patterns('arrays'))
  return copy


def test_tfds_arrays_are_cached_and_checked_against_tfds(
    mnist_data_dir, tmp_path
):
  config = _config(data_dir=_tfds_copy(mnist_data_dir, tmp_path))
  config.test_split = 'test[:300]'
  train, test = input_pipeline.load(config)
  cached = glob.glob(os.path.join(config.data_dir, 'mnist', '*', 'arrays', '*'))
  assert len(cached) == 2 and all(p.endswith('.npz') for p in cached)
  # Arrays of the wrong size (another version's, say) are decoded anew.
  short = [p for p in cached if os.path.basename(p).startswith('test')][0]
  np.savez(short, image=test['image'][:10], label=test['label'][:10])
  _, again = input_pipeline.load(config)
  np.testing.assert_array_equal(again['image'], test['image'])
  # With TFDS' records gone, the cached arrays are all that is read.
  for record in glob.glob(os.path.join(config.data_dir, '**', '*.tfrecord*')):
    os.remove(record)
  cached_train, cached_test = input_pipeline.load(config)
  for got, want in ((cached_train, train), (cached_test, test)):
    np.testing.assert_array_equal(got['image'], want['image'])
    np.testing.assert_array_equal(got['label'], want['label'])


def test_unwritable_array_cache_warns_and_loads(
    mnist_data_dir, tmp_path, caplog
):
  config = _config(data_dir=_tfds_copy(mnist_data_dir, tmp_path))
  config.train_split, config.test_split = 'train[:64]', 'test[:64]'
  for version in glob.glob(os.path.join(config.data_dir, 'mnist', '*')):
    open(os.path.join(version, 'arrays'), 'w').close()  # Not a directory.
  with caplog.at_level(logging.WARNING):
    train, test = input_pipeline.load(config)
  assert len(train['label']) == len(test['label']) == 64
  assert 'Not caching' in caplog.text


def test_manual_dir_comes_from_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv(sources.MANUAL_DIR_ENV, str(tmp_path))
  config = _config(data_dir=str(tmp_path / 'tfds'))
  with pytest.raises(errors.UserError, match=str(tmp_path)):
    input_pipeline.get_builder(config)


def test_missing_file_names_directory_and_file(copy_of_mnist_files, tmp_path):
  os.remove(os.path.join(copy_of_mnist_files, 't10k-labels-idx1-ubyte.gz'))
  config = _config(
      data_dir=str(tmp_path / 'tfds'), manual_dir=copy_of_mnist_files
  )
  with pytest.raises(errors.UserError) as error:
    input_pipeline.get_builder(config)
  message = str(error.value)
  assert '\n' not in message
  assert message.startswith(
      f'{copy_of_mnist_files}: missing t10k-labels-idx1-ubyte.gz'
  )


def test_corrupt_file_names_directory_and_file(copy_of_mnist_files, tmp_path):
  path = os.path.join(copy_of_mnist_files, 'train-labels-idx1-ubyte.gz')
  with open(path, 'r+b') as f:
    f.truncate(1000)
  config = _config(
      data_dir=str(tmp_path / 'tfds'), manual_dir=copy_of_mnist_files
  )
  with pytest.raises(errors.UserError) as error:
    input_pipeline.get_builder(config)
  message = str(error.value)
  assert '\n' not in message
  assert message.startswith(
      f'{copy_of_mnist_files}: train-labels-idx1-ubyte.gz does not match'
  )


def _canonical(arrays):
  """The examples sorted by label, then pixels: an order-free comparison."""
  flat = arrays['image'].reshape(len(arrays['label']), -1)
  order = np.lexsort(np.c_[flat, arrays['label']].T)
  return {k: v[order] for k, v in arrays.items()}


def test_tfds_gives_the_examples_of_the_original_files(
    mnist_data_dir, mnist_files, assert_same_arrays
):
  # TFDS orders the examples its own way, so compare them in a common order.
  _, expected = input_pipeline.load(
      _config(data_source='idx', manual_dir=mnist_files)
  )
  _, actual = input_pipeline.load(_config(data_dir=mnist_data_dir))
  assert_same_arrays(_canonical(actual), _canonical(expected))


def test_other_sources_slice_splits_like_tfds(small_files, assert_same_arrays):
  config = _config(
      data_source='idx',
      manual_dir=small_files,
      train_split='train[:10%]',
      test_split='test[-5:]',
  )
  train, test = input_pipeline.load(config)
  whole, whole_test = input_pipeline.load(
      _config(data_source='idx', manual_dir=small_files)
  )
  assert_same_arrays(train, {k: v[:30] for k, v in whole.items()})
  assert_same_arrays(test, {k: v[95:] for k, v in whole_test.items()})


def test_other_sources_read_tfds_split_syntax_whole(
    small_files, assert_same_arrays
):
  """'+' joins splits; percent rounds to the closest example, as TFDS does."""
  train, test = input_pipeline.load(
      _config(data_source='idx', manual_dir=small_files)
  )
  joined = input_pipeline.split_arrays(
      _config(data_source='idx', manual_dir=small_files),
      'test[-2:]+train[33.3%:34%]',
  )
  assert_same_arrays(
      joined,
      {k: np.concatenate([test[k][98:], train[k][100:102]]) for k in train},
  )
  with pytest.raises(errors.UserError) as error:
    input_pipeline.split_arrays(
        _config(data_source='idx', manual_dir=small_files), 'test[-500:]'
    )
  assert str(error.value) == (
      "split 'test[-500:]': Requested slice [-500:100] incompatible with 100 "
      'examples.'
  )
