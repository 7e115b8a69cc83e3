"""Exports the trained model as a TensorFlow SavedModel for TF Serving.

TF Serving watches `<base>/<model name>/` and serves the highest integer
version directory in it, so every export goes to a new version directory.
"""

import os

from flax import nnx
import jax
import models
from orbax.export import ExportManager, JaxModule, ServingConfig
import tensorflow as tf

# Signatures of the SavedModel: TF Serving's REST API uses 'serving_default'
# when a request names none.
SIGNATURES = ('serving_default', 'mnist_server')
INPUT_NAME = 'image'
IMAGE_SHAPE = (28, 28, 1)


def next_version(model_dir: str) -> int:
  """One more than the highest integer version under `model_dir` (1 if none)."""
  if not tf.io.gfile.isdir(model_dir):
    return 1
  versions = [int(d) for d in tf.io.gfile.listdir(model_dir) if d.strip('/').isdigit()]
  return max(versions, default=0) + 1


def export_saved_model(model: models.CNN, model_dir: str) -> str:
  """Writes the eval-mode `model` to `<model_dir>/<next version>/`.

  The signatures take `(None, 28, 28, 1)` float32 images in [0, 1] named
  'image' and return 'logits' and 'probabilities', both `(None, 10)`.

  Returns:
    The version directory written.
  """
  model.eval()
  graphdef, weights, rest = nnx.split(model, (nnx.Param, nnx.BatchStat), ...)

  def predict(weights, images):
    logits = nnx.merge(graphdef, weights, rest)(images)
    return {'logits': logits, 'probabilities': jax.nn.softmax(logits)}

  module = JaxModule(
      weights,
      predict,
      input_polymorphic_shape='(b, ...)',
  )
  serving = ServingConfig(
      signature_key=list(SIGNATURES),
      input_signature=[
          tf.TensorSpec((None, *IMAGE_SHAPE), tf.float32, name=INPUT_NAME)
      ],
  )
  path = os.path.join(model_dir, str(next_version(model_dir)))
  ExportManager(module, [serving]).save(path)
  return path

