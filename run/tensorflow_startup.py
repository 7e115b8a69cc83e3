"""Keeps TensorFlow's start-up lines from the user, and its hands off the GPUs.

On x86 CPUs with AVX-512 VNNI or bf16, AVX-VNNI or AMX (recent Intel Xeons,
AMD Zen 4 and 5), TensorFlow turns on its oneDNN custom operations when it
is first imported, and its C++ says so on stderr, before absl's logging is
set up: `TF_CPP_MIN_LOG_LEVEL` alone does not hold those lines back.
`TF_ENABLE_ONEDNN_OPTS=0` keeps them off, and `TF_CPP_MIN_LOG_LEVEL=1` (the
level JAX sets on import) the CPU-feature line that takes their place.
This project runs no TensorFlow operation that oneDNN speeds up: the same
data, SavedModels and answers either way (see docs/tensorflow_startup.md).

Each entry point calls `quiet` before anything imports TensorFlow. A
variable the user set is left as it is; with `--verbosity=1` (or `-v 1`)
nothing is set, and TensorFlow prints what it prints. `main.py` then calls
`hide_gpus` when its run is about to need TensorFlow.
"""

import os
from typing import Sequence

from absl import flags


def verbosity(argv: Sequence[str]) -> int:
  """The value of absl's `--verbosity` (`-v`) in `argv`, before app.run.

  Parsed by absl itself (also from a --flagfile), into flags of its own; 0
  where it is not given or not a number (absl reports that later).
  """
  parser = flags.FlagValues()
  flags.DEFINE_integer('verbosity', 0, '', short_name='v', flag_values=parser)
  try:
    parser(list(argv) or [''], known_only=True)
  except flags.Error:
    return 0
  return parser.verbosity


def quiet(argv: Sequence[str], min_log_level: int = 1) -> None:
  """Turns oneDNN and TensorFlow's C++ logs off, unless `argv` asks for -v 1.

  `min_log_level` 1 hides the C++ INFO lines (JAX's own default), 2 the
  WARNING lines too. Call it before TensorFlow is imported: TensorFlow reads
  these variables once, as it loads.
  """
  if verbosity(argv) >= 1:
    return
  os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', str(min_log_level))


def hide_gpus() -> None:
  """Imports TensorFlow and hides the GPUs from it: their memory is JAX's.

  TensorFlow would otherwise reserve most of a GPU's memory at its first
  operation (a summary, TFDS' decoding, the export). Call it before that,
  after `quiet`; the import takes seconds, so not before a run needs it.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  tf.config.experimental.set_visible_devices([], 'GPU')
