"""Writes MNIST test images as PNG files, to try predict.py on real digits.

  python -m tools.mnist_pngs --out=/tmp/digits --num=10

reads the test split as training reads it (`input_pipeline.split_arrays` of
`config.test_split`, the test half of `input_pipeline.load`) and writes
`test_00000_label_2.png`, ...: the index in the split read and the label;
28x28 8-bit grey, white digits on black, the very pixels that training reads,
so predict.py scores them as training did.

`--config` and `--config.<field>=...` are main.py's, `configs/default.py`
unless named: TFDS, prepared where `make train` prepared it (downloaded once,
or from the original files in $MNIST_MANUAL_DIR). A run made with other data
flags (`--config.data_dir`, `--config.data_source=idx`, ...) names them here
too. TFDS orders the test examples its own way (its first is a 2); the other
sources keep the original files' order (their first is a 7).
"""

import sys

from run import errors
from run import startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  startup.begin(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
import os

from absl import app
from absl import flags
from absl import logging
from run import config_checks
import input_pipeline
import ml_collections
from ml_collections import config_flags
import numpy as np
from PIL import Image

FLAGS = flags.FLAGS

DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    'configs',
    'default.py',
)


def define_config_flag() -> None:
  """Defines --config, as main.py does, with configs/default.py by default.

  Called by the programs that read the test split (this one, the serving
  benchmark), not on import: the notebook imports this module beside main.py,
  which defines --config itself.
  """
  config_flags.DEFINE_config_file(
      'config',
      DEFAULT_CONFIG,
      'The config whose test split is read (data_source, dataset, data_dir, '
      "manual_dir, test_split): the training run's.",
      lock_config=True,
  )


def test_images(
    config: ml_collections.ConfigDict, num: int
) -> tuple[np.ndarray, np.ndarray]:
  """The first `num` images `(n, 28, 28)` uint8 and labels of the test split.

  Read by input_pipeline from `config`'s source, as training reads them.
  Raises UserError, whose message is one line.
  """
  config_checks.validate(config)
  test = input_pipeline.split_arrays(config, config.test_split)
  return test['image'][:num, ..., 0], test['label'][:num]


def write_pngs(images: np.ndarray, labels: np.ndarray, out: str) -> list[str]:
  """Writes each image as `test_<index>_label_<label>.png`; returns the paths."""
  os.makedirs(out, exist_ok=True)
  paths = []
  for i, (image, label) in enumerate(zip(images, labels)):
    path = os.path.join(out, f'test_{i:05d}_label_{label}.png')
    Image.fromarray(image, mode='L').save(path)
    paths.append(path)
  return paths


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')
  if not FLAGS['verbosity'].present:  # JAX's and TFDS' INFO lines.
    logging.set_verbosity(logging.WARNING)
  try:
    images, labels = test_images(FLAGS.config, FLAGS.num)
  except errors.UserError as e:
    sys.exit(f'error: {e}')
  for path in write_pngs(images, labels, FLAGS.out):
    print(path)


if __name__ == '__main__':
  # Here, not on import: importing the module (the notebook, the tests)
  # defines no flags.
  define_config_flag()
  flags.DEFINE_string('out', None, 'Directory to write the PNG files to.')
  flags.DEFINE_integer('num', 10, 'Number of test images, from the first.')
  flags.mark_flags_as_required(['out'])
  app.run(main)
