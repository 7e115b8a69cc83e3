"""Speed levers for training on a CPU, kept apart from the model and the loop.

Two levers compute what the stock code computes (the same math; the bits of
dropout are the same too) in a form that XLA runs faster on a CPU: the
convolutions trained as matmuls (cpu_matmuls.py) and threefry unrolled.
Two more trade exactness for speed, each behind its own config field: bf16
matmuls (`config.matmul_precision`, on CPUs that multiply bf16 natively;
cpu_matmuls.py) and dropout masks from narrow random draws
(`config.narrow_dropout_bits`). They were measured on 2-core x86 CPUs with
jax 0.10.2 and nowhere else, so `applied` uses them only where JAX's default
backend is the CPU and `config.cpu_levers` is on; on a GPU or TPU the stock
code runs (cuDNN's and the TPU's own convolution gradients are what those
platforms are built for).

Nothing changes on import. `applied` is a context manager: on entry it sets
the levers on the model it is given and on JAX's CPU lowering of threefry,
and on exit it puts back what was there, so that a library caller's JAX and
model are as they were.
"""

import contextlib
import math
import os

from absl import logging
import cpu_matmuls
from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp
from jax.interpreters import mlir
import ml_collections

# Set to '1' or '0', says whether this CPU multiplies bf16 natively, in place
# of its flags: both paths of `matmul_precision='auto'` run on any CPU.
BF16_ENV = 'MNIST_CPU_BF16'
# CPU flags (/proc/cpuinfo) of the bf16 dot instructions that XLA's YNNPACK
# kernels use: Intel's AMX, and AVX-512's (Intel and AMD Zen 4 on).
BF16_FLAGS = ('amx_bf16', 'avx512_bf16')


def enabled(
    config: ml_collections.ConfigDict, platform: str | None = None
) -> bool:
  """Whether the levers apply: `config.cpu_levers` on a 'cpu' platform.

  `platform` defaults to JAX's default backend ('cpu', 'gpu', 'tpu').
  """
  return config.cpu_levers and (platform or jax.default_backend()) == 'cpu'


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


def native_bf16(flags: frozenset[str] | None = None) -> tuple[bool, str]:
  """Whether the CPU multiplies bf16 natively, and what says so.

  `$MNIST_CPU_BF16` ('1' or '0') decides where it is set; else `flags`
  (by default `cpu_flags()`) decide: any of `BF16_FLAGS`.
  """
  forced = os.environ.get(BF16_ENV)
  if forced is not None:
    if forced not in ('0', '1'):
      raise ValueError(f'${BF16_ENV} must be 0 or 1, not {forced!r}')
    return forced == '1', f'${BF16_ENV}={forced}'
  flags = cpu_flags() if flags is None else flags
  found = [flag for flag in BF16_FLAGS if flag in flags]
  if found:
    return True, f'this CPU has {" and ".join(found)}'
  return False, f'this CPU has neither {" nor ".join(BF16_FLAGS)}'


def bf16_matmuls(
    config: ml_collections.ConfigDict,
    platform: str | None = None,
    flags: frozenset[str] | None = None,
) -> tuple[bool, str]:
  """Whether training's matmuls take bf16 operands, and why, for the log.

  They do with `config.matmul_precision='auto'` where the CPU levers apply
  and the CPU multiplies bf16 natively (see `native_bf16`): as a TPU's
  default precision, bf16 operands, float32 accumulation and results, and
  float32 everywhere else (parameters, optimizer, BatchNorm).
  """
  why = f'matmul_precision={config.matmul_precision}'
  platform = platform or jax.default_backend()
  if config.matmul_precision == 'float32':
    return False, why
  if platform != 'cpu':
    return False, f'{why}; the CPU levers do not apply on {platform}'
  if not config.cpu_levers:
    return False, f'{why}; config.cpu_levers is off'
  native, because = native_bf16(flags)
  return native, f'{why}; {because}'


def matmul_precision(
    config: ml_collections.ConfigDict,
    platform: str | None = None,
    flags: frozenset[str] | None = None,
) -> str:
  """What training's matmuls compute in, and why (see `bf16_matmuls`).

  The run logs it; `mnist_benchmark.py` records it beside its figures.
  """
  bf16, why = bf16_matmuls(config, platform, flags)
  if bf16:
    precision = 'bfloat16 operands, float32 accumulation'
  elif (platform or jax.default_backend()) == 'cpu':
    precision = 'float32'
  else:
    precision = "JAX's default"
  return f'{precision} ({why})'


@contextlib.contextmanager
def applied(
    config: ml_collections.ConfigDict,
    model: nnx.Module,
    platform: str | None = None,
):
  """Within the block, `model` trains with the CPU levers where they apply.

  The one call that turns them on (see `enabled`; `bf16_matmuls` and
  `config.narrow_dropout_bits` for the two that change the numbers), and
  logs the matmuls' precision: training run inside the block compiles with
  them. On exit the model's layers and JAX's threefry lowering are what
  they were before.
  """
  logging.info('Matmul precision: %s.', matmul_precision(config, platform))
  with contextlib.ExitStack() as stack:
    if enabled(config, platform):
      stack.enter_context(cpu_matmuls.conv_gradients(model))
      stack.enter_context(unrolled_threefry())
      if bf16_matmuls(config, platform)[0]:
        stack.enter_context(cpu_matmuls.bf16_layers(model))
      if config.narrow_dropout_bits:
        stack.enter_context(narrow_dropout(model))
    yield


# Lever: threefry's random bits compiled unrolled on the CPU.


def _threefry_rules():
  """JAX's threefry primitive, its CPU lowering now and its unrolled rule.

  These are private to JAX (there is no public switch, jax 0.10): returns
  None, after one warning, where they are missing or not what this lever
  was written against (another JAX version).
  """
  try:
    # pylint: disable-next=g-import-not-at-top
    from jax._src.interpreters import mlir as mlir_internal
    # pylint: disable-next=g-import-not-at-top
    from jax._src.random import threefry2x32 as threefry

    primitive = threefry.threefry2x32_p
    current = mlir_internal._platform_specific_lowerings['cpu'][primitive]
    if current.rule is not threefry._threefry2x32_cpu_lowering_rule:
      raise ValueError('the CPU lowering is not the rolled one')
    return primitive, current, threefry._threefry2x32_lowering_rule
  except (ImportError, AttributeError, KeyError, ValueError) as e:
    logging.warning(
        'CPU lever unrolled_threefry is off: JAX %s lacks the private '
        'threefry lowering it replaces (%s); training goes on without it.',
        jax.__version__,
        e,
    )
    return None


@contextlib.contextmanager
def unrolled_threefry():
  """Within the block, JAX compiles threefry unrolled on the CPU too.

  JAX lowers threefry with a rolled loop on the CPU (to compile faster),
  which XLA runs as five passes over memory; dropout draws 3.2 million
  random words a step, and unrolled (JAX's own lowering for the other
  platforms) they fuse into one pass: 113.7 against 131.1 ms a step here
  (x1.15). The bits are the same, so dropout masks do not change. Code
  compiled inside the block keeps the unrolled form; JAX's own CPU rule is
  registered again on exit.
  """
  rules = _threefry_rules()
  if rules is None:
    yield
    return
  primitive, cpu_rule, unrolled_rule = rules
  mlir.register_lowering(primitive, unrolled_rule, platform='cpu', inline=False)
  try:
    yield
  finally:
    mlir.register_lowering(
        primitive, cpu_rule.rule, platform='cpu', inline=cpu_rule.inline
    )


# Lever: dropout masks from narrow random draws.


def narrow_keep_bits(keep: float) -> tuple[jnp.dtype, int] | None:
  """The narrowest unsigned draw that keeps with probability `keep`, to 0.1%.

  Returns its dtype and the threshold below which a draw keeps: 8 bits
  for rates such as 0.5, 16 for 0.975 (8 bits would keep 0.9766, 0.16%
  off). None where even 32 bits do not come within 0.1% (`keep` below
  about 1e-7, or 0).
  """
  for dtype in (jnp.uint8, jnp.uint16, jnp.uint32):
    values = 2 ** jnp.iinfo(dtype).bits
    threshold = round(keep * values)
    if 0 < threshold < values and abs(threshold / values - keep) <= keep / 1000:
      return dtype, threshold
  return None


def narrow_draws(key: jax.Array, shape, dtype) -> jax.Array:
  """Uniform `dtype` draws of `shape`, each from its own bits of 32-bit words.

  JAX's unpartitioned threefry spends a word on 2 (or 4) narrow draws too,
  but interleaves them (draw `i` from word `i // 2`), a transpose that XLA
  repeats in each fusion that reads the mask: here chunk `j` of word `i`
  is draw `i + j * words`. The default config's training step ran x1.14
  as fast so on 2 cores, x1.22 on one (2-core AMD EPYC Zen 5, 2026-12-03).
  """
  bits = jnp.iinfo(dtype).bits
  size = math.prod(shape)
  per_word = 32 // bits
  with jax.threefry_partitionable(False):
    words = jax.random.bits(key, (-(-size // per_word),), jnp.uint32)
  chunks = [(words >> (bits * j)).astype(dtype) for j in range(per_word)]
  return jnp.concatenate(chunks)[:size].reshape(shape)


class NarrowBitsDropout(nnx.Dropout):
  """`nnx.Dropout`, its mask drawn from 8 or 16 bits an element, not 32.

  The same state (its `RngStream`), so checkpoints do not change; another
  random stream, the same distribution, the keep rate within 0.1% of
  1 - rate (see `narrow_keep_bits`), and kept inputs scaled by the inverse
  of that rate, so the expectation is exact. JAX's partitionable threefry
  spends one 32-bit word an element whatever the width; `narrow_draws`
  packs 2 or 4 draws to a word. The (128, 28, 28, 32) mask of one step,
  drawn and applied (JAX's rolled threefry), on one core: 43 ms stock, 16
  ms unpartitioned, 5.7 ms drawing 16 bits, 4.1 drawing 8 (2-core AMD EPYC
  Zen 5, 2026-12-03). Calls that pass their own key or broadcast a mask,
  and rates that no width fits, draw as `nnx.Dropout` does.
  """

  def __call__(self, inputs, *, deterministic=None, rngs=None):
    if deterministic is None:
      deterministic = self.deterministic
    keep_bits = narrow_keep_bits(1.0 - self.rate)
    stock = deterministic is None or deterministic or rngs is not None
    if stock or self.broadcast_dims or keep_bits is None:
      return super().__call__(inputs, deterministic=deterministic, rngs=rngs)
    dtype, threshold = keep_bits
    draws = narrow_draws(self.rngs(), inputs.shape, dtype)
    keep = threshold / 2 ** jnp.iinfo(dtype).bits
    return lax.select(draws < threshold, inputs / keep, jnp.zeros_like(inputs))


@contextlib.contextmanager
def narrow_dropout(model: nnx.Module):
  """Within the block, `model`'s `nnx.Dropout`s are `NarrowBitsDropout`s.

  The modules themselves, their class changed and put back on exit: their
  state, and whatever refers to them, stay as they are.
  """
  dropouts = [
      m
      for m in cpu_matmuls.modules(model, nnx.Dropout)
      if type(m) is nnx.Dropout
  ]
  for dropout in dropouts:
    # Not `dropout.__class__ = ...`: nnx would record a field '__class__'.
    object.__setattr__(dropout, '__class__', NarrowBitsDropout)
  try:
    yield
  finally:
    for dropout in dropouts:
      object.__setattr__(dropout, '__class__', nnx.Dropout)
