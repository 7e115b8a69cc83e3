"""The sources other than TFDS (idx, hf, torchvision), and what every source
shares: `to_arrays`, which makes the uint8 images and labels they read the
same `Arrays`.
"""

import glob
import gzip
import importlib.util
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np
from run import errors

# The manual directory of MNIST where the config names none (MNIST's own).
MANUAL_DIR_ENV = 'MNIST_MANUAL_DIR'
# Where Debian's package dataset-fashion-mnist puts its files.
DEFAULT_IDX_DIRS = {'fashion_mnist': '/usr/share/datasets/fashion-mnist'}
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
Arrays = dict[str, np.ndarray]  # uint8 'image' (N, 28, 28, 1), int32 'label'.


def to_arrays(images, labels) -> Arrays:
  """uint8 images `(N, 28, 28[, 1])` and integer labels as `Arrays`."""
  images, labels = np.asarray(images), np.asarray(labels)
  shape = images.shape[1:]
  if images.dtype != np.uint8 or shape not in ((28, 28), (28, 28, 1)):
    raise errors.UserError(
        f'expected uint8 images of 28x28 pixels, got {images.dtype} {images.shape}'
    )
  if len(labels) != len(images):
    raise errors.UserError(f'{len(images)} images but {len(labels)} labels')
  return {
      'image': images.reshape(-1, 28, 28, 1),
      'label': labels.astype(np.int32),
  }


def named_manual_dir(config) -> str:
  """config.manual_dir, else $MNIST_MANUAL_DIR for MNIST, else ''."""
  named = config.manual_dir
  if not named and config.dataset == 'mnist':
    named = os.environ.get(MANUAL_DIR_ENV, '')
  return os.path.expanduser(named)


def read_idx(path: str, ndim: int) -> np.ndarray:
  """One IDX file of unsigned bytes (gzipped or not), its header checked."""
  try:
    with (gzip.open if path.endswith('.gz') else open)(path, 'rb') as f:
      data = f.read()
  except (OSError, EOFError, zlib.error) as e:
    raise errors.UserError(
        f'{path}: cannot be read, truncated or corrupt? ({e})'
    ) from None
  header = 4 + 4 * ndim
  magic = int.from_bytes(data[:4], 'big')
  if len(data) < header or magic != 0x800 + ndim:
    raise errors.UserError(
        f'{path}: not an IDX file of {ndim}-dimensional unsigned bytes (magic '
        f'number {magic:#x}, expected {0x800 + ndim:#x})'
    )
  shape = tuple(int(n) for n in np.frombuffer(data, '>u4', ndim, 4))
  if len(data) != header + np.prod(shape):
    raise errors.UserError(
        f'{path}: {len(data)} bytes, but its header says {shape}, '
        f'{header + np.prod(shape)} bytes: the file is truncated or not IDX'
    )
  return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def from_idx(config, split: str) -> Arrays:
  """`split` ('train' or 'test') from the original files, `*-ubyte[.gz]`."""
  directory = named_manual_dir(config) or DEFAULT_IDX_DIRS.get(config.dataset)
  if not directory:
    raise errors.UserError(
        f'no directory of the original {config.dataset} files: set '
        f'config.manual_dir or ${MANUAL_DIR_ENV}'
    )
  arrays = []
  for name, ndim in zip(IDX_FILES[split], (3, 1)):
    paths = [os.path.join(directory, name + ext) for ext in ('.gz', '')]
    path = next((p for p in paths if os.path.isfile(p)), None)
    if not path:
      raise errors.UserError(f'{directory}: missing {name}.gz (or {name})')
    arrays.append(read_idx(path, ndim))
  return to_arrays(*arrays)


def hf_arrays(dataset) -> Arrays:
  """A Hugging Face `Dataset` of 'image' and 'label' as `Arrays`, read in NumPy
  format, a column as one array; uint8 spares int64 pixels first.
  """
  data = dataset.with_format(
      'numpy', columns=['image', 'label'], dtype=np.uint8
  )[:]
  return to_arrays(data['image'], data['label'])


def from_hf(config, split: str) -> Arrays:
  """`split` from Hugging Face datasets: the Hub (or its cache), or
  `config.data_dir`, a `save_to_disk` directory or a copy of the Hub's
  repository (`<split>-*.parquet` files).
  """
  try:
    import datasets  # pylint: disable=g-import-not-at-top
    from pyarrow import parquet  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise errors.UserError(
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
    raise errors.UserError(
        f'{directory}: neither a save_to_disk directory nor {split}-*.parquet files'
    )
  # In memory: no copy of the files in the Hugging Face cache.
  return hf_arrays(datasets.Dataset(parquet.read_table(files)))


# torchvision imports triton, which aborts a process that imported
# TensorFlow (each brings its own LLVM): it reads in a process of its own.
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


def from_torchvision(config, split: str) -> Arrays:
  """`split` from torchvision's `.data` and `.targets`, in its own process;
  `config.data_dir` is its root, where it downloads the files if need be.
  """
  if importlib.util.find_spec('torchvision') is None:
    raise errors.UserError(
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
      raise errors.UserError(
          f'{root}: torchvision cannot read or download {config.dataset}: '
          f'{lines[-1] if lines else f"exit status {result.returncode}"}'
      )
    with np.load(out) as arrays:
      return to_arrays(arrays['images'], arrays['labels'])
