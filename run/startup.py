"""What a command does before its imports, and about the libraries' noise.

Every entry point calls `begin(sys.argv)` before its imports of seconds (JAX,
TensorFlow): TensorFlow's C++ start-up lines and gRPC's INFO lines are held
back unless `-v 1`. For training, SIGTERM and Ctrl-C are taken first, and the
collector is off while the imports make half a million objects that live
until exit, which it would walk again and again: `imports_done` freezes them.
"""

import gc
import importlib.util
import logging
import os
import sys

from absl import app
from absl import flags
from absl import logging as absl_logging
from run import stop_signals


def early_flags(argv) -> flags.FlagValues:
  """`--config` and `--verbosity` (`-v`) in `argv` as absl reads them, early."""
  parser = flags.FlagValues()
  flags.DEFINE_string('config', None, '', flag_values=parser)
  flags.DEFINE_integer('verbosity', 0, '', short_name='v', flag_values=parser)
  try:
    parser(list(argv) or [''], known_only=True)
  except flags.Error:
    parser.mark_as_parsed()  # The defaults; absl reports it, parsing again.
  return parser


def quiet(argv, tensorflow_log_level: int = 1) -> None:
  """TensorFlow's oneDNN and C++ log lines off, gRPC's but errors, unless -v 1;
  TensorFlow's level 1 hides its INFO lines, 2 its warnings too."""
  if early_flags(argv).verbosity < 1:
    os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', str(tensorflow_log_level))
    os.environ.setdefault('GRPC_VERBOSITY', 'ERROR')


def begin(argv, training: bool = False, tensorflow_log_level: int = 1) -> None:
  """What a command does first, before its imports (see above)."""
  quiet(argv, tensorflow_log_level)
  if training:
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


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing; a `--config` that gives no config is one line, where
  absl prints what config_flags raised loading it with a traceback."""
  try:
    rest = flags.FLAGS(argv)
    flags.FLAGS.config.keys()  # A file that could not be read raises here.
    return rest
  except Exception as e:  # pylint: disable=broad-except
    error = e
  parsed = early_flags(argv)  # Whatever the order of the flags that failed.
  if isinstance(error, flags.Error) and not (
      parsed.config is not None and str(error).startswith('flag --config=')
  ):
    return app.parse_flags_with_usage(argv)  # absl's line and its usage.
  if parsed.verbosity >= 1:
    raise error
  if isinstance(error, AttributeError) and isinstance(error.args[0], KeyError):
    # "'field'\nDid you mean ...?"
    field, _, hint = str(error.args[0].args[0]).partition('\n')
    hint = hint[:1].lower() + hint[1:] or 'see the config file for its fields'
    sys.exit(f'error: the config has no field {field}; {hint}')
  # The last line of the traceback that config_flags quotes, or its message.
  cause = str(error).strip().partition(': ')[2] or str(error)
  cause = cause.splitlines()[-1].strip() if cause else type(error).__name__
  if isinstance(error, SyntaxError):
    cause = f'not valid Python: {error.msg} (line {error.lineno})'
  elif not isinstance(error, (flags.Error, OSError)):
    cause = f'{type(error).__name__}: {error}'
  sys.exit(f'error: --config={parsed.config}: {cause}')


class QuietLibraries(logging.Filter):
  """Drops what orbax and TensorFlow log that the run says better in a line:
  their INFO narration of a checkpoint or SavedModel, and a failed write's
  traceback, logged again and again by orbax's and clu's threads and loops."""

  def __init__(self):
    super().__init__()
    top = lambda name: os.path.dirname(importlib.util.find_spec(name).origin)
    orbax = os.path.dirname(top('orbax.checkpoint')) + os.sep
    self._dirs = (orbax, top('tensorflow') + os.sep)
    self._thread_dirs = (orbax, top('clu') + os.sep, top('asyncio') + os.sep)

  def filter(self, record) -> bool:
    if record.levelno <= logging.INFO:
      return not record.pathname.startswith(self._dirs)
    return not (
        record.exc_info and record.pathname.startswith(self._thread_dirs)
    )


def quiet_logs() -> None:
  """QuietLibraries on absl's handler; errors Python drops, as DEBUG lines."""
  absl_logging.get_absl_handler().addFilter(QuietLibraries())
  # After a failed write, TensorStore's callbacks into orbax's closed loop.
  sys.unraisablehook = lambda unraisable: absl_logging.debug(
      'Ignored in %r: %r', unraisable.object, unraisable.exc_value
  )
