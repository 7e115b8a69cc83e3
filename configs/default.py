"""Default hyperparameters: those of the Flax MNIST example."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the default configuration (SGD with momentum, 10 epochs)."""
  config = ml_collections.ConfigDict()

  # Optimisation.
  config.learning_rate = 0.1  # SGD learning rate.
  config.momentum = 0.9  # SGD momentum (heavy ball, not Nesterov).
  config.batch_size = 128  # Training images per step; the remainder is dropped.
  config.num_epochs = 10  # Passes over the training split.

  # Model.
  config.dropout_rate = 0.025  # Dropout after the first conv and first linear.

  # Data.
  config.dataset = 'mnist'  # TFDS builder name.
  config.data_dir = ''  # TFDS data_dir; '' uses TFDS' default (TFDS_DATA_DIR).
  # Directory holding the original *-ubyte.gz files for offline preparation;
  # '' uses $MNIST_MANUAL_DIR, else <data_dir>/downloads/manual.
  config.manual_dir = ''
  config.train_split = 'train'  # TFDS split (slices like 'train[:10%]' work).
  config.test_split = 'test'  # TFDS split evaluated after every epoch, whole.
  config.eval_batch_size = 128  # Test images per step; the last batch is padded.

  # Reproducibility and reporting.
  config.seed = 0  # Seeds initialisation, dropout and the data order.
  config.progress_every_secs = 30.0  # Interval of in-epoch progress lines.

  # Speed.
  # Training steps per jitted call (a lax.scan over batches on the device):
  # fewer Python dispatches, progress reported between calls. 39 divides the
  # 468 steps of an epoch, so one compiled call serves them all.
  config.steps_per_call = 39

  # Checkpoints, in <workdir>/checkpoints: rerunning a command resumes there.
  config.checkpoint_every_epochs = 1  # Epochs between checkpoints (and the last).
  config.checkpoints_to_keep = 3  # The most recent ones; older ones are deleted.

  # Export.
  config.export_model_name = 'mnist'  # Exports go to <workdir>/export/<name>/.
  return config
