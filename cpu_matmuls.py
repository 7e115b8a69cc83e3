"""The CPU levers' matmuls: convolutions as im2col, and bf16 operands.

Two levers of `cpu_levers.applied`, which sets them on a model within its
block (a field of each `nnx.Conv` and `nnx.Linear`, put back on exit):

- `conv_gradients`: the convolutions train as matmuls (im2col), the same
  math, which XLA's CPU backend runs far faster than its transposed
  convolutions;
- `bf16_layers`: those matmuls, and the dense layers', multiply bf16
  operands into float32 results, forward and backward, on CPUs that do so
  natively (`config.matmul_precision`).
"""

import contextlib
import itertools
import math

from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp

_NHWC = ('NHWC', 'HWIO', 'NHWC')


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


def modules(model: nnx.Module, kind: type) -> list:
  """The modules of `model` (itself included) of class `kind`."""
  return [m for _, m in nnx.iter_modules(model) if isinstance(m, kind)]


# The convolutions trained as matmuls (im2col).


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


def _padded_rows(g: jax.Array, kh: int, kw: int) -> jax.Array:
  """`g`'s pixels as rows, with the zero border that `_shifted` pads inputs."""
  pad = ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0))
  return jnp.pad(g, pad).reshape(-1, g.shape[-1])


def _col2im(patch_grads: jax.Array, shape, kh: int, kw: int) -> jax.Array:
  """The transpose of `_patches`: each tap's part added back where it read.

  `patch_grads` has a row for each pixel of the output gradient padded by
  `_padded_rows`, so each tap's shifted window is a slice of it: the
  border's rows are zeros, and padding the output gradient (64 channels)
  before the matmul spares a padded copy of its result (288). As a sum of
  the windows, which XLA computes in one pass, not as `kh * kw` updates of
  a buffer; the same sums in the same order.
  """
  b, h, w, c = shape
  taps = patch_grads.reshape(b, h + kh - 1, w + kw - 1, kh * kw, c)
  windows = [
      taps[:, kh - 1 - i : kh - 1 - i + h, kw - 1 - j : kw - 1 - j + w, t]
      for t, (i, j) in enumerate(itertools.product(range(kh), range(kw)))
  ]
  return sum(windows[1:], windows[0])


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
  dkernel = (patches.T @ g.reshape(-1, cout)).reshape(kernel.shape)
  dpatches = _padded_rows(g, kh, kw) @ kernel.reshape(-1, cout).T
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
  convs = modules(model, nnx.Conv)
  with _fields_set(convs, 'conv_general_dilated', conv_general_dilated):
    yield


# bf16 operands for the matmuls, float32 results, where the CPU multiplies
# bf16 natively.

# XLA's CPU backend gives YNNPACK's bf16 kernels (AMX, avx512_bf16) only
# some bf16 dots (xla/backends/cpu/ynn_support.cc, and the compiled HLO of
# jax 0.10.2): a dot whose result is bf16, or that contracts the first axis
# of its left operand or the last of its right one, has its operands
# converted to float32 first. So the dots here ask for float32 results and
# take each transposed operand as a copy (`_transposed`), or built so
# (`_bf16_kernel_gradient`). bf16 convolutions are converted too: the
# 32->64 conv multiplies as im2col.


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
  """`a @ b` of bf16 operands, its result float32: YNNPACK's bf16 dot."""
  return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _transposed(a: jax.Array) -> jax.Array:
  """`a.T`, laid out as a copy, so that a dot reads it as it reads `a`.

  XLA folds a plain `.T` into the dot's dimension numbers, which sends a
  bf16 dot to a float32 conversion; through a 3-D transpose (rows taken
  16 at a time, the fastest tried) it does not. The first dense layer's
  kernel gradient, its input `(128, 3136)` transposed times the output
  gradient: 0.44 ms so, 0.92 converted (2-core AMD EPYC Zen 5, one core,
  2026-12-04).
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
  """`conv_same` as bf16 matmuls with float32 results, in evaluation too.

  XLA converts a bf16 convolution to float32, so even where no gradient is
  taken the convolution is the bf16 patches times the kernel. Backward,
  the output gradient times the kernel transposed, added back (col2im) in
  float32, is the input gradient; the patches transposed times the output
  gradient (`_bf16_kernel_gradient`) the kernel gradient.
  """
  return _conv_same_bf16_fwd(x, kernel)[0]


def _bf16_patches(x: jax.Array, kh: int, kw: int) -> jax.Array:
  """`_patches` of `x` rounded to bf16, built as their bit patterns.

  XLA's CPU backend runs bf16 pads and concatenations, which only move
  data, through float32: the patches of one step took 30 ms so, 2.6 as
  uint16 (one core, 2-core AMD EPYC Zen 5, 2026-12-03). Pairs of channels
  move as 32-bit words, faster still: 7.7 ms against 16.6 for the 32->64
  conv's forward pass, patches and matmul (one core, Intel Xeon with AMX,
  2026-12-04).
  """
  b, h, w, c = x.shape
  if c % 2:
    bits = lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
    return lax.bitcast_convert_type(_patches(bits, kh, kw), jnp.bfloat16)
  pairs = x.astype(jnp.bfloat16).reshape(b, h, w, c // 2, 2)
  patches = _patches(lax.bitcast_convert_type(pairs, jnp.uint32), kh, kw)
  return lax.bitcast_convert_type(patches, jnp.bfloat16).reshape(
      -1, kh * kw * c
  )


def _bf16_kernel_gradient(x: jax.Array, g: jax.Array, kh: int, kw: int):
  """`_bf16_patches(x).T @ g`, `g` in bf16: the kernel gradient.

  The patches transposed are built as shifted windows of `x` transposed
  to (C, H, W, B), not as a transposed copy of the patches, which XLA's
  CPU backend moves slowly (4.7 ms a step for the 32->64 conv, one core,
  2-core AMD EPYC Zen 5, 2026-12-04). Their columns, and `g`'s rows, are
  the pixels in (h, w, b) order; the windows move pairs of images as
  32-bit words, which XLA moves faster than 16-bit ones.
  """
  b, h, w, c = x.shape
  if b % 2:  # Pairs of images: one more, of zeros, that adds nothing.
    x, g = (jnp.pad(a, ((0, 1), (0, 0), (0, 0), (0, 0))) for a in (x, g))
    b += 1
  bits = lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
  pairs = bits.transpose(3, 1, 2, 0).reshape(c, h, w, b // 2, 2)
  pairs = lax.bitcast_convert_type(pairs, jnp.uint32)
  windows = jnp.concatenate(_shifted(pairs, kh, kw), axis=0)
  bits = lax.bitcast_convert_type(windows, jnp.uint16)
  patches_t = lax.bitcast_convert_type(
      bits.reshape(kh * kw * c, h * w * b), jnp.bfloat16
  )
  return _dot(patches_t, g.transpose(1, 2, 0, 3).reshape(-1, g.shape[-1]))


def _conv_same_bf16_fwd(x, kernel):
  kh, kw, _, cout = kernel.shape
  patches = _bf16_patches(x, kh, kw)
  y = _dot(patches, kernel.reshape(-1, cout).astype(jnp.bfloat16))
  return y.reshape(*x.shape[:3], cout), (x, kernel)


def _conv_same_bf16_bwd(residuals, g):
  x, kernel = residuals
  kh, kw, _, cout = kernel.shape
  g = g.astype(jnp.bfloat16)
  matrix = kernel.reshape(-1, cout).astype(jnp.bfloat16)
  dpatches = _dot(_padded_rows(g, kh, kw), _transposed(matrix))
  dx = _col2im(dpatches, x.shape, kh, kw)
  dkernel = _bf16_kernel_gradient(x, g, kh, kw)
  return dx, dkernel.reshape(kernel.shape)


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
  convs = [c for c in modules(model, nnx.Conv) if c.in_features > 1]
  with (
      _fields_set(convs, 'conv_general_dilated', conv_general_dilated_bf16),
      _fields_set(modules(model, nnx.Linear), 'dot_general', dot_general_bf16),
  ):
    yield
