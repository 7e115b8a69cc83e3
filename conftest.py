"""Shared test fixtures: MNIST prepared by TFDS from the original files.

The tests read the four original MNIST files from $MNIST_MANUAL_DIR, else
from ../shared/data/mnist beside the checkout. Where there are none, they
are downloaded once, as `make train` downloads them, into TFDS' download
directory (~/tensorflow_datasets/downloads/mnist, or under $TFDS_DATA_DIR);
where that fails too, each test that needs them fails with one line saying
why; the others run.
"""

import gzip
import os
import shutil
import struct
import tempfile
import zlib

# Before JAX is imported, here and in the tests' subprocesses (which inherit
# the environment): a persistent compilation cache, so that the same
# computation compiled by several tests and processes compiles once.
os.environ.setdefault(
    'JAX_COMPILATION_CACHE_DIR',
    os.path.join(tempfile.gettempdir(), 'mnist-tests-jax-cache'),
)
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
# TensorFlow as the entry points run it, without its start-up lines. The
# tests of those lines run their processes without these variables.
from run import startup  # pylint: disable=g-import-not-at-top

startup.quiet([])

# pylint: disable=g-import-not-at-top,wrong-import-position
from cpu import layers as cpu_layers
from data import sources
from serving import export
import filelock
from flax import nnx
import input_pipeline
import numpy as np
from run import errors
from run import parallel
from tools import crafted_images
from PIL import Image
import pytest
import tensorflow_datasets as tfds
import train
from configs import default
from configs import fast

# The four original MNIST files, beside the checkout (see ../shared/data).
SHARED_MNIST = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), '..', 'shared', 'data', 'mnist'
)


# The fixtures that train, export, serve or drive a browser: a test that uses
# one is left out of the quick tier, as are the modules marked slow whole.
SLOW_FIXTURES = frozenset(
    {
        'trained_model',
        'reading_export',
        'trained',
        'uninterrupted',
        'two_epochs',
        'standin',
        'servers',
        'four_devices',
    }
)


def pytest_collection_modifyitems(items):
  for item in items:
    if SLOW_FIXTURES & set(item.fixturenames):
      item.add_marker(pytest.mark.slow)


@pytest.fixture(scope='session')
def mnist_files(tmp_path_factory) -> str:
  """The directory of the original MNIST files, downloaded if need be.

  The parallel workers of pytest-xdist download them once: the lock, in the
  folder above the session's, makes the others wait for the first.
  """
  named = os.environ.get(sources.MANUAL_DIR_ENV)
  directory = named or SHARED_MNIST
  missing = [
      name + '.gz'
      for names in sources.IDX_FILES.values()
      for name in names
      if not os.path.isfile(os.path.join(directory, name + '.gz'))
  ]
  if not missing:
    return directory
  if named:  # CI names its copy: it never downloads.
    pytest.fail(
        f'no MNIST files in ${sources.MANUAL_DIR_ENV}={named} (missing '
        f'{", ".join(missing)})',
        pytrace=False,
    )
  shared = tmp_path_factory.getbasetemp().parent
  try:
    with filelock.FileLock(str(shared / 'mnist-download.lock')):
      return input_pipeline.download_files(
          tfds.builder('mnist'), default.get_config()
      )
  except errors.UserError as e:
    error = e  # Failed outside the handler: no chained traceback.
  pytest.fail(f'no MNIST files in {directory}, and {error}', pytrace=False)


@pytest.fixture(scope='session')
def mnist_data_dir(mnist_files, tmp_path_factory) -> str:
  """A TFDS data_dir with MNIST prepared from `mnist_files`.

  Prepared once (about 20 s of CPU) in the folder above the session's, which
  the parallel workers of pytest-xdist share; the lock makes the others
  wait for the first.
  """
  shared = tmp_path_factory.getbasetemp().parent
  with filelock.FileLock(str(shared / 'tfds.lock')):
    config = default.get_config()
    config.data_dir = str(shared / 'tfds')
    config.manual_dir = mnist_files
    input_pipeline.get_builder(config)
  return config.data_dir


@pytest.fixture
def copy_of_mnist_files(mnist_files, tmp_path) -> str:
  """A writable copy of the original files, to damage in a test."""
  directory = tmp_path / 'manual'
  shutil.copytree(mnist_files, directory)
  for name in os.listdir(directory):
    os.chmod(directory / name, 0o644)
  return str(directory)


def _write_idx(path, array):
  """`array` (uint8) as an IDX file: magic 0x0800 + ndim, sizes, bytes."""
  header = np.array([0x800 + array.ndim, *array.shape], '>u4').tobytes()
  with gzip.open(path, 'wb') as f:
    f.write(header + array.tobytes())


@pytest.fixture
def small_files(mnist_files, tmp_path) -> str:
  """The first 300 training and 100 test examples of MNIST, as IDX files."""
  directory = tmp_path / 'small'
  directory.mkdir()
  for split, size in (('train', 300), ('test', 100)):
    for name, ndim in zip(sources.IDX_FILES[split], (3, 1)):
      full = sources.read_idx(os.path.join(mnist_files, name + '.gz'), ndim)
      _write_idx(directory / (name + '.gz'), full[:size])
  return str(directory)


@pytest.fixture(scope='session')
def assert_same_arrays():
  """Checks that two `Arrays` are equal: keys, dtypes, shapes and values.

  A fixture, so that the tests of every source share it without importing
  each other.
  """

  def check(actual, expected):
    assert actual.keys() == expected.keys() == {'image', 'label'}
    for k in expected:
      assert (
          actual[k].dtype == expected[k].dtype
          and actual[k].shape == expected[k].shape
      )
      np.testing.assert_array_equal(actual[k], expected[k])

  return check


@pytest.fixture(scope='session')
def small_config(mnist_data_dir):
  """Makes the default config on small slices of MNIST, for fast runs.

  `small_config(num_epochs=2, ...)` returns a fresh config each call, with
  those fields changed: one epoch of 16 steps of 64 on 1,024 training
  images, and 300 test images.
  """

  def make(**fields):
    config = default.get_config()
    config.update(
        data_dir=mnist_data_dir,
        train_split='train[:1024]',
        test_split='test[:300]',
        num_epochs=1,
        batch_size=64,
        eval_batch_size=128,
    )
    config.update(fields)
    return config

  return make


def _trained_for_one_epoch(config):
  """The CNN after one epoch of `config`, in eval mode.

  Trained with train.py's own steps, so that exports of it are exports of a
  model as training leaves it (BatchNorm statistics included).
  """
  data, _ = input_pipeline.load(config)
  model = train.create_model(config, cpu_layers.for_config(config))
  size = len(data['label'])
  order = input_pipeline.epoch_order(config.seed, 1, size, config.batch_size)
  optimizer = train.create_optimizer(model, config, len(order))
  objects = (model, optimizer, train.create_metrics())
  mesh = parallel.create_mesh()
  train.train_epoch(objects, data, order, mesh, config.steps_per_call)
  flax_model = train.create_model(config)  # Flax's own kernels, as exported.
  nnx.update(flax_model, nnx.state(model))
  flax_model.eval()
  return flax_model


@pytest.fixture(scope='session')
def trained_model(small_config):
  """The CNN after one epoch of `small_config`, in eval mode."""
  return _trained_for_one_epoch(small_config())


@pytest.fixture(scope='session')
def mnist_test_images(small_config) -> tuple:
  """The first 256 images of TFDS' test split, float32 in [0, 1], and labels.

  TFDS orders them its own way, not as the original files do.
  """
  _, test = input_pipeline.load(small_config(test_split='test[:256]'))
  return np.asarray(train.normalize(test['image'])), test['label']


@pytest.fixture(scope='session')
def trained_export(trained_model, tmp_path_factory) -> str:
  """The SavedModel exported from `trained_model`: its version directory."""
  model_dir = str(tmp_path_factory.mktemp('trained_export') / 'mnist')
  return export.export_saved_model(trained_model, model_dir)


def _claiming(data: bytes, width: int, height: int) -> bytes:
  """A small PNG or JPEG whose header says `width` x `height`, as in an attack.

  PNG's IHDR (its checksum made again) or JPEG's SOF0; the data stays that
  of the small image, which decoders fill out to the size claimed.
  """
  data = bytearray(data)
  if data.startswith(b'\x89PNG'):
    data[16:24] = struct.pack('>II', width, height)
    data[29:33] = struct.pack('>I', zlib.crc32(data[12:29]))
  else:
    sof = data.index(b'\xff\xc0')
    data[sof + 5 : sof + 9] = struct.pack('>HH', height, width)
  return bytes(data)


@pytest.fixture(scope='session')
def oversized_images(tmp_path_factory) -> dict[str, str]:
  """Files of a few bytes to a few dozen KB, each over the decoding bound.

  name -> path. Some say the truth (a blank image of 5000x5000 pixels
  compresses to next to nothing), some lie (a 16x16 JPEG, PNG or BMP whose
  header claims more).
  """
  directory = tmp_path_factory.mktemp('oversized')
  small = Image.new('L', (16, 16))
  bmp = crafted_images.encoded(small, 'BMP')
  files = {
      'blank.png': crafted_images.encoded(Image.new('L', (5000, 5000)), 'PNG'),
      'strip.png': crafted_images.encoded(Image.new('L', (20000, 1)), 'PNG'),
      'claims.jpg': _claiming(
          crafted_images.encoded(small, 'JPEG'), 5000, 5000
      ),
      'claims.png': _claiming(
          crafted_images.encoded(small, 'PNG'), 30000, 30000
      ),
      'claims.bmp': bmp[:18] + struct.pack('<ii', 5000, 5000) + bmp[26:],
  }
  for name, data in files.items():
    (directory / name).write_bytes(data)
  return {name: str(directory / name) for name in files}


@pytest.fixture(scope='session')
def costly_images(tmp_path_factory) -> dict[str, str]:
  """Files within the size bound whose decoding would cost the most.

  name -> path: the crafted JPEG (Pillow's progressive JPEG, its first AC
  scan written 20,000 more times), a CMYK JPEG, a PNG whose IHDR claims
  4096x4096 pixels of 16-bit RGB.
  """
  directory = tmp_path_factory.mktemp('costly')
  progressive = crafted_images.progressive_jpeg('L', 64)
  png = _claiming(
      crafted_images.encoded(Image.new('RGB', (16, 16)), 'PNG'), 4096, 4096
  )
  png = bytearray(png)
  png[24] = 16  # Bit depth; the checksum made again.
  png[29:33] = struct.pack('>I', zlib.crc32(png[12:29]))
  files = {
      'scans.jpg': crafted_images.with_scans(progressive, 20_006, 1),
      'cmyk.jpg': crafted_images.encoded(Image.new('CMYK', (16, 16)), 'JPEG'),
      'rgb16.png': bytes(png),
  }
  for name, data in files.items():
    (directory / name).write_bytes(data)
  return {name: str(directory / name) for name in files}


@pytest.fixture(scope='session')
def heap_corrupting_webp(tmp_path_factory) -> str:
  """An animated 28x28 WebP whose first frame is 29 pixels wide.

  TensorFlow's WebP decoder (every decode op, on these bytes) corrupts the
  heap on it and aborts the process. The frame's width less one is the
  24-bit little-endian field 6 bytes into the first ANMF chunk's payload.
  """
  frames = [Image.new('RGB', (28, 28), (255 * i, 0, 0)) for i in range(2)]
  data = bytearray(
      crafted_images.encoded(
          frames[0], 'WEBP', save_all=True, append_images=frames[1:]
      )
  )
  payload = data.index(b'ANMF') + 8
  data[payload + 6 : payload + 9] = (28).to_bytes(3, 'little')
  path = tmp_path_factory.mktemp('webp') / 'wide_frame.webp'
  path.write_bytes(data)
  return str(path)


@pytest.fixture(scope='session')
def reading_export(mnist_data_dir, tmp_path_factory) -> str:
  """A SavedModel that reads hand-drawn digits: its version directory.

  `trained_model`'s 16 steps leave a model that misreads many of MNIST's own
  test digits, too weak to judge how a drawing is prepared; this one, trained
  with configs/fast.py's hyperparameters for one epoch of the first 8,192
  training images, reads nearly all of them right.
  """
  config = fast.get_config()
  config.update(
      data_dir=mnist_data_dir, train_split='train[:8192]', test_split='test[:1]'
  )
  model_dir = str(tmp_path_factory.mktemp('reading_export') / 'mnist')
  return export.export_saved_model(_trained_for_one_epoch(config), model_dir)
