"""Tests of the config checks: every field, before any work."""

import re

import config_validation
from configs import default
from configs import fast
import pytest


def test_the_shipped_configs_pass():
  config_validation.validate(default.get_config())
  config_validation.validate(fast.get_config())


@pytest.mark.parametrize(
    'field, value, allowed',
    [
        ('learning_rate', 0.0, 'a number > 0'),
        ('learning_rate', float('inf'), 'a number > 0'),
        ('momentum', 1.0, 'a number in [0, 1)'),
        ('lr_schedule', 'cosine', "one of 'constant', 'one_cycle'"),
        ('batch_size', -1, 'an integer > 0'),
        ('num_epochs', 0, 'an integer > 0'),
        ('dropout_rate', -0.1, 'a number in [0, 1)'),
        ('data_source', 'tfsd', "one of 'tfds', 'hf', 'torchvision', 'idx'"),
        ('dataset', 'mnits', "one of 'mnist', 'fashion_mnist'"),
        ('train_split', 'validation', "a TFDS split of 'train' and 'test'"),
        ('train_split', 'train[:10', "a TFDS split of 'train' and 'test'"),
        ('test_split', 'test+tset', "a TFDS split of 'train' and 'test'"),
        ('eval_batch_size', 0, 'an integer > 0'),
        ('seed', -1, 'an integer >= 0'),
        ('progress_every_secs', 0.0, 'a number of seconds > 0'),
        ('steps_per_call', 0, 'an integer > 0'),
        ('checkpoint_every_epochs', 0, 'an integer > 0'),
        ('checkpoints_to_keep', 0, 'an integer > 0'),
        ('export_model_name', 'a/b', 'a directory name of letters'),
        ('export_model_name', '..', 'a directory name of letters'),
    ],
)
def test_a_bad_value_is_named_with_what_is_allowed(field, value, allowed):
  config = default.get_config()
  config[field] = value
  with pytest.raises(config_validation.ConfigError) as error:
    config_validation.validate(config)
  assert str(error.value).startswith(
      f'config.{field}={value!r} is not allowed: use {allowed}'
  )


@pytest.mark.parametrize(
    'split',
    [
        'train',
        'test',
        'train[:10%]',
        'train[:50%]+test',
        'test[-500:]',
        'train[100:600]',
    ],
)
def test_tfds_takes_its_split_syntax(split):
  config = default.get_config()
  config.train_split = split
  config_validation.validate(config)


@pytest.mark.parametrize(
    'split, allowed',
    [
        ('train[:10%]', True),
        ('test[-500:]', True),
        ('test', True),
        ('train+test', False),
        ('validation', False),
    ],
)
def test_the_other_sources_take_one_sliced_split(split, allowed):
  config = default.get_config()
  config.data_source = 'idx'
  config.test_split = split
  if allowed:
    config_validation.validate(config)
  else:
    with pytest.raises(
        config_validation.ConfigError,
        match=(
            f"^config.test_split='{re.escape(split)}' .*: use 'train' or 'test', "
            'optionally sliced'
        ),
    ):
      config_validation.validate(config)


def test_a_field_without_a_check_is_a_programming_error():
  config = default.get_config()
  config.new_field = 1
  with pytest.raises(KeyError, match='new_field'):
    config_validation.validate(config)
