"""Tests of the SavedModel export."""

import json
import os
import signal
import subprocess
import sys
import time

from configs import default
from serving import export
from flax import nnx
import input_pipeline
import jax
import models
import numpy as np
from PIL import Image
import pytest
from serving import signatures as names
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import prediction_log_pb2
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """An untrained model in eval mode and the SavedModel exported from it."""
  model = models.CNN(nnx.Rngs(0))
  model_dir = str(tmp_path_factory.mktemp('export') / 'mnist')
  path = export.export_saved_model(model, model_dir)
  return model, model_dir, path


def _images(n: int, seed: int = 0) -> np.ndarray:
  return np.random.RandomState(seed).rand(n, 28, 28, 1).astype(np.float32)


def test_layout_is_what_tf_serving_loads(exported):
  _, model_dir, path = exported
  assert path == os.path.join(model_dir, '1')
  assert os.path.isfile(os.path.join(path, 'saved_model.pb'))
  assert os.path.isdir(os.path.join(path, 'variables'))


def _saved_model(path: str) -> saved_model_pb2.SavedModel:
  saved_model = saved_model_pb2.SavedModel()
  with open(os.path.join(path, 'saved_model.pb'), 'rb') as f:
    saved_model.ParseFromString(f.read())
  return saved_model


def test_serialised_for_cpu_and_gpu_servers(exported):
  """The XlaCallModule ops hold the computation lowered for CPU and CUDA."""
  _, _, path = exported
  (meta_graph,) = _saved_model(path).meta_graphs
  platforms = [
      list(node.attr['platforms'].list.s)
      for function in meta_graph.graph_def.library.function
      for node in function.node_def
      if node.op == 'XlaCallModule'
  ]
  assert platforms and all(p == [b'CPU', b'CUDA'] for p in platforms)


def test_no_signature_holds_a_decoder_of_other_formats(exported):
  """Decoders of PNG, JPEG and BMP alone: no generic, GIF or WebP one."""
  _, _, path = exported
  (meta_graph,) = _saved_model(path).meta_graphs
  graph = meta_graph.graph_def
  ops = {node.op for node in graph.node} | {
      node.op for f in graph.library.function for node in f.node_def
  }
  assert {'DecodePng', 'DecodeJpeg', 'DecodeBmp'} <= ops
  assert not ops & {'DecodeImage', 'DecodeGif', 'DecodeWebP'}


@pytest.mark.slow  # A process that starts TensorFlow.
def test_a_heap_corrupting_webp_is_refused_and_the_next_image_classified(
    exported, heap_corrupting_webp, tmp_path
):
  """In a process of its own, as TF Serving runs it: a crash fails the test."""
  _, _, path = exported
  digit = tmp_path / 'digit.png'
  Image.new('L', (28, 28)).save(digit)
  script = (
      'import sys, tensorflow as tf\n'
      'serve = tf.saved_model.load(sys.argv[1]).signatures["serving_bytes"]\n'
      'for path in sys.argv[2:]:\n'
      '  data = tf.constant([open(path, "rb").read()])\n'
      '  try:\n'
      '    print(serve(image_bytes=data)["probabilities"].shape)\n'
      '  except tf.errors.InvalidArgumentError as e:\n'
      '    print(e.message.split("assertion failed: ")[1].splitlines()[0])\n'
  )
  result = subprocess.run(
      [sys.executable, '-c', script, path, heap_corrupting_webp, str(digit)],
      capture_output=True,
      text=True,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines()[-2:] == [
      '[the input is not a PNG, JPEG or BMP image, the formats the model'
      ' decodes]',
      '(1, 10)',
  ]


def test_warmup_requests_replay_against_the_saved_model(exported):
  """Reads the warm-up file as TF Serving does and runs every request."""
  _, _, path = exported
  records = tf.data.TFRecordDataset(os.path.join(path, export.WARMUP_FILE))
  logs = [
      prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in records
  ]
  signatures = tf.saved_model.load(path).signatures
  replayed = []
  for log in logs:
    request = log.predict_log.request
    assert request.model_spec.name == 'mnist'
    function = signatures[request.model_spec.signature_name]
    inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
    outputs = function(**{k: tf.constant(v) for k, v in inputs.items()})
    assert outputs['probabilities'].shape == (1, 10)
    replayed.append(request.model_spec.signature_name)
  assert sorted(replayed) == sorted(names.SIGNATURES + (names.BYTES_SIGNATURE,))


@pytest.mark.slow  # A process that starts TensorFlow.
def test_a_killed_export_leaves_no_version(tmp_path):
  """SIGKILL while a version is written: none half-written, the next is next."""
  model_dir = str(tmp_path / 'mnist')
  script = (
      'import models\n'
      'from serving import export\n'
      'from flax import nnx\n'
      'model = models.CNN(nnx.Rngs(0))\n'
      'while True:\n'
      '  export.export_saved_model(model, %r)\n' % model_dir
  )
  exporting = subprocess.Popen([sys.executable, '-c', script], cwd=ROOT)
  deadline = time.monotonic() + 120
  incomplete = []
  while not incomplete and exporting.poll() is None:
    assert time.monotonic() < deadline, 'no export began within 120 s'
    names = os.listdir(model_dir) if os.path.isdir(model_dir) else []
    incomplete = [n for n in names if n.endswith(export.INCOMPLETE)]
    time.sleep(0.005)
  exporting.send_signal(signal.SIGKILL)
  assert exporting.wait() == -signal.SIGKILL
  names = os.listdir(model_dir)
  versions = sorted(int(n) for n in names if n.isdigit())
  assert incomplete  # It was killed while writing a version, or after.
  for version in versions:
    version_dir = os.path.join(model_dir, str(version))
    assert os.path.isfile(os.path.join(version_dir, 'saved_model.pb'))
    assert os.path.isdir(os.path.join(version_dir, 'variables'))
    assert os.path.isfile(os.path.join(version_dir, export.WARMUP_FILE))
  model = models.CNN(nnx.Rngs(0))
  path = export.export_saved_model(model, model_dir)
  assert path == os.path.join(model_dir, str(max(versions, default=0) + 1))
  assert not [n for n in os.listdir(model_dir) if n.endswith(export.INCOMPLETE)]
  tf.saved_model.load(path)


def test_each_export_is_a_new_version(exported):
  model, model_dir, _ = exported
  os.makedirs(os.path.join(model_dir, 'not-a-version'))
  assert export.next_version(model_dir) == 2
  assert export.next_version(os.path.join(model_dir, 'absent')) == 1


@pytest.mark.parametrize('batch', [1, 37])
def test_signatures_compute_the_jax_logits(exported, batch):
  model, _, path = exported
  images = _images(batch)
  expected = np.asarray(model(images))
  loaded = tf.saved_model.load(path)
  for key in names.SIGNATURES:
    outputs = loaded.signatures[key](image=tf.constant(images))
    np.testing.assert_allclose(outputs['logits'].numpy(), expected, atol=1e-4)
    probabilities = outputs['probabilities'].numpy()
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(probabilities.argmax(-1), expected.argmax(-1))


def test_signature_takes_a_named_batch_of_any_size(exported):
  _, _, path = exported
  signature = tf.saved_model.load(path).signatures['serving_default']
  _, inputs = signature.structured_input_signature
  assert list(inputs) == ['image']
  assert inputs['image'].dtype == tf.float32
  assert inputs['image'].shape.as_list() == [None, 28, 28, 1]
  assert sorted(signature.structured_outputs) == ['logits', 'probabilities']


@pytest.mark.slow  # A process that starts TensorFlow.
def test_runs_in_tensorflow_without_jax(exported):
  model, _, path = exported
  images = _images(3, seed=1)
  # TensorFlow imports JAX if it can (for TFLite): make sure it cannot.
  script = (
      'import sys\n'
      'sys.modules["jax"] = sys.modules["jaxlib"] = None\n'
      'import json, numpy as np, tensorflow as tf\n'
      'f = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]\n'
      'x = np.array(json.loads(sys.stdin.read()), np.float32)\n'
      'print(json.dumps(f(image=tf.constant(x))["logits"].numpy().tolist()))\n'
  )
  result = subprocess.run(
      [sys.executable, '-c', script, path],
      input=json.dumps(images.tolist()),
      capture_output=True,
      text=True,
      check=True,
  )
  logits = np.array(json.loads(result.stdout.splitlines()[-1]))
  np.testing.assert_allclose(logits, np.asarray(model(images)), atol=1e-4)


# What TF Serving needs of a trained model's export, checked on real MNIST.


@pytest.mark.parametrize('batch', [1, 7, 256])
def test_trained_export_computes_the_jax_logits(
    trained_model, trained_export, mnist_test_images, batch
):
  images = mnist_test_images[0][:batch]
  expected = np.asarray(trained_model(images))
  loaded = tf.saved_model.load(trained_export)
  for key in names.SIGNATURES:
    outputs = loaded.signatures[key](image=tf.constant(images))
    np.testing.assert_allclose(outputs['logits'].numpy(), expected, atol=1e-4)
    np.testing.assert_allclose(
        outputs['probabilities'].numpy(),
        np.asarray(jax.nn.softmax(expected)),
        atol=1e-5,
    )


def test_trained_export_runs_in_tensorflow_without_jax(
    trained_model, trained_export, mnist_test_images
):
  images = mnist_test_images[0]
  script = (
      'import sys\n'
      'sys.modules["jax"] = sys.modules["jaxlib"] = None\n'
      'import numpy as np, tensorflow as tf\n'
      'f = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]\n'
      'for n in (1, 7, 256):\n'
      '  x = np.load(sys.argv[2])[:n]\n'
      '  np.save(sys.argv[3] + str(n), f(image=tf.constant(x))["logits"].numpy())\n'
      'assert "jax" not in [m.split(".")[0] for m, v in sys.modules.items() if v]\n'
  )
  directory = os.path.dirname(trained_export)
  np.save(os.path.join(directory, 'images.npy'), images)
  subprocess.run(
      [
          sys.executable,
          '-c',
          script,
          trained_export,
          os.path.join(directory, 'images.npy'),
          os.path.join(directory, 'logits'),
      ],
      check=True,
      capture_output=True,
      timeout=300,
  )
  expected = np.asarray(trained_model(images))
  for n in (1, 7, 256):
    logits = np.load(os.path.join(directory, f'logits{n}.npy'))
    assert logits.shape == (n, 10)
    np.testing.assert_allclose(logits, expected[:n], atol=1e-4)


def test_signature_def_is_what_tf_serving_reads(trained_export):
  """The MetaGraph that TF Serving loads (tag 'serve') and its Predict API reads."""
  (meta_graph,) = _saved_model(trained_export).meta_graphs
  assert list(meta_graph.meta_info_def.tags) == ['serve']
  for key in names.SIGNATURES:
    signature = meta_graph.signature_def[key]
    assert signature.method_name == 'tensorflow/serving/predict'
    assert list(signature.inputs) == [names.INPUT_NAME]
    image = signature.inputs[names.INPUT_NAME]
    assert image.dtype == types_pb2.DT_FLOAT
    assert [d.size for d in image.tensor_shape.dim] == [-1, 28, 28, 1]
    assert sorted(signature.outputs) == ['logits', 'probabilities']
    for output in signature.outputs.values():
      assert output.dtype == types_pb2.DT_FLOAT
      assert [d.size for d in output.tensor_shape.dim] == [-1, 10]
  signature = meta_graph.signature_def[names.BYTES_SIGNATURE]
  assert signature.method_name == 'tensorflow/serving/predict'
  assert list(signature.inputs) == [names.BYTES_INPUT_NAME]
  encoded = signature.inputs[names.BYTES_INPUT_NAME]
  assert encoded.dtype == types_pb2.DT_STRING
  assert [d.size for d in encoded.tensor_shape.dim] == [-1]
  assert sorted(signature.outputs) == ['logits', 'probabilities']


def test_trained_export_scores_the_accuracy_training_reports(
    trained_model, trained_export, mnist_data_dir
):
  config = default.get_config()
  config.data_dir = mnist_data_dir
  config.test_split = 'test[:300]'
  _, test = input_pipeline.load(config)
  batches = input_pipeline.eval_batches(test, config.eval_batch_size)
  reported, _ = train.evaluate(trained_model, train.create_metrics(), batches)
  function = tf.saved_model.load(trained_export).signatures['serving_default']
  images = np.asarray(train.normalize(test['image']))
  logits = function(image=tf.constant(images))['logits'].numpy()
  correct = np.sum(logits.argmax(-1) == test['label'])
  assert np.float32(correct / 300) == np.float32(reported['accuracy'])
