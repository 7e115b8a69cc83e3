"""Tests of the SavedModel export."""

import json
import os
import subprocess
import sys

import export
from flax import nnx
import models
import numpy as np
import pytest
import tensorflow as tf


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """An untrained model in eval mode and the SavedModel exported from it."""
  model = models.CNN(dropout_rate=0.025, rngs=nnx.Rngs(0))
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
  for key in export.SIGNATURES:
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
      input=json.dumps(images.tolist()), capture_output=True, text=True,
      check=True,
  )
  logits = np.array(json.loads(result.stdout.splitlines()[-1]))
  np.testing.assert_allclose(logits, np.asarray(model(images)), atol=1e-4)
