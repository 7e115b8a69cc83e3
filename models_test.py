"""Tests of the CNN: the Flax example's, built and called as the example does."""

from flax import nnx
import jax
import jax.numpy as jnp
import models
import numpy as np


def _count(model, *filters) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, *filters)))


def test_output_shape():
  model = models.CNN(nnx.Rngs(0))
  model.eval()
  assert model(jnp.ones((5, 28, 28, 1)), None).shape == (5, models.NUM_CLASSES)


def test_parameter_counts():
  model = models.CNN(nnx.Rngs(0))
  # 3*3*1*32+32 + 3*3*32*64+64 + 3136*256+256 + 256*10+10 weights and biases,
  # and a scale and a bias per BatchNorm channel (32 + 64).
  assert _count(model, nnx.Param) == 824_650
  # Running mean and variance per BatchNorm channel.
  assert _count(model, nnx.Param, nnx.BatchStat) == 824_842


def test_dropout_draws_from_the_rngs_of_the_call_or_the_model_s_own():
  """The model's own streams are part of its state: checkpoints resume them."""
  x = jnp.ones((4, 28, 28, 1))
  model = models.CNN(nnx.Rngs(0), dropout_rate=0.5)
  same = [model(x, nnx.Rngs(dropout=1)) for _ in range(2)]
  np.testing.assert_array_equal(*same)
  counts = [int(d.rngs.count[...]) for d in (model.dropout1, model.dropout2)]
  own = model(x)
  assert [int(d.rngs.count[...]) for d in (model.dropout1, model.dropout2)] == [
      c + 1 for c in counts
  ]
  assert not np.array_equal(own, same[0])
  model.eval()
  np.testing.assert_array_equal(model(x, None), model(x))
