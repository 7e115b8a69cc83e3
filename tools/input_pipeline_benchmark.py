"""Times each data source delivering MNIST's 60,000 training images as arrays.

  python -m tools.input_pipeline_benchmark --mnist_dir=../shared/data/mnist --runs=5

Opt-in (not a test). From the original files in `--mnist_dir` it first lays
out, untimed, what each source reads: a TFDS data_dir prepared offline, a
Hugging Face `save_to_disk` directory of `Array2D` images, Hub-style parquet
files of PNG images (as `ylecun/mnist` ships them), and torchvision's
`MNIST/raw` (where torchvision is installed). Then it times
`input_pipeline.split_arrays(config, 'train')` for each, `--runs` times in
this process, and prints the median and every run, in seconds.
"""

import sys

from run import startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  startup.begin(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
import gzip
import importlib.util
import os
import shutil
import statistics
import tempfile
import time

from absl import app
from absl import flags
from configs import default
from data import sources
import input_pipeline

FLAGS = flags.FLAGS

flags.DEFINE_string(
    'mnist_dir',
    os.environ.get(sources.MANUAL_DIR_ENV),
    'Directory of the original MNIST files (default: $MNIST_MANUAL_DIR).',
)
flags.DEFINE_integer('runs', 5, 'Timed runs per source.')


def _raw_splits(mnist_dir: str) -> dict:
  """{'train': (images, labels), 'test': ...} uint8, from the original files."""
  return {
      split: tuple(
          sources.read_idx(os.path.join(mnist_dir, name + '.gz'), ndim)
          for name, ndim in zip(names, (3, 1))
      )
      for split, names in sources.IDX_FILES.items()
  }


def _hf_dirs(raw: dict, root: str) -> tuple[str, str]:
  """A save_to_disk directory (Array2D) and a directory of Hub-style parquet."""
  import datasets  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  label = datasets.ClassLabel(num_classes=10)
  array2d = datasets.Features(
      {'image': datasets.Array2D((28, 28), 'uint8'), 'label': label}
  )
  saved = os.path.join(root, 'hf_saved')
  datasets.DatasetDict(
      {
          split: datasets.Dataset.from_dict(
              {'image': images, 'label': labels}, features=array2d
          )
          for split, (images, labels) in raw.items()
      }
  ).save_to_disk(saved)
  hub = os.path.join(root, 'hf_hub')
  os.makedirs(os.path.join(hub, 'mnist'))
  png = datasets.Features({'image': datasets.Image(), 'label': label})
  for split, (images, labels) in raw.items():
    datasets.Dataset.from_dict(
        {'image': [Image.fromarray(i) for i in images], 'label': labels},
        features=png,
    ).to_parquet(os.path.join(hub, 'mnist', f'{split}-00000-of-00001.parquet'))
  return saved, hub


def _torchvision_root(mnist_dir: str, root: str) -> str:
  """torchvision's layout: the four files uncompressed in <root>/MNIST/raw."""
  raw = os.path.join(root, 'torchvision', 'MNIST', 'raw')
  os.makedirs(raw)
  for names in sources.IDX_FILES.values():
    for name in names:
      with gzip.open(os.path.join(mnist_dir, name + '.gz')) as f:
        with open(os.path.join(raw, name), 'wb') as out:
          shutil.copyfileobj(f, out)
  return os.path.dirname(os.path.dirname(raw))


def _configs(mnist_dir: str, root: str) -> dict:
  """{label: config} of each source that can run here."""
  config = default.get_config()
  config.manual_dir = mnist_dir
  configs = {}

  def add(label, source, data_dir=''):
    configs[label] = c = config.copy_and_resolve_references()
    c.data_source, c.data_dir = source, data_dir

  add('tfds', 'tfds', os.path.join(root, 'tfds'))
  input_pipeline.get_builder(configs['tfds'])  # Prepared, untimed.
  add('idx', 'idx')
  try:
    saved, hub = _hf_dirs(_raw_splits(mnist_dir), root)
    add('hf (save_to_disk, Array2D)', 'hf', saved)
    add('hf (Hub parquet, PNG Image)', 'hf', hub)
  except ImportError:
    print('hf: datasets is not installed')
  if importlib.util.find_spec('torchvision'):
    add('torchvision', 'torchvision', _torchvision_root(mnist_dir, root))
  else:
    print('torchvision: not installed')
  return configs


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')
  if not FLAGS.mnist_dir:
    raise app.UsageError('Set --mnist_dir or $MNIST_MANUAL_DIR.')
  with tempfile.TemporaryDirectory() as root:
    configs = _configs(FLAGS.mnist_dir, root)
    print(f'{"source":30} {"median s":>8}  runs (s)')
    for label, config in configs.items():
      times = []
      for _ in range(FLAGS.runs):
        start = time.perf_counter()
        arrays = input_pipeline.split_arrays(config, 'train')
        times.append(time.perf_counter() - start)
      assert arrays['image'].shape == (60_000, 28, 28, 1)
      runs = ' '.join(f'{t:.2f}' for t in times)
      print(f'{label:30} {statistics.median(times):8.2f}  {runs}', flush=True)


if __name__ == '__main__':
  app.run(main)
