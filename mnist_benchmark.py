"""Benchmark: a full training run through `main.main`, then its summaries.

Opt-in, not part of the tests:

  python mnist_benchmark.py --workdir=DIR --config=configs/default.py \
      [--config.num_epochs=2 ...] [--reference]

`--reference` trains with the Flax example's loop instead (`tools/reference_loop.py`),
the baseline that speed-ups are measured against.

Prints a report, then one JSON object as its last line: besides accuracy and
speed, the seconds of each phase of the run (start-up: the imports before
training starts; data; compilation; training; evaluation; summaries;
checkpoints; export), the peak RSS and what the matmuls computed in (with
`matmul_precision='auto'`, bf16 or float32 depending on the CPU). Exits
non-zero when the final test accuracy is outside [0.99, 1.0].
"""

import time

_START = time.perf_counter()  # Before the imports, which start-up counts.

# pylint: disable=g-import-not-at-top,wrong-import-position
import gc
import sys

from run import malloc_arenas
from run import startup
from run import tensorflow_startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  startup.check_config(sys.argv)
  malloc_arenas.limit()  # As main.py does, for the same peak memory.
  tensorflow_startup.quiet(sys.argv)
  gc.disable()  # As main.py does for its imports; `run` turns it on.

import collections
import json
import resource
import statistics

from absl import app
from absl import flags
from cpu import layers as cpu_layers
import jax
import main
from run import phases
from run import summaries
from tools import reference_loop

FLAGS = flags.FLAGS
flags.DEFINE_bool('reference', False, "Train with the Flax example's loop.")
ACCURACY_RANGE = (0.99, 1.0)
# JAX's events whose durations make up compilation: tracing, lowering and
# XLA's compilation of every jitted computation.
COMPILE_EVENTS = (
    '/jax/core/compile/jaxpr_trace_duration',
    '/jax/core/compile/jaxpr_to_mlir_module_duration',
    '/jax/core/compile/backend_compile_duration',
)


def summarize(
    scalars, wall_time_s: float, peak_rss_mb: float, seconds: dict
) -> dict:
  """The benchmark's figures from the summaries of one run.

  Seconds per epoch are the intervals between epochs' test summaries, so
  they include evaluation; the median over epochs after the first leaves out
  compilation. Throughput is the median of the epochs' training images/s.
  `seconds` holds the seconds of each phase: start-up and compilation,
  measured here, and those of `phases.SECONDS`. Training's seconds include
  the compilation of its step.
  """
  accuracy = scalars['test_accuracy']
  epochs = sorted(accuracy)
  times = [accuracy[e][1] for e in epochs]
  intervals = [b - a for a, b in zip(times, times[1:])]
  throughput = [
      v for e, (v, _) in sorted(scalars['train_images_per_sec'].items())
  ]
  return {
      'epochs': len(epochs),
      'wall_time_s': round(wall_time_s, 2),
      'seconds_per_epoch': round(statistics.median(intervals), 3)
      if intervals
      else None,
      'train_images_per_sec': round(
          statistics.median(throughput[1:] or throughput), 1
      ),
      'final_test_accuracy': accuracy[epochs[-1]][0],
      'best_test_accuracy': max(v for v, _ in accuracy.values()),
      'peak_rss_mb': round(peak_rss_mb, 1),
      'seconds': {k: round(v, 2) for k, v in seconds.items()},
  }


def run(argv) -> None:
  start = time.perf_counter()
  gc.enable()  # The imports are done (TensorFlow's among them): both loops.
  seconds = collections.Counter(startup=start - _START)

  def count_compile(event: str, duration: float, **unused_kwargs) -> None:
    if event in COMPILE_EVENTS:
      seconds['compile'] += duration

  jax.monitoring.register_event_duration_secs_listener(count_compile)
  phases.SECONDS.clear()
  if FLAGS.reference:
    reference_loop.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    precision = "JAX's default (the Flax example's loop: no CPU levers)"
  else:
    main.main(argv)
    precision = cpu_layers.matmul_precision(FLAGS.config)
  peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  seconds.update(phases.SECONDS)
  result = summarize(
      summaries.read_scalars(FLAGS.workdir),
      time.perf_counter() - _START,
      peak_rss_mb,
      seconds,
  )
  result['config'] = FLAGS.config.to_dict()
  result['loop'] = 'reference' if FLAGS.reference else 'ours'
  result['matmul_precision'] = precision
  for key, value in result.items():
    if key != 'config':
      print(f'{key}: {value}')
  print(json.dumps(result, sort_keys=True))
  low, high = ACCURACY_RANGE
  if not low <= result['final_test_accuracy'] <= high:
    sys.exit(
        f'final test accuracy {result["final_test_accuracy"]:.4f} is outside '
        f'[{low}, {high}]'
    )


if __name__ == '__main__':
  app.run(run)
