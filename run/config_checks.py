"""What each config field allows, and which a resumed run may change.

`validate` checks every field before any work: a mistyped value costs nothing.
"""

import math
import re
import sys
from typing import Any, Callable

import ml_collections
from run import errors

Check = Callable[[Any, int], str | None]

DATA_SOURCES = ('tfds', 'hf', 'torchvision', 'idx')


def _allows(test: Callable[[Any], bool], allowed: str) -> Check:
  return lambda value, *_: None if test(value) else allowed


def _one_of(*names) -> Check:
  return _allows(lambda v: v in names, 'one of ' + ', '.join(map(repr, names)))


def _devices_share(value, devices: int) -> str | None:
  if value > 0 and value % devices == 0:
    return None
  return f'a multiple of the {devices} devices' if devices > 1 else _POSITIVE


def split_parts(spec: str, sizes: dict[str, int] | None = None) -> list:
  """TFDS' (splitname, from_, to) of each '+' part of `spec` (its ValueError),
  in splits of `sizes` examples (one shard); by default any slice fits."""
  # Here: TFDS takes a second to import, and only the split check needs it.
  from tensorflow_datasets.core import splits  # pylint: disable=g-import-not-at-top

  sizes = sizes or {'train': sys.maxsize, 'test': sys.maxsize}
  infos = {
      name: splits.SplitInfo(name=name, shard_lengths=[n], num_bytes=0)
      for name, n in sizes.items()
  }
  return splits.ReadInstruction.from_spec(spec).to_absolute(infos)


def _split(value, *_) -> str | None:
  try:
    split_parts(value)
  except (ValueError, NotImplementedError) as e:
    return (
        "a TFDS split of 'train' and 'test', like 'train[:10%]' or "
        f"'train[:50%]+test' (TFDS: {str(e).splitlines()[-1]})"
    )
  return None


_ANY = _allows(lambda v: True, '')
_POSITIVE = 'an integer > 0'
_POSITIVE_INT = _allows(lambda v: v > 0, _POSITIVE)
_FRACTION = _allows(lambda v: 0 <= v < 1, 'a number in [0, 1)')

CHECKS = {
    'data_source': _one_of(*DATA_SOURCES),
    'learning_rate': _allows(lambda v: 0 < v < math.inf, 'a number > 0'),
    'momentum': _FRACTION,
    'batch_size': _devices_share,
    'num_epochs': _POSITIVE_INT,
    'nesterov': _ANY,
    'lr_schedule': _one_of('constant', 'one_cycle'),
    'dropout_rate': _FRACTION,
    'seed': _allows(lambda v: v >= 0, 'an integer >= 0'),
    'dataset': _one_of('mnist', 'fashion_mnist'),
    'data_dir': _ANY,
    'manual_dir': _ANY,
    'download_url': _allows(
        lambda v: not v or re.match(r'(https?|file)://', v),
        "'' or an http://, https:// or file:// URL",
    ),
    'train_split': _split,
    'test_split': _split,
    'eval_batch_size': _devices_share,
    'progress_every_secs': _allows(lambda v: v > 0, 'a number of seconds > 0'),
    'checkpoint_every_epochs': _POSITIVE_INT,
    'checkpoints_to_keep': _POSITIVE_INT,
    'export_model_name': _allows(
        lambda v: re.fullmatch(r'[\w.-]+', v) and v not in ('.', '..'),
        'a directory name of letters, digits, _, - and .',
    ),
    'steps_per_call': _POSITIVE_INT,
    'cpu_levers': _ANY,
    'matmul_precision': _one_of('auto', 'float32', 'bfloat16'),
    'narrow_dropout_bits': _ANY,
}

# What a resumed run may change: neither the data order nor what training
# computes, at most its rounding (the CPU levers) or dropout's random stream.
RESUMABLE = frozenset(
    'num_epochs data_dir manual_dir download_url test_split eval_batch_size '
    'progress_every_secs checkpoint_every_epochs checkpoints_to_keep '
    'export_model_name steps_per_call cpu_levers matmul_precision '
    'narrow_dropout_bits'.split()
)


def resumable(config) -> frozenset[str]:
  """RESUMABLE, but num_epochs under a one-cycle rate, whose cycle spans
  every epoch: another num_epochs would move the rate at the restored step."""
  one_cycle = config['lr_schedule'] == 'one_cycle'
  return RESUMABLE - {'num_epochs'} if one_cycle else RESUMABLE


def validate(config: ml_collections.ConfigDict, devices: int = 1) -> None:
  """Raises errors.UserError naming the first field with a value not allowed."""
  unchecked = set(config.keys()) - set(CHECKS)
  if unchecked:
    raise KeyError(f'no check for config fields {sorted(unchecked)}')
  for name, check in CHECKS.items():
    allowed = check(config[name], devices)
    if allowed is not None:
      raise errors.UserError(
          f'config.{name}={config[name]!r} is not allowed: use {allowed}'
      )
