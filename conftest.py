"""Shared test fixtures: MNIST prepared by TFDS from the original files."""

import os
import shutil

import pytest

import input_pipeline
from configs import default

# The four original MNIST files, beside the checkout (see ../shared/data).
SHARED_MNIST = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), '..', 'shared', 'data', 'mnist'
)


@pytest.fixture(scope='session')
def mnist_files() -> str:
  """The directory of the original MNIST files; skips where there is none."""
  if not os.path.isfile(os.path.join(SHARED_MNIST, 'train-images-idx3-ubyte.gz')):
    pytest.skip(f'no MNIST files in {SHARED_MNIST}')
  return SHARED_MNIST


@pytest.fixture(scope='session')
def mnist_data_dir(mnist_files, tmp_path_factory) -> str:
  """A TFDS data_dir with MNIST prepared from `mnist_files`, once a session."""
  data_dir = str(tmp_path_factory.mktemp('tfds'))
  config = default.get_config()
  config.data_dir = data_dir
  config.manual_dir = mnist_files
  input_pipeline.get_builder(config)
  return data_dir


@pytest.fixture
def copy_of_mnist_files(mnist_files, tmp_path) -> str:
  """A writable copy of the original files, to damage in a test."""
  directory = tmp_path / 'manual'
  shutil.copytree(mnist_files, directory)
  for name in os.listdir(directory):
    os.chmod(directory / name, 0o644)
  return str(directory)


@pytest.fixture
def small_config(mnist_data_dir):
  """The default config on small slices of MNIST, for fast training runs."""
  config = default.get_config()
  config.data_dir = mnist_data_dir
  config.train_split = 'train[:1024]'
  config.test_split = 'test[:300]'
  config.num_epochs = 1
  config.batch_size = 64
  config.eval_batch_size = 128
  return config
