"""Every config field: its default, the values it allows, and if it may resume.

Adding a field is one entry in `FIELDS`: configs/default.py takes the
defaults from here, `validate` checks each value before any work (so a
mistyped one costs nothing: no data read, no file written), and a run that
resumes from a checkpoint may change only the fields marked `resumable`.
The locked config already rejects unknown fields and values of the wrong
type. Importing this module imports neither JAX nor TFDS.
"""

import math
import re
from typing import Any, Callable, NamedTuple

from data import sources
from run import errors
import ml_collections

# A check: (value, config, device count) -> None if allowed, else what is.
Check = Callable[[Any, ml_collections.ConfigDict, int], str | None]


class ConfigError(errors.UserError):
  """A field's value is not allowed; the message is one line for the user."""


class Field(NamedTuple):
  default: Any
  check: Check
  # Whether a run resumed from a checkpoint may change it: it changes neither
  # the order of the data nor what training computes, at most its rounding
  # (the CPU levers) or dropout's random stream, not its distribution.
  resumable: bool = False


def _allows(test: Callable[[Any], bool], allowed: str) -> Check:
  return lambda value, *_: None if test(value) else allowed


def _one_of(*names) -> Check:
  return _allows(lambda v: v in names, 'one of ' + ', '.join(map(repr, names)))


_ANY = _allows(lambda v: True, '')
_POSITIVE_INT = _allows(lambda v: v > 0, 'an integer > 0')
_FRACTION = _allows(lambda v: 0 <= v < 1, 'a number in [0, 1)')


def _devices_share(value, config, devices: int) -> str | None:
  """A batch size > 0 that the devices share evenly."""
  if value > 0 and value % devices == 0:
    return None
  return (
      'an integer > 0'
      if devices == 1
      else f'a multiple of the {devices} devices'
  )


# TFDS' split syntax (tfds.core.ReadInstruction.from_spec) for the two
# splits: '+'-joined, each optionally sliced in examples, percent or shards.
_TFDS_BOUND = r'-?[\d_.]+(?:%|shard)?'
_TFDS_SPLIT = re.compile(
    rf'(train|test)(\[(?=[^\]]*\d)(?:{_TFDS_BOUND})?:(?:{_TFDS_BOUND})?\])?'
)


def _split(value, config, devices) -> str | None:
  """A split that `config.data_source` reads."""
  if config.data_source != 'tfds':
    if sources.SPLIT.fullmatch(value):
      return None
    return (
        "'train' or 'test', optionally sliced like 'train[:10%]' or "
        "'test[100:600]'"
    )
  if all(_TFDS_SPLIT.fullmatch(p) for p in re.split(r'\s*\+\s*', value)):
    return None
  return (
      "a TFDS split of 'train' and 'test', like 'train[:10%]' or "
      "'train[:50%]+test'"
  )


DATA_SOURCES = ('tfds', 'hf', 'torchvision', 'idx')
LR_SCHEDULES = ('constant', 'one_cycle')

FIELDS = {
    # Optimisation.
    'learning_rate': Field(  # SGD learning rate.
        0.1, _allows(lambda v: 0 < v < math.inf, 'a number > 0')
    ),
    'momentum': Field(0.9, _FRACTION),  # SGD momentum.
    'nesterov': Field(False, _ANY),  # Heavy-ball momentum, as the example.
    # 'constant', or 'one_cycle': warm-up to learning_rate, then cosine decay.
    'lr_schedule': Field('constant', _one_of(*LR_SCHEDULES)),
    # Training images per step; an epoch's remainder is dropped.
    'batch_size': Field(128, _devices_share),
    'num_epochs': Field(10, _POSITIVE_INT, resumable=True),
    # Model: dropout after the first conv and the first linear layer.
    'dropout_rate': Field(0.025, _FRACTION),
    # Data.
    # 'tfds' (TensorFlow Datasets), 'hf' (Hugging Face datasets),
    # 'torchvision' (needs PyTorch, not in requirements.txt) or 'idx' (the
    # four original files, read with NumPy). The same arrays from each.
    'data_source': Field('tfds', _one_of(*DATA_SOURCES)),
    'dataset': Field('mnist', _one_of(*sources.DATASETS)),
    # The source's own directory: tfds: its data_dir ('' uses TFDS' default,
    # $TFDS_DATA_DIR or ~/tensorflow_datasets); hf: a save_to_disk directory
    # or a directory of <split>-*.parquet files ('' loads from the Hub or its
    # cache); torchvision: its root ('' is ~/torchvision_datasets); idx:
    # unused.
    'data_dir': Field('', _ANY, resumable=True),
    # The directory of the original *-ubyte.gz files, for TFDS' offline
    # preparation and for the idx source. '' uses $MNIST_MANUAL_DIR for
    # MNIST; failing that, tfds uses <data_dir>/downloads/manual, and idx
    # reads fashion_mnist from /usr/share/datasets/fashion-mnist (Debian's
    # package dataset-fashion-mnist).
    'manual_dir': Field('', _ANY, resumable=True),
    # Where tfds downloads the original files from when it has none: '' is
    # the addresses TFDS registers, else the URL of a directory (a mirror)
    # that holds the same four file names.
    'download_url': Field(
        '',
        _allows(
            lambda v: not v or re.match(r'(https?|file)://', v),
            "'' or an http://, https:// or file:// URL",
        ),
        resumable=True,
    ),
    # Splits. tfds: any TFDS split ('train[:10%]', 'train[:50%]+test'); the
    # other sources: 'train' or 'test', optionally with one slice in TFDS'
    # syntax: 'train[:10%]', 'train[:1024]', 'test[-500:]'.
    'train_split': Field('train', _split),
    'test_split': Field('test', _split, resumable=True),  # Evaluated whole.
    # Test images per step; the last batch is padded.
    'eval_batch_size': Field(128, _devices_share, resumable=True),
    # Reproducibility and reporting.
    # Seeds initialisation, dropout and the data order.
    'seed': Field(0, _allows(lambda v: v >= 0, 'an integer >= 0')),
    'progress_every_secs': Field(  # Interval of in-epoch progress lines.
        30.0, _allows(lambda v: v > 0, 'a number of seconds > 0'), True
    ),
    # Speed.
    # Training steps per jitted call (a lax.scan over batches on the
    # device): fewer Python dispatches, progress reported between calls. 39
    # divides the 468 steps of an epoch, so one compiled call serves them all.
    'steps_per_call': Field(39, _POSITIVE_INT, resumable=True),
    # On a CPU, build the model with the layers of cpu/layers.py: the same
    # math, in forms that XLA runs faster there. Other platforms never do.
    'cpu_levers': Field(True, _ANY, resumable=True),
    # The matmuls' precision with the CPU levers: 'bfloat16' multiplies bf16
    # operands with float32 accumulation and results (as a TPU's default
    # precision does): the conv of 32 channels and the dense layers, in
    # training and evaluation; parameters, optimizer and BatchNorm stay
    # float32. 'auto' does so where the CPU does natively (amx_bf16 or
    # avx512_bf16 among its flags). 'float32': float32 everywhere.
    'matmul_precision': Field(
        'auto', _one_of('auto', 'float32', 'bfloat16'), resumable=True
    ),
    # With the CPU levers, dropout masks from 8- or 16-bit random draws, not
    # 32: another random stream, the same distribution (the keep rate within
    # 0.1% of 1 - dropout_rate). False draws as nnx.Dropout does.
    'narrow_dropout_bits': Field(True, _ANY, resumable=True),
    # Checkpoints, in <workdir>/checkpoints: rerunning a command resumes.
    # Epochs between checkpoints (and the last).
    'checkpoint_every_epochs': Field(1, _POSITIVE_INT, resumable=True),
    # The most recent ones are kept; older ones are deleted.
    'checkpoints_to_keep': Field(3, _POSITIVE_INT, resumable=True),
    # Exports go to <workdir>/export/<name>/.
    'export_model_name': Field(
        'mnist',
        _allows(
            lambda v: re.fullmatch(r'[\w.-]+', v) and v not in ('.', '..'),
            'a directory name of letters, digits, _, - and .',
        ),
        resumable=True,
    ),
}

RESUMABLE = frozenset(name for name, f in FIELDS.items() if f.resumable)


def defaults() -> ml_collections.ConfigDict:
  """Every field at its default."""
  return ml_collections.ConfigDict({k: f.default for k, f in FIELDS.items()})


def validate(config: ml_collections.ConfigDict, devices: int = 1) -> None:
  """Raises ConfigError naming the first field whose value is not allowed.

  `devices` is the number of devices that share each batch. A field that
  `FIELDS` lacks is a programming error (a field added without its
  check), and raises KeyError.
  """
  unchecked = set(config.keys()) - set(FIELDS)
  if unchecked:
    raise KeyError(f'no check for config fields {sorted(unchecked)}')
  # The data source first: the splits' check depends on it.
  for name in dict.fromkeys(('data_source', *FIELDS)):
    allowed = FIELDS[name].check(config[name], config, devices)
    if allowed is not None:
      raise ConfigError(
          f'config.{name}={config[name]!r} is not allowed: use {allowed}'
      )
