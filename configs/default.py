"""Default Hyperparameter configuration: the Flax MNIST example's, and more.

What each field allows, and which a resumed run may change, is checked
before any work (run/config_checks.py): a new field is a line here and its
check there.
"""

import ml_collections


def get_config():
  """Get the default hyperparameter configuration."""
  config = ml_collections.ConfigDict()

  # The Flax example's.
  config.learning_rate = 0.1
  config.momentum = 0.9
  config.batch_size = 128
  config.num_epochs = 10

  # Training.
  config.nesterov = False  # Heavy-ball momentum, as the example.
  config.lr_schedule = 'constant'  # Or 'one_cycle': warm-up, cosine decay.
  config.dropout_rate = 0.025  # After conv1 and linear1, as the example.
  config.seed = 0  # Initialisation, dropout and the data order.

  # Data (docs/data.md): the same arrays from each source.
  config.data_source = 'tfds'  # Or 'hf', 'torchvision', 'idx'.
  config.dataset = 'mnist'  # Or 'fashion_mnist'.
  config.data_dir = ''  # The source's own directory; '' is its default.
  config.manual_dir = ''  # The original files; '' is $MNIST_MANUAL_DIR.
  config.download_url = ''  # A mirror of the original files; '' is TFDS'.
  config.train_split = 'train'  # A TFDS split, like 'train[:10%]'.
  config.test_split = 'test'  # Evaluated whole, the last batch padded.
  config.eval_batch_size = 128

  # The run: progress lines, checkpoints, the export's name.
  config.progress_every_secs = 30.0
  config.checkpoint_every_epochs = 1
  config.checkpoints_to_keep = 3
  config.export_model_name = 'mnist'  # <workdir>/export/<name>/<version>.

  # Speed (docs/speed.md).
  config.steps_per_call = 39  # Steps per jitted lax.scan; 39 divides 468.
  config.cpu_levers = True  # On a CPU, layers that train faster there.
  config.matmul_precision = 'auto'  # bf16 where the CPU has it; 'float32'.
  config.narrow_dropout_bits = True  # Dropout masks from 16 random bits.
  return config
