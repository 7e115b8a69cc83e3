"""Tests of the input pipeline on the real MNIST files."""

import glob
import gzip
import importlib.util
import logging
import os
import shutil
import sys

from configs import default
import data_sources
import input_pipeline
import jax
import numpy as np
import pytest
import tensorflow as tf


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


def test_normalize_is_tf_datas_cast_and_divide_on_the_host_and_jitted():
  pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
  want = (tf.cast(pixels, tf.float32) / 255.0).numpy()
  np.testing.assert_array_equal(input_pipeline.normalize(pixels), want)
  jitted = jax.jit(input_pipeline.normalize)(pixels)
  assert jitted.dtype == np.float32
  np.testing.assert_array_equal(jitted, want)


def test_prepares_offline_from_the_manual_dir(mnist_data_dir):
  # The fixture prepared the data set from the original files, offline.
  config = _config(data_dir=mnist_data_dir)
  builder = input_pipeline.get_builder(config)
  assert builder.is_prepared()
  assert input_pipeline.num_examples(builder, 'train') == 60_000
  assert input_pipeline.num_examples(builder, 'test') == 10_000


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
  monkeypatch.setenv(data_sources.MANUAL_DIR_ENV, str(tmp_path))
  config = _config(data_dir=str(tmp_path / 'tfds'))
  with pytest.raises(data_sources.DataError, match=str(tmp_path)):
    input_pipeline.get_builder(config)


def test_missing_file_names_directory_and_file(copy_of_mnist_files, tmp_path):
  os.remove(os.path.join(copy_of_mnist_files, 't10k-labels-idx1-ubyte.gz'))
  config = _config(
      data_dir=str(tmp_path / 'tfds'), manual_dir=copy_of_mnist_files
  )
  with pytest.raises(data_sources.DataError) as error:
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
  with pytest.raises(data_sources.DataError) as error:
    input_pipeline.get_builder(config)
  message = str(error.value)
  assert '\n' not in message
  assert message.startswith(
      f'{copy_of_mnist_files}: train-labels-idx1-ubyte.gz does not match'
  )


# The other sources, on the same small real files.


def _write_idx(path, array):
  """`array` (uint8) as an IDX file: magic 0x0800 + ndim, sizes, bytes."""
  header = np.array([0x800 + array.ndim, *array.shape], '>u4').tobytes()
  with gzip.open(path, 'wb') as f:
    f.write(header + array.tobytes())


@pytest.fixture
def small_files(mnist_files, tmp_path):
  """The first 300 training and 100 test examples of MNIST, as IDX files."""
  directory = tmp_path / 'small'
  directory.mkdir()
  for split, size in (('train', 300), ('test', 100)):
    for name, ndim in zip(data_sources.IDX_FILES[split], (3, 1)):
      full = data_sources.read_idx(
          os.path.join(mnist_files, name + '.gz'), ndim
      )
      _write_idx(directory / (name + '.gz'), full[:size])
  return str(directory)


def _assert_same(actual, expected):
  assert actual.keys() == expected.keys() == {'image', 'label'}
  for k in expected:
    assert (
        actual[k].dtype == expected[k].dtype
        and actual[k].shape == expected[k].shape
    )
    np.testing.assert_array_equal(actual[k], expected[k])


def test_idx_source_reads_the_original_files(small_files):
  train, test = input_pipeline.load(
      _config(data_source='idx', manual_dir=small_files)
  )
  assert (
      train['image'].shape == (300, 28, 28, 1)
      and train['image'].dtype == np.uint8
  )
  assert test['label'].shape == (100,) and test['label'].dtype == np.int32
  assert test['label'][:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
  assert train['image'].min() == 0 and train['image'].max() == 255


def test_hf_sources_give_the_idx_arrays(small_files, tmp_path):
  import datasets  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  idx = _config(data_source='idx', manual_dir=small_files)
  raw = {}
  for split in ('train', 'test'):
    names = data_sources.IDX_FILES[split]
    raw[split] = [
        data_sources.read_idx(os.path.join(small_files, n + '.gz'), d)
        for n, d in zip(names, (3, 1))
    ]
  label = datasets.ClassLabel(num_classes=10)
  # A save_to_disk directory of Array2D images: one Arrow read.
  arrays = datasets.DatasetDict(
      {
          split: datasets.Dataset.from_dict(
              {'image': images, 'label': labels},
              features=datasets.Features(
                  {'image': datasets.Array2D((28, 28), 'uint8'), 'label': label}
              ),
          )
          for split, (images, labels) in raw.items()
      }
  )
  arrays.save_to_disk(str(tmp_path / 'saved'))
  # Parquet files of PNG images, laid out as the Hub's ylecun/mnist.
  (tmp_path / 'hub' / 'mnist').mkdir(parents=True)
  for split, (images, labels) in raw.items():
    datasets.Dataset.from_dict(
        {'image': [Image.fromarray(i) for i in images], 'label': labels},
        features=datasets.Features({'image': datasets.Image(), 'label': label}),
    ).to_parquet(
        str(tmp_path / 'hub' / 'mnist' / f'{split}-00000-of-00001.parquet')
    )

  expected = input_pipeline.load(idx)
  for directory in ('saved', 'hub'):
    config = _config(data_source='hf', data_dir=str(tmp_path / directory))
    for actual, wanted in zip(input_pipeline.load(config), expected):
      _assert_same(actual, wanted)
  _assert_same(data_sources.hf_arrays(arrays['test']), expected[1])


def test_torchvision_source_gives_the_idx_arrays(small_files, tmp_path):
  """Opt-in: torchvision brings PyTorch, which `make test` leaves out.

  Not imported here: this process has TensorFlow, and torchvision brings
  triton, which aborts a process that loaded TensorFlow first. The source
  reads in a process of its own; that is what this test runs.
  """
  if importlib.util.find_spec('torchvision') is None:
    pytest.skip('opt-in: the torchvision extra, uv sync --extra torchvision')
  raw = tmp_path / 'MNIST' / 'raw'  # torchvision's layout, uncompressed.
  raw.mkdir(parents=True)
  for name in os.listdir(small_files):
    with gzip.open(os.path.join(small_files, name)) as f:
      (raw / name[: -len('.gz')]).write_bytes(f.read())
  expected = input_pipeline.load(
      _config(data_source='idx', manual_dir=small_files)
  )
  config = _config(data_source='torchvision', data_dir=str(tmp_path))
  for actual, wanted in zip(input_pipeline.load(config), expected):
    _assert_same(actual, wanted)


def test_missing_torchvision_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, 'torchvision', None)  # Import fails.
  with pytest.raises(data_sources.DataError, match='pip install torchvision'):
    input_pipeline.load(_config(data_source='torchvision'))


def _canonical(arrays):
  """The examples sorted by label, then pixels: an order-free comparison."""
  flat = arrays['image'].reshape(len(arrays['label']), -1)
  order = np.lexsort(np.c_[flat, arrays['label']].T)
  return {k: v[order] for k, v in arrays.items()}


def test_tfds_gives_the_examples_of_the_original_files(
    mnist_data_dir, mnist_files
):
  # TFDS orders the examples its own way, so compare them in a common order.
  _, expected = input_pipeline.load(
      _config(data_source='idx', manual_dir=mnist_files)
  )
  _, actual = input_pipeline.load(_config(data_dir=mnist_data_dir))
  _assert_same(_canonical(actual), _canonical(expected))


def test_other_sources_slice_splits_like_tfds(small_files):
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
  _assert_same(train, {k: v[:30] for k, v in whole.items()})
  _assert_same(test, {k: v[95:] for k, v in whole_test.items()})


def test_truncated_idx_file_is_named(small_files):
  path = os.path.join(small_files, 'train-images-idx3-ubyte.gz')
  with open(path, 'r+b') as f:
    f.truncate(1000)
  with pytest.raises(data_sources.DataError, match=f'^{path}: cannot be read'):
    input_pipeline.load(_config(data_source='idx', manual_dir=small_files))


def test_short_idx_file_is_named(tmp_path):
  path = tmp_path / 'images'
  path.write_bytes(np.array([0x803, 5, 28, 28], '>u4').tobytes() + bytes(100))
  with pytest.raises(
      data_sources.DataError,
      match=f'^{path}: 116 bytes, but its header says .5, 28, 28., 3936 bytes',
  ):
    data_sources.read_idx(str(path), 3)


def test_wrong_idx_file_is_named(small_files):
  # A labels file where the images should be.
  images = os.path.join(small_files, 'train-images-idx3-ubyte.gz')
  os.replace(os.path.join(small_files, 'train-labels-idx1-ubyte.gz'), images)
  with pytest.raises(
      data_sources.DataError,
      match=f'^{images}: not an IDX file of 3-dimensional unsigned bytes '
      r'\(magic number 0x801, expected 0x803\)$',
  ):
    input_pipeline.load(_config(data_source='idx', manual_dir=small_files))


def test_missing_idx_file_is_named(small_files):
  os.remove(os.path.join(small_files, 't10k-labels-idx1-ubyte.gz'))
  with pytest.raises(
      data_sources.DataError,
      match=f'^{small_files}: missing t10k-labels-idx1-ubyte.gz',
  ):
    input_pipeline.load(_config(data_source='idx', manual_dir=small_files))


def test_fashion_mnist_from_debian_package(monkeypatch, mnist_files):
  directory = data_sources.DEFAULT_IDX_DIRS['fashion_mnist']
  if not os.path.isdir(directory):
    pytest.skip(f'no {directory}: apt-get install dataset-fashion-mnist')
  # $MNIST_MANUAL_DIR holds MNIST: Fashion-MNIST does not read it.
  monkeypatch.setenv(data_sources.MANUAL_DIR_ENV, mnist_files)
  train, test = input_pipeline.load(
      _config(data_source='idx', dataset='fashion_mnist')
  )
  assert train['image'].shape == (60_000, 28, 28, 1)
  assert np.bincount(test['label']).tolist() == [1000] * 10
  mnist = input_pipeline.load(
      _config(data_source='idx', test_split='test[:100]')
  )[1]
  assert not np.array_equal(test['image'][:100], mnist['image'])
