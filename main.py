"""Main file for running the MNIST example.

This file is intentionally kept short. The majority of logic is in libraries
that can be easily tested and imported in Colab. A mistake ends the run with
one line, `error: ...`; SIGTERM or Ctrl-C stops it with a checkpoint, which the
same command resumes (docs/running.md).
"""

import sys

from run import startup

if __name__ == '__main__':
  startup.begin(sys.argv, training=True)  # Before these imports' seconds.

# pylint: disable=g-import-not-at-top,wrong-import-position
import os

from absl import app
from absl import flags
from absl import logging
from clu import platform
import jax
from ml_collections import config_flags
from run import config_checks
from run import errors
from run import stop_signals
from run import workdirs
import train

FLAGS = flags.FLAGS

flags.DEFINE_string('workdir', None, 'Directory to store model data.')
config_flags.DEFINE_config_file(
    'config',
    None,
    'File path to the training hyperparameter configuration.',
    lock_config=True,
)
flags.mark_flags_as_required(['config', 'workdir'])
flags.DEFINE_string(
    'compilation_cache_dir',
    os.environ.get('XDG_CACHE_HOME', '~/.cache') + '/flax_mnist/jax',
    "JAX's persistent compilation cache: later runs reuse the steps that a "
    "run compiled. '' turns it off; $JAX_COMPILATION_CACHE_DIR, where set, "
    'takes precedence.',
)
flags.DEFINE_bool(
    'distributed',
    False,
    "Initialise JAX's multi-process runtime (jax.distributed) to train over "
    'several hosts. The three flags below may be left unset where JAX detects '
    'them (Cloud TPU, SLURM, Open MPI, Kubernetes).',
)
flags.DEFINE_string(
    'coordinator_address', None, "HOST:PORT of process 0's coordinator."
)
flags.DEFINE_integer('num_processes', None, 'Number of processes (hosts).')
flags.DEFINE_integer('process_id', None, "This process's index, from 0.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')
  signals = stop_signals.install()
  if FLAGS.verbosity < 1:
    startup.quiet_logs()
  cache = os.path.expanduser(FLAGS.compilation_cache_dir)
  if cache and not jax.config.jax_compilation_cache_dir:
    jax.config.update('jax_compilation_cache_dir', cache)
    # The small computations too (initialisers, metrics), not only over 1 s.
    if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
      jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  if FLAGS.distributed:
    jax.distributed.initialize(
        FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id
    )
    signals.take_signals()  # Its preemption notifier took SIGTERM.

  logging.info('JAX process: %d / %d', jax.process_index(), jax.process_count())
  logging.info('JAX local devices: %r', jax.local_devices())

  # Add a note so that we can tell which task is which JAX host.
  # (Depending on the platform task 0 is not guaranteed to be host 0)
  platform.work_unit().set_task_status(
      f'process_index: {jax.process_index()}, '
      f'process_count: {jax.process_count()}'
  )
  platform.work_unit().create_artifact(
      platform.ArtifactType.DIRECTORY, FLAGS.workdir, 'workdir'
  )

  try:
    config_checks.validate(FLAGS.config, jax.device_count())
    # Processes of one multi-host job share the workdir: process 0 holds it.
    with workdirs.exclusive(FLAGS.workdir, jax.process_index() == 0):
      startup.hide_gpus()  # TensorFlow, now that the run needs it.
      startup.imports_done()
      train.train_and_evaluate(FLAGS.config, FLAGS.workdir, signals.asked)
  except stop_signals.Stopped as e:
    sys.exit(signals.exit_status(e))
  except errors.UserError as e:
    if FLAGS.verbosity >= 1:
      raise
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  # A line of stderr in one write, even under PYTHONUNBUFFERED: there
  # `sys.exit(message)` writes the message and its newline apart, and a
  # line that TensorFlow's C++ threads log in between lands inside ours.
  sys.stderr.reconfigure(line_buffering=True, write_through=False)
  app.run(main, flags_parser=startup.parse_flags)
