"""The layers `models.CNN` is built with on a CPU: Flax's own, faster there.

`for_config(config)` returns what the model takes as `layers`: `flax.nnx`
itself, except where JAX's default backend is the CPU and
`config.cpu_levers` is on. There, `Conv`, `Linear` and `Dropout` are Flax's
own classes given other kernels through their construction arguments
(cpu/matmuls.py): convolutions trained as matmuls, the same math; with
`config.matmul_precision`, bf16 matmuls with float32 results; and
`config.narrow_dropout_bits`, dropout masks from fewer random bits
(cpu/dropout.py), another random stream. Their state is Flax's, so
checkpoints and the export do not depend on them. A layer that these do not
cover computes as stock Flax does.
"""

import functools
import os
import types

from cpu import dropout
from cpu import matmuls
from flax import nnx
import jax
import ml_collections

# CPU flags (/proc/cpuinfo) of the bf16 dot instructions that XLA's YNNPACK
# kernels use: Intel's AMX, and AVX-512's (Intel, and AMD from Zen 4).
BF16_FLAGS = ('amx_bf16', 'avx512_bf16')


def cpu_flags() -> frozenset[str]:
  """This CPU's flags, as Linux lists them; none where it does not."""
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('flags'):
          return frozenset(line.partition(':')[2].split())
  except OSError:
    pass
  return frozenset()


def bf16_matmuls(config, platform=None, flags=None) -> tuple[bool, str]:
  """Whether the matmuls take bf16 operands, and why, for the log.

  With `config.matmul_precision` 'auto', where the CPU levers apply and
  the CPU multiplies bf16 natively (`flags`, by default `cpu_flags()`);
  'bfloat16' and 'float32' decide on any CPU.
  """
  why = f'matmul_precision={config.matmul_precision}'
  platform = platform or jax.default_backend()
  if platform != 'cpu' or not config.cpu_levers:
    where = (
        f'the CPU levers do not apply on {platform}'
        if config.cpu_levers
        else 'config.cpu_levers is off'
    )
    return False, f'{why}; {where}'
  if config.matmul_precision != 'auto':
    return config.matmul_precision == 'bfloat16', why
  found = [
      f for f in BF16_FLAGS if f in (cpu_flags() if flags is None else flags)
  ]
  if found:
    return True, f'{why}; this CPU has {" and ".join(found)}'
  return False, f'{why}; this CPU has neither {" nor ".join(BF16_FLAGS)}'


def matmul_precision(config, platform=None, flags=None) -> str:
  """What the matmuls compute in, and why: the run logs it, the benchmark keeps it."""
  bf16, why = bf16_matmuls(config, platform, flags)
  platform = platform or jax.default_backend()
  if bf16:
    precision = 'bfloat16 operands, float32 accumulation'
  else:
    precision = 'float32' if platform == 'cpu' else "JAX's default"
  return f'{precision} ({why})'


def for_config(config: ml_collections.ConfigDict, platform=None, flags=None):
  """The module whose Conv, Linear and Dropout `models.CNN` builds with."""
  platform = platform or jax.default_backend()
  if platform != 'cpu' or not config.cpu_levers:
    return nnx
  bf16 = bf16_matmuls(config, platform, flags)[0]
  return types.SimpleNamespace(
      Conv=functools.partial(
          nnx.Conv,
          conv_general_dilated=matmuls.conv_general_dilated_bf16
          if bf16
          else matmuls.conv_general_dilated,
      ),
      Linear=functools.partial(nnx.Linear, dot_general=matmuls.dot_general_bf16)
      if bf16
      else nnx.Linear,
      Dropout=dropout.NarrowDropout
      if config.narrow_dropout_bits
      else nnx.Dropout,
  )
