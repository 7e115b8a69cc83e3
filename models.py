"""The convolutional network of the Flax MNIST example, in Flax NNX."""

import functools

from flax import nnx
import jax
from serving_signatures import NUM_CLASSES


class CNN(nnx.Module):
  """A simple CNN: two conv/BatchNorm/ReLU/avg-pool blocks, then two dense layers.

  Layer for layer the `CNN` of the Flax MNIST example: 824,650 parameters
  (`nnx.Param`), plus 192 BatchNorm running statistics. The dropout layers
  hold their own random stream, so a checkpoint of the model resumes it.
  """

  def __init__(self, *, dropout_rate: float, rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
    self.batch_norm1 = nnx.BatchNorm(32, rngs=rngs)
    self.dropout1 = nnx.Dropout(rate=dropout_rate, rngs=rngs)
    self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
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
    x = x.reshape(x.shape[0], -1)  # flatten
    x = nnx.relu(self.dropout2(self.linear1(x)))
    x = self.linear2(x)
    return x
