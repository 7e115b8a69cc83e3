"""MNIST input pipeline: TFDS prepares the data, tf.data normalises it.

TFDS prepares the data set once in its `data_dir`. Offline, it prepares it from
the four original `*-ubyte.gz` files in a manual directory, checking them
against the checksums it registers; online, with no manual directory, it
downloads the same files itself.
"""

import os

import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import download_manager

# Environment variable naming the manual directory when the config does not.
MANUAL_DIR_ENV = 'MNIST_MANUAL_DIR'

# A split or a batch: float32 'image' (N, 28, 28, 1) in [0, 1], int32 'label'.
Arrays = dict[str, np.ndarray]


class DataError(Exception):
  """The data set cannot be prepared; the message is one line for the user."""


def get_builder(config: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """Returns the TFDS builder of `config.dataset`, prepared if it was not."""
  try:
    builder = tfds.builder(config.dataset, data_dir=config.data_dir or None)
  except tfds.core.registered.DatasetNotFoundError:
    raise DataError(
        f'unknown dataset {config.dataset!r}: use a TFDS image classification '
        "builder of 28x28x1 images, e.g. 'mnist' or 'fashion_mnist'"
    ) from None
  if not builder.is_prepared():
    _prepare(builder, config)
  return builder


def manual_dir(config: ml_collections.ConfigDict, builder) -> tuple[str, bool]:
  """Returns the manual directory and whether the user named it."""
  named = config.manual_dir or os.environ.get(MANUAL_DIR_ENV, '')
  if named:
    return os.path.expanduser(named), True
  return os.path.join(builder.data_dir_root, 'downloads', 'manual'), False


def _prepare(builder, config: ml_collections.ConfigDict) -> None:
  """Prepares the data set from the manual directory, or downloads it.

  A manual directory that the user named, or that exists, must hold every
  file: a missing one is reported instead of starting a download that hangs
  without network.
  """
  directory, named = manual_dir(config, builder)
  if not named and not os.path.isdir(directory):
    builder.download_and_prepare()
    return
  expected = sorted(info.filename for info in builder.url_infos.values())
  missing = [f for f in expected if not os.path.isfile(os.path.join(directory, f))]
  if missing:
    raise DataError(
        f'{directory}: missing {", ".join(missing)} ({config.dataset} needs '
        f'{", ".join(expected)}; set config.manual_dir or ${MANUAL_DIR_ENV})'
    )
  try:
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=directory)
    )
  except download_manager.NonMatchingChecksumError as e:
    bad = [f for f in expected if f in str(e)] or ['a file']
    raise DataError(
        f'{directory}: {bad[0]} does not match the size and SHA-256 that TFDS '
        f'registers for {config.dataset}: the file is corrupt or truncated; '
        'replace it with the original'
    ) from None


def num_examples(builder, split: str) -> int:
  """Number of examples in `split` (slices like 'train[:10%]' included)."""
  return builder.info.splits[split].num_examples


def normalize(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """uint8 images to float32 in [0, 1]; integer labels as int32."""
  return {
      'image': tf.cast(example['image'], tf.float32) / 255.0,
      'label': tf.cast(example['label'], tf.int32),
  }


def split_arrays(builder, split: str) -> Arrays:
  """All examples of `split`, normalised by tf.data, as one pair of arrays.

  MNIST is small (60,000 training images are 188 MB as float32), so the
  training loop keeps it whole in device memory and batches it there.
  """
  ds = builder.as_dataset(split=split, shuffle_files=False)
  ds = ds.map(normalize, num_parallel_calls=tf.data.AUTOTUNE)
  return next(ds.batch(num_examples(builder, split)).as_numpy_iterator())


def load(config: ml_collections.ConfigDict) -> tuple[Arrays, Arrays]:
  """This process's share of the training split, and the whole test split.

  With several JAX processes (hosts), each reads only its share of the
  training examples; each evaluates its part of every test batch.
  """
  builder = get_builder(config)
  return (
      split_arrays(builder, tfds.split_for_jax_process(config.train_split)),
      split_arrays(builder, config.test_split),
  )


def epoch_seed(seed: int, epoch: int) -> int:
  """A shuffle seed that depends on (seed, epoch) alone.

  Each epoch's order is then a pure function of the config, so a resumed run
  sees the same order as an uninterrupted one.
  """
  return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def epoch_order(seed: int, epoch: int, num_examples: int, batch_size: int) -> np.ndarray:
  """Indices of the examples of each step of `epoch`, `(steps, batch_size)`.

  A fresh permutation of the whole split every epoch; the remainder that
  does not fill a batch is dropped.
  """
  order = np.random.default_rng(epoch_seed(seed, epoch)).permutation(num_examples)
  steps = num_examples // batch_size
  return order[: steps * batch_size].reshape(steps, batch_size).astype(np.int32)


def eval_batches(arrays: Arrays, batch_size: int) -> Arrays:
  """Every example once, in `(batches, batch_size, ...)` arrays with a 'mask'.

  The last batch is padded with zeros; the mask is False on the padding, so
  that metrics ignore it and one compiled step serves every batch.
  """
  n = len(arrays['label'])
  size = -(-n // batch_size) * batch_size
  padded = {
      k: np.pad(v, [(0, size - n)] + [(0, 0)] * (v.ndim - 1))
      for k, v in arrays.items()
  }
  padded['mask'] = np.arange(size) < n
  return {k: v.reshape(-1, batch_size, *v.shape[1:]) for k, v in padded.items()}
