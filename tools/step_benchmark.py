"""Milliseconds per training step for each speed lever, side by side.

Opt-in, not part of the tests:

  python -m tools.step_benchmark [--steps=78] [--rounds=3]
      [--variants=all|levers] [--taskset=CPUS | --in_process]

Each variant runs in a fresh process, variants alternate round by round (the
order reversed every other round, so neither side of a pair always runs
first), and the median per variant is reported with its ratio to the first
variant (and the median of the ratios round by round, `paired`): the Flax
example's loop, or with `--variants=levers` our loop with neither bf16
matmuls nor narrow dropout bits, then each of them and both. `--taskset=1`
runs each process on CPU 1 alone (`taskset -c 1`: XLA then runs one thread,
and each operation's time is its own work). Batches are 128 random images
(step time does not depend on pixel values); each variant compiles and warms
up before it is timed. Prints a table, then one JSON object as its last line.

`--in_process` builds every variant in this one process and alternates
their timed dispatches the same way: a machine whose speed drifts for
minutes slows both sides of a pair alike, so a lever of a few percent shows
through. For one core, run the whole command under `taskset -c 1`.

It imports JAX, Flax, optax, NumPy, absl and ml_collections alone, not
TensorFlow, TFDS, clu or orbax: it runs where only JAX is (a GPU machine).
Off a CPU, the variants of the CPU levers train with Flax's own layers.
"""

import sys

from run import startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  startup.begin(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
import json
import os
import statistics
import subprocess
import time
import typing

from absl import app
from absl import flags
from configs import default
from cpu import layers as cpu_layers
from flax import nnx
import jax
import numpy as np
from run import parallel
import train

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
flags.DEFINE_integer('steps', 78, 'Timed steps per variant and round.')
flags.DEFINE_integer('rounds', 3, 'Rounds; each runs every variant once.')
flags.DEFINE_enum(
    'variants',
    'all',
    ['all', 'levers'],
    'all: every lever from the Flax example up; levers: ours with and '
    'without bf16 matmuls and narrow dropout bits.',
)
flags.DEFINE_string(
    'taskset', '', "CPUs for each variant's process (taskset -c); '': all."
)
flags.DEFINE_bool(
    'in_process',
    False,
    'Every variant in this process, their timed dispatches alternating.',
)
flags.DEFINE_string(
    'variant', None, 'Internal: run one variant, print ms/step.'
)


class Variant(typing.NamedTuple):
  """What a variant turns on, from the Flax example's loop up."""

  scan: bool = False  # Steps in a lax.scan, batches gathered on the host.
  levers: bool = False  # The layers of cpu/layers.py (config.cpu_levers).
  precision: str = 'float32'  # config.matmul_precision.
  narrow: bool = False  # config.narrow_dropout_bits.
  dropout: float = 0.025  # The dropout rate.


_OURS_FLOAT32 = Variant(scan=True, levers=True)
_OURS = _OURS_FLOAT32._replace(precision='bfloat16', narrow=True)
# The first is the Flax example's loop.
VARIANTS = {
    'example: nnx.jit per step': Variant(),
    '+ convolutions trained as matmuls': Variant(levers=True),
    '+ lax.scan over host-gathered batches': _OURS_FLOAT32,
    '+ narrow dropout bits': _OURS_FLOAT32._replace(narrow=True),
    '+ bf16 matmuls (ours, where bf16 is native)': _OURS,
    'ours, no dropout (configs/fast.py)': _OURS._replace(dropout=0.0),
}
# Our loop with each of the two levers that change the numbers on or off.
LEVERS = {
    'ours, float32, 32-bit dropout bits': _OURS_FLOAT32,
    'ours, float32, narrow dropout bits': _OURS_FLOAT32._replace(narrow=True),
    'ours, bf16 matmuls, 32-bit dropout bits': _OURS._replace(narrow=False),
    'ours, bf16 matmuls, narrow dropout bits': _OURS,
}


def _prepare(name: str, steps: int) -> typing.Callable[[], float]:
  """Variant `name`, compiled and warmed up: a call times `steps` steps.

  It returns milliseconds per step. bf16 matmuls are timed whether or not
  this CPU multiplies bf16 natively (`main` prints which).
  """
  variant = {**VARIANTS, **LEVERS}[name]
  config = default.get_config()
  config.update(
      dropout_rate=variant.dropout,
      cpu_levers=variant.levers,
      matmul_precision=variant.precision,
      narrow_dropout_bits=variant.narrow,
  )
  rng = np.random.default_rng(0)
  n = (steps + 8) * config.batch_size
  images = rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8)
  labels = rng.integers(0, 10, n).astype(np.int32)
  order = rng.permutation(n).reshape(-1, config.batch_size).astype(np.int32)
  model = train.create_model(config, cpu_layers.for_config(config))
  optimizer = train.create_optimizer(model, config, len(order))
  metrics = train.create_metrics()
  if variant.scan:
    mesh = parallel.create_mesh()
    # Sharded as train_and_evaluate shards it: the state that each call
    # returns then matches what the next call was compiled for.
    objects = (model, optimizer, metrics)
    nnx.update(objects, parallel.replicate(nnx.state(objects), mesh))
    data = {'image': images, 'label': labels}

    def run(o):  # One dispatch of all of `o`.
      train.train_epoch(
          model, optimizer, metrics, data, o, mesh=mesh, steps_per_call=len(o)
      )

  else:
    step = nnx.jit(train.train_step)

    def run(o):  # The Flax example's design: an nnx.jit step per batch.
      model.train()
      for i in o:
        step(
            model, optimizer, metrics, {'image': images[i], 'label': labels[i]}
        )

  warmup, timed = order[:8], order[8:]
  if variant.scan:  # One dispatch of all timed steps: compile that shape first.
    run(timed)
  run(warmup)
  jax.block_until_ready(nnx.state(model))

  def time_steps() -> float:
    start = time.perf_counter()
    run(timed)
    jax.block_until_ready(nnx.state(model))
    return (time.perf_counter() - start) * 1000 / len(timed)

  return time_steps


def _in_fresh_process(name: str, pinned: list[str]) -> float:
  """Milliseconds per step of variant `name`, timed by a new Python."""
  command = [sys.executable, '-m', 'tools.step_benchmark', f'--variant={name}']
  out = subprocess.run(
      pinned + command + [f'--steps={FLAGS.steps}'],
      capture_output=True,
      text=True,
      check=True,
      cwd=ROOT,
  ).stdout
  return float(out.strip().splitlines()[-1])


def main(argv):
  del argv
  if FLAGS.variant:
    print(_prepare(FLAGS.variant, FLAGS.steps)())
    return
  if FLAGS.in_process and FLAGS.taskset:
    sys.exit(
        f'--taskset={FLAGS.taskset} pins fresh processes; with --in_process,'
        f' run the whole command under taskset -c {FLAGS.taskset} instead.'
    )
  variants = VARIANTS if FLAGS.variants == 'all' else LEVERS
  pinned = ['taskset', '-c', FLAGS.taskset] if FLAGS.taskset else []
  native, why = cpu_layers.bf16_matmuls(default.get_config(), 'cpu')
  cpus = FLAGS.taskset or ','.join(map(str, sorted(os.sched_getaffinity(0))))
  how = 'one process, dispatches alternating' if FLAGS.in_process else 'fresh'
  print(
      f'CPUs: {cpus}; bf16 matmuls native: {native} ({why}); jax'
      f' {jax.__version__}; variants timed: {how}'
  )
  if FLAGS.in_process:
    timers = {name: _prepare(name, FLAGS.steps) for name in variants}
  else:
    timers = {
        name: lambda n=name: _in_fresh_process(n, pinned) for name in variants
    }
  times = {name: [] for name in variants}
  for round_ in range(FLAGS.rounds):
    for name in list(variants)[:: -1 if round_ % 2 else 1]:
      times[name].append(timers[name]())
  first = next(iter(times.values()))
  base = statistics.median(first)
  result = {'cpus': cpus, 'native_bf16': native, 'in_process': FLAGS.in_process}
  for name, values in times.items():
    median = statistics.median(values)
    # Round by round, against the first variant's run of the same round:
    # a machine that slows for a while slows both.
    paired = [b / v for b, v in zip(first, values)]
    result[name] = {
        'ms_per_step': round(median, 1),
        'speedup': round(base / median, 2),
        'paired_speedup': round(statistics.median(paired), 2),
        'runs': [round(v, 1) for v in values],
    }
    print(
        f'{name:45s} {median:7.1f} ms/step  x{base / median:.2f}  '
        f'(paired x{statistics.median(paired):.2f})'
    )
  print(json.dumps(result))


if __name__ == '__main__':
  app.run(main)
