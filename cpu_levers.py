"""Speed levers for training on a CPU, kept apart from the model and the loop.

The first two levers compute what the stock code computes (the same math;
the bits of dropout are the same too) in a form that XLA runs faster on a
CPU. Two more trade exactness for speed, each behind its own config field:
bf16 matmuls (`config.matmul_precision`, on CPUs that multiply bf16
natively) and dropout masks from narrow random draws
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
from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp
from jax.interpreters import mlir
import ml_collections

_NHWC = ('NHWC', 'HWIO', 'NHWC')

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
  bf16, why = bf16_matmuls(config, platform)
  if bf16:
    precision = 'bfloat16 operands, float32 accumulation'
  elif (platform or jax.default_backend()) == 'cpu':
    precision = 'float32'
  else:
    precision = "JAX's default"
  logging.info('Matmul precision: %s (%s).', precision, why)
  with contextlib.ExitStack() as stack:
    if enabled(config, platform):
      stack.enter_context(conv_gradients(model))
      stack.enter_context(unrolled_threefry())
      if bf16:
        stack.enter_context(bf16_layers(model))
      if config.narrow_dropout_bits:
        stack.enter_context(narrow_dropout(model))
    yield


@contextlib.contextmanager
def _fields_set(modules: list[nnx.Module], name: str, value):
  """Within the block, each of `modules` has `value` as its field `name`."""
  previous = [getattr(module, name) for module in modules]
  for module in modules:
    setattr(module, name, value)
  try:
    yield
  finally:
    for module, old in zip(modules, previous):
      setattr(module, name, old)


def _modules(model: nnx.Module, kind: type) -> list:
  return [m for _, m in nnx.iter_modules(model) if isinstance(m, kind)]


# Lever 1: the convolutions' gradients as convolutions and matmuls.


def _conv(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """Stride-1 'SAME' convolution, NHWC images and HWIO kernel."""
  return lax.conv_general_dilated(
      x, kernel, (1, 1), 'SAME', dimension_numbers=_NHWC
  )


def _shifted(x: jax.Array, kh: int, kw: int) -> list[jax.Array]:
  """The `kh * kw` windows of zero-padded `x` that a 'SAME' kernel tap reads."""
  h, w = x.shape[1:3]
  padded = jnp.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
  return [padded[:, i : i + h, j : j + w] for i in range(kh) for j in range(kw)]


def _patches(x: jax.Array, kh: int, kw: int) -> jax.Array:
  """im2col: `(B*H*W, kh*kw*C)`, the inputs of each output pixel in a row."""
  return jnp.concatenate(_shifted(x, kh, kw), axis=-1).reshape(
      -1, kh * kw * x.shape[-1]
  )


def _col2im(patch_grads: jax.Array, shape, kh: int, kw: int) -> jax.Array:
  """The transpose of `_patches`: each tap's part added back where it read."""
  b, h, w, c = shape
  taps = patch_grads.reshape(b, h, w, kh * kw, c)
  padded = jnp.zeros((b, h + kh - 1, w + kw - 1, c), patch_grads.dtype)
  for t in range(kh * kw):
    i, j = divmod(t, kw)
    padded = padded.at[:, i : i + h, j : j + w].add(taps[:, :, :, t])
  return padded[:, kh // 2 : kh // 2 + h, kw // 2 : kw // 2 + w]


@jax.custom_vjp
def conv_same(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`_conv`, trained as matmuls: im2col forward, its transposes backward.

  The same function as `lax.conv_general_dilated` (which computes it where
  no gradient is taken, as in evaluation). XLA's CPU transposed
  convolutions are slow, above all inside `lax.scan` (where the training
  loop runs): the kernel gradient of the 32->64 conv took 1.7 s a step
  there, against 20 ms as matmuls. In training the forward pass is the
  patches times the kernel, and the patches serve the kernel gradient too.
  """
  return _conv(x, kernel)


def _conv_same_fwd(x, kernel):
  kh, kw, cin, cout = kernel.shape
  patches = _patches(x, kh, kw)
  if cin == 1:  # Nine taps of one channel: XLA's own convolution is faster.
    return _conv(x, kernel), (patches, kernel)
  y = patches @ kernel.reshape(-1, cout)
  return y.reshape(*x.shape[:3], cout), (patches, kernel)


def _conv_same_bwd(residuals, g):
  patches, kernel = residuals
  kh, kw, cin, cout = kernel.shape
  g2 = g.reshape(-1, cout)
  dkernel = (patches.T @ g2).reshape(kernel.shape)
  dpatches = g2 @ kernel.reshape(-1, cout).T
  return _col2im(dpatches, (*g.shape[:3], cin), kh, kw), dkernel


conv_same.defvjp(_conv_same_fwd, _conv_same_bwd)


def _check_supported(
    lhs,
    rhs,
    window_strides,
    padding,
    *,
    lhs_dilation,
    rhs_dilation,
    dimension_numbers,
    feature_group_count,
    precision,
    **unused_kwargs,
):
  """Raises ValueError unless `conv_same` computes this convolution.

  It computes stride 1, 'SAME' padding, odd kernels, no dilation or groups,
  NHWC. Anything else is a programming error, reported rather than
  computed some other way.
  """
  supported = (
      tuple(window_strides) == (1, 1)
      and padding == 'SAME'
      and tuple(lhs_dilation) == (1, 1)
      and tuple(rhs_dilation) == (1, 1)
      and feature_group_count == 1
      and precision is None
      and dimension_numbers
      == lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC)
      and rhs.shape[0] % 2 == 1
      and rhs.shape[1] % 2 == 1
  )
  if not supported:
    raise ValueError(
        'conv_same supports only stride-1 SAME NHWC convolutions '
        'with odd kernels, no dilation and no groups'
    )


def conv_general_dilated(lhs, rhs, *args, **kwargs):
  """`lax.conv_general_dilated` for `nnx.Conv`, computed by `conv_same`."""
  _check_supported(lhs, rhs, *args, **kwargs)
  return conv_same(lhs, rhs)


@contextlib.contextmanager
def conv_gradients(model: nnx.Module):
  """Within the block, `model`'s `nnx.Conv`s compute through `conv_same`.

  `nnx.Conv` takes its convolution function as a field; this sets it on each
  of the model's convolutions, and puts back the previous one on exit.
  """
  convs = _modules(model, nnx.Conv)
  with _fields_set(convs, 'conv_general_dilated', conv_general_dilated):
    yield


# Lever 2: threefry's random bits compiled unrolled on the CPU.


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


# Lever 3: bf16 operands for the matmuls, float32 results, where the CPU
# multiplies bf16 natively.

# XLA's CPU backend gives YNNPACK's bf16 kernels (AMX, avx512_bf16) only
# some bf16 dots (xla/backends/cpu/ynn_support.cc, and the compiled HLO of
# jax 0.10.2): a dot whose result is bf16, or that contracts the first axis
# of its left operand or the last of its right one, has its operands
# converted to float32 first. So the dots here ask for float32 results and
# take each transposed operand as a copy (`_transposed`). bf16 convolutions
# are converted too: the 32->64 conv multiplies as im2col.


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
  """`a @ b` of bf16 operands, its result float32: YNNPACK's bf16 dot."""
  return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _transposed(a: jax.Array) -> jax.Array:
  """`a.T`, laid out as a copy, so that a dot reads it as it reads `a`.

  XLA folds a plain `.T` into the dot's dimension numbers, which sends a
  bf16 dot to a float32 conversion; through a 3-D transpose (rows taken
  16 at a time, the fastest tried) it does not. The 32->64 conv's kernel
  gradient, its patches transposed `(288, 25088)` times the output
  gradient: 4.5 ms so, 25 ms converted (2-core AMD EPYC Zen 5, one core,
  2026-12-03).
  """
  n, k = a.shape
  rows = math.gcd(n, 16)
  return a.reshape(n // rows, rows, k).transpose(2, 0, 1).reshape(k, n)


@jax.custom_vjp
def matmul_bf16(a: jax.Array, b: jax.Array) -> jax.Array:
  """`a @ b` of float32 matrices, computed from their bf16 roundings.

  Accumulated in float32, with a float32 result; the gradients too are
  bf16 products with float32 results: the incoming gradient times `b`
  transposed, and `a` transposed times it. Plain `jax.grad` of a bf16 dot
  would keep only the forward product in bf16.
  """
  return _matmul_bf16_fwd(a, b)[0]


def _matmul_bf16_fwd(a, b):
  a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  return _dot(a, b), (a, b)


def _matmul_bf16_bwd(residuals, g):
  a, b = residuals
  g = g.astype(jnp.bfloat16)
  return _dot(g, _transposed(b)), _dot(_transposed(a), g)


matmul_bf16.defvjp(_matmul_bf16_fwd, _matmul_bf16_bwd)


@jax.custom_vjp
def conv_same_bf16(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`conv_same` as `matmul_bf16` of its bf16 patches, in evaluation too.

  XLA converts a bf16 convolution to float32, so even where no gradient is
  taken the convolution is the patches (in bf16, half the bytes) times the
  kernel. The input gradient is added back (col2im) in float32.
  """
  return _conv_same_bf16_fwd(x, kernel)[0]


def _bf16_patches(x: jax.Array, kh: int, kw: int) -> jax.Array:
  """`_patches` of `x` rounded to bf16, built as their 16-bit patterns.

  XLA's CPU backend runs bf16 pads and concatenations, which only move
  data, through float32: the patches of one step took 30 ms so, 2.6 as
  uint16 (one core, 2-core AMD EPYC Zen 5, 2026-12-03).
  """
  bits = lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
  return lax.bitcast_convert_type(_patches(bits, kh, kw), jnp.bfloat16)


def _conv_same_bf16_fwd(x, kernel):
  kh, kw, _, cout = kernel.shape
  patches = _bf16_patches(x, kh, kw)
  y, residuals = _matmul_bf16_fwd(patches, kernel.reshape(-1, cout))
  return y.reshape(*x.shape[:3], cout), (residuals, kernel.shape)


def _conv_same_bf16_bwd(residuals, g):
  residuals, (kh, kw, cin, cout) = residuals
  dpatches, dkernel = _matmul_bf16_bwd(residuals, g.reshape(-1, cout))
  dx = _col2im(dpatches, (*g.shape[:3], cin), kh, kw)
  return dx, dkernel.reshape(kh, kw, cin, cout)


conv_same_bf16.defvjp(_conv_same_bf16_fwd, _conv_same_bf16_bwd)


def conv_general_dilated_bf16(lhs, rhs, *args, **kwargs):
  """`lax.conv_general_dilated` for `nnx.Conv`, computed by `conv_same_bf16`."""
  _check_supported(lhs, rhs, *args, **kwargs)
  return conv_same_bf16(lhs, rhs)


def dot_general_bf16(
    lhs,
    rhs,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    out_sharding=None,
):
  """`lax.dot_general` for `nnx.Linear`, computed by `matmul_bf16`.

  Only for what `nnx.Linear` asks of it: the last axis of `lhs` times a
  kernel matrix, default precision, a float32 result.
  """
  supported = (
      rhs.ndim == 2
      and dimension_numbers == (((lhs.ndim - 1,), (0,)), ((), ()))
      and precision is None
      and preferred_element_type in (None, jnp.float32)
      and out_sharding is None
  )
  if not supported:
    raise ValueError(
        'matmul_bf16 supports only the last axis of the inputs times a '
        'kernel matrix, default precision, float32 results'
    )
  y = matmul_bf16(lhs.reshape(-1, lhs.shape[-1]), rhs)
  return y.reshape(*lhs.shape[:-1], rhs.shape[1])


@contextlib.contextmanager
def bf16_layers(model: nnx.Module):
  """Within the block, `model`'s matmuls take bf16 operands, float32 results.

  Each `nnx.Linear` multiplies through `dot_general_bf16`, each `nnx.Conv`
  of more than one input channel through `conv_general_dilated_bf16`, in
  training and evaluation; the previous functions are put back on exit.
  Convolutions of one channel (nine multiply-adds a pixel, not a matmul)
  stay float32, as does all element-wise work (BatchNorm, ReLU, pooling,
  dropout: bf16 ran it 1.6 times slower, Intel AMX, 2026-12).
  """
  convs = [c for c in _modules(model, nnx.Conv) if c.in_features > 1]
  with (
      _fields_set(convs, 'conv_general_dilated', conv_general_dilated_bf16),
      _fields_set(_modules(model, nnx.Linear), 'dot_general', dot_general_bf16),
  ):
    yield


# Lever 4: dropout masks from narrow random draws.


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


class NarrowBitsDropout(nnx.Dropout):
  """`nnx.Dropout`, its mask drawn from 8 or 16 bits an element, not 32.

  The same state (its `RngStream`), so checkpoints do not change; another
  random stream, the same distribution, the keep rate within 0.1% of
  1 - rate (see `narrow_keep_bits`), and kept inputs scaled by the inverse
  of that rate, so the expectation is exact. JAX's partitionable threefry
  spends one 32-bit word an element whatever the width; the original
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
    with jax.threefry_partitionable(False):
      draws = jax.random.bits(
          self.rngs(),
          inputs.shape,
          dtype,
          out_sharding=jax.typeof(inputs).sharding,
      )
    keep = threshold / 2 ** jnp.iinfo(dtype).bits
    return lax.select(draws < threshold, inputs / keep, jnp.zeros_like(inputs))


@contextlib.contextmanager
def narrow_dropout(model: nnx.Module):
  """Within the block, `model`'s `nnx.Dropout`s are `NarrowBitsDropout`s.

  The modules themselves, their class changed and put back on exit: their
  state, and whatever refers to them, stay as they are.
  """
  dropouts = [m for m in _modules(model, nnx.Dropout) if type(m) is nnx.Dropout]
  for dropout in dropouts:
    # Not `dropout.__class__ = ...`: nnx would record a field '__class__'.
    object.__setattr__(dropout, '__class__', NarrowBitsDropout)
  try:
    yield
  finally:
    for dropout in dropouts:
      object.__setattr__(dropout, '__class__', nnx.Dropout)
