"""Benchmark: a full training run through `main.main`, then its summaries.

  python mnist_benchmark.py --workdir=DIR --config=configs/default.py

Prints a report, then one JSON object as its last line: accuracy, speed,
each phase's seconds, the peak RSS and what the matmuls computed in. Exits 1
if the final test accuracy is below 0.99.
"""

import time

_START = time.perf_counter()  # Before the imports, which start-up counts.

# pylint: disable=g-import-not-at-top,wrong-import-position
import sys

from run import startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  startup.begin(sys.argv, training=True)  # As main.py does.

import collections
import json
import resource
import statistics

from absl import app
from absl import flags
from cpu import layers as cpu_layers
import jax
import main
from run import progress
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

FLAGS = flags.FLAGS
ACCURACY_RANGE = (0.99, 1.0)
# JAX's events whose durations make up compilation: tracing, lowering, XLA.
COMPILE_EVENTS = (
    '/jax/core/compile/jaxpr_trace_duration',
    '/jax/core/compile/jaxpr_to_mlir_module_duration',
    '/jax/core/compile/backend_compile_duration',
)


def summarize(
    events, wall_time_s: float, peak_rss_mb: float, seconds: dict
) -> dict:
  """The figures of one run's summaries (an EventAccumulator): seconds per
  epoch, the median interval between test summaries (evaluation included, the
  first epoch's compilation not); images/s, the median after the first epoch.
  """
  accuracy = events.Tensors('test_accuracy')
  value = lambda event: tensor_util.make_ndarray(event.tensor_proto).item()
  times = [e.wall_time for e in accuracy]
  intervals = [b - a for a, b in zip(times, times[1:])]
  per_epoch = round(statistics.median(intervals), 3) if intervals else None
  throughput = [value(e) for e in events.Tensors('train_images_per_sec')]
  images_per_sec = statistics.median(throughput[1:] or throughput)
  return {
      'epochs': len(accuracy),
      'wall_time_s': round(wall_time_s, 2),
      'seconds_per_epoch': per_epoch,
      'train_images_per_sec': round(images_per_sec, 1),
      'final_test_accuracy': value(accuracy[-1]),
      'best_test_accuracy': max(map(value, accuracy)),
      'peak_rss_mb': round(peak_rss_mb, 1),
      'seconds': {k: round(v, 2) for k, v in seconds.items()},
  }


def timed_phases(start: float) -> collections.Counter:
  """Start-up's seconds (since `start`), then each phase's as JAX reports it."""
  seconds = collections.Counter(startup=time.perf_counter() - start)

  def count(event: str, duration: float, **unused_kwargs) -> None:
    if event in COMPILE_EVENTS:
      seconds['compile'] += duration
    elif event.startswith(progress.EVENT):
      seconds[event[len(progress.EVENT) :]] += duration

  jax.monitoring.register_event_duration_secs_listener(count)
  return seconds


def run(argv) -> None:
  """Trains as main.py does, prints the figures; exits 1 if they fell short."""
  seconds = timed_phases(_START)
  main.main(argv)
  peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  events = event_accumulator.EventAccumulator(
      FLAGS.workdir, {event_accumulator.TENSORS: 0}  # All of them.
  ).Reload()
  result = summarize(events, time.perf_counter() - _START, peak_rss_mb, seconds)
  result.update(
      config=FLAGS.config.to_dict(),
      matmul_precision=cpu_layers.matmul_precision(FLAGS.config),
  )
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
  app.run(run, flags_parser=startup.parse_flags)
