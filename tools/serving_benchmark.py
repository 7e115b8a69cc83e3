"""Latency and throughput of the exported SavedModel, in TensorFlow alone.

  python -m tools.serving_benchmark --model=$HOME/mnist/export/mnist

What TF Serving adds (the network, request parsing) is not in these figures:
they are the model's share of a request. For each signature, the float one on
prepared images and the bytes one on MNIST test digits as PNG files (the
test split of --config, as tools/mnist_pngs.py reads it): the
latency of one image (p50 and p99 over --calls calls, after warm-up calls as
TF Serving's warm-up file makes) and the throughput of batches of --batch.
One JSON object per signature, then one about the machine.
"""

import sys

from run import errors
from run import startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  startup.begin(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
import io
import json
import os
import platform
import time

from absl import app
from absl import flags
from serving import classifiers
import numpy as np
from PIL import Image
from serving import signatures
import tensorflow as tf
from tools import mnist_pngs

FLAGS = flags.FLAGS  # --config is tools.mnist_pngs' flag.

flags.DEFINE_string(
    'model',
    None,
    'The SavedModel: a version directory, or the model directory (its '
    'highest version is used).',
)
flags.DEFINE_integer('calls', 200, 'Timed calls of one image.')
flags.DEFINE_integer('batch', 256, 'Images per call for the throughput.')
flags.DEFINE_integer('batch_calls', 20, 'Timed calls of --batch images.')
WARMUP_CALLS = 5


def inputs(config, n: int) -> dict[str, tuple[str, np.ndarray]]:
  """The first `n` test digits per signature: its input name and the batch."""
  images, _ = mnist_pngs.test_images(config, n)
  encoded = []
  for image in images:
    buffer = io.BytesIO()
    Image.fromarray(image, mode='L').save(buffer, 'PNG')
    encoded.append(buffer.getvalue())
  floats = (images.astype(np.float32) / 255.0)[..., None]
  return {
      'serving_default': (signatures.INPUT_NAME, floats),
      signatures.BYTES_SIGNATURE: (
          signatures.BYTES_INPUT_NAME,
          np.array(encoded, object),
      ),
  }


def timed_calls(function, name: str, batch: np.ndarray, calls: int):
  """Seconds of each of `calls` calls, after WARMUP_CALLS untimed ones."""
  argument = {name: tf.constant(batch)}
  for _ in range(WARMUP_CALLS):
    function(**argument)['logits'].numpy()
  seconds = []
  for _ in range(calls):
    start = time.perf_counter()
    function(**argument)['logits'].numpy()
    seconds.append(time.perf_counter() - start)
  return np.array(seconds)


def measure(function, name: str, batch: np.ndarray) -> dict:
  one = timed_calls(function, name, batch[:1], FLAGS.calls) * 1e3
  many = timed_calls(function, name, batch, FLAGS.batch_calls)
  return {
      'latency_ms_p50': round(float(np.percentile(one, 50)), 3),
      'latency_ms_p99': round(float(np.percentile(one, 99)), 3),
      'calls': FLAGS.calls,
      'batch': len(batch),
      'images_per_sec': round(len(batch) / float(np.median(many)), 1),
  }


def machine() -> dict:
  model = platform.processor()
  if os.path.exists('/proc/cpuinfo'):
    with open('/proc/cpuinfo') as f:
      names = [
          l.split(':', 1)[1].strip() for l in f if l.startswith('model name')
      ]
    model = names[0] if names else model
  return {
      'cpu': model,
      'cores': os.cpu_count(),
      'tensorflow': tf.__version__,
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')
  try:
    path = classifiers.find_saved_model(FLAGS.model)
  except classifiers.InputError as e:
    sys.exit(f'error: --model={FLAGS.model}: {e}')
  try:
    batches = inputs(FLAGS.config, FLAGS.batch)
  except errors.UserError as e:
    sys.exit(f'error: {e}')
  signatures = tf.saved_model.load(path).signatures
  for signature, (name, batch) in batches.items():
    result = measure(signatures[signature], name, batch)
    print(json.dumps({'signature': signature, **result}), flush=True)
  print(json.dumps({'saved_model': path, **machine()}))


if __name__ == '__main__':
  mnist_pngs.define_config_flag()
  flags.mark_flags_as_required(['model'])
  app.run(main)
