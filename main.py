"""Command line of the MNIST example: flags, then `train.train_and_evaluate`.

Kept short on purpose: the logic lives in libraries that can be imported
and tested on their own.
"""

import sys

from absl import app
from absl import flags
from absl import logging
from clu import platform
import input_pipeline
import jax
from ml_collections import config_flags
import tensorflow as tf
import train

FLAGS = flags.FLAGS

flags.DEFINE_string('workdir', None, 'Directory for summaries and exports.')
config_flags.DEFINE_config_file(
    'config',
    None,
    'File path to the training hyperparameter configuration.',
    lock_config=True,
)
flags.mark_flags_as_required(['config', 'workdir'])
flags.DEFINE_bool(
    'distributed', False,
    'Initialise JAX\'s multi-process runtime (jax.distributed) to train over '
    'several hosts. The three flags below may be left unset where JAX detects '
    'them (Cloud TPU, SLURM, Open MPI, Kubernetes), and the coordinator '
    'address may come from $JAX_COORDINATOR_ADDRESS.',
)
flags.DEFINE_string(
    'coordinator_address', None, 'HOST:PORT of process 0\'s coordinator.'
)
flags.DEFINE_integer('num_processes', None, 'Number of processes (hosts).')
flags.DEFINE_integer('process_id', None, 'This process\'s index, from 0.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')

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

  try:
    train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except input_pipeline.DataError as e:
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  app.run(main)
