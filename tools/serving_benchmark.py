"""Latency and throughput of the exported SavedModel, in TensorFlow alone.

  python -m tools.serving_benchmark --model=$HOME/mnist/export/mnist
  python -m tools.serving_benchmark --model=$HOME/mnist/export/mnist --costs

What TF Serving adds (the network, request parsing) is not in these figures:
they are the model's share of a request. For each signature, the float one on
prepared images and the bytes one on MNIST test digits as PNG files (the
test split of --config, as tools/mnist_pngs.py reads it): the
latency of one image (p50 and p99 over --calls calls, after warm-up calls as
TF Serving's warm-up file makes) and the throughput of batches of --batch.
One JSON object per signature, then one about the machine.

With --costs, what one request to `serving_bytes` costs at worst, the model
loaded as TF Serving loads it (tools/serving_standin.py): for the costliest
image of each kind that the signature accepts, the crafted JPEG of many
scans, and requests of several images up to the request's bound, the CPU
seconds of the whole process (the median of --cost_calls warm calls) and
the peak memory above the loaded model's (Linux: /proc/self/clear_refs).
"""

import sys

from run import errors
from run import startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  startup.begin(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
import json
import math
import os
import platform
import subprocess
import tempfile
import time

from absl import app
from absl import flags
from serving import classifiers
import numpy as np
from PIL import Image
from serving import signatures
import tensorflow as tf
from tools import crafted_images as crafted
from tools import mnist_pngs
from tools import serving_standin

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
flags.DEFINE_bool(
    'costs', False, "The CPU and memory of serving_bytes' worst requests."
)
flags.DEFINE_integer('cost_calls', 3, 'Timed calls of each request (--costs).')
flags.DEFINE_string(
    'request',
    None,
    'A directory whose files make one serving_bytes request: its costs, as '
    '--costs measures each of its requests (in a process of its own).',
)
WARMUP_CALLS = 5


def inputs(config, n: int) -> dict[str, tuple[str, np.ndarray]]:
  """The first `n` test digits per signature: its input name and the batch."""
  images, _ = mnist_pngs.test_images(config, n)
  encoded = [crafted.encoded(Image.fromarray(i, 'L'), 'PNG') for i in images]
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


def _status_kb(field: str) -> int:
  with open('/proc/self/status') as f:
    return int(next(l for l in f if l.startswith(field)).split()[1])


def request_cost(servable, images: list[bytes]) -> dict:
  """CPU seconds and peak MB of one serving_bytes request, and its outcome.

  The peak is the first call's, over the resident memory before it; in a
  process that has run no other request, what the request itself takes.
  The CPU seconds are the median of --cost_calls calls after it.
  """
  inputs = {signatures.BYTES_INPUT_NAME: images}
  seconds, outcome = [], 'classified'
  with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # The peak (VmHWM) starts again from the resident size.
  before = _status_kb('VmRSS:')
  for call in range(FLAGS.cost_calls + 1):
    start = time.process_time()
    try:
      servable.run(signatures.BYTES_SIGNATURE, inputs)
    except serving_standin.ServingError as e:
      outcome = f'{e.code.name}: {e.message.splitlines()[0]}'
    seconds.append(time.process_time() - start)
    peak = peak if call else _status_kb('VmHWM:') - before
  size = sum(len(image) for image in images)
  cpu = float(np.median(seconds[1:]))
  return {
      'images': len(images),
      'bytes_sent': size,
      'cpu_s': round(cpu, 3),
      'cpu_s_per_mb': round(cpu / (size / 2**20), 2),
      'peak_mb': round(peak / 1024, 1),
      'outcome': outcome,
  }


def _in_fresh_process(images: list[bytes]) -> dict:
  """request_cost of `images` in a process of its own: files of a directory."""
  with tempfile.TemporaryDirectory() as directory:
    for i, image in enumerate(images):
      with open(os.path.join(directory, f'{i:04d}'), 'wb') as f:
        f.write(image)
    command = [sys.executable, '-m', 'tools.serving_benchmark']
    command += [f'--model={FLAGS.model}', f'--request={directory}']
    command += [f'--cost_calls={FLAGS.cost_calls}']
    result = subprocess.run(command, capture_output=True, text=True, check=True)
  return json.loads(result.stdout.splitlines()[-1])


def costliest_scan(servable, mode: str) -> int:
  """Which scan of a progressive JPEG of the bound, written again up to the
  scans' limit, costs the most: each tried and timed."""
  jpeg = crafted.progressive_jpeg(mode, crafted.SIDE)
  limit = signatures.MAX_JPEG_SCANS
  tried = [
      crafted.with_scans(jpeg, limit, i)
      for i in range(len(crafted.scan_spans(jpeg)))
  ]
  return int(np.argmax([request_cost(servable, [t])['cpu_s'] for t in tried]))


def costs(servable) -> None:
  """Prints one JSON line per request: what it holds, then request_cost's."""
  limit, side = signatures.MAX_JPEG_SCANS, crafted.SIDE
  grey, colour = (costliest_scan(servable, mode) for mode in ('L', 'RGB'))
  noise = np.random.RandomState(0).randint(0, 256, (side, side, 3), np.uint8)
  # Each kind's costliest image, as a function of its side.
  kinds = {
      'PNG, 8-bit RGB, interlaced, Paeth rows': lambda n: crafted.costly_png(
          n, n
      ),
      'baseline JPEG 4:4:4, flat': lambda n: crafted.encoded(
          Image.new('RGB', (n, n), (128,) * 3), 'JPEG', subsampling=0
      ),
      'baseline JPEG 4:4:4, noise, quality 100': lambda n: crafted.encoded(
          Image.fromarray(noise[:n, :n]), 'JPEG', quality=100, subsampling=0
      ),
      'BMP, 32-bit': lambda n: crafted.encoded(
          Image.new('RGBA', (n, n)), 'BMP'
      ),
      f'progressive JPEG grey, {limit} scans, scan {grey} repeated': (
          lambda n: crafted.with_scans(
              crafted.progressive_jpeg('L', n), limit, grey
          )
      ),
      f'progressive JPEG 4:4:4, {limit} scans, scan {colour} repeated': (
          lambda n: crafted.with_scans(
              crafted.progressive_jpeg('RGB', n), limit, colour
          )
      ),
  }
  rows = {}
  for kind, make in kinds.items():
    rows[kind] = _in_fresh_process([make(side)])
    print(json.dumps({'request': f'{kind}, {side}x{side}', **rows[kind]}))
  bomb = crafted.with_scans(crafted.progressive_jpeg('L', side), 20_006, 1)
  row = _in_fresh_process([bomb])
  print(json.dumps({'request': 'crafted: 20,000 AC scans more', **row}))
  # Several images of the kind whose file under 1 MB costs the most, each of
  # the most pixels that the request's bound leaves it; five of the bound
  # are one too many.
  small = [kind for kind, row in rows.items() if row['bytes_sent'] < 2**20]
  worst = max(small, key=lambda kind: rows[kind]['cpu_s'])
  for count in (1, 4, 32, 256, 5):
    each = math.isqrt(signatures.MAX_REQUEST_PIXELS // count)
    each = side if count == 5 else min(side, each)
    row = _in_fresh_process([kinds[worst](each)] * count)
    name = f'{count} x {worst}, {each}x{each}'
    print(json.dumps({'request': name, **row}), flush=True)
  # The most images for their bytes, each with its own checks, decoding and
  # activations; one more is refused.
  tiny = crafted.encoded(Image.new('L', (1, 1)), 'PNG')
  for count in (
      signatures.MAX_REQUEST_IMAGES,
      signatures.MAX_REQUEST_IMAGES + 1,
  ):
    row = _in_fresh_process([tiny] * count)
    print(json.dumps({'request': f'{count} x PNG, 1x1', **row}), flush=True)


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
  if FLAGS.costs or FLAGS.request:
    version = int(os.path.basename(path))
    servable = serving_standin.Servable('mnist', version, path)
    for request in servable.warmup_requests():  # As TF Serving loads it.
      servable.predict(request)
    if FLAGS.request:
      names = sorted(os.listdir(FLAGS.request))
      images = []
      for name in names:
        with open(os.path.join(FLAGS.request, name), 'rb') as f:
          images.append(f.read())
      print(json.dumps(request_cost(servable, images)))
      return
    costs(servable)
    print(json.dumps({'saved_model': path, **machine()}))
    return
  try:
    batches = inputs(FLAGS.config, FLAGS.batch)
  except errors.UserError as e:
    sys.exit(f'error: {e}')
  loaded = tf.saved_model.load(path).signatures
  for signature, (name, batch) in batches.items():
    result = measure(loaded[signature], name, batch)
    print(json.dumps({'signature': signature, **result}), flush=True)
  print(json.dumps({'saved_model': path, **machine()}))


if __name__ == '__main__':
  mnist_pngs.define_config_flag()
  flags.mark_flags_as_required(['model'])
  app.run(main)
