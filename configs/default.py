"""Default hyperparameters: those of the Flax MNIST example."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the default configuration (SGD with momentum, 10 epochs)."""
  config = ml_collections.ConfigDict()

  # Optimisation.
  config.learning_rate = 0.1  # SGD learning rate.
  config.momentum = 0.9  # SGD momentum.
  config.nesterov = False  # Heavy-ball momentum, as the Flax example.
  # 'constant', or 'one_cycle': warm-up to learning_rate, then cosine decay.
  config.lr_schedule = 'constant'
  config.batch_size = 128  # Training images per step; the remainder is dropped.
  config.num_epochs = 10  # Passes over the training split.

  # Model.
  config.dropout_rate = 0.025  # Dropout after the first conv and first linear.

  # Data.
  # Where the data comes from: 'tfds' (TensorFlow Datasets), 'hf' (Hugging
  # Face datasets), 'torchvision' (needs PyTorch, not in requirements.txt) or
  # 'idx' (the four original files, read with NumPy). Same arrays from each.
  config.data_source = 'tfds'
  config.dataset = 'mnist'  # 'mnist' or 'fashion_mnist'.
  # The source's own directory: tfds: its data_dir ('' uses TFDS' default,
  # $TFDS_DATA_DIR or ~/tensorflow_datasets); hf: a save_to_disk directory or
  # a directory of <split>-*.parquet files ('' loads from the Hub or its
  # cache); torchvision: its root ('' is ~/torchvision_datasets); idx: unused.
  config.data_dir = ''
  # Directory holding the original *-ubyte.gz files, for TFDS' offline
  # preparation and for the idx source. '' uses $MNIST_MANUAL_DIR for MNIST;
  # failing that, tfds uses <data_dir>/downloads/manual, and idx reads
  # fashion_mnist from /usr/share/datasets/fashion-mnist (Debian's package
  # dataset-fashion-mnist).
  config.manual_dir = ''
  # Where tfds downloads the original files from when it prepares the data set
  # and has none: '' is the addresses TFDS registers, else the URL of a
  # directory (a mirror) that holds the same four file names.
  config.download_url = ''
  # Splits. tfds: any TFDS split ('train[:10%]', 'train[:50%]+test'); the
  # other sources: 'train' or 'test', optionally with one slice in TFDS'
  # syntax: 'train[:10%]', 'train[:1024]', 'test[-500:]'.
  config.train_split = 'train'
  config.test_split = 'test'  # Evaluated after every epoch, whole.
  config.eval_batch_size = (
      128  # Test images per step; the last batch is padded.
  )

  # Reproducibility and reporting.
  config.seed = 0  # Seeds initialisation, dropout and the data order.
  config.progress_every_secs = 30.0  # Interval of in-epoch progress lines.

  # Speed.
  # Training steps per jitted call (a lax.scan over batches on the device):
  # fewer Python dispatches, progress reported between calls. 39 divides the
  # 468 steps of an epoch, so one compiled call serves them all.
  config.steps_per_call = 39
  # On a CPU, train with the levers of cpu_levers.py: the same math (but for
  # the two below), in forms that XLA runs faster there. Other platforms
  # never use them.
  config.cpu_levers = True
  # The matmuls' precision with the CPU levers: 'auto' multiplies bf16
  # operands with float32 accumulation and results (as a TPU's default
  # precision does) where the CPU does so natively (amx_bf16 or avx512_bf16
  # among its flags; $MNIST_CPU_BF16=1 or 0 decides instead), in the 32->64
  # conv and the dense layers, in training and evaluation; parameters,
  # optimizer and BatchNorm stay float32. 'float32': float32 everywhere. A
  # resumed run may change it.
  config.matmul_precision = 'auto'
  # With the CPU levers, dropout masks from 8- or 16-bit random draws, not
  # 32: another random stream, the same distribution (the keep rate within
  # 0.1% of 1 - dropout_rate). False draws as nnx.Dropout does. A resumed
  # run may change it.
  config.narrow_dropout_bits = True

  # Checkpoints, in <workdir>/checkpoints: rerunning a command resumes there.
  config.checkpoint_every_epochs = (
      1  # Epochs between checkpoints (and the last).
  )
  config.checkpoints_to_keep = (
      3  # The most recent ones; older ones are deleted.
  )

  # Export.
  config.export_model_name = 'mnist'  # Exports go to <workdir>/export/<name>/.
  return config
