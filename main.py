"""Command line of the MNIST example: flags, then `train.train_and_evaluate`.

Kept short on purpose: the logic lives in libraries that can be imported
and tested on their own. Mistakes (config, workdir, data, a diverging loss)
end the run with one line, `error: ...`, and exit status 1; `--verbosity=1`
shows the traceback too. SIGTERM stops training at the next dispatch of
steps, saves a checkpoint there and exits with 143 (128 + SIGTERM), the
status of a preempted job; the same command resumes it.
"""

import os
import signal
import sys
import threading

from absl import app
from absl import flags
from absl import logging
import checkpoints
from clu import platform
import config_validation
import export
import input_pipeline
import jax
from ml_collections import config_flags
import orbax.checkpoint
import tensorflow as tf
import train

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
  """Drops the INFO records of orbax and TensorFlow, which narrate their work.

  Saving a checkpoint or a SavedModel logs dozens of lines (temporary
  directories, handler registries, threads); the run logs one of its own
  instead. WARNING and above always pass.
  """

  def __init__(self):
    super().__init__()
    orbax_dir = os.path.dirname(os.path.dirname(orbax.checkpoint.__file__))
    self._dirs = (orbax_dir + os.sep, os.path.dirname(tf.__file__) + os.sep)

  def filter(self, record) -> bool:
    return record.levelno > logging.logging.INFO or not (
        record.pathname.startswith(self._dirs)
    )


QUIET_LIBRARIES = QuietLibraries()


def stop_on_sigterm() -> threading.Event:
  """An event that SIGTERM sets: the training loop polls it between dispatches."""
  stop = threading.Event()
  signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
  return stop


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')

  if FLAGS.verbosity < 1:
    logging.get_absl_handler().addFilter(QUIET_LIBRARIES)
  # Hide any GPUs from TensorFlow: it would otherwise reserve their memory,
  # which JAX needs.
  tf.config.experimental.set_visible_devices([], 'GPU')

  if FLAGS.distributed:
    jax.distributed.initialize(
        coordinator_address=FLAGS.coordinator_address,
        num_processes=FLAGS.num_processes,
        process_id=FLAGS.process_id,
    )

  logging.info('JAX process: %d / %d', jax.process_index(), jax.process_count())
  logging.info('JAX local devices: %r', jax.local_devices())

  platform.work_unit().set_task_status(
      f'process_index: {jax.process_index()}, '
      f'process_count: {jax.process_count()}'
  )
  platform.work_unit().create_artifact(
      platform.ArtifactType.DIRECTORY, FLAGS.workdir, 'workdir'
  )

  stop = stop_on_sigterm()
  try:
    if FLAGS.mode == 'export':
      export.export_checkpoint(FLAGS.config, FLAGS.workdir)
    else:
      train.train_and_evaluate(FLAGS.config, FLAGS.workdir, stop.is_set)
  except train.Stopped as e:
    logging.warning('SIGTERM: %s', e)
    sys.exit(128 + signal.SIGTERM)
  except (
      config_validation.ConfigError,
      checkpoints.WorkdirError,
      input_pipeline.DataError,
      train.TrainingError,
  ) as e:
    if FLAGS.verbosity >= 1:
      raise
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
