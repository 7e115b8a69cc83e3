"""Kernels for Flax's layers on a CPU: convolutions as matmuls, bf16 matmuls.

XLA's CPU backend runs a convolution's transposed gradients slowly, above
all inside `lax.scan`; as matmuls (im2col) the same sums run fast. bf16
operands with float32 results, forward and backward, as a TPU's default
precision, where the CPU multiplies bf16 natively. `lax` computes the rest.
"""

import functools
import itertools
import math

import jax
from jax import lax
import jax.numpy as jnp

_NHWC = ('NHWC', 'HWIO', 'NHWC')


def _conv(x, kernel):
  """Stride-1 'SAME' convolution, NHWC images and HWIO kernel."""
  return lax.conv_general_dilated(
      x, kernel, (1, 1), 'SAME', dimension_numbers=_NHWC
  )


def _pad(x, kh: int, kw: int) -> jax.Array:
  """`x` with the zero border that a 'SAME' kernel reads."""
  return jnp.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))


def _shifted(x, kh: int, kw: int) -> list[jax.Array]:
  """The `kh * kw` windows of `_pad(x)` that a 'SAME' kernel's taps read."""
  h, w = x.shape[1:3]
  padded = _pad(x, kh, kw)
  return [padded[:, i : i + h, j : j + w] for i in range(kh) for j in range(kw)]


def _patches(x, kh: int, kw: int) -> jax.Array:
  """im2col: `(B*H*W, kh*kw*C)`, the inputs of each output pixel in a row."""
  windows = jnp.concatenate(_shifted(x, kh, kw), axis=-1)
  return windows.reshape(-1, kh * kw * x.shape[-1])


def _col2im(patch_grads, shape, kh: int, kw: int) -> jax.Array:
  """The transpose of `_patches`, from rows of the `_pad`ded output gradient's
  pixels: each tap's window of them, mirrored, is its part; summed in one pass.
  """
  b, h, w, c = shape
  taps = patch_grads.reshape(b, h + kh - 1, w + kw - 1, kh * kw, c)
  starts = itertools.product(range(kh - 1, -1, -1), range(kw - 1, -1, -1))
  slices = [taps[:, i : i + h, j : j + w, t] for t, (i, j) in enumerate(starts)]
  return sum(slices[1:], slices[0])


@jax.custom_vjp
def conv_same(x, kernel):
  """`_conv`, trained as matmuls: the patches give the kernel gradient and,
  but for one input channel (nine taps), the forward pass; `_conv` computes
  it where no gradient is taken, as in evaluation.
  """
  return _conv(x, kernel)


def _conv_same_fwd(x, kernel):
  kh, kw, cin, cout = kernel.shape
  if cin == 1:
    return _conv(x, kernel), (x, kernel)
  patches = _patches(x, kh, kw)
  y = patches @ kernel.reshape(-1, cout)
  return y.reshape(*x.shape[:3], cout), (patches, kernel)


def _conv_same_bwd(residuals, g):
  xs, kernel = residuals  # `x` for one input channel, else its patches.
  kh, kw, cin, cout = kernel.shape
  if cin == 1:  # The taps' windows as rows, not a transposed copy.
    rows = jnp.stack(_shifted(xs, kh, kw)).reshape(kh * kw, -1)
  else:
    rows = xs.T
  dkernel = (rows @ g.reshape(-1, cout)).reshape(kernel.shape)
  dpatches = _pad(g, kh, kw).reshape(-1, cout) @ kernel.reshape(-1, cout).T
  return _col2im(dpatches, (*g.shape[:3], cin), kh, kw), dkernel


conv_same.defvjp(_conv_same_fwd, _conv_same_bwd)

# bf16 operands, float32 results: YNNPACK's bf16 dot. XLA gives it only dots
# whose left operand is contracted on its last axis, the right on its first
# (xla/backends/cpu/ynn_support.cc), and converts the others to float32: a
# transposed operand is a copy XLA does not fold.
_dot = functools.partial(jnp.dot, preferred_element_type=jnp.float32)


def _transposed(a) -> jax.Array:
  """`a.T` laid out as a copy (a plain `.T` is folded into the dot)."""
  n, k = a.shape
  rows = math.gcd(n, 16)  # Rows moved 16 at a time: the fastest tried.
  return a.reshape(n // rows, rows, k).transpose(2, 0, 1).reshape(k, n)


@jax.custom_vjp
def matmul_bf16(a, b):
  """`a @ b` of float32 matrices from their bf16 roundings, a float32 result;
  its gradients too (`jax.grad` of a bf16 dot keeps only the forward one).
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


def _bf16_patches(x, kh: int, kw: int) -> jax.Array:
  """`_patches` of `x` rounded to bf16, moved as bits: XLA's CPU backend
  moves bf16 through float32, uint16 as it is, uint32 pairs faster still.
  """
  x = x.astype(jnp.bfloat16)
  if x.shape[-1] % 2:
    words = lax.bitcast_convert_type(x, jnp.uint16)
  else:  # Pairs of channels.
    words = lax.bitcast_convert_type(x.reshape(*x.shape[:3], -1, 2), jnp.uint32)
  patches = lax.bitcast_convert_type(_patches(words, kh, kw), jnp.bfloat16)
  return patches.reshape(-1, kh * kw * x.shape[-1])


def _bf16_kernel_gradient(x, g, kh: int, kw: int) -> jax.Array:
  """`_bf16_patches(x).T @ g`, the kernel gradient, `g` bf16: windows of `x`
  transposed to (C, H, W, B), pairs of images as uint32 words: a transposed
  copy moves slowly.
  """
  b, h, w, c = x.shape
  if b % 2:  # Pairs of images: one more, of zeros, adds nothing.
    x, g = (jnp.pad(a, ((0, 1), (0, 0), (0, 0), (0, 0))) for a in (x, g))
    b += 1
  bits = lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
  pairs = bits.transpose(3, 1, 2, 0).reshape(c, h, w, b // 2, 2)
  words = _shifted(lax.bitcast_convert_type(pairs, jnp.uint32), kh, kw)
  halves = lax.bitcast_convert_type(jnp.concatenate(words, axis=0), jnp.uint16)
  patches_t = halves.reshape(kh * kw * c, h * w * b)
  patches_t = lax.bitcast_convert_type(patches_t, jnp.bfloat16)
  return _dot(patches_t, g.transpose(1, 2, 0, 3).reshape(-1, g.shape[-1]))


@jax.custom_vjp
def conv_same_bf16(x, kernel):
  """`conv_same` as bf16 matmuls with float32 results, in evaluation too."""
  return _conv_same_bf16_fwd(x, kernel)[0]


def _conv_same_bf16_fwd(x, kernel):
  kh, kw, _, cout = kernel.shape
  matrix = kernel.reshape(-1, cout).astype(jnp.bfloat16)
  y = _dot(_bf16_patches(x, kh, kw), matrix)
  return y.reshape(*x.shape[:3], cout), (x, kernel)


def _conv_same_bf16_bwd(residuals, g):
  x, kernel = residuals
  kh, kw, _, cout = kernel.shape
  g = g.astype(jnp.bfloat16)
  matrix = kernel.reshape(-1, cout).astype(jnp.bfloat16)
  dpatches = _dot(_pad(g, kh, kw).reshape(-1, cout), _transposed(matrix))
  dkernel = _bf16_kernel_gradient(x, g, kh, kw).reshape(kernel.shape)
  return _col2im(dpatches, x.shape, kh, kw), dkernel


conv_same_bf16.defvjp(_conv_same_bf16_fwd, _conv_same_bf16_bwd)


def _covered(lhs, rhs, window_strides, padding, **kwargs) -> bool:
  """Whether `conv_same` computes this `lax.conv_general_dilated` call."""
  ones = (None, (1, 1))
  unset = ('precision', 'preferred_element_type', 'out_sharding')
  return (
      lhs.ndim == 4
      and tuple(window_strides) == (1, 1)
      and padding == 'SAME'
      and all(kwargs.get(k) in ones for k in ('lhs_dilation', 'rhs_dilation'))
      and kwargs.get('feature_group_count', 1) == 1
      and all(kwargs.get(k) is None for k in unset)
      and kwargs.get('dimension_numbers')
      == lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC)
      and rhs.shape[0] % 2 == rhs.shape[1] % 2 == 1
  )


def conv_general_dilated(lhs, rhs, *args, **kwargs):
  """`lax.conv_general_dilated` for `nnx.Conv`, trained as matmuls."""
  if _covered(lhs, rhs, *args, **kwargs):
    return conv_same(lhs, rhs)
  return lax.conv_general_dilated(lhs, rhs, *args, **kwargs)


def conv_general_dilated_bf16(lhs, rhs, *args, **kwargs):
  """`conv_general_dilated` in bf16 matmuls, but for one input channel."""
  if _covered(lhs, rhs, *args, **kwargs) and rhs.shape[2] > 1:
    return conv_same_bf16(lhs, rhs)
  return conv_general_dilated(lhs, rhs, *args, **kwargs)


def dot_general_bf16(lhs, rhs, dimension_numbers, precision=None, **kwargs):
  """`lax.dot_general` for `nnx.Linear`, in bf16: inputs times a kernel."""
  if (
      rhs.ndim == 2
      and dimension_numbers == (((lhs.ndim - 1,), (0,)), ((), ()))
      and precision is None
      and kwargs.get('preferred_element_type') in (None, jnp.float32)
      and kwargs.get('out_sharding') is None
  ):
    y = matmul_bf16(lhs.reshape(-1, lhs.shape[-1]), rhs)
    return y.reshape(*lhs.shape[:-1], rhs.shape[1])
  return lax.dot_general(lhs, rhs, dimension_numbers, precision, **kwargs)
