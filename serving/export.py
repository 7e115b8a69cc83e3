"""Exports the trained model as a TensorFlow SavedModel for TF Serving.

TF Serving watches `<base>/<model name>/` and loads any new integer version
directory in it, so every export goes to the next version, written under a
hidden name and renamed into place when whole. The serialised computation runs
on CPU and CUDA servers; warm-up requests let TF Serving compile it before the
first user request.
"""

import os

from absl import logging
from flax import nnx
from serving import image_decoding
import jax
import models
import numpy as np
from orbax.export import ExportManager, JaxModule, ServingConfig
from serving.signatures import BYTES_INPUT_NAME, BYTES_SIGNATURE, IMAGE_SHAPE, INPUT_NAME, SIGNATURES
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2

# What the serialised JAX computation is lowered for ('cuda' for TF Serving's
# GPU image); TensorFlow runs the one it is on.
PLATFORMS = ('cpu', 'cuda')
# Where TF Serving looks for the requests it replays on loading a version.
WARMUP_FILE = os.path.join('assets.extra', 'tf_serving_warmup_requests')
INCOMPLETE = '.incomplete'


def next_version(model_dir: str) -> int:
  """One more than the highest integer version under `model_dir` (1 if none)."""
  if not tf.io.gfile.isdir(model_dir):
    return 1
  versions = [
      int(d) for d in tf.io.gfile.listdir(model_dir) if d.strip('/').isdigit()
  ]
  return max(versions, default=0) + 1


def _serving_configs() -> list[ServingConfig]:
  floats = tf.TensorSpec((None, *IMAGE_SHAPE), tf.float32, name=INPUT_NAME)
  encoded = tf.TensorSpec((None,), tf.string, name=BYTES_INPUT_NAME)
  return [
      ServingConfig(signature_key=list(SIGNATURES), input_signature=[floats]),
      ServingConfig(
          signature_key=BYTES_SIGNATURE,
          input_signature=[encoded],
          tf_preprocessor=image_decoding.decode,
      ),
  ]


def warmup_requests(model_name: str) -> list[prediction_log_pb2.PredictionLog]:
  """One request of one black image per signature, as TF Serving replays them."""
  black = np.zeros((1, *IMAGE_SHAPE), np.uint8)
  return requests(model_name, black.astype(np.float32), black)


def requests(
    model_name: str, images: np.ndarray, pixels: np.ndarray
) -> list[prediction_log_pb2.PredictionLog]:
  """A predict request for each signature, as PredictionLogs.

  The float signatures get `images` (float32 in [0, 1]); `serving_bytes`
  gets `pixels` (the same images as uint8) encoded as PNG files.
  """
  inputs = {key: (INPUT_NAME, images) for key in SIGNATURES}
  inputs[BYTES_SIGNATURE] = (
      BYTES_INPUT_NAME,
      np.array([tf.io.encode_png(p).numpy() for p in pixels], object),
  )
  logs = []
  for key, (name, value) in inputs.items():
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = key
    request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    logs.append(
        prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=request)
        )
    )
  return logs


def _write_warmup_requests(path: str, model_name: str) -> None:
  tf.io.gfile.makedirs(os.path.dirname(path))
  with tf.io.TFRecordWriter(path) as writer:
    for log in warmup_requests(model_name):
      writer.write(log.SerializeToString())


def _remove_incomplete(model_dir: str) -> None:
  """Removes what an export that was killed or failed left half-written."""
  if not tf.io.gfile.isdir(model_dir):
    return
  for name in tf.io.gfile.listdir(model_dir):
    name = name.strip('/')
    if name.startswith('.') and name.endswith(INCOMPLETE):
      logging.warning(
          'Removing an incomplete export: %s', os.path.join(model_dir, name)
      )
      tf.io.gfile.rmtree(os.path.join(model_dir, name))


def export_saved_model(model: models.CNN, model_dir: str) -> str:
  """Writes the eval-mode `model` to `<model_dir>/<next version>/`.

  The float signatures take `(None, 28, 28, 1)` float32 images in [0, 1]
  named 'image', the bytes signature `(None,)` encoded images named
  'image_bytes'; all return 'logits' and 'probabilities', both `(None, 10)`.
  The version appears only when complete, by a rename on the same file system
  (atomic on a local one), so TF Serving never loads a half-written one.

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
      jax2tf_kwargs={'native_serialization_platforms': PLATFORMS},
  )
  _remove_incomplete(model_dir)
  version = str(next_version(model_dir))
  incomplete = os.path.join(model_dir, f'.{version}{INCOMPLETE}')
  ExportManager(module, _serving_configs()).save(incomplete)
  _write_warmup_requests(
      os.path.join(incomplete, WARMUP_FILE), os.path.basename(model_dir)
  )
  path = os.path.join(model_dir, version)
  tf.io.gfile.rename(incomplete, path)
  return path
