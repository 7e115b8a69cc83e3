"""The BatchNorm a CPU trains with: Flax's results, state and gradients."""

from cpu import batch_norm
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest


def _layers(features=4):
  """A stock BatchNorm and ours, the same non-trivial scale and bias."""
  pair = []
  for cls in (nnx.BatchNorm, batch_norm.BatchNorm):
    layer = cls(features, rngs=nnx.Rngs(0))
    layer.scale[...] = jnp.linspace(0.5, 2.0, features)
    layer.bias[...] = jnp.linspace(-0.3, 0.3, features)
    pair.append(layer)
  return pair


def _inputs(shape=(6, 5, 3, 4), seed=0):
  rng = np.random.default_rng(seed)
  # Far from zero mean and unit variance, as a layer's activations are.
  return jnp.asarray(rng.normal(2.0, 3.0, shape).astype(np.float32))


def test_training_matches_flax_s_outputs_running_averages_and_gradients():
  x = _inputs()
  weights = _inputs(seed=1)

  def loss(layer, x):
    y = layer(x)
    return (y * weights).sum() + (y**2).sum()

  results = []
  for layer in _layers():
    value = loss(layer, x)  # Updates the running averages once more.
    grads, x_grad = nnx.grad(loss, argnums=(0, 1))(layer, x)
    results.append((value, layer.mean[...], layer.var[...], grads, x_grad))
  stock, ours = results
  np.testing.assert_allclose(ours[0], stock[0], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(ours[1:]), jax.tree.leaves(stock[1:])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_the_statistics_own_gradients_are_their_derivatives():
  """A loss that reads the batch statistics gets their gradient too."""
  x = _inputs()
  scale, bias = jnp.full(4, 1.5), jnp.full(4, 0.2)

  def loss(x):
    y, mean, var = batch_norm.batch_norm(x, scale, bias, 1e-5)
    return (y**3).sum() + (mean**2).sum() + (var * mean).sum()

  def reference(x):
    mean = x.mean((0, 1, 2))
    var = jnp.maximum(0.0, (x * x).mean((0, 1, 2)) - mean * mean)
    y = (x - mean) * (jax.lax.rsqrt(var + 1e-5) * scale) + bias
    return (y**3).sum() + (mean**2).sum() + (var * mean).sum()

  np.testing.assert_allclose(
      jax.grad(loss)(x), jax.grad(reference)(x), rtol=1e-4, atol=1e-4
  )


@pytest.mark.parametrize(
    'call',
    [
        pytest.param(
            lambda layer, x: layer(x, use_running_average=True), id='eval'
        ),
        pytest.param(lambda layer, x: layer(x, mask=x > 1.0), id='mask'),
        pytest.param(
            lambda layer, x: layer(x.astype(jnp.bfloat16)), id='bfloat16'
        ),
    ],
)
def test_what_it_does_not_cover_is_flax_s(call):
  x = _inputs()
  stock, ours = _layers()
  stock_y, our_y = call(stock, x), call(ours, x)
  assert our_y.dtype == stock_y.dtype
  np.testing.assert_array_equal(our_y, stock_y)
  np.testing.assert_array_equal(ours.mean[...], stock.mean[...])
