"""Exports the trained model as a TensorFlow SavedModel for TF Serving.

TF Serving watches `<base>/<model name>/` and serves the highest integer
version directory in it, so every export goes to a new version directory.
`export_checkpoint` exports the model of a workdir's latest checkpoint
(`main.py --mode=export`), without training.
"""

import os

from absl import logging
import checkpoints
import config_validation
from flax import nnx
import jax
import ml_collections
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
  versions = [
      int(d) for d in tf.io.gfile.listdir(model_dir) if d.strip('/').isdigit()
  ]
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


def export_checkpoint(config: ml_collections.ConfigDict, workdir: str) -> str:
  """Exports the model of the latest checkpoint in `workdir`.

  Returns:
    The version directory written, under
    `workdir/export/<config.export_model_name>/`.

  Raises:
    config_validation.ConfigError: a field of `config` is not allowed.
    checkpoints.WorkdirError: no checkpoint, or one of another config.
  """
  config_validation.validate(config)
  saved, meta = checkpoints.latest(config, workdir, training=False)
  if meta is None:
    raise checkpoints.WorkdirError(
        f'no checkpoint in {saved.directory}: train first, with the same '
        '--workdir and --config'
    )
  # Any initial values do: the checkpoint replaces them all.
  model = models.CNN(dropout_rate=config.dropout_rate, rngs=nnx.Rngs(0))
  checkpoints.restore(saved, meta['step'], model=model)
  path = export_saved_model(
      model, os.path.join(workdir, 'export', config.export_model_name)
  )
  logging.info(
      'Exported the model of the checkpoint (%s) in %s to %s',
      checkpoints.position(meta['step'], meta['steps_per_epoch']),
      saved.directory,
      path,
  )
  return path
