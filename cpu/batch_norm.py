"""`nnx.BatchNorm` in training with its gradient written out: fewer passes.

JAX's gradient of Flax's normalisation keeps the centred input, the normalised
one and the output, each a whole array that XLA's CPU backend writes. Written
out, the forward pass writes only the output and the backward pass reads only
the input and its statistics: the same sums in float32, to rounding.
"""

import functools

from flax import nnx
from flax.nnx.module import first_from
import jax
from jax import lax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def batch_norm(x, scale, bias, epsilon: float):
  """`x` normalised over all axes but the last, as Flax's fast variance does,
  with the batch's mean and variance.
  """
  return _batch_norm_fwd(x, scale, bias, epsilon)[0]


def _batch_norm_fwd(x, scale, bias, epsilon):
  axes = tuple(range(x.ndim - 1))
  mean = x.mean(axes)
  var = jnp.maximum(0.0, (x * x).mean(axes) - mean * mean)
  inv = lax.rsqrt(var + epsilon)
  y = (x - mean) * (inv * scale) + bias
  return (y, mean, var), (x, mean, inv, scale)


def _batch_norm_bwd(epsilon, residuals, cotangents):
  del epsilon  # In `inv`.
  x, mean, inv, scale = residuals
  gy, gmean, gvar = cotangents
  axes = tuple(range(x.ndim - 1))
  n = x.size // x.shape[-1]
  centred = x - mean
  normalised = centred * inv
  gbias = gy.sum(axes)
  gscale = (gy * normalised).sum(axes)
  gx = (scale * inv / n) * (n * gy - gbias - normalised * gscale)
  # The statistics' own cotangents: zeros where only the running averages
  # read them, as in `BatchNorm`.
  gx += gmean / n + (2 / n) * gvar * centred
  return gx, gscale, gbias


batch_norm.defvjp(_batch_norm_fwd, _batch_norm_bwd)


class BatchNorm(nnx.BatchNorm):
  """`nnx.BatchNorm`, its batch statistics' pass by `batch_norm` where that
  covers the call: the same state and results.
  """

  def __call__(self, x, use_running_average=None, *, mask=None):
    running = first_from(
        use_running_average,
        self.use_running_average,
        error_msg='BatchNorm has no use_running_average, at the call or built',
    )
    covered = (
        not running
        and mask is None
        and self.axis_name is None
        and self.axis in (-1, x.ndim - 1)
        and self.scale is not None
        and self.bias is not None
        and self.use_fast_variance
        and self.dtype is None
        and x.dtype == self.param_dtype == jnp.float32
    )
    if not covered:
      return super().__call__(x, use_running_average, mask=mask)
    y, mean, var = batch_norm(x, self.scale[...], self.bias[...], self.epsilon)
    momentum = self.momentum
    for average, batch in ((self.mean, mean), (self.var, var)):
      average[...] = lax.stop_gradient(
          momentum * average[...] + (1 - momentum) * batch
      )
    return y
