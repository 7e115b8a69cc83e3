"""Exports the trained model as a TensorFlow SavedModel for TF Serving.

TF Serving loads any new integer version under `<base>/<model name>/`:
each export is the next version, written under a hidden name and renamed
into place when whole. The serialised computation runs on CPU and CUDA
servers; warm-up requests let TF Serving compile it before the first user.
"""

import os

from absl import logging
from flax import nnx
import jax
import numpy as np
from orbax.export import ExportManager, JaxModule, ServingConfig
from serving import image_decoding
from serving.signatures import BYTES_INPUT_NAME, BYTES_SIGNATURE, IMAGE_SHAPE, INPUT_NAME, SIGNATURES
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2

# Where TF Serving looks for the requests it replays on loading a version.
WARMUP_FILE = os.path.join('assets.extra', 'tf_serving_warmup_requests')
INCOMPLETE = '.incomplete'


def next_version(model_dir: str) -> int:
  """One more than the highest integer version under `model_dir` (1 if none)."""
  names = tf.io.gfile.listdir(model_dir) if tf.io.gfile.isdir(model_dir) else []
  return max((int(d) for d in names if d.strip('/').isdigit()), default=0) + 1


def requests(model_name: str, images, pixels) -> list:
  """A PredictionLog of a request for each signature, of `images` (float32).

  serving_bytes' holds `pixels` (the same images as uint8) as PNG files.
  """
  inputs = {key: (INPUT_NAME, images) for key in SIGNATURES}
  pngs = np.array([tf.io.encode_png(p).numpy() for p in pixels], object)
  inputs[BYTES_SIGNATURE] = (BYTES_INPUT_NAME, pngs)
  logs = []
  for key, (name, value) in inputs.items():
    request = predict_pb2.PredictRequest(
        model_spec={'name': model_name, 'signature_name': key},
        inputs={name: tf.make_tensor_proto(value)},
    )
    log = prediction_log_pb2.PredictLog(request=request)
    logs.append(prediction_log_pb2.PredictionLog(predict_log=log))
  return logs


def export_saved_model(model: nnx.Module, model_dir: str) -> str:
  """Writes the eval-mode `model` to `<model_dir>/<next version>/`; returns it.

  Renamed into place on the same file system: atomic on a local one.
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
      jax2tf_kwargs={'native_serialization_platforms': ('cpu', 'cuda')},
  )
  for left in tf.io.gfile.glob(os.path.join(model_dir, f'.*{INCOMPLETE}')):
    logging.warning('Removing an incomplete export: %s', left)
    tf.io.gfile.rmtree(left)
  version = str(next_version(model_dir))
  incomplete = os.path.join(model_dir, f'.{version}{INCOMPLETE}')
  floats = tf.TensorSpec((None, *IMAGE_SHAPE), tf.float32, name=INPUT_NAME)
  encoded = tf.TensorSpec((None,), tf.string, name=BYTES_INPUT_NAME)
  serving_configs = [
      ServingConfig(signature_key=list(SIGNATURES), input_signature=[floats]),
      ServingConfig(
          signature_key=BYTES_SIGNATURE,
          input_signature=[encoded],
          tf_preprocessor=image_decoding.decode,
      ),
  ]
  ExportManager(module, serving_configs).save(incomplete)
  warmup = os.path.join(incomplete, WARMUP_FILE)
  tf.io.gfile.makedirs(os.path.dirname(warmup))
  with tf.io.TFRecordWriter(warmup) as writer:
    black = np.zeros((1, *IMAGE_SHAPE), np.uint8)
    model_name = os.path.basename(model_dir)
    for log in requests(model_name, black.astype(np.float32), black):
      writer.write(log.SerializeToString())
  path = os.path.join(model_dir, version)
  tf.io.gfile.rename(incomplete, path)
  return path
