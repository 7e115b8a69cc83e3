"""Training timed side by side: a step of each speed lever, or whole commands.

  python -m tools.benchmark [--variants=all|levers] [--steps=78] [--rounds=5]
  python -m tools.benchmark [--epoch=2] [--rounds=5] \
      --run='ours=.venv/bin/python main.py --workdir={workdir} ...' \
      --run='other=...'

What is compared takes turns, round by round, the order reversed every other
round, and is reported by its median and its speed against the first, pair
by pair: a machine that slows for a while slows both sides of a pair.

Without --run, milliseconds a training step of each variant: from the Flax
example's loop up, lever by lever (`all`), or ours with bf16 matmuls and
narrow dropout bits each on and off (`levers`). Every variant is built in
this process on random batches of 128 (a step's time does not depend on the
pixels), compiled and warmed up; their timed dispatches alternate. For one
core, run the command under `taskset -c 1`. It imports JAX, Flax, optax,
NumPy, absl and ml_collections alone: it runs where only JAX is (a GPU
machine), where the variants of the CPU levers train Flax's own layers.

With --run=NAME=COMMAND, once per command, whole commands, one at a time in
the foreground, `{workdir}` in a command a new directory each time, removed
after: the seconds of epoch --epoch, from the epoch line before it to its
own (a line with `epoch: N` and `test_accuracy: X`, as main.py and the Flax
example print once an epoch is evaluated), or of the whole command with
--epoch=0; its test accuracy, and its peak RSS (the kernel's count from the
fork, this process's own included).

Prints each result as it comes, a table, then one JSON object.
"""

import collections
import functools
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
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
flags.DEFINE_integer('rounds', 5, 'Rounds; each runs every variant once.')
flags.DEFINE_integer('steps', 78, 'Timed steps per variant and round.')
flags.DEFINE_enum(
    'variants',
    'all',
    ['all', 'levers'],
    'all: every lever from the Flax example up; levers: ours with and '
    'without bf16 matmuls and narrow dropout bits.',
)
flags.DEFINE_multi_string(
    'run', [], "NAME=COMMAND: whole commands; '{workdir}' a new directory."
)
flags.DEFINE_integer(
    'epoch', 2, 'With --run: the epoch timed; 0, the whole command.'
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
    '+ the CPU layers, float32': Variant(levers=True),
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


def prepare_steps(variant: Variant, steps: int) -> typing.Callable[[], dict]:
  """`variant`, compiled and warmed up: a call times `steps` steps.

  bf16 matmuls are timed whether or not this CPU multiplies bf16 natively
  (`main` prints which).
  """
  config = default.get_config()
  config.update(
      dropout_rate=variant.dropout,
      cpu_levers=variant.levers,
      matmul_precision=variant.precision,
      narrow_dropout_bits=variant.narrow,
  )
  rng = np.random.default_rng(0)
  n = (steps + 8) * config.batch_size
  data = {
      'image': rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
      'label': rng.integers(0, 10, n).astype(np.int32),
  }
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

    def run(o):  # One dispatch of all of `o`.
      train.train_epoch(objects, data, o, mesh, steps_per_call=len(o))

  else:
    step = nnx.jit(train.train_step)

    def run(o):  # The Flax example's design: an nnx.jit step per batch.
      model.train()
      for i in o:
        step(model, optimizer, metrics, {k: v[i] for k, v in data.items()})

  warmup, timed = order[:8], order[8:]
  # A scan is compiled for its length: warmed up at the timed steps' own.
  run(timed if variant.scan else warmup)
  jax.block_until_ready(nnx.state(model))

  def time_steps() -> dict:
    start = time.perf_counter()
    run(timed)
    jax.block_until_ready(nnx.state(model))
    return {'ms_per_step': (time.perf_counter() - start) * 1e3 / len(timed)}

  return time_steps


def parse_runs(specs: list[str]) -> dict[str, list[str]]:
  """{name: argv} from `NAME=COMMAND` specs; ValueError names a bad one."""
  runs = {}
  for spec in specs:
    name, _, command = spec.partition('=')
    if not name.strip() or not command.strip():
      raise ValueError(f'--run={spec!r}: expected NAME=COMMAND')
    if name in runs:
      raise ValueError(f'--run={spec!r}: the name {name!r} is taken')
    runs[name] = shlex.split(command)
  return runs


_EPOCH_LINE = re.compile(r'\bepoch:\s*(\d+)\b.*\btest_accuracy:\s*([\d.]+)')


def run_once(name: str, argv: list[str], epoch: int) -> dict:
  """Runs `argv` once; RuntimeError if it fails or prints no epoch line."""
  with tempfile.TemporaryDirectory() as scratch:
    workdir = os.path.join(scratch, 'workdir')
    argv = [arg.replace('{workdir}', workdir) for arg in argv]
    env = dict(os.environ, PYTHONUNBUFFERED='1')  # Lines as they happen.
    start, arrivals, accuracies = time.monotonic(), {}, {}  # By epoch.
    tail = collections.deque(maxlen=20)
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    ) as process:
      for line in process.stdout:
        tail.append(line)
        match = _EPOCH_LINE.search(line)
        if match and int(match.group(1)) not in arrivals:
          arrivals[int(match.group(1))] = time.monotonic()
          accuracies[int(match.group(1))] = float(match.group(2))
      # wait4, not wait: the command's resource usage, its peak RSS.
      _, status, usage = os.wait4(process.pid, 0)
      seconds = time.monotonic() - start
      process.returncode = os.waitstatus_to_exitcode(status)
  missing = sorted({epoch - 1, epoch} - arrivals.keys() - {0}) if epoch else []
  if not process.returncode and not missing:
    timed = arrivals[epoch] - arrivals.get(epoch - 1, start) if epoch else 0
    return {
        'seconds': timed if epoch else seconds,
        'peak_rss_gb': usage.ru_maxrss / 1e6,  # Kilobytes on Linux.
        'test_accuracy': accuracies.get(epoch or max(accuracies, default=0)),
    }
  why = f'exited with {process.returncode}'
  if not process.returncode:
    why = f'printed no epoch line for epoch {" or ".join(map(str, missing))}'
  sys.stderr.write(''.join(tail))
  raise RuntimeError(f'{name!r} ({shlex.join(argv)}) {why}')


def alternate(timers: dict, rounds: int, key: str) -> dict:
  """Each timer called once a round, in turns; their figures, and `key`'s
  median and speed against the first timer's, pair by pair."""
  results = {name: [] for name in timers}
  for number in range(rounds):
    for name in list(timers)[:: -1 if number % 2 else 1]:
      results[name].append(timers[name]())
      print(f'round {number + 1}, {name}: {results[name][-1]}', flush=True)
  first = [figures[key] for figures in next(iter(results.values()))]
  summary = {}
  for name, runs in results.items():
    values = [figures[key] for figures in runs]
    pairs = [f / v for f, v in zip(first, values)]
    summary[name] = {
        'median': round(statistics.median(values), 2),
        'paired_speedup': round(statistics.median(pairs), 2),
        'pairs': [round(p, 2) for p in pairs],
        **{k: [r[k] and round(r[k], 2) for r in runs] for k in runs[0]},
    }
  return summary


def main(argv):
  del argv
  try:
    runs = parse_runs(FLAGS.run)
  except ValueError as error:
    raise app.UsageError(str(error)) from None
  if runs:
    timers = {
        name: functools.partial(run_once, name, command, FLAGS.epoch)
        for name, command in runs.items()
    }
    key = 'seconds'
    print(f'timed: {f"epoch {FLAGS.epoch}" if FLAGS.epoch else "commands"}')
  else:
    variants = VARIANTS if FLAGS.variants == 'all' else LEVERS
    timers = {n: prepare_steps(v, FLAGS.steps) for n, v in variants.items()}
    key = 'ms_per_step'
    native, why = cpu_layers.bf16_matmuls(default.get_config(), 'cpu')
    cpus = ','.join(map(str, sorted(os.sched_getaffinity(0))))
    print(f'CPUs {cpus}; bf16 native: {native} ({why}); jax {jax.__version__}')
  try:
    summary = alternate(timers, FLAGS.rounds, key)
  except RuntimeError as error:
    sys.exit(f'benchmark: {error}')
  for name, s in summary.items():
    print(f'{name:45s} {s["median"]:8.2f} {key}  x{s["paired_speedup"]}')
  print(json.dumps(summary))


if __name__ == '__main__':
  app.run(main)
