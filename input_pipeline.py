"""MNIST input pipeline: every source of the data converges to the same arrays.

`load(config)` reads the training and test splits of `config.dataset` from
`config.data_source` and returns each whole, as `Arrays`. Whatever the source,
the recipe is the same: get the source's uint8 images and integer labels as
NumPy arrays, then `to_arrays` makes them uint8 `(N, 28, 28, 1)` and int32
labels, so the training loop never depends on where the data came from.
The pixels stay uint8 (a quarter of float32's memory) until `normalize`
makes them floats in [0, 1], inside the jitted step.

- `tfds` (default): TFDS prepares the data set once in its `data_dir`.
  Offline, it prepares it from the four original `*-ubyte.gz` files in a
  manual directory, checking them against the checksums it registers; online,
  with no manual directory, it downloads the same files itself.
- `hf`: Hugging Face `datasets`, from the Hub or offline from a `save_to_disk`
  directory or parquet files.
- `torchvision`: `torchvision.datasets.MNIST` (an optional extra: PyTorch).
- `idx`: the four original files read with NumPy alone.
"""

import glob
import gzip
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zlib

from absl import logging
import download
import errors
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import download_manager

# Environment variable naming the manual directory of MNIST when the config
# does not (it holds MNIST's files: other data sets do not read it).
MANUAL_DIR_ENV = 'MNIST_MANUAL_DIR'

# The data sets: 28x28 grey images in ten classes, with the same file names.
DATASETS = ('mnist', 'fashion_mnist')

# The idx source's directory when config.manual_dir names none: Debian's
# package dataset-fashion-mnist installs Fashion-MNIST's files here.
DEFAULT_IDX_DIRS = {'fashion_mnist': '/usr/share/datasets/fashion-mnist'}

# The data sets on the Hugging Face Hub, and their torchvision classes.
HF_NAMES = {
    'mnist': 'ylecun/mnist',
    'fashion_mnist': 'zalando-datasets/fashion_mnist',
}
TORCHVISION_CLASSES = {'mnist': 'MNIST', 'fashion_mnist': 'FashionMNIST'}

# The original files of each split: images, then labels.
IDX_FILES = {
    'train': ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte'),
    'test': ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte'),
}

# A split or a batch: uint8 'image' (N, 28, 28, 1), int32 'label'.
Arrays = dict[str, np.ndarray]


class DataError(errors.UserError):
  """The data set cannot be prepared; the message is one line for the user."""


def to_arrays(images, labels) -> Arrays:
  """uint8 images `(N, 28, 28[, 1])` and integer labels as `Arrays`."""
  images, labels = np.asarray(images), np.asarray(labels)
  if images.dtype != np.uint8 or images.shape[1:] not in (
      (28, 28),
      (28, 28, 1),
  ):
    raise DataError(
        f'expected uint8 images of 28x28 pixels, got {images.dtype} {images.shape}'
    )
  if len(labels) != len(images):
    raise DataError(f'{len(images)} images but {len(labels)} labels')
  return {
      'image': images.reshape(-1, 28, 28, 1),
      'label': labels.astype(np.int32),
  }


# Pixel value k as a float: k / 255, rounded as tf.data's
# `tf.cast(image, tf.float32) / 255.0` rounds it.
PIXEL_VALUES = np.arange(256, dtype=np.float32) / np.float32(255)


def normalize(images) -> jax.Array:
  """uint8 pixels as float32 in [0, 1]: the Flax example's inputs, exactly.

  A lookup in `PIXEL_VALUES`, not a division: jitted, XLA turns a division
  by 255 into a multiplication by its reciprocal, one rounding off.
  """
  return jnp.asarray(PIXEL_VALUES)[images]


def get_builder(config: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """Returns the TFDS builder of `config.dataset`, prepared if it was not."""
  builder = tfds.builder(config.dataset, data_dir=config.data_dir or None)
  if not builder.is_prepared():
    _prepare(builder, config)
  return builder


def manual_dir(config: ml_collections.ConfigDict, builder) -> tuple[str, bool]:
  """Returns TFDS' manual directory and whether the user named it."""
  named = _named_manual_dir(config)
  if named:
    return named, True
  return os.path.join(builder.data_dir_root, 'downloads', 'manual'), False


def _named_manual_dir(config: ml_collections.ConfigDict) -> str:
  """config.manual_dir, else $MNIST_MANUAL_DIR for MNIST, else ''."""
  named = config.manual_dir
  if not named and config.dataset == 'mnist':
    named = os.environ.get(MANUAL_DIR_ENV, '')
  return os.path.expanduser(named)


def _prepare(builder, config: ml_collections.ConfigDict) -> None:
  """Prepares the data set from the manual directory, or downloads it.

  A manual directory that the user named, or that exists, must hold every
  file: a missing one is reported instead of starting a download that hangs
  without network. Otherwise the original files are downloaded into
  `<data_dir>/downloads/<dataset>` (see download.py), then prepared from
  there.
  """
  directory, named = manual_dir(config, builder)
  if not named and not os.path.isdir(directory):
    directory = download_files(builder, config)
  expected = sorted(info.filename for info in builder.url_infos.values())
  missing = [
      f for f in expected if not os.path.isfile(os.path.join(directory, f))
  ]
  if missing:
    raise DataError(
        f'{directory}: missing {", ".join(missing)} ({config.dataset} needs '
        f'{", ".join(expected)}; set config.manual_dir or ${MANUAL_DIR_ENV})'
    )
  try:
    # From the files alone: no look for a prepared copy on GCS either.
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            manual_dir=directory, try_download_gcs=False
        )
    )
  except download_manager.NonMatchingChecksumError as e:
    bad = [f for f in expected if f in str(e)] or ['a file']
    raise DataError(
        f'{directory}: {bad[0]} does not match the size and SHA-256 that TFDS '
        f'registers for {config.dataset}: the file is corrupt, truncated or '
        'recompressed; replace it with the original, or read the files with '
        "data_source='idx', which checks their contents instead"
    ) from None


def download_files(builder, config: ml_collections.ConfigDict) -> str:
  """Downloads the data set's original files; returns their directory.

  Into TFDS' download directory, or a local temporary one where TFDS' data
  directory is a bucket (gs://...).
  """
  root = str(builder.data_dir_root)
  if '://' in root:
    root = os.path.join(tempfile.gettempdir(), 'tensorflow_datasets')
  directory = os.path.join(root, 'downloads', config.dataset)
  try:
    download.fetch(builder.url_infos, directory, config.download_url)
  except download.DownloadError as e:
    names = sorted(info.filename for info in builder.url_infos.values())
    where = os.path.dirname(min(builder.url_infos))
    named_by = 'config.manual_dir' + (
        f' or ${MANUAL_DIR_ENV}' if config.dataset == 'mnist' else ''
    )
    raise DataError(
        f'{e}; offline, put the four original files ({", ".join(names)}; '
        f'published at {where}/) in a directory and name it in {named_by} '
        "for TFDS to prepare, or read them from there with data_source='idx'"
    ) from None
  return directory


def num_examples(builder, split: str) -> int:
  """Number of examples in `split` (slices like 'train[:10%]' included)."""
  return builder.info.splits[split].num_examples


def from_tfds(config: ml_collections.ConfigDict, split: str) -> Arrays:
  """`split` (any TFDS split or slice) from TFDS, prepared offline if need be.

  `batch_size=-1` reads the whole split as one batch of uint8 tensors: no
  per-example tf.data map. The arrays are then kept beside TFDS' files (see
  `_cached_arrays`), which spares later runs decoding 70,000 PNGs.
  """
  builder = get_builder(config)
  cached = _cached_arrays(builder, split)
  if cached is not None:
    return cached
  data = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
  arrays = to_arrays(data['image'], data['label'])
  _cache_arrays(builder, split, arrays)
  return arrays


def _array_cache_path(builder, split) -> str:
  """`<TFDS' directory of this version>/arrays/<split>.npz`.

  The directory is that of the prepared version, so a new version of the
  data set (or its deletion) leaves the old arrays behind, unread.
  """
  name = re.sub(r'[^A-Za-z0-9]+', '_', str(split)).strip('_')
  digest = zlib.crc32(str(split).encode()) & 0xFFFFFFFF
  return os.path.join(builder.data_dir, 'arrays', f'{name}-{digest:08x}.npz')


def _cached_arrays(builder, split) -> Arrays | None:
  """The arrays saved by `_cache_arrays`, if they match TFDS' split sizes."""
  path = _array_cache_path(builder, split)
  if not os.path.isfile(path):
    return None
  with np.load(path) as saved:
    arrays = {'image': saved['image'], 'label': saved['label']}
  if len(arrays['label']) != num_examples(builder, split):
    return None
  return arrays


def _cache_arrays(builder, split, arrays: Arrays) -> None:
  """Saves `arrays` for `_cached_arrays`, if TFDS' directory is local.

  Written to a temporary name, then renamed: a run killed meanwhile leaves
  no half file. Where the directory cannot be written, runs go on decoding.
  """
  path = _array_cache_path(builder, split)
  if not os.path.isdir(builder.data_dir):  # A bucket (gs://): not cached.
    return
  incomplete = f'{path}.{os.getpid()}.incomplete'
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(incomplete, 'wb') as f:
      np.savez(f, **arrays)
    os.replace(incomplete, path)
  except OSError as e:
    if os.path.exists(incomplete):
      os.remove(incomplete)
    logging.warning('Not caching %s arrays of %s: %s', split, builder.name, e)


def read_idx(path: str, ndim: int) -> np.ndarray:
  """One IDX file of unsigned bytes (gzipped or not), its header checked.

  IDX: a big-endian magic number 0x0800 + ndim (0x08 for unsigned bytes),
  ndim big-endian 32-bit sizes, then the bytes, row-major.
  """
  try:
    with (gzip.open if path.endswith('.gz') else open)(path, 'rb') as f:
      data = f.read()
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(
        f'{path}: cannot be read, truncated or corrupt? ({e})'
    ) from None
  header = 4 + 4 * ndim
  magic = int.from_bytes(data[:4], 'big')
  if len(data) < header or magic != 0x800 + ndim:
    raise DataError(
        f'{path}: not an IDX file of {ndim}-dimensional unsigned bytes (magic '
        f'number {magic:#x}, expected {0x800 + ndim:#x})'
    )
  shape = tuple(int(n) for n in np.frombuffer(data, '>u4', ndim, 4))
  if len(data) != header + np.prod(shape):
    raise DataError(
        f'{path}: {len(data)} bytes, but its header says {shape}, '
        f'{header + np.prod(shape)} bytes: the file is truncated or not IDX'
    )
  return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def idx_dir(config: ml_collections.ConfigDict) -> str:
  """The directory of the original files: the manual directory, or a default."""
  directory = _named_manual_dir(config) or DEFAULT_IDX_DIRS.get(config.dataset)
  if not directory:
    raise DataError(
        f'no directory of the original {config.dataset} files: set '
        f'config.manual_dir or ${MANUAL_DIR_ENV}'
    )
  return directory


def from_idx(config: ml_collections.ConfigDict, split: str) -> Arrays:
  """`split` ('train' or 'test') from the original files, `*-ubyte[.gz]`."""
  directory = idx_dir(config)
  arrays = []
  for name, ndim in zip(IDX_FILES[split], (3, 1)):
    paths = [os.path.join(directory, name + ext) for ext in ('.gz', '')]
    path = next((p for p in paths if os.path.isfile(p)), None)
    if not path:
      raise DataError(f'{directory}: missing {name}.gz (or {name})')
    arrays.append(read_idx(path, ndim))
  return to_arrays(*arrays)


def hf_arrays(dataset) -> Arrays:
  """A Hugging Face `Dataset` of 'image' and 'label' as `Arrays`.

  In NumPy format the whole column is one array read: an `Array2D` image
  column straight from Arrow, an `Image` column (PNG bytes, as on the Hub)
  decoded in one call. uint8 asks the formatter not to widen the pixels to
  int64 first.
  """
  data = dataset.with_format(
      'numpy', columns=['image', 'label'], dtype=np.uint8
  )[:]
  return to_arrays(data['image'], data['label'])


def from_hf(config: ml_collections.ConfigDict, split: str) -> Arrays:
  """`split` from Hugging Face datasets.

  `config.data_dir` is a `save_to_disk` directory, or a directory of parquet
  files named `<split>-*.parquet` (as in a copy of the Hub's repository);
  empty, `load_dataset` reads the Hub (or its cache, offline).
  """
  try:
    import datasets  # pylint: disable=g-import-not-at-top
    from pyarrow import parquet  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise DataError(
        "data_source 'hf' needs Hugging Face datasets: the hf extra, "
        'uv sync --extra hf (make installs it), or pip install datasets'
    ) from None
  directory = os.path.expanduser(config.data_dir)
  if not directory:
    return hf_arrays(
        datasets.load_dataset(HF_NAMES[config.dataset], split=split)
    )
  if os.path.isfile(os.path.join(directory, 'dataset_dict.json')):
    return hf_arrays(datasets.load_from_disk(directory)[split])
  pattern = os.path.join(directory, '**', f'{split}-*.parquet')
  files = sorted(glob.glob(pattern, recursive=True))
  if not files:
    raise DataError(
        f'{directory}: neither a save_to_disk directory nor {split}-*.parquet files'
    )
  # In memory: no copy of the files in the Hugging Face cache.
  return hf_arrays(datasets.Dataset(parquet.read_table(files)))


# torchvision imports triton (through torch._dynamo), and importing triton
# after TensorFlow aborts the process: both bring their own LLVM. So
# torchvision reads the files in a process of its own, without TensorFlow.
# argv: root, dataset class, split, output .npz.
_TORCHVISION_READER = """
import sys
import numpy as np
from torchvision import datasets
root, name, split, out = sys.argv[1:]
try:
  dataset = getattr(datasets, name)(root, train=split == 'train', download=True)
except (OSError, RuntimeError) as e:
  sys.exit(' '.join(str(e).split()))
np.savez(out, images=dataset.data.numpy(), labels=dataset.targets.numpy())
"""


def from_torchvision(config: ml_collections.ConfigDict, split: str) -> Arrays:
  """`split` from torchvision, reading the dataset's `.data` and `.targets`.

  torchvision is optional (it brings PyTorch): the `torchvision` extra.
  `config.data_dir` is its root ('' is ~/torchvision_datasets); torchvision
  downloads the files into `<root>/MNIST/raw` unless they are there.
  """
  if importlib.util.find_spec('torchvision') is None:
    raise DataError(
        "data_source 'torchvision' needs torchvision, which brings PyTorch: "
        'uv sync --extra torchvision, or pip install torchvision'
    )
  root = os.path.expanduser(config.data_dir or '~/torchvision_datasets')
  with tempfile.TemporaryDirectory() as directory:
    out = os.path.join(directory, 'arrays.npz')
    name = TORCHVISION_CLASSES[config.dataset]
    result = subprocess.run(
        [sys.executable, '-c', _TORCHVISION_READER, root, name, split, out],
        capture_output=True,
        text=True,
    )
    if result.returncode:
      lines = result.stderr.strip().splitlines()
      raise DataError(
          f'{root}: torchvision cannot read or download {config.dataset}: '
          f'{lines[-1] if lines else f"exit status {result.returncode}"}'
      )
    with np.load(out) as arrays:
      return to_arrays(arrays['images'], arrays['labels'])


# data_source: a function (config, split) -> Arrays.
SOURCES = {
    'tfds': from_tfds,
    'hf': from_hf,
    'torchvision': from_torchvision,
    'idx': from_idx,
}

# The splits of both data sets; the non-TFDS sources read one, optionally
# sliced, TFDS any split in its syntax.
SPLITS = ('train', 'test')
_SPLIT = re.compile(r'(train|test)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?')
SPLIT_SYNTAX = {
    'tfds': "a TFDS split of 'train' and 'test', like 'train[:10%]' or "
    "'train[:50%]+test'",
    **dict.fromkeys(
        ('hf', 'torchvision', 'idx'),
        "'train' or 'test', optionally sliced like 'train[:10%]' or "
        "'test[100:600]'",
    ),
}


def valid_split(data_source: str, split: str) -> bool:
  """Whether `data_source` reads `split` (see SPLIT_SYNTAX)."""
  if data_source != 'tfds':
    return _SPLIT.fullmatch(split) is not None
  try:
    tfds.core.ReadInstruction.from_spec(split)
  except ValueError:
    return False
  return all(part.split('[')[0] in SPLITS for part in split.split('+'))


def _bound(bound: str | None, n: int) -> int | None:
  """A slice bound, in examples or in percent of the `n` examples (TFDS')."""
  if bound and bound.endswith('%'):
    return round(int(bound[:-1]) * n / 100)
  return None if bound is None else int(bound)


def split_arrays(config: ml_collections.ConfigDict, split: str) -> Arrays:
  """`split` of `config.dataset` from `config.data_source`.

  TFDS reads any TFDS split. The other sources read 'train' or 'test', or a
  slice of one in TFDS' syntax with one range, like 'train[:10%]' or
  'test[-500:]'; they read the whole split, then slice it.
  """
  if config.data_source == 'tfds':
    return from_tfds(config, split)
  name, start, stop = _SPLIT.fullmatch(split).groups()
  arrays = SOURCES[config.data_source](config, name)
  n = len(arrays['label'])
  # A copy, so that a small slice does not keep the whole split in memory.
  part = slice(_bound(start, n), _bound(stop, n))
  return {k: v[part].copy() for k, v in arrays.items()}


def load(config: ml_collections.ConfigDict) -> tuple[Arrays, Arrays]:
  """This process's share of the training split, and the whole test split.

  With several JAX processes (hosts), each trains on its own share of the
  training examples (TFDS reads only that share), and evaluates its part of
  every test batch. `config` is one that `config_validation.validate`
  passed.
  """
  if config.data_source == 'tfds':
    train = from_tfds(config, tfds.split_for_jax_process(config.train_split))
  else:
    train = _process_share(split_arrays(config, config.train_split))
  return train, split_arrays(config, config.test_split)


def _process_share(arrays: Arrays) -> Arrays:
  """This JAX process's contiguous share of `arrays`, as TFDS would split it."""
  share = len(arrays['label']) // jax.process_count()
  start = jax.process_index() * share
  return {k: v[start : start + share] for k, v in arrays.items()}


def epoch_seed(seed: int, epoch: int) -> int:
  """A shuffle seed that depends on (seed, epoch) alone.

  Each epoch's order is then a pure function of the config, so a resumed run
  sees the same order as an uninterrupted one.
  """
  return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def epoch_order(
    seed: int, epoch: int, num_examples: int, batch_size: int
) -> np.ndarray:
  """Indices of the examples of each step of `epoch`, `(steps, batch_size)`.

  A fresh permutation of the whole split every epoch; the remainder that
  does not fill a batch is dropped.
  """
  order = np.random.default_rng(epoch_seed(seed, epoch)).permutation(
      num_examples
  )
  steps = num_examples // batch_size
  return order[: steps * batch_size].reshape(steps, batch_size).astype(np.int32)


def eval_batches(arrays: Arrays, batch_size: int) -> Arrays:
  """Every example once, in `(batches, batch_size, ...)` arrays with a 'mask'.

  The last batch is padded with zeros; the mask is False on the padding, so
  that metrics ignore it and one compiled step serves every batch.
  """
  n = len(arrays['label'])
  size = -(-n // batch_size) * batch_size
  padded = {
      k: np.pad(v, [(0, size - n)] + [(0, 0)] * (v.ndim - 1))
      for k, v in arrays.items()
  }
  padded['mask'] = np.arange(size) < n
  return {k: v.reshape(-1, batch_size, *v.shape[1:]) for k, v in padded.items()}
