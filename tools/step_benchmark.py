"""Milliseconds per training step for each speed lever, side by side.

Opt-in, not part of the tests:

  python -m tools.step_benchmark [--steps=78] [--rounds=3]

Each variant runs in a fresh process, variants alternate round by round, and the median per variant is reported
with its ratio to the Flax example's loop. Batches are 128 random images
(step time does not depend on pixel values); each variant compiles and warms
up before it is timed. Prints a table, then one JSON object as its last line.
"""

import sys

import tensorflow_startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  tensorflow_startup.quiet(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
import contextlib
import json
import os
import statistics
import subprocess
import time

from absl import app
from absl import flags
from configs import default
import cpu_levers
from flax import nnx
import jax
import numpy as np
import parallel
from tools import reference_loop
import train

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
flags.DEFINE_integer('steps', 78, 'Timed steps per variant and round.')
flags.DEFINE_integer('rounds', 3, 'Rounds; each runs every variant once.')
flags.DEFINE_string(
    'variant', None, 'Internal: run one variant, print ms/step.'
)

# name -> (scan over steps on the device, cpu_levers.conv_gradients,
# cpu_levers.unrolled_threefry, dropout rate). The first is the Flax
# example's loop (tools/reference_loop.py), which the next two speed up.
VARIANTS = {
    'example: nnx.jit per step': (False, False, False, 0.025),
    '+ conv_same gradients': (False, True, False, 0.025),
    '+ unrolled threefry': (False, True, True, 0.025),
    '+ lax.scan over host-gathered batches (ours)': (True, True, True, 0.025),
    'ours, no dropout (configs/fast.py)': (True, True, True, 0.0),
}


def _time_variant(name: str, steps: int) -> float:
  """Milliseconds per step of variant `name`, after compiling and warm-up."""
  scan, conv_same, unrolled, dropout = VARIANTS[name]
  config = default.get_config()
  config.dropout_rate = dropout
  rng = np.random.default_rng(0)
  n = (steps + 8) * config.batch_size
  images = rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8)
  labels = rng.integers(0, 10, n).astype(np.int32)
  order = rng.permutation(n).reshape(-1, config.batch_size).astype(np.int32)
  model = train.create_model(config)
  optimizer = train.create_optimizer(model, config, len(order))
  metrics = train.create_metrics()
  levers = contextlib.ExitStack()
  if conv_same:
    levers.enter_context(cpu_levers.conv_gradients(model))
  if unrolled:
    levers.enter_context(cpu_levers.unrolled_threefry())
  if scan:
    mesh = parallel.create_mesh()
    # Sharded as train_and_evaluate shards it: the state that each call
    # returns then matches what the next call was compiled for.
    objects = (model, optimizer, metrics)
    nnx.update(objects, parallel.replicate(nnx.state(objects), mesh))
    data = {'image': images, 'label': labels}

    def run(o):  # One dispatch of all of `o`.
      config.steps_per_call = len(o)
      train.train_epoch(
          model,
          optimizer,
          metrics,
          data=data,
          order=o,
          mesh=mesh,
          steps_per_call=config.steps_per_call,
      )

  else:

    def run(o):  # The Flax example's step, a dispatch per batch.
      reference_loop.train_steps(
          model,
          optimizer,
          metrics,
          ({'image': images[i], 'label': labels[i]} for i in o),
      )

  warmup, timed = order[:8], order[8:]
  with levers:
    if scan:  # One dispatch of all timed steps: compile that shape first.
      run(timed)
    run(warmup)
    jax.block_until_ready(nnx.state(model))
    start = time.perf_counter()
    run(timed)
    jax.block_until_ready(nnx.state(model))
  return (time.perf_counter() - start) * 1000 / len(timed)


def main(argv):
  del argv
  if FLAGS.variant:
    print(_time_variant(FLAGS.variant, FLAGS.steps))
    return
  times = {name: [] for name in VARIANTS}
  for _ in range(FLAGS.rounds):
    for name in VARIANTS:
      out = subprocess.run(
          [
              sys.executable,
              '-m',
              'tools.step_benchmark',
              f'--variant={name}',
              f'--steps={FLAGS.steps}',
          ],
          capture_output=True,
          text=True,
          check=True,
          cwd=ROOT,
      ).stdout
      times[name].append(float(out.strip().splitlines()[-1]))
  base = statistics.median(times['example: nnx.jit per step'])
  result = {}
  for name, values in times.items():
    median = statistics.median(values)
    result[name] = {
        'ms_per_step': round(median, 1),
        'speedup': round(base / median, 2),
        'runs': [round(v, 1) for v in values],
    }
    print(f'{name:40s} {median:7.1f} ms/step  x{base / median:.2f}')
  print(json.dumps(result))


if __name__ == '__main__':
  app.run(main)
