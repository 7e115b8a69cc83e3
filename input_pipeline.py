"""MNIST input pipeline: every source of the data gives the same arrays.

`load(config)` reads the splits whole, as uint8 images `(N, 28, 28, 1)` (a
quarter of float32's memory until the jitted step normalises them) and int32
labels. TFDS is here, the other sources in data/sources.py (docs/data.md).
"""

import os
import re
import tempfile
import zlib

from absl import logging
from data import download
from data import sources
import jax
from jax.experimental import multihost_utils
import numpy as np
from run import config_checks
from run import errors
from run import progress
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import download_manager


def get_builder(config) -> tfds.core.DatasetBuilder:
  """The TFDS builder of `config.dataset`, prepared if it was not (not by
  TFDS' own download, which retries for minutes offline).
  """
  builder = tfds.builder(config.dataset, data_dir=config.data_dir or None)
  # Its file first: `is_prepared` warns of each version that lacks it.
  info = builder.data_path / 'dataset_info.json'
  if info.exists() and builder.is_prepared():
    return builder
  try:  # Data that TFDS reads unprepared (`tfds.testing.mock_data`'s) passes.
    builder.as_dataset(split=[])  # No split: only TFDS' check for its data.
    return builder
  except AssertionError:  # TFDS' word for a data set not prepared.
    pass  # Prepared out of this block: its errors' causes are not this one.
  _prepare(builder, config)
  return builder


def _prepare(builder, config) -> None:
  """Prepares the data set from the manual directory, or downloads it."""
  directory = sources.named_manual_dir(config)
  if not directory:
    directory = os.path.join(builder.data_dir_root, 'downloads', 'manual')
    if not os.path.isdir(directory):
      directory = download_files(builder, config)
  # Every file: for a missing one, TFDS would try a download that hangs.
  expected = sorted(info.filename for info in builder.url_infos.values())
  missing = [f for f in expected if not os.path.isfile(f'{directory}/{f}')]
  if missing:
    raise errors.UserError(
        f'{directory}: missing {", ".join(missing)} ({config.dataset} needs '
        f'{", ".join(expected)}; set config.manual_dir or '
        f'${sources.MANUAL_DIR_ENV})'
    )
  try:  # From the files alone: no look for a prepared copy on GCS either.
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            manual_dir=directory, try_download_gcs=False
        )
    )
  except download_manager.NonMatchingChecksumError as e:
    bad = next((f for f in expected if f in str(e)), 'a file')
    raise errors.UserError(
        f'{directory}: {bad} does not match the size and SHA-256 that TFDS '
        f'registers for {config.dataset}: the file is corrupt, truncated or '
        'recompressed; replace it with the original, or read the files with '
        "data_source='idx', which checks their contents instead"
    ) from None


def download_files(builder, config) -> str:
  """Downloads the original files into TFDS' downloads; returns the folder."""
  root = str(builder.data_dir_root)
  if '://' in root:  # A bucket: a local folder instead.
    root = os.path.join(tempfile.gettempdir(), 'tensorflow_datasets')
  directory = os.path.join(root, 'downloads', config.dataset)
  try:
    download.fetch(builder.url_infos, directory, config.download_url)
  except download.DownloadError as e:
    names = sorted(info.filename for info in builder.url_infos.values())
    where = os.path.dirname(min(builder.url_infos))
    env = f' or ${sources.MANUAL_DIR_ENV}' if config.dataset == 'mnist' else ''
    raise errors.UserError(
        f'{e}; offline, put the four original files ({", ".join(names)}; '
        f'published at {where}/) in a directory and name it in '
        f'config.manual_dir{env} for TFDS to prepare, or read them from '
        "there with data_source='idx'"
    ) from None
  return directory


def from_tfds(config, split: str) -> sources.Arrays:
  """Any TFDS split or slice, from TFDS, prepared offline if need be."""
  builder = get_builder(config)
  key = str(split)  # A ReadInstruction for a process's share.
  # Its arrays kept beside TFDS' files: no later run decodes 70,000 PNGs again.
  name = re.sub(r'[^A-Za-z0-9]+', '_', key).strip('_')
  cache = f'{builder.data_dir}/arrays/{name}-{zlib.crc32(key.encode()):08x}.npz'
  if os.path.isfile(cache):
    with np.load(cache) as saved:
      if len(saved['label']) == builder.info.splits[split].num_examples:
        return {'image': saved['image'], 'label': saved['label']}
  # In batches: batch_size=-1 aborts under `tfds.testing.mock_data`.
  dataset = builder.as_dataset(split=split, batch_size=10_000)
  batches = list(tfds.as_numpy(dataset))
  arrays = sources.to_arrays(
      *(np.concatenate([b[k] for b in batches]) for k in ('image', 'label'))
  )
  if os.path.isdir(builder.data_dir):  # Not in a bucket (gs://).
    try:
      os.makedirs(os.path.dirname(cache), exist_ok=True)
      with download.whole_file(cache) as f:
        np.savez(f, **arrays)
    except OSError as e:
      logging.warning('Not caching %s arrays of %s: %s', split, builder.name, e)
  return arrays


# data_source: a function (config, split) -> Arrays.
SOURCES = {
    'tfds': from_tfds,
    'hf': sources.from_hf,
    'torchvision': sources.from_torchvision,
    'idx': sources.from_idx,
}


def split_arrays(config, split: str) -> sources.Arrays:
  """`split` of `config.dataset` from `config.data_source`."""
  if config.data_source == 'tfds':
    return from_tfds(config, split)
  # The others read 'train' or 'test' whole, then take what TFDS would of
  # splits of one shard ('train[:10%]', 'test[-500:]', 'train+test').
  names = {part.splitname for part in config_checks.split_parts(split)}
  whole = {name: SOURCES[config.data_source](config, name) for name in names}
  try:
    parts = config_checks.split_parts(
        split, {name: len(a['label']) for name, a in whole.items()}
    )
  except ValueError as e:
    raise errors.UserError(f'split {split!r}: {e}') from None
  # Copies: a small slice does not keep the whole split in memory.
  return {
      k: np.concatenate([whole[p.splitname][k][p.from_ : p.to] for p in parts])
      for k in ('image', 'label')
  }


@progress.timed('data')
def load(config) -> tuple[sources.Arrays, sources.Arrays]:
  """This process's share of the training split, and the whole test split
  (each process evaluates its part of every test batch).
  """
  if config.data_source == 'tfds':
    train = from_tfds(config, tfds.split_for_jax_process(config.train_split))
  else:
    train = split_arrays(config, config.train_split)
    share = len(train['label']) // jax.process_count()
    start = jax.process_index() * share
    train = {k: v[start : start + share] for k, v in train.items()}
  return train, split_arrays(config, config.test_split)


def epoch_seed(seed: int, epoch: int) -> int:
  """A shuffle seed of (seed, epoch) alone: a resumed run's order is the same."""
  return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def epoch_order(seed: int, epoch: int, num_examples: int, batch_size: int):
  """A fresh permutation's `(steps, batch_size)` indices; the rest dropped."""
  rng = np.random.default_rng(epoch_seed(seed, epoch))
  steps = num_examples // batch_size
  order = rng.permutation(num_examples)[: steps * batch_size]
  return order.reshape(steps, batch_size).astype(np.int32)


def steps_per_epoch(config, train_data) -> int:
  """Steps an epoch, the same in every process: its smallest share's."""
  shares = multihost_utils.process_allgather(np.int64(len(train_data['label'])))
  num_train = int(np.sum(shares))
  if config.batch_size > num_train:
    raise errors.UserError(
        f'config.batch_size={config.batch_size} is larger than the {num_train} '
        f'examples of config.train_split={config.train_split!r}: use at most '
        f'{num_train}'
    )
  steps = int(np.min(shares)) // (config.batch_size // jax.process_count())
  logging.info(
      'Training on %d examples of %r (%d steps/epoch) on %d devices.',
      num_train,
      config.train_split,
      steps,
      jax.device_count(),
  )
  return steps


def epoch_rest(config, step: int, steps: int, train_data) -> np.ndarray:
  """This process's indices, a row per step, for the rest of `step`'s epoch."""
  epoch, done = divmod(step, steps)
  batch = config.batch_size // jax.process_count()
  order = epoch_order(config.seed, epoch + 1, len(train_data['label']), batch)
  return order[done:steps]


def eval_batches(arrays: sources.Arrays, batch_size: int) -> sources.Arrays:
  """Every example once, in `(batches, batch_size, ...)` arrays with a 'mask':
  the last batch is padded with zeros, masked out, so that one compiled step
  serves every batch and the metrics count each example once.
  """
  n = len(arrays['label'])
  size = -(-n // batch_size) * batch_size
  padded = {
      k: np.pad(v, [(0, size - n)] + [(0, 0)] * (v.ndim - 1))
      for k, v in arrays.items()
  }
  padded['mask'] = np.arange(size) < n
  return {k: v.reshape(-1, batch_size, *v.shape[1:]) for k, v in padded.items()}
