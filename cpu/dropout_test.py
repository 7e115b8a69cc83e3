"""Dropout from narrow draws: the same distribution, the same state."""

import functools

from cpu import dropout
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.mark.parametrize(
    'keep, expected',
    [
        (0.5, (jnp.uint8, 128)),
        (0.75, (jnp.uint8, 192)),
        (0.975, (jnp.uint16, 63898)),  # 8 bits: 250 / 256 = 0.9766, 0.16% off.
        (0.001, (jnp.uint32, 4294967)),
        (1.0, None),
        (0.0, None),
    ],
)
def test_narrow_keep_bits_are_the_narrowest_within_a_thousandth(keep, expected):
  assert dropout.narrow_keep_bits(keep) == expected


def test_every_keep_rate_is_kept_within_a_thousandth():
  for keep in np.linspace(0.001, 0.999, 999):
    dtype, threshold = dropout.narrow_keep_bits(keep)
    got = threshold / 2 ** jnp.iinfo(dtype).bits
    assert abs(got - keep) <= keep / 1000, keep


@pytest.mark.parametrize('dtype', [jnp.uint8, jnp.uint16])
def test_narrow_draws_are_uniform_and_share_no_bits_without_a_transpose(dtype):
  shape = (64, 28, 28, 32)
  draw = functools.partial(dropout.narrow_draws, shape=shape, dtype=dtype)
  draws = np.asarray(draw(jax.random.key(0)))
  assert draws.shape == shape and draws.dtype == dtype
  uniform = draws.ravel() / np.iinfo(dtype).max
  n = uniform.size
  assert abs(uniform.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
  # Draws i and i + words come from one word: their bits are independent.
  words = n // (32 // jnp.iinfo(dtype).bits)
  corr = np.corrcoef(uniform[:-words], uniform[words:])[0, 1]
  assert abs(corr) < 5 / np.sqrt(n - words)
  assert 'transpose' not in jax.jit(draw).lower(jax.random.key(0)).as_text()


@pytest.mark.parametrize('rate', [0.025, 0.5])
def test_narrow_dropout_keeps_at_the_rate_with_the_same_state(rate):
  stock = nnx.Dropout(rate, rngs=nnx.Rngs(0))
  narrow = dropout.NarrowDropout(rate, rngs=nnx.Rngs(0))
  assert jax.tree.structure(nnx.state(narrow)) == jax.tree.structure(
      nnx.state(stock)
  )
  x = np.ones((128, 28, 28, 32), np.float32)
  expected = np.asarray(stock(x))
  got = np.asarray(nnx.jit(lambda d, x: d(x))(narrow, x))
  assert int(narrow.rngs.count[...]) == 1  # One key drawn.
  kept = got != 0
  # Within 5 standard deviations of the binomial's mean (3.2M draws).
  sigma = np.sqrt(rate * (1 - rate) / kept.size)
  assert abs(kept.mean() - (1 - rate)) < 5 * sigma + (1 - rate) / 1000
  assert abs(got.mean() - 1) < 5 * sigma / (1 - rate)  # Scaled to keep it.
  assert not np.array_equal(got != 0, expected != 0)  # Another stream.


def test_a_rate_that_needs_32_bit_draws_compares_them_as_unsigned():
  narrow = dropout.NarrowDropout(1e-9, rngs=nnx.Rngs(0))
  assert dropout.narrow_keep_bits(1 - 1e-9)[1] > np.iinfo(np.int32).max
  assert (np.asarray(narrow(np.ones((64, 64), np.float32))) != 0).all()


def test_narrow_dropout_draws_16_bits_and_only_in_training():
  layer = dropout.NarrowDropout(0.025, rngs=nnx.Rngs(0))
  x = np.ones((64, 28, 28, 32), np.float32)
  graphdef, state = nnx.split(layer)
  call = lambda state, x: nnx.merge(graphdef, state)(x)
  lowered = jax.jit(call).lower(state, x).as_text()
  assert 'ui16' in lowered  # 0.975 takes 16-bit draws.
  layer.eval()
  np.testing.assert_array_equal(layer(x), x)


def test_the_rngs_of_the_call_as_the_flax_example_passes_them():
  """They take precedence over the layer's own stream, as in `nnx.Dropout`."""
  layer = dropout.NarrowDropout(0.5)  # No stream of its own.
  x = np.ones((8, 100), np.float32)
  first = layer(x, rngs=nnx.Rngs(dropout=3))
  np.testing.assert_array_equal(first, layer(x, rngs=nnx.Rngs(dropout=3)))
  assert not np.array_equal(first, layer(x, rngs=nnx.Rngs(dropout=4)))
  with pytest.raises(ValueError, match='no `rngs`'):
    layer(x)
  np.testing.assert_array_equal(layer(x, deterministic=True), x)
