"""Shared test fixtures: MNIST prepared by TFDS from the original files."""

import os
import shutil

import pytest

import export
import input_pipeline
import parallel
import train
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


@pytest.fixture(scope='session')
def trained_model(mnist_data_dir):
  """The CNN after one epoch on 1,024 training images, in eval mode.

  Trained with train.py's own steps, so that exports of it are exports of a
  model as training leaves it (BatchNorm statistics included).
  """
  config = default.get_config()
  config.data_dir = mnist_data_dir
  config.train_split = 'train[:1024]'
  config.batch_size = 64
  data, _ = input_pipeline.load(config)
  model = train.create_model(config)
  order = input_pipeline.epoch_order(config.seed, 1, 1024, config.batch_size)
  optimizer = train.create_optimizer(model, config, len(order))
  train.train_epoch(
      model, optimizer, train.create_metrics(), data, order,
      config.steps_per_call, parallel.create_mesh(),
  )
  model.eval()
  return model


@pytest.fixture(scope='session')
def mnist_test_images(mnist_data_dir) -> tuple:
  """The first 256 images of TFDS' test split, float32 in [0, 1], and labels.

  TFDS orders them its own way, not as the original files do.
  """
  config = default.get_config()
  config.data_dir = mnist_data_dir
  config.test_split = 'test[:256]'
  _, test = input_pipeline.load(config)
  return test['image'], test['label']


@pytest.fixture(scope='session')
def trained_export(trained_model, tmp_path_factory) -> str:
  """The SavedModel exported from `trained_model`: its version directory."""
  model_dir = str(tmp_path_factory.mktemp('trained_export') / 'mnist')
  return export.export_saved_model(trained_model, model_dir)
