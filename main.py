"""Command line of the MNIST example: flags, then `train.train_and_evaluate`.

Kept short on purpose: the logic lives in libraries that can be imported
and tested on their own. Mistakes (config, workdir, data, a diverging loss,
a failed write) end the run with one line, `error: ...`, and exit status 1;
`--verbosity=1` shows the traceback too. SIGTERM or Ctrl-C (SIGINT) stops
training at the next dispatch of steps, on every process, saves a checkpoint
there and exits with 128 + the signal (143: a preempted job; 130); the same
command resumes it. Before training begins, it ends the run at once, with
nothing to save (see stop_signals.py). A second Ctrl-C exits at once.
One run at a time per workdir: the second one started refuses with one line.
"""

import gc
import sys

from run import malloc_arenas
from run import startup
from run import stop_signals
from run import tensorflow_startup

if __name__ == '__main__':  # Before the imports below, which take seconds.
  startup.check_config(sys.argv)  # A bad --config is one line, at once.
  malloc_arenas.limit()  # Before they start threads.
  tensorflow_startup.quiet(sys.argv)  # Before TensorFlow's first import.
  stop_signals.install()  # A stop while they run is prompt too.
  # The imports make half a million objects that live until exit: the
  # collector, walking them again and again meanwhile, frees next to
  # nothing. It is back on once they are frozen (see `main`).
  gc.disable()

# pylint: disable=g-import-not-at-top,wrong-import-position
import asyncio
import importlib.util
import os
import signal

from absl import app
from absl import flags
from absl import logging
import clu
from clu import platform
from run import config_checks
from run import errors
import jax
from ml_collections import config_flags
import orbax.checkpoint
import train
from run import workdirs

FLAGS = flags.FLAGS

flags.DEFINE_string(
    'workdir', None, 'Directory for summaries, checkpoints and exports.'
)
config_flags.DEFINE_config_file(
    'config',
    None,
    'File path to the training hyperparameter configuration.',
    lock_config=True,
)
flags.DEFINE_enum(
    'mode',
    'train',
    ['train', 'export'],
    "train: train (resuming from the workdir's latest checkpoint), then "
    'export; export: export the latest checkpoint, without training.',
)
flags.mark_flags_as_required(['config', 'workdir'])
flags.DEFINE_bool(
    'distributed',
    False,
    "Initialise JAX's multi-process runtime (jax.distributed) to train over "
    'several hosts. The three flags below may be left unset where JAX detects '
    'them (Cloud TPU, SLURM, Open MPI, Kubernetes), and the coordinator '
    'address may come from $JAX_COORDINATOR_ADDRESS.',
)
flags.DEFINE_string(
    'coordinator_address', None, "HOST:PORT of process 0's coordinator."
)
flags.DEFINE_integer('num_processes', None, 'Number of processes (hosts).')
flags.DEFINE_string(
    'compilation_cache_dir',
    os.path.join(
        os.environ.get('XDG_CACHE_HOME', os.path.expanduser('~/.cache')),
        'flax_mnist',
        'jax',
    ),
    "JAX's persistent compilation cache: later runs reuse the steps that a "
    "run compiled. Delete the directory to clear it; '' turns it off. "
    '$JAX_COMPILATION_CACHE_DIR, where set, takes precedence.',
)
flags.DEFINE_integer('process_id', None, "This process's index, from 0.")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing; a config field that does not exist is one line.

  config_flags reports it as an AttributeError whose text suggests the field
  meant; absl would print it with a traceback.
  """
  try:
    return app.parse_flags_with_usage(argv)
  except AttributeError as e:
    if FLAGS['verbosity'].value >= 1:
      raise
    # The KeyError inside holds "'field'\nDid you mean ...?".
    cause = e.args[0].args[0] if isinstance(e.args[0], KeyError) else str(e)
    field, _, hint = str(cause).partition('\n')
    hint = hint[:1].lower() + hint[1:] or 'see the config file for its fields'
    sys.exit(f'error: the config has no field {field}; {hint}')


class QuietLibraries(logging.logging.Filter):
  """Drops what orbax and TensorFlow log that the run says better itself.

  Their INFO records narrate their work: saving a checkpoint or a SavedModel
  logs dozens of lines (temporary directories, handler registries, threads);
  the run logs one of its own instead. When a write fails, orbax's threads
  and their asyncio loops log the error with its traceback, several times;
  the run ends with one line naming it; so do clu's summary writer threads.
  Other warnings and errors pass. TensorFlow's directory is found without
  importing it: a run imports it only when it needs it.
  """

  def __init__(self):
    super().__init__()
    orbax_dir = os.path.dirname(os.path.dirname(orbax.checkpoint.__file__))
    tf_dir = os.path.dirname(importlib.util.find_spec('tensorflow').origin)
    self._dirs = (orbax_dir + os.sep, tf_dir + os.sep)
    self._threads_dirs = (
        orbax_dir + os.sep,
        os.path.dirname(asyncio.__file__) + os.sep,
        os.path.dirname(clu.__file__) + os.sep,
    )

  def filter(self, record) -> bool:
    if record.levelno <= logging.logging.INFO:
      return not record.pathname.startswith(self._dirs)
    return not (
        record.exc_info and record.pathname.startswith(self._threads_dirs)
    )


QUIET_LIBRARIES = QuietLibraries()


def log_unraisable(unraisable) -> None:
  """Python's report of an error it cannot raise, as one DEBUG line.

  After a failed checkpoint write, TensorStore's callbacks into orbax's
  closed event loop fail this way a dozen times, each with a traceback, where
  the run's one-line error says what happened.
  """
  logging.debug('Ignored in %r: %r', unraisable.object, unraisable.exc_value)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')
  signals = stop_signals.install()

  if FLAGS.verbosity < 1:
    logging.get_absl_handler().addFilter(QUIET_LIBRARIES)
    signals.report_unraisable = log_unraisable

  if FLAGS.compilation_cache_dir and not jax.config.jax_compilation_cache_dir:
    jax.config.update(
        'jax_compilation_cache_dir',
        os.path.expanduser(FLAGS.compilation_cache_dir),
    )
    # JAX caches only what took 1 s to compile; the run's many small
    # computations (the model's initialisers, the metrics, the schedule)
    # take 10-700 ms each, about 4 s in all: keep them too.
    if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
      jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  if FLAGS.distributed:
    jax.distributed.initialize(
        coordinator_address=FLAGS.coordinator_address,
        num_processes=FLAGS.num_processes,
        process_id=FLAGS.process_id,
    )
    signals.take_signals()  # Its preemption notifier took SIGTERM.

  logging.info('JAX process: %d / %d', jax.process_index(), jax.process_count())
  logging.info('JAX local devices: %r', jax.local_devices())

  platform.work_unit().set_task_status(
      f'process_index: {jax.process_index()}, '
      f'process_count: {jax.process_count()}'
  )
  platform.work_unit().create_artifact(
      platform.ArtifactType.DIRECTORY, FLAGS.workdir, 'workdir'
  )

  try:
    # Before anything is written.
    config_checks.validate(FLAGS.config, jax.device_count())
    # Processes of one multi-host job share the workdir: process 0 holds it.
    with workdirs.exclusive(FLAGS.workdir, jax.process_index() == 0):
      # The summaries and the export need TensorFlow (and TFDS' decoding):
      # imported now, once the config and the workdir are known to be good.
      tensorflow_startup.hide_gpus()
      # The half million objects that the imports made live until exit:
      # frozen, Python's full collections (and those at exit) skip them.
      # The collector, off during the imports, is back on for the run.
      gc.freeze()
      gc.enable()
      if FLAGS.mode == 'export':
        train.export_checkpoint(FLAGS.config, FLAGS.workdir)
      else:
        train.train_and_evaluate(FLAGS.config, FLAGS.workdir, signals.asked)
  except train.Stopped as e:
    if signals.received:
      received, cause = signals.received, signals.received.name
    else:  # Another process was asked: the status of a preempted job.
      received, cause = signal.SIGTERM, 'another process was asked to stop'
    logging.warning('%s: %s', cause, e)
    sys.exit(128 + received)
  except errors.UserError as e:
    if FLAGS.verbosity >= 1:
      raise
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  # A line of stderr in one write, even under PYTHONUNBUFFERED: there
  # `sys.exit(message)` writes the message and its newline apart, and a
  # line that TensorFlow's C++ threads log in between lands inside ours.
  sys.stderr.reconfigure(line_buffering=True, write_through=False)
  app.run(main, flags_parser=parse_flags)
