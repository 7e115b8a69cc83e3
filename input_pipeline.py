"""MNIST input pipeline: every source of the data converges to the same arrays.

`load(config)` reads the training and test splits of `config.dataset` from
`config.data_source` and returns each whole, as `sources.Arrays`: uint8
images `(N, 28, 28, 1)` and int32 labels, so the training loop never depends
on where the data came from. The pixels stay uint8 (a quarter of float32's
memory) until `train.normalize` makes them floats in [0, 1], inside the
jitted step.

The default source, TFDS, is here: TFDS prepares the data set once in its
`data_dir`, from the four original `*-ubyte.gz` files of a manual directory
or of a download (download.py), checking them against the checksums it
registers. The other sources (idx, hf, torchvision) are in sources.py.
Then: the splits' syntax, each process's share, epoch orders and evaluation
batches.
"""

import os
import re
import tempfile
import zlib

from absl import logging
from data import sources
from data import download
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
from run import config_checks
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import download_manager

# Examples a batch, as TFDS' data are read into arrays.
_READ_BATCH = 10_000


def get_builder(config: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """Returns the TFDS builder of `config.dataset`, prepared if it was not.

  Not by TFDS' own `download_and_prepare` alone, whose download retries for
  minutes offline (see `_prepare`). A builder whose data TFDS reads without
  it, as `tfds.testing.mock_data` makes them, is left as it is.
  """
  builder = tfds.builder(config.dataset, data_dir=config.data_dir or None)
  try:
    builder.as_dataset(split=[])  # No split: TFDS' check that it has data.
  except AssertionError:  # TFDS' word for a data set not prepared.
    _prepare(builder, config)
  return builder


def manual_dir(config: ml_collections.ConfigDict, builder) -> tuple[str, bool]:
  """Returns TFDS' manual directory and whether the user named it."""
  named = sources.named_manual_dir(config)
  if named:
    return named, True
  return os.path.join(builder.data_dir_root, 'downloads', 'manual'), False


def _prepare(builder, config: ml_collections.ConfigDict) -> None:
  """Prepares the data set from the manual directory, or downloads it.

  A manual directory that the user named, or that exists, must hold every
  file: a missing one is reported instead of starting a download that hangs
  without network. Otherwise the original files are downloaded into
  `<data_dir>/downloads/<dataset>` (see download.py), then prepared from
  there.
  """
  directory, named = manual_dir(config, builder)
  if not named and not os.path.isdir(directory):
    directory = download_files(builder, config)
  expected = sorted(info.filename for info in builder.url_infos.values())
  missing = [
      f for f in expected if not os.path.isfile(os.path.join(directory, f))
  ]
  if missing:
    raise sources.DataError(
        f'{directory}: missing {", ".join(missing)} ({config.dataset} needs '
        f'{", ".join(expected)}; set config.manual_dir or '
        f'${sources.MANUAL_DIR_ENV})'
    )
  try:
    # From the files alone: no look for a prepared copy on GCS either.
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            manual_dir=directory, try_download_gcs=False
        )
    )
  except download_manager.NonMatchingChecksumError as e:
    bad = [f for f in expected if f in str(e)] or ['a file']
    raise sources.DataError(
        f'{directory}: {bad[0]} does not match the size and SHA-256 that TFDS '
        f'registers for {config.dataset}: the file is corrupt, truncated or '
        'recompressed; replace it with the original, or read the files with '
        "data_source='idx', which checks their contents instead"
    ) from None


def download_files(builder, config: ml_collections.ConfigDict) -> str:
  """Downloads the data set's original files; returns their directory.

  Into TFDS' download directory, or a local temporary one where TFDS' data
  directory is a bucket (gs://...).
  """
  root = str(builder.data_dir_root)
  if '://' in root:
    root = os.path.join(tempfile.gettempdir(), 'tensorflow_datasets')
  directory = os.path.join(root, 'downloads', config.dataset)
  try:
    download.fetch(builder.url_infos, directory, config.download_url)
  except download.DownloadError as e:
    names = sorted(info.filename for info in builder.url_infos.values())
    where = os.path.dirname(min(builder.url_infos))
    named_by = 'config.manual_dir' + (
        f' or ${sources.MANUAL_DIR_ENV}' if config.dataset == 'mnist' else ''
    )
    raise sources.DataError(
        f'{e}; offline, put the four original files ({", ".join(names)}; '
        f'published at {where}/) in a directory and name it in {named_by} '
        "for TFDS to prepare, or read them from there with data_source='idx'"
    ) from None
  return directory


def num_examples(builder, split: str) -> int:
  """Number of examples in `split` (slices like 'train[:10%]' included)."""
  return builder.info.splits[split].num_examples


def from_tfds(config: ml_collections.ConfigDict, split: str) -> sources.Arrays:
  """`split` (any TFDS split or slice) from TFDS, prepared offline if need be.

  Read in batches of uint8 tensors: no per-example tf.data map. The arrays
  are then kept beside TFDS' files (see `_cached_arrays`), which spares
  later runs decoding 70,000 PNGs.
  """
  builder = get_builder(config)
  cached = _cached_arrays(builder, split)
  if cached is not None:
    return cached
  batches = list(
      tfds.as_numpy(builder.as_dataset(split=split, batch_size=_READ_BATCH))
  )
  arrays = sources.to_arrays(
      *(np.concatenate([b[k] for b in batches]) for k in ('image', 'label'))
  )
  _cache_arrays(builder, split, arrays)
  return arrays


def _array_cache_path(builder, split) -> str:
  """`<TFDS' directory of this version>/arrays/<split>.npz`.

  The directory is that of the prepared version, so a new version of the
  data set (or its deletion) leaves the old arrays behind, unread.
  """
  name = re.sub(r'[^A-Za-z0-9]+', '_', str(split)).strip('_')
  digest = zlib.crc32(str(split).encode()) & 0xFFFFFFFF
  return os.path.join(builder.data_dir, 'arrays', f'{name}-{digest:08x}.npz')


def _cached_arrays(builder, split) -> sources.Arrays | None:
  """The arrays saved by `_cache_arrays`, if they match TFDS' split sizes."""
  path = _array_cache_path(builder, split)
  if not os.path.isfile(path):
    return None
  with np.load(path) as saved:
    arrays = {'image': saved['image'], 'label': saved['label']}
  if len(arrays['label']) != num_examples(builder, split):
    return None
  return arrays


def _cache_arrays(builder, split, arrays: sources.Arrays) -> None:
  """Saves `arrays` for `_cached_arrays`, if TFDS' directory is local.

  Written whole or not at all (`download.whole_file`): a run stopped
  meanwhile leaves no half file. Where the directory cannot be written, runs
  go on decoding.
  """
  path = _array_cache_path(builder, split)
  if not os.path.isdir(builder.data_dir):  # A bucket (gs://): not cached.
    return
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with download.whole_file(path) as f:
      np.savez(f, **arrays)
  except OSError as e:
    logging.warning('Not caching %s arrays of %s: %s', split, builder.name, e)


# data_source: a function (config, split) -> Arrays.
SOURCES = {
    'tfds': from_tfds,
    'hf': sources.from_hf,
    'torchvision': sources.from_torchvision,
    'idx': sources.from_idx,
}


def _bound(bound: str | None, n: int) -> int | None:
  """A slice bound, in examples or in percent of the `n` examples (TFDS')."""
  if bound and bound.endswith('%'):
    return round(int(bound[:-1]) * n / 100)
  return None if bound is None else int(bound)


def split_arrays(
    config: ml_collections.ConfigDict, split: str
) -> sources.Arrays:
  """`split` of `config.dataset` from `config.data_source`.

  TFDS reads any TFDS split. The other sources read 'train' or 'test', or a
  slice of one in TFDS' syntax with one range, like 'train[:10%]' or
  'test[-500:]'; they read the whole split, then slice it.
  """
  if config.data_source == 'tfds':
    return from_tfds(config, split)
  name, start, stop = config_checks.SPLIT.fullmatch(split).groups()
  arrays = SOURCES[config.data_source](config, name)
  n = len(arrays['label'])
  # A copy, so that a small slice does not keep the whole split in memory.
  part = slice(_bound(start, n), _bound(stop, n))
  return {k: v[part].copy() for k, v in arrays.items()}


def load(
    config: ml_collections.ConfigDict,
) -> tuple[sources.Arrays, sources.Arrays]:
  """This process's share of the training split, and the whole test split.

  With several JAX processes (hosts), each trains on its own share of the
  training examples (TFDS reads only that share), and evaluates its part of
  every test batch. `config` is one that `config_checks.validate`
  passed.
  """
  if config.data_source == 'tfds':
    train = from_tfds(config, tfds.split_for_jax_process(config.train_split))
  else:
    train = _process_share(split_arrays(config, config.train_split))
  return train, split_arrays(config, config.test_split)


def _process_share(arrays: sources.Arrays) -> sources.Arrays:
  """This JAX process's contiguous share of `arrays`, as TFDS would split it."""
  share = len(arrays['label']) // jax.process_count()
  start = jax.process_index() * share
  return {k: v[start : start + share] for k, v in arrays.items()}


def epoch_seed(seed: int, epoch: int) -> int:
  """A shuffle seed that depends on (seed, epoch) alone.

  Each epoch's order is then a pure function of the config, so a resumed run
  sees the same order as an uninterrupted one.
  """
  return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def epoch_order(
    seed: int, epoch: int, num_examples: int, batch_size: int
) -> np.ndarray:
  """Indices of the examples of each step of `epoch`, `(steps, batch_size)`.

  A fresh permutation of the whole split every epoch; the remainder that
  does not fill a batch is dropped.
  """
  order = np.random.default_rng(epoch_seed(seed, epoch)).permutation(
      num_examples
  )
  steps = num_examples // batch_size
  return order[: steps * batch_size].reshape(steps, batch_size).astype(np.int32)


def _process_batch(config: ml_collections.ConfigDict) -> int:
  """The examples of each batch that this process feeds: its share."""
  return config.batch_size // jax.process_count()


def steps_per_epoch(config: ml_collections.ConfigDict, train_data) -> int:
  """Steps an epoch: every process takes as many, each from its own share.

  Those of the smallest share, in this process's batches.
  """
  shares = multihost_utils.process_allgather(np.int64(len(train_data['label'])))
  num_train = int(np.sum(shares))
  if config.batch_size > num_train:
    raise sources.DataError(
        f'config.batch_size={config.batch_size} is larger than the {num_train} '
        f'examples of config.train_split={config.train_split!r}: use at most '
        f'{num_train}'
    )
  steps = int(np.min(shares)) // _process_batch(config)
  logging.info(
      'Training on %d examples of %r (%d steps/epoch) on %d devices.',
      num_train,
      config.train_split,
      steps,
      jax.device_count(),
  )
  return steps


def epoch_rest(
    config: ml_collections.ConfigDict, step: int, steps: int, train_data
):
  """This process's indices into its `train_data`, per step from `step` on.

  The steps left in the epoch of the run's global `step`, of `steps` an
  epoch (`steps_per_epoch`, the same in every process): all of them at its
  start.
  """
  epoch, done = divmod(step, steps)
  order = epoch_order(
      config.seed, epoch + 1, len(train_data['label']), _process_batch(config)
  )
  return order[done:steps]


def eval_batches(arrays: sources.Arrays, batch_size: int) -> sources.Arrays:
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
