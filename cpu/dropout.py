"""`nnx.Dropout` with its mask drawn from 8 or 16 random bits an element.

JAX draws 32 bits for each element of a mask; 16 keep at 0.975 to within
0.1% (63,898 of 65,536 values), 8 at 0.5 exactly. Packing 2 or 4 draws in
each word of JAX's threefry draws fewer: another random stream, the same
distribution, and `nnx.Dropout`'s state, so checkpoints restore into either.
"""

import math

from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp


def narrow_keep_bits(keep: float) -> tuple[jnp.dtype, int] | None:
  """The dtype of the narrowest unsigned draw that keeps with probability
  `keep`, to 0.1%, and the threshold below which a draw keeps; None where even
  32 bits do not come within 0.1% (`keep` below about 1e-7, or 0).
  """
  for dtype in (jnp.uint8, jnp.uint16, jnp.uint32):
    values = 2 ** jnp.iinfo(dtype).bits
    threshold = round(keep * values)
    if 0 < threshold < values and abs(threshold / values - keep) <= keep / 1000:
      return dtype, threshold
  return None


def narrow_draws(key: jax.Array, shape, dtype) -> jax.Array:
  """Uniform `dtype` draws, chunk `j` of word `i` draw `i + j * words`: not
  JAX's interleaved ones, whose transpose XLA repeats in each fusion that
  reads the mask.
  """
  bits = jnp.iinfo(dtype).bits
  size = math.prod(shape)
  with jax.threefry_partitionable(False):  # A word per 32 bits, not per draw.
    words = jax.random.bits(key, (-(-size // (32 // bits)),), jnp.uint32)
  chunks = [(words >> (bits * j)).astype(dtype) for j in range(32 // bits)]
  return jnp.concatenate(chunks)[:size].reshape(shape)


class NarrowDropout(nnx.Dropout):
  """`nnx.Dropout`, its mask from `narrow_draws` where that covers the call;
  kept inputs divided by the rate the threshold keeps: the expectation is exact.
  """

  def __call__(self, inputs, *, deterministic=None, rngs=None):
    keep_bits = narrow_keep_bits(1.0 - self.rate)
    off = self.deterministic if deterministic is None else deterministic
    stream = rngs if rngs is not None else self.rngs
    if off or keep_bits is None or self.broadcast_dims or stream is None:
      return super().__call__(inputs, deterministic=deterministic, rngs=rngs)
    if isinstance(stream, nnx.Rngs):
      stream = stream[self.rng_collection]
    if not isinstance(stream, nnx.RngStream):  # A key.
      return super().__call__(inputs, deterministic=deterministic, rngs=rngs)
    dtype, threshold = keep_bits
    keep = threshold / 2 ** jnp.iinfo(dtype).bits
    draws = narrow_draws(stream(), inputs.shape, dtype)
    return lax.select(
        draws < dtype(threshold), inputs / keep, jnp.zeros_like(inputs)
    )
