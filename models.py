"""The convolutional network of the Flax MNIST example, in Flax NNX."""

import functools

from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp

NUM_CLASSES = 10
_NHWC = ('NHWC', 'HWIO', 'NHWC')


def _conv(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """Stride-1 'SAME' convolution, NHWC images and HWIO kernel."""
  return lax.conv_general_dilated(x, kernel, (1, 1), 'SAME', dimension_numbers=_NHWC)


def _shifted(x: jax.Array, kh: int, kw: int) -> list[jax.Array]:
  """The `kh * kw` windows of zero-padded `x` that a 'SAME' kernel tap reads."""
  h, w = x.shape[1:3]
  padded = jnp.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
  return [padded[:, i : i + h, j : j + w] for i in range(kh) for j in range(kw)]


@jax.custom_vjp
def conv_same(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`_conv` with a backward pass written as convolutions and matmuls.

  The same function as `lax.conv_general_dilated`; only its gradients are
  formulated differently. On the CPU, XLA's own transposed convolutions
  are slow, above all inside `lax.scan` (where the training loop runs): the
  kernel gradient of the 32->64 conv took 1.7 s per step there, against 20 ms
  as the nine matmuls below.
  """
  return _conv(x, kernel)


def _conv_same_fwd(x, kernel):
  return _conv(x, kernel), (x, kernel)


def _conv_same_bwd(residuals, g):
  x, kernel = residuals
  kh, kw, cin, cout = kernel.shape
  # Input gradient: the 'SAME' convolution with the flipped, transposed kernel.
  dx = _conv(g, jnp.flip(kernel, (0, 1)).transpose(0, 1, 3, 2))
  # Kernel gradient: tap (i, j) is x shifted by (i, j), contracted with g
  # over batch and space.
  windows = _shifted(x, kh, kw)
  g2 = g.reshape(-1, cout)
  if cin == 1:  # One matmul over the (B*H*W, kh*kw) patches.
    patches = jnp.concatenate(windows, axis=-1).reshape(-1, kh * kw)
    dkernel = patches.T @ g2
  else:  # One (cin, B*H*W) x (B*H*W, cout) matmul per tap.
    dkernel = jnp.stack([w.reshape(-1, cin).T @ g2 for w in windows])
  return dx, dkernel.reshape(kh, kw, cin, cout)


conv_same.defvjp(_conv_same_fwd, _conv_same_bwd)


def conv_general_dilated(
    lhs, rhs, window_strides, padding, *, lhs_dilation, rhs_dilation,
    dimension_numbers, feature_group_count, precision, **unused_kwargs,
):
  """`lax.conv_general_dilated` for `nnx.Conv`, for the case the CNN uses.

  Only stride 1, 'SAME' padding, odd kernels, no dilation or groups and NHWC:
  anything else is a programming error, reported rather than computed some
  other way.
  """
  supported = (
      tuple(window_strides) == (1, 1)
      and padding == 'SAME'
      and tuple(lhs_dilation) == (1, 1)
      and tuple(rhs_dilation) == (1, 1)
      and feature_group_count == 1
      and precision is None
      and dimension_numbers == lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC)
      and rhs.shape[0] % 2 == 1
      and rhs.shape[1] % 2 == 1
  )
  if not supported:
    raise ValueError('conv_same supports only stride-1 SAME NHWC convolutions '
                     'with odd kernels, no dilation and no groups')
  return conv_same(lhs, rhs)


class CNN(nnx.Module):
  """Two conv/BatchNorm/ReLU/avg-pool blocks, then a two-layer classifier.

  Layer for layer the NNX `CNN` of the Flax MNIST example: 824,650 parameters
  (`nnx.Param`), plus 192 BatchNorm running statistics. The convolutions
  compute what `nnx.Conv`'s default does, with faster gradients (`conv_same`).
  """

  def __init__(self, *, dropout_rate: float, rngs: nnx.Rngs):
    conv = functools.partial(
        nnx.Conv, kernel_size=(3, 3), conv_general_dilated=conv_general_dilated
    )
    self.conv1 = conv(1, 32, rngs=rngs)
    self.batch_norm1 = nnx.BatchNorm(32, rngs=rngs)
    self.dropout1 = nnx.Dropout(rate=dropout_rate, rngs=rngs)
    self.conv2 = conv(32, 64, rngs=rngs)
    self.batch_norm2 = nnx.BatchNorm(64, rngs=rngs)
    self.avg_pool = functools.partial(
        nnx.avg_pool, window_shape=(2, 2), strides=(2, 2)
    )
    self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
    self.dropout2 = nnx.Dropout(rate=dropout_rate, rngs=rngs)
    self.linear2 = nnx.Linear(256, NUM_CLASSES, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Maps images `(B, 28, 28, 1)` in [0, 1] to logits `(B, 10)`."""
    x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x)))))
    x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
    x = x.reshape(x.shape[0], -1)
    x = nnx.relu(self.dropout2(self.linear1(x)))
    return self.linear2(x)
