"""Tests of the CNN."""

from flax import nnx
import jax
import jax.numpy as jnp
import models


def _count(model, *filters) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, *filters)))


def test_output_shape():
  model = models.CNN(dropout_rate=0.025, rngs=nnx.Rngs(0))
  assert model(jnp.ones((5, 28, 28, 1))).shape == (5, models.NUM_CLASSES)


def test_parameter_counts():
  model = models.CNN(dropout_rate=0.025, rngs=nnx.Rngs(0))
  # 3*3*1*32+32 + 3*3*32*64+64 + 3136*256+256 + 256*10+10 weights and biases,
  # and a scale and a bias per BatchNorm channel (32 + 64).
  assert _count(model, nnx.Param) == 824_650
  # Running mean and variance per BatchNorm channel.
  assert _count(model, nnx.Param, nnx.BatchStat) == 824_842
