"""Tests of the config checks: before any work, on every field."""

import subprocess
import sys

from run import config_checks
from run import errors
from configs import default
from configs import fast
import pytest


def test_the_shipped_configs_pass():
  config_checks.validate(default.get_config())
  config_checks.validate(fast.get_config())


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
        ('matmul_precision', 'bf16', "one of 'auto', 'float32', 'bfloat16'"),
    ],
)
def test_a_bad_value_is_named_with_what_is_allowed(field, value, allowed):
  config = default.get_config()
  config[field] = value
  with pytest.raises(errors.UserError) as error:
    config_checks.validate(config)
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
def test_every_source_takes_tfds_split_syntax(split):
  config = default.get_config()
  config.train_split = split
  for config.data_source in config_checks.DATA_SOURCES:
    config_checks.validate(config)


@pytest.mark.parametrize(
    'split, tfds_says',
    [
        ('validation', "Unknown split 'validation'. Should be one of"),
        ('train[:10', "Unrecognized split format: 'train[:10'. See format"),
        ('test[5]', 'Absolute or percent only support slice syntax.'),
    ],
)
def test_a_bad_split_is_one_line_with_tfds_own_words(split, tfds_says):
  config = default.get_config()
  config.data_source = 'idx'
  config.test_split = split
  with pytest.raises(errors.UserError) as error:
    config_checks.validate(config)
  assert str(error.value).startswith(
      f"config.test_split={split!r} is not allowed: use a TFDS split of 'train'"
      " and 'test', like 'train[:10%]' or 'train[:50%]+test' (TFDS: "
      + tfds_says
  )
  assert '\n' not in str(error.value)


def test_a_field_without_a_check_is_a_programming_error():
  config = default.get_config()
  config.new_field = 1
  with pytest.raises(KeyError, match='new_field'):
    config_checks.validate(config)


@pytest.mark.parametrize('devices', [1, 4])
def test_batch_sizes_are_shared_evenly_by_the_devices(devices):
  config = default.get_config()
  config_checks.validate(config, devices)
  config.batch_size = 130
  if devices == 1:
    config_checks.validate(config, devices)
    return
  with pytest.raises(errors.UserError) as error:
    config_checks.validate(config, devices)
  assert str(error.value) == (
      'config.batch_size=130 is not allowed: use a multiple of the 4 devices'
  )


@pytest.mark.parametrize(
    'split',
    [
        'train',
        'test[5]',
        'train[:10%]',
        'train[10%:]',
        'train[-500:]',
        'train[1_000:2_000]',
        'train[:2shard]',
        'train + test',
        'train[:]',
        'train[]',
        'train[:10',
        'validation',
        'train+',
        'train[a:b]',
        'train[1.5%:]',
        'train[:50%]+test',
    ],
)
def test_tfds_splits_are_checked_as_tfds_reads_them(split):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    tfds.core.ReadInstruction.from_spec(split)
    names = {part.split('[')[0].strip() for part in split.split('+')}
    tfds_reads = names <= {'train', 'test'}
  except (ValueError, AssertionError):
    tfds_reads = False
  allowed = config_checks.CHECKS['train_split'](split, 1)
  assert (allowed is None) == tfds_reads


def test_checking_imports_neither_jax_nor_tensorflow():
  """TFDS' split parser only, which needs no TensorFlow."""
  script = (
      'import sys; from run import config_checks; from configs import default; '
      'config_checks.validate(default.get_config()); '
      "print(sorted(m for m in ('jax', 'tensorflow') if m in sys.modules))"
  )
  result = subprocess.run(
      [sys.executable, '-c', script], capture_output=True, text=True, check=True
  )
  assert result.stdout == '[]\n'


def test_every_data_source_has_a_reader():
  import input_pipeline  # pylint: disable=g-import-not-at-top

  assert tuple(input_pipeline.SOURCES) == config_checks.DATA_SOURCES


def test_only_what_changes_neither_the_state_nor_the_data_order_resumes():
  assert config_checks.RESUMABLE == {
      'num_epochs',
      'test_split',
      'eval_batch_size',
      'data_dir',
      'manual_dir',
      'download_url',
      'progress_every_secs',
      'steps_per_call',
      'export_model_name',
      'checkpoint_every_epochs',
      'checkpoints_to_keep',
      'cpu_levers',
      'matmul_precision',
      'narrow_dropout_bits',
  }


def test_every_field_of_the_default_config_has_a_check_and_no_more():
  assert set(default.get_config()) == set(config_checks.CHECKS)
  assert config_checks.RESUMABLE <= set(config_checks.CHECKS)


def test_the_default_config_is_the_flax_examples():
  config = default.get_config()
  assert (
      config.learning_rate,
      config.momentum,
      config.batch_size,
      config.num_epochs,
      config.dropout_rate,
  ) == (0.1, 0.9, 128, 10, 0.025)
