"""Writes MNIST test images as PNG files, to try predict.py on real digits.

  python -m tools.mnist_pngs --mnist_dir=$MNIST_MANUAL_DIR --out=/tmp/digits --num=10

reads the original `t10k-*-ubyte.gz` files (no TFDS, no JAX) and writes
`test_00000_label_7.png`, ...: 28x28 8-bit grey, white digits on black, the
very pixels that training reads, so predict.py scores them as training did.
"""

import gzip
import os

from absl import app
from absl import flags
import numpy as np
from PIL import Image

FLAGS = flags.FLAGS

flags.DEFINE_string(
    'mnist_dir',
    os.environ.get('MNIST_MANUAL_DIR'),
    'Directory of the original MNIST files (default: $MNIST_MANUAL_DIR).',
)
flags.DEFINE_string('out', None, 'Directory to write the PNG files to.')
flags.DEFINE_integer('num', 10, 'Number of test images, from the first.')


def read_test_set(mnist_dir: str) -> tuple[np.ndarray, np.ndarray]:
  """The 10,000 test images `(n, 28, 28)` uint8 and labels, from the idx files.

  An idx file is a big-endian header (16 bytes for images, 8 for labels)
  followed by one unsigned byte per pixel or label.
  """
  with gzip.open(os.path.join(mnist_dir, 't10k-images-idx3-ubyte.gz')) as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
  with gzip.open(os.path.join(mnist_dir, 't10k-labels-idx1-ubyte.gz')) as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8)
  return images, labels


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
  if not FLAGS.mnist_dir:
    raise app.UsageError('Set --mnist_dir or $MNIST_MANUAL_DIR.')
  images, labels = read_test_set(FLAGS.mnist_dir)
  for path in write_pngs(images[: FLAGS.num], labels[: FLAGS.num], FLAGS.out):
    print(path)


if __name__ == '__main__':
  # Here, not on import: importing the module (its tests) needs no flags.
  flags.mark_flags_as_required(['out'])
  app.run(main)
