"""What a command checks before its imports, which take seconds.

`check_config` loads the file that `--config` names as ml_collections'
`config_flags` will (`path.py` or `path.py:argument`, its `get_config`
called with the argument), so that a mistake in it is one line, before JAX
starts or anything is written; `--verbosity=1` (`-v 1`) shows the
traceback instead. The flags are parsed again, as usual, by absl.
"""

import importlib.util
import inspect
import os
import sys
from typing import Sequence

from absl import flags


def _flags(argv: Sequence[str]) -> flags.FlagValues:
  """`--config` and `--verbosity` from `argv`, parsed by absl (flagfiles too)."""
  parser = flags.FlagValues()
  flags.DEFINE_string('config', None, '', flag_values=parser)
  flags.DEFINE_integer('verbosity', 0, '', short_name='v', flag_values=parser)
  try:
    parser(list(argv) or [''], known_only=True)
  except flags.Error:
    pass  # absl reports it, as it parses the flags again.
  return parser


class ConfigFileError(Exception):
  """The config file cannot give a config; the message says why, in a line."""


def load_config(path: str):
  """The config of `--config=path`: `get_config()` of the file, or raises.

  ConfigFileError where the file or its `get_config` is missing or cannot
  take the argument; whatever the file's code raises, as it raises it.
  """
  file, colon, argument = path.partition(':')
  arguments = (argument,) if colon else ()
  if not os.path.isfile(file):
    raise ConfigFileError(
        'not a file' if os.path.exists(file) else 'no such file'
    )
  spec = importlib.util.spec_from_file_location('config_file', file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  get_config = getattr(module, 'get_config', None)
  if not callable(get_config):
    raise ConfigFileError('it defines no get_config()')
  signature = inspect.signature(get_config).replace(
      return_annotation=inspect.Signature.empty
  )
  try:
    signature.bind(*arguments)
  except TypeError:
    if colon:
      raise ConfigFileError(
          f'its get_config{signature} cannot take the argument {argument!r}'
      ) from None
    raise ConfigFileError(
        f'its get_config{signature} needs an argument: --config={file}:...'
    ) from None
  config = get_config(*arguments)
  if config is None:
    raise ConfigFileError('its get_config() returned None')
  return config


def _cause(error: Exception) -> str:
  if isinstance(error, ConfigFileError):
    return str(error)
  if isinstance(error, SyntaxError):
    return f'not valid Python: {error.msg} (line {error.lineno})'
  cause = ' '.join(str(error).split())
  return f'loading it raised {type(error).__name__}' + (
      f': {cause}' if cause else ''
  )


def check_config(argv: Sequence[str]) -> None:
  """Exits with one line if `--config` names a config that cannot be had."""
  parsed = _flags(argv)
  if parsed.config is None:
    return  # absl says that the flag is required.
  try:
    load_config(parsed.config)
  except Exception as e:  # pylint: disable=broad-except
    if parsed.verbosity >= 1:
      raise
    sys.exit(f'error: --config={parsed.config}: {_cause(e)}')
