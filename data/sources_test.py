"""Tests of sources.py: the idx, hf and torchvision sources, on MNIST.

Most read small IDX files cut from the original ones (conftest's
`small_files`); the hf and torchvision sources must give the arrays that the
idx source reads from them.
"""

import gzip
import importlib.util
import os
from run import errors
import sys

from configs import default
from data import sources
import input_pipeline
import numpy as np
import pytest


def _config(**fields):
  config = default.get_config()
  config.update(fields)
  return config


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


def test_hf_sources_give_the_idx_arrays(
    small_files, tmp_path, assert_same_arrays
):
  import datasets  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  idx = _config(data_source='idx', manual_dir=small_files)
  raw = {}
  for split in ('train', 'test'):
    names = sources.IDX_FILES[split]
    raw[split] = [
        sources.read_idx(os.path.join(small_files, n + '.gz'), d)
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
      assert_same_arrays(actual, wanted)
  assert_same_arrays(sources.hf_arrays(arrays['test']), expected[1])


def test_torchvision_source_gives_the_idx_arrays(
    small_files, tmp_path, assert_same_arrays
):
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
    assert_same_arrays(actual, wanted)


def test_missing_torchvision_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, 'torchvision', None)  # Import fails.
  with pytest.raises(errors.UserError, match='pip install torchvision'):
    input_pipeline.load(_config(data_source='torchvision'))


def test_truncated_idx_file_is_named(small_files):
  path = os.path.join(small_files, 'train-images-idx3-ubyte.gz')
  with open(path, 'r+b') as f:
    f.truncate(1000)
  with pytest.raises(errors.UserError, match=f'^{path}: cannot be read'):
    input_pipeline.load(_config(data_source='idx', manual_dir=small_files))


def test_short_idx_file_is_named(tmp_path):
  path = tmp_path / 'images'
  path.write_bytes(np.array([0x803, 5, 28, 28], '>u4').tobytes() + bytes(100))
  with pytest.raises(
      errors.UserError,
      match=f'^{path}: 116 bytes, but its header says .5, 28, 28., 3936 bytes',
  ):
    sources.read_idx(str(path), 3)


def test_wrong_idx_file_is_named(small_files):
  # A labels file where the images should be.
  images = os.path.join(small_files, 'train-images-idx3-ubyte.gz')
  os.replace(os.path.join(small_files, 'train-labels-idx1-ubyte.gz'), images)
  with pytest.raises(
      errors.UserError,
      match=f'^{images}: not an IDX file of 3-dimensional unsigned bytes '
      r'\(magic number 0x801, expected 0x803\)$',
  ):
    input_pipeline.load(_config(data_source='idx', manual_dir=small_files))


def test_missing_idx_file_is_named(small_files):
  os.remove(os.path.join(small_files, 't10k-labels-idx1-ubyte.gz'))
  with pytest.raises(
      errors.UserError,
      match=f'^{small_files}: missing t10k-labels-idx1-ubyte.gz',
  ):
    input_pipeline.load(_config(data_source='idx', manual_dir=small_files))


def test_fashion_mnist_from_debian_package(monkeypatch, mnist_files):
  directory = sources.DEFAULT_IDX_DIRS['fashion_mnist']
  if not os.path.isdir(directory):
    pytest.skip(f'no {directory}: apt-get install dataset-fashion-mnist')
  # $MNIST_MANUAL_DIR holds MNIST: Fashion-MNIST does not read it.
  monkeypatch.setenv(sources.MANUAL_DIR_ENV, mnist_files)
  train, test = input_pipeline.load(
      _config(data_source='idx', dataset='fashion_mnist')
  )
  assert train['image'].shape == (60_000, 28, 28, 1)
  assert np.bincount(test['label']).tolist() == [1000] * 10
  mnist = input_pipeline.load(
      _config(data_source='idx', test_split='test[:100]')
  )[1]
  assert not np.array_equal(test['image'][:100], mnist['image'])
