"""Checks every field of a config against what it allows, before any work.

`validate` runs first in training and in export, so that a mistyped value
costs nothing: no data read, no file written. The locked config already
rejects unknown fields and values of the wrong type; this adds the ranges
and the sets of names.
"""

import math
import re

import data_sources
import errors
import input_pipeline
import jax
import ml_collections

# The learning-rate schedules `train.learning_rate` builds.
LR_SCHEDULES = ('constant', 'one_cycle')


class ConfigError(errors.UserError):
  """A field's value is not allowed; the message is one line for the user."""


def _one_of(names) -> tuple:
  return (lambda v: v in names, 'one of ' + ', '.join(map(repr, names)))


def _positive_multiple(n: int) -> tuple:
  """An integer > 0 that `n` devices share evenly."""
  if n == 1:
    return (lambda v: v > 0, 'an integer > 0')
  return (lambda v: v > 0 and v % n == 0, f'a multiple of the {n} devices')


_POSITIVE_INT = (lambda v: v > 0, 'an integer > 0')
_FRACTION = (lambda v: 0 <= v < 1, 'a number in [0, 1)')
_ANY = (lambda v: True, '')


def _allowed(config: ml_collections.ConfigDict) -> dict[str, tuple]:
  """field -> (whether a value is allowed, what is), for every field.

  The splits' syntax depends on the data source, the batch sizes on the
  number of devices (each takes an equal share of a batch).
  """
  devices = jax.device_count()
  split = (
      lambda v: input_pipeline.valid_split(config.data_source, v),
      input_pipeline.SPLIT_SYNTAX.get(config.data_source, ''),
  )
  return {
      'learning_rate': (lambda v: 0 < v < math.inf, 'a number > 0'),
      'momentum': _FRACTION,
      'nesterov': _ANY,
      'lr_schedule': _one_of(LR_SCHEDULES),
      'batch_size': _positive_multiple(devices),
      'num_epochs': _POSITIVE_INT,
      'dropout_rate': _FRACTION,
      'data_source': _one_of(tuple(input_pipeline.SOURCES)),
      'dataset': _one_of(data_sources.DATASETS),
      'data_dir': _ANY,
      'manual_dir': _ANY,
      'download_url': (
          lambda v: not v or re.match(r'(https?|file)://', v),
          "'' or an http://, https:// or file:// URL",
      ),
      'train_split': split,
      'test_split': split,
      'eval_batch_size': _positive_multiple(devices),
      'seed': (lambda v: v >= 0, 'an integer >= 0'),
      'progress_every_secs': (lambda v: v > 0, 'a number of seconds > 0'),
      'steps_per_call': _POSITIVE_INT,
      'cpu_levers': _ANY,
      'matmul_precision': _one_of(('auto', 'float32')),
      'narrow_dropout_bits': _ANY,
      'checkpoint_every_epochs': _POSITIVE_INT,
      'checkpoints_to_keep': _POSITIVE_INT,
      'export_model_name': (
          lambda v: re.fullmatch(r'[\w.-]+', v) and v not in ('.', '..'),
          'a directory name of letters, digits, _, - and .',
      ),
  }


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first field whose value is not allowed.

  A field that the config has and this does not know is a programming
  error (a field added without its check), and raises KeyError.
  """
  allowed = _allowed(config)
  unchecked = set(config.keys()) - set(allowed)
  if unchecked:
    raise KeyError(f'no check for config fields {sorted(unchecked)}')
  if not allowed['data_source'][0](config.data_source):
    # The splits' check depends on it.
    allowed = {'data_source': allowed['data_source']}
  for field, (is_allowed, description) in allowed.items():
    if not is_allowed(config[field]):
      raise ConfigError(
          f'config.{field}={config[field]!r} is not allowed: use {description}'
      )
