"""The convolutional network of the Flax MNIST example, in Flax NNX."""

import functools

from flax import nnx

NUM_CLASSES = 10  # The digits.


class CNN(nnx.Module):
  """A simple CNN model: the Flax example's, layer for layer.

  824,650 parameters. Its dropout layers hold their own random streams, which
  a checkpoint resumes; `rngs` at the call, as the example passes it, draws
  from that instead. `layers`: `flax.nnx`, or its layers with faster kernels
  (cpu/layers.py), the same parameters under the same names.
  """

  def __init__(
      self, rngs: nnx.Rngs, *, dropout_rate: float = 0.025, layers=nnx
  ):
    self.conv1 = layers.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
    self.batch_norm1 = layers.BatchNorm(32, rngs=rngs)
    self.dropout1 = layers.Dropout(rate=dropout_rate, rngs=rngs)
    self.conv2 = layers.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
    self.batch_norm2 = layers.BatchNorm(64, rngs=rngs)
    self.avg_pool = functools.partial(
        nnx.avg_pool, window_shape=(2, 2), strides=(2, 2)
    )
    self.linear1 = layers.Linear(3136, 256, rngs=rngs)
    self.dropout2 = layers.Dropout(rate=dropout_rate, rngs=rngs)
    self.linear2 = layers.Linear(256, NUM_CLASSES, rngs=rngs)

  def __call__(self, x, rngs: nnx.Rngs | None = None):
    x = self.avg_pool(
        nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs)))
    )
    x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
    x = x.reshape(x.shape[0], -1)  # flatten
    x = nnx.relu(self.dropout2(self.linear1(x), rngs=rngs))
    x = self.linear2(x)
    return x
