"""The layers `models.CNN` is built with on a CPU: Flax's own, faster there.

With `config.cpu_levers` on a CPU, `flax.nnx` with Conv, Linear, Dropout and
BatchNorm replaced by subclasses (cpu/matmuls.py, dropout.py, batch_norm.py)
whose state is Flax's: checkpoints and the export do not depend on them.
"""

import functools
import types

from absl import logging
from cpu import batch_norm
from cpu import dropout
from cpu import matmuls
from flax import nnx
import jax

# CPU flags of the bf16 dot instructions that XLA's YNNPACK kernels use:
# Intel's AMX, and AVX-512's (Intel, and AMD from Zen 4).
BF16_FLAGS = ('amx_bf16', 'avx512_bf16')


def cpu_flags() -> frozenset[str]:
  """This CPU's flags, as Linux lists them; none where it does not."""
  try:
    with open('/proc/cpuinfo') as f:
      flags = next((l for l in f if l.startswith('flags')), ':')
    return frozenset(flags.partition(':')[2].split())
  except OSError:
    return frozenset()


def bf16_matmuls(config, platform=None, flags=None) -> tuple[bool, str]:
  """Whether the matmuls take bf16 operands, and why, for the log."""
  why = f'matmul_precision={config.matmul_precision}'
  platform = platform or jax.default_backend()
  if platform != 'cpu':
    return False, f'{why}; the CPU levers do not apply on {platform}'
  if not config.cpu_levers:
    return False, f'{why}; config.cpu_levers is off'
  if config.matmul_precision != 'auto':
    return config.matmul_precision == 'bfloat16', why
  flags = cpu_flags() if flags is None else flags
  found = [f for f in BF16_FLAGS if f in flags]
  if found:
    return True, f'{why}; this CPU has {" and ".join(found)}'
  return False, f'{why}; this CPU has neither {" nor ".join(BF16_FLAGS)}'


def matmul_precision(config, platform=None, flags=None) -> str:
  """What the matmuls compute in, and why: for the log and the benchmark."""
  bf16, why = bf16_matmuls(config, platform, flags)
  if bf16:
    return f'bfloat16 operands, float32 accumulation ({why})'
  cpu = (platform or jax.default_backend()) == 'cpu'
  precision = 'float32' if cpu else "JAX's default"
  return f'{precision} ({why})'


@functools.cache
def with_default(layer: type[nnx.Module], argument: str, value) -> type:
  """A subclass of `layer` whose `argument` is `value` unless one is given: a
  class, as Flax's are (subclassed, in `isinstance`, the same signature shown).
  """

  @functools.wraps(layer.__init__)
  def __init__(self, *args, **kwargs):
    kwargs.setdefault(argument, value)
    layer.__init__(self, *args, **kwargs)

  namespace = {'__init__': __init__, '__module__': __name__}
  return type(layer.__name__, (layer,), namespace)


class Layers(types.SimpleNamespace):
  """`flax.nnx`, but for the layers given as keywords."""

  def __getattr__(self, name: str):  # Only names not given: Flax's own.
    return getattr(nnx, name)


def steps_per_call(config) -> int:
  """`config.steps_per_call`, but 1 on a CPU with Flax's own layers: XLA runs
  their convolution gradients many times slower in `train.train_steps`' loop.
  """
  if jax.default_backend() == 'cpu' and not config.cpu_levers:
    return 1
  return config.steps_per_call


def for_config(config, platform=None):
  """What `models.CNN` takes as `layers`; logs the matmuls' precision."""
  logging.info('Matmul precision: %s.', matmul_precision(config, platform))
  if (platform or jax.default_backend()) != 'cpu' or not config.cpu_levers:
    return nnx
  conv, dot = matmuls.conv_general_dilated, jax.lax.dot_general
  if bf16_matmuls(config, platform)[0]:
    conv, dot = matmuls.conv_general_dilated_bf16, matmuls.dot_general_bf16
  narrow = config.narrow_dropout_bits
  return Layers(
      Conv=with_default(nnx.Conv, 'conv_general_dilated', conv),
      Linear=with_default(nnx.Linear, 'dot_general', dot),
      Dropout=dropout.NarrowDropout if narrow else nnx.Dropout,
      BatchNorm=batch_norm.BatchNorm,
  )
