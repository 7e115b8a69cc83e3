"""What a command does before its imports, and about the libraries' noise.

Every entry point calls `begin(sys.argv)` before the imports that take
seconds (JAX, TensorFlow): a bad `--config` is one line before anything
starts; TensorFlow's C++ start-up lines (printed before absl's logging is
set up) and gRPC's INFO lines are held back unless `-v 1`. For training,
SIGTERM and Ctrl-C are taken first, and the garbage collector is off while
the imports make half a million objects that live until exit, which it
would walk again and again: `imports_done` freezes them and turns it on.
"""

import asyncio
import gc
import importlib.util
import inspect
import logging
import os
import sys

from absl import flags


def _flags(argv) -> flags.FlagValues:
  """`--config` and `--verbosity` from `argv`, parsed by absl (flagfiles too)."""
  parser = flags.FlagValues()
  flags.DEFINE_string('config', None, '', flag_values=parser)
  flags.DEFINE_integer('verbosity', 0, '', short_name='v', flag_values=parser)
  try:
    parser(list(argv) or [''], known_only=True)
  except flags.Error:
    parser.mark_as_parsed()  # The defaults; absl reports it, parsing again.
  return parser


def verbosity(argv) -> int:
  """absl's `--verbosity` (`-v`) in `argv`, before app.run; 0 if not a number."""
  return _flags(argv).verbosity


class ConfigFileError(Exception):
  """The config file cannot give a config; the message says why, in a line."""


def load_config(path: str):
  """`get_config()` of `--config=path` ('file.py' or 'file.py:argument').

  As ml_collections' config_flags loads it. Raises ConfigFileError, or
  whatever the file's code raises.
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
  signature = inspect.signature(get_config)
  signature = signature.replace(return_annotation=signature.empty)
  try:
    signature.bind(*arguments)
  except TypeError:
    raise ConfigFileError(
        f'its get_config{signature} cannot take the argument {argument!r}'
        if colon
        else f'its get_config{signature} needs an argument: --config={file}:...'
    ) from None
  config = get_config(*arguments)
  if config is None:
    raise ConfigFileError('its get_config() returned None')
  return config


def check_config(argv) -> None:
  """Exits with one line if `--config` names a config that cannot be had."""
  parsed = _flags(argv)
  if parsed.config is None:
    return  # absl says that the flag is required.
  try:
    load_config(parsed.config)
  except Exception as e:  # pylint: disable=broad-except
    if parsed.verbosity >= 1:
      raise
    if isinstance(e, SyntaxError):
      cause = f'not valid Python: {e.msg} (line {e.lineno})'
    elif isinstance(e, ConfigFileError):
      cause = str(e)
    else:
      cause = f'loading it raised {type(e).__name__}'
      cause += f': {" ".join(str(e).split())}' if str(e) else ''
    sys.exit(f'error: --config={parsed.config}: {cause}')


def quiet(argv, tensorflow_log_level: int = 1) -> None:
  """TensorFlow's oneDNN and C++ log lines off, gRPC's but errors, unless -v 1.

  What the user set stays. Level 1 hides TensorFlow's INFO lines, 2 its
  warnings too.
  """
  if verbosity(argv) < 1:
    os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', str(tensorflow_log_level))
    os.environ.setdefault('GRPC_VERBOSITY', 'ERROR')


def begin(argv, training: bool = False, tensorflow_log_level: int = 1) -> None:
  """What a command does first, before its imports (see above)."""
  check_config(argv)
  quiet(argv, tensorflow_log_level)
  if training:
    from run import stop_signals  # pylint: disable=g-import-not-at-top

    stop_signals.install()
    gc.disable()


def imports_done() -> None:
  """The objects made so far live until exit: frozen; the collector back on."""
  gc.freeze()
  gc.enable()


def hide_gpus() -> None:
  """Imports TensorFlow (seconds), GPUs hidden: it would take JAX's memory."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  tf.config.experimental.set_visible_devices([], 'GPU')


def configure_jax(compilation_cache_dir: str) -> None:
  """JAX's persistent compilation cache in the directory, unless '' or set.

  The run's many small computations (initialisers, metrics, the schedule)
  are kept too, not only what took JAX's threshold of 1 s.
  """
  import jax  # pylint: disable=g-import-not-at-top

  if compilation_cache_dir and not jax.config.jax_compilation_cache_dir:
    cache = os.path.expanduser(compilation_cache_dir)
    jax.config.update('jax_compilation_cache_dir', cache)
    if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
      jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing; a config field that does not exist is one line.

  config_flags reports it as an AttributeError that suggests the field
  meant; absl would print it with a traceback.
  """
  from absl import app  # pylint: disable=g-import-not-at-top

  try:
    return app.parse_flags_with_usage(argv)
  except AttributeError as e:
    if flags.FLAGS['verbosity'].value >= 1:
      raise
    # The KeyError inside holds "'field'\nDid you mean ...?".
    cause = e.args[0].args[0] if isinstance(e.args[0], KeyError) else str(e)
    field, _, hint = str(cause).partition('\n')
    hint = hint[:1].lower() + hint[1:] or 'see the config file for its fields'
    sys.exit(f'error: the config has no field {field}; {hint}')


class QuietLibraries(logging.Filter):
  """Drops what orbax and TensorFlow log that the run says better itself.

  Their INFO records narrate a checkpoint or a SavedModel in dozens of
  lines; a failed write's traceback is logged again and again by orbax's
  and clu's threads and their asyncio loops. The run logs one line.
  """

  def __init__(self):
    super().__init__()
    top = lambda name: os.path.dirname(importlib.util.find_spec(name).origin)
    orbax = os.path.dirname(top('orbax.checkpoint')) + os.sep
    self._dirs = (orbax, top('tensorflow') + os.sep)
    asyncio_dir = os.path.dirname(asyncio.__file__) + os.sep
    self._thread_dirs = (orbax, top('clu') + os.sep, asyncio_dir)

  def filter(self, record) -> bool:
    if record.levelno <= logging.INFO:
      return not record.pathname.startswith(self._dirs)
    return not (
        record.exc_info and record.pathname.startswith(self._thread_dirs)
    )


def quiet_logs(signals) -> None:
  """QuietLibraries on absl's handler; dropped errors' reports as DEBUG lines.

  After a failed checkpoint write, TensorStore's callbacks into orbax's
  closed event loop fail a dozen times. `signals`, the process's
  StopSignals, takes Python's reports of them first.
  """
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top

  absl_logging.get_absl_handler().addFilter(QuietLibraries())
  signals.report_unraisable = lambda unraisable: absl_logging.debug(
      'Ignored in %r: %r', unraisable.object, unraisable.exc_value
  )
