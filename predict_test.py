"""Tests of predict.py: inputs, the three ways to the model, and bad inputs.

TF Serving itself cannot be installed here. Its REST and gRPC front ends are
stood in for by the loopback servers below, which answer as TF Serving
documents by running the exported SavedModel; the clients are tested for
building exactly the requests TF Serving documents.
"""

import base64
import concurrent.futures
import http.server
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading

import grpc
import input_pipeline
import numpy as np
from PIL import Image
import predict
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tools import mnist_pngs

ROOT = os.path.dirname(os.path.abspath(__file__))
# A bound on the loopback servers' lives, should a test run never tear down.
SERVER_LIFETIME_SECS = 600


def _run_signature(signatures, name: str, inputs: dict) -> dict:
  """Runs signature `name` on `inputs` as TF Serving does, or raises KeyError."""
  function = signatures[name or 'serving_default']
  specs = function.structured_input_signature[1]
  outputs = function(
      **{k: tf.constant(v, specs[k].dtype) for k, v in inputs.items()}
  )
  return {k: v.numpy() for k, v in outputs.items()}


def _server_error(error: Exception) -> str:
  """The message TF Serving sends for a failed run: the cause and its node.

  TensorFlow's eager Python adds a header and the op's stack in front; the
  server's status message starts at the cause.
  """
  lines = str(error).splitlines()
  causes = [i for i, l in enumerate(lines) if l and not l[0].isspace()]
  return '\n'.join(lines[causes[-1] :]) if causes else str(error)


def _rest_value(value):
  """A REST value as TF Serving reads it: {"b64": ...} is a binary string."""
  if isinstance(value, dict) and list(value) == ['b64']:
    return base64.b64decode(value['b64'])
  return value


# A stand-in for TF Serving's REST API (port 8501 of the docker image).


class _RestHandler(http.server.BaseHTTPRequestHandler):
  """POST /v1/models/mnist[/versions/N]:predict, row format, as TF Serving."""

  signatures = None  # Set on the subclass that a server uses.
  requests = None

  def do_POST(self):  # pylint: disable=invalid-name
    body = self.rfile.read(int(self.headers['Content-Length']))
    self.requests.append((self.command, self.path, dict(self.headers), body))
    match = re.fullmatch(
        r'/v1/models/([^/:]+)(/versions/\d+)?:predict', self.path
    )
    if not match or match.group(1) != 'mnist':
      name = match.group(1) if match else self.path
      return self._answer(
          404, {'error': f'Servable not found for request: Latest({name})'}
      )
    try:
      request = json.loads(body)
      signature = request.get('signature_name', 'serving_default')
      if signature not in self.signatures:
        return self._answer(
            400,
            {
                'error': f'Serving signature name: "{signature}" not found in signature def'
            },
        )
      instances = [_rest_value(row) for row in request['instances']]
      if isinstance(instances[0], dict):
        inputs = {
            k: [_rest_value(row[k]) for row in instances] for k in instances[0]
        }
      else:  # The signature's only input.
        function = self.signatures[signature]
        (name,) = function.structured_input_signature[1]
        inputs = {name: instances}
      outputs = _run_signature(self.signatures, signature, inputs)
    except Exception as e:  # pylint: disable=broad-except
      return self._answer(400, {'error': _server_error(e)})
    names = sorted(outputs)
    predictions = [
        {k: outputs[k][i].tolist() for k in names}
        for i in range(len(outputs[names[0]]))
    ]
    self._answer(200, {'predictions': predictions})

  def _answer(self, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    self.send_response(status)
    self.send_header('Content-Type', 'application/json')
    self.send_header('Content-Length', str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    del args  # Quiet.


# A stand-in for TF Serving's gRPC PredictionService (port 8500).


class _PredictionServicer(
    prediction_service_pb2_grpc.PredictionServiceServicer
):
  """Predict, as TF Serving answers it: named TensorProtos in and out."""

  def __init__(self, signatures):
    self.signatures = signatures
    self.requests = []

  def Predict(self, request, context):  # pylint: disable=invalid-name
    self.requests.append(request)
    if request.model_spec.name != 'mnist':
      context.abort(
          grpc.StatusCode.NOT_FOUND,
          f'Servable not found for request: Latest({request.model_spec.name})',
      )
    signature = request.model_spec.signature_name or 'serving_default'
    if signature not in self.signatures:
      context.abort(
          grpc.StatusCode.INVALID_ARGUMENT,
          f'Serving signature name: "{signature}" not found in signature def',
      )
    try:
      inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
      outputs = _run_signature(self.signatures, signature, inputs)
    except Exception as e:  # pylint: disable=broad-except
      context.abort(grpc.StatusCode.INVALID_ARGUMENT, _server_error(e))
    response = predict_pb2.PredictResponse()
    response.model_spec.CopyFrom(request.model_spec)
    response.model_spec.signature_name = signature
    response.model_spec.version.value = 1
    for k, v in outputs.items():
      response.outputs[k].CopyFrom(tf.make_tensor_proto(v))
    return response


@pytest.fixture(scope='module')
def signatures(trained_export):
  loaded = tf.saved_model.load(trained_export)
  return loaded, loaded.signatures


@pytest.fixture(scope='module')
def rest_server(signatures):
  """The loopback REST server: its HOST:PORT and the requests it received."""
  handler = type(
      'Handler',
      (_RestHandler,),
      {
          'signatures': signatures[1],
          'requests': [],
      },
  )
  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
  server.daemon_threads = True
  threading.Thread(target=server.serve_forever, daemon=True).start()
  backstop = threading.Timer(SERVER_LIFETIME_SECS, server.shutdown)
  backstop.daemon = True
  backstop.start()
  yield f'127.0.0.1:{server.server_address[1]}', handler.requests
  backstop.cancel()
  server.shutdown()
  server.server_close()


@pytest.fixture(scope='module')
def grpc_server(signatures):
  """The loopback gRPC server: its HOST:PORT and its servicer."""
  servicer = _PredictionServicer(signatures[1])
  server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
  prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
      servicer, server
  )
  port = server.add_insecure_port('127.0.0.1:0')
  server.start()
  backstop = threading.Timer(SERVER_LIFETIME_SECS, server.stop, args=(0,))
  backstop.daemon = True
  backstop.start()
  yield f'127.0.0.1:{port}', servicer
  backstop.cancel()
  server.stop(0).wait()


@pytest.fixture(scope='module')
def closed_port() -> str:
  """A loopback HOST:PORT that nothing listens on."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  return f'127.0.0.1:{port}'


@pytest.fixture(scope='module')
def pngs(mnist_files, tmp_path_factory) -> list[str]:
  """The first 10 MNIST test images as PNG files, written by mnist_pngs."""
  images, labels = mnist_pngs.read_test_set(mnist_files)
  out = str(tmp_path_factory.mktemp('pngs'))
  return mnist_pngs.write_pngs(images[:10], labels[:10], out)


@pytest.fixture(scope='module')
def bad_inputs(tmp_path_factory, mnist_test_images) -> dict[str, str]:
  """One file of each kind that predict.py must reject, and why."""
  directory = tmp_path_factory.mktemp('bad')
  text = directory / 'notes.png'
  text.write_text('not a picture\n')
  wrong = directory / 'wrong.npy'
  np.save(wrong, np.zeros((3, 32, 32), np.uint8))
  good = directory / 'batch.npy'
  np.save(
      good, (mnist_test_images[0][:3, ..., 0] * 255).round().astype(np.uint8)
  )
  return {
      'missing': str(directory / 'missing.png'),
      'not_image': str(text),
      'wrong_shape': str(wrong),
      'good_npy': str(good),
  }


@pytest.fixture(scope='module')
def varied_images(pngs, tmp_path_factory) -> list[str]:
  """MNIST digits as users' files: other sizes, in colour, one a JPEG."""
  directory = tmp_path_factory.mktemp('varied')
  paths = []
  for i, (size, mode, suffix) in enumerate(
      [
          ((100, 100), 'RGB', 'png'),
          ((45, 60), 'L', 'png'),
          ((200, 150), 'RGBA', 'png'),
          ((84, 84), 'RGB', 'jpg'),
      ]
  ):
    with Image.open(pngs[i]) as digit:
      image = digit.resize(size, Image.Resampling.BICUBIC).convert(mode)
    if mode != 'L':  # A red digit on a blue ground.
      pixels = np.array(image)
      pixels[..., 1] //= 3
      pixels[..., 2] = 255 - pixels[..., 2]
      image = Image.fromarray(pixels, mode)
    paths.append(str(directory / f'digit_{i}.{suffix}'))
    image.save(paths[-1])
  return paths


def _classify(paths, classifier, **kwargs) -> tuple[int, list[str], list[str]]:
  out, err = io.StringIO(), io.StringIO()
  failures = predict.classify(paths, classifier, out=out, err=err, **kwargs)
  return failures, out.getvalue().splitlines(), err.getvalue().splitlines()


# Inputs.


def test_pngs_of_mnist_are_read_as_training_reads_mnist(pngs, mnist_files):
  images = np.concatenate([predict.load_input(p) for p in pngs])
  raw, labels = mnist_pngs.read_test_set(mnist_files)
  assert labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
  assert [os.path.basename(p) for p in pngs[:2]] == [
      'test_00000_label_7.png',
      'test_00001_label_2.png',
  ]
  # input_pipeline's own normalisation of the same pixels.
  seen = input_pipeline.to_arrays(raw[:10], labels[:10])['image']
  seen = np.asarray(input_pipeline.normalize(seen))
  np.testing.assert_array_equal(images, seen)


def test_images_of_any_size_and_colour_become_28x28_grey(pngs, tmp_path):
  digit = np.asarray(Image.open(pngs[0]))
  big_rgb = Image.fromarray(np.stack([digit] * 3, -1)).resize((280, 280))
  big_rgb.save(tmp_path / 'big.png')
  image = predict.load_input(str(tmp_path / 'big.png'))
  assert image.shape == (1, 28, 28, 1) and image.dtype == np.float32
  assert 0.0 <= image.min() and image.max() <= 1.0
  # Ten times larger, then back: close to the original, not equal.
  original = predict.load_input(pngs[0])
  assert np.abs(image - original).mean() < 0.05
  inverted = predict.load_input(pngs[0], invert=True)
  np.testing.assert_allclose(inverted, 1.0 - original)


@pytest.mark.parametrize(
    'shape', [(28, 28), (28, 28, 1), (4, 28, 28), (4, 28, 28, 1)]
)
def test_arrays_of_one_or_many_images(tmp_path, shape):
  array = np.random.RandomState(0).randint(0, 256, shape).astype(np.uint8)
  np.save(tmp_path / 'a.npy', array)
  images = predict.load_input(str(tmp_path / 'a.npy'))
  assert images.shape == (int(np.prod(shape)) // 784, 28, 28, 1)
  np.testing.assert_array_equal(images.ravel(), array.ravel() / np.float32(255))
  np.save(tmp_path / 'f.npy', images)
  np.testing.assert_array_equal(
      predict.load_input(str(tmp_path / 'f.npy')), images
  )


@pytest.mark.parametrize(
    'array, cause',
    [
        (np.zeros((28, 27)), 'array of shape (28, 27), expected'),
        (np.zeros((2, 28, 28, 3)), 'array of shape (2, 28, 28, 3), expected'),
        (np.zeros((0, 28, 28)), 'holds no image'),
        (np.full((28, 28), 2.0), 'float array with values outside [0, 1]'),
        (np.zeros((28, 28), np.int64), 'array of dtype int64'),
    ],
)
def test_bad_arrays_are_rejected(tmp_path, array, cause):
  np.save(tmp_path / 'a.npy', array)
  with pytest.raises(predict.InputError, match=re.escape(cause)):
    predict.load_input(str(tmp_path / 'a.npy'))


# The three ways to the model agree with the JAX model.


def test_saved_model_classifier_predicts_the_jax_logits(
    trained_model, trained_export, mnist_test_images
):
  images = mnist_test_images[0]
  # The model directory: the highest version is used, as TF Serving does.
  classifier = predict.SavedModelClassifier(
      os.path.dirname(trained_export), 'serving_default'
  )
  outputs = classifier(images)
  np.testing.assert_allclose(
      outputs['logits'], np.asarray(trained_model(images)), atol=1e-4
  )


def test_rest_request_is_what_tf_serving_documents(rest_server, pngs):
  address, requests = rest_server
  del requests[:]
  predict.RestClassifier(address, 'mnist', 'mnist_server', 10.0)(
      predict.load_input(pngs[0])
  )
  ((method, path, headers, body),) = requests
  assert (method, path) == ('POST', '/v1/models/mnist:predict')
  assert headers['Content-Type'] == 'application/json'
  request = json.loads(body)
  assert sorted(request) == ['instances', 'signature_name']
  assert request['signature_name'] == 'mnist_server'
  (row,) = request['instances']
  assert list(row) == ['image']
  assert np.array(row['image']).shape == (28, 28, 1)
  assert row['image'] == predict.load_input(pngs[0])[0].tolist()


def test_grpc_request_is_what_tf_serving_documents(grpc_server, pngs):
  address, servicer = grpc_server
  del servicer.requests[:]
  images = np.concatenate([predict.load_input(p) for p in pngs[:3]])
  predict.GrpcClassifier(address, 'mnist', 'mnist_server', 10.0)(images)
  (request,) = servicer.requests
  assert request.model_spec.name == 'mnist'
  assert request.model_spec.signature_name == 'mnist_server'
  assert list(request.inputs) == ['image']
  tensor = request.inputs['image']
  assert tensor.dtype == tf.float32.as_datatype_enum
  assert [d.size for d in tensor.tensor_shape.dim] == [3, 28, 28, 1]
  np.testing.assert_array_equal(tf.make_ndarray(tensor), images)


@pytest.mark.parametrize('way', ['saved_model', 'rest', 'grpc'])
def test_each_way_predicts_what_the_jax_model_does(
    way,
    trained_model,
    trained_export,
    rest_server,
    grpc_server,
    pngs,
    bad_inputs,
):
  classifier = {
      'saved_model': lambda: predict.SavedModelClassifier(
          trained_export, 'serving_default'
      ),
      'rest': lambda: predict.RestClassifier(
          rest_server[0], 'mnist', 'serving_default', 10.0
      ),
      'grpc': lambda: predict.GrpcClassifier(
          grpc_server[0], 'mnist', 'serving_default', 10.0
      ),
  }[way]()
  paths = pngs + [bad_inputs['good_npy']]
  failures, out, err = _classify(paths, classifier, as_json=True)
  assert (failures, err) == (0, [])
  rows = [json.loads(line) for line in out]
  assert [r['input'] for r in rows] == pngs + [
      f'{bad_inputs["good_npy"]}[{i}]' for i in range(3)
  ]
  images = np.concatenate([predict.load_input(p) for p in paths])
  logits = np.asarray(trained_model(images))
  np.testing.assert_allclose([r['logits'] for r in rows], logits, atol=1e-4)
  assert [r['digit'] for r in rows] == logits.argmax(-1).tolist()
  for r in rows:
    assert r['probability'] == max(r['probabilities'])


def _classifiers(way, trained_export, rest_server, grpc_server, signature):
  return {
      'saved_model': lambda: predict.SavedModelClassifier(
          trained_export, signature
      ),
      'rest': lambda: predict.RestClassifier(
          rest_server[0], 'mnist', signature, 10.0
      ),
      'grpc': lambda: predict.GrpcClassifier(
          grpc_server[0], 'mnist', signature, 10.0
      ),
  }[way]()


@pytest.mark.parametrize('way', ['saved_model', 'rest', 'grpc'])
def test_bytes_signature_prepares_images_as_predict_does(
    way, trained_export, rest_server, grpc_server, pngs, varied_images
):
  paths = pngs[:4] + varied_images
  classifier = _classifiers(
      way, trained_export, rest_server, grpc_server, 'serving_bytes'
  )
  failures, out, err = _classify(paths, classifier, as_json=True, as_bytes=True)
  assert (failures, err) == (0, [])
  rows = [json.loads(line) for line in out]
  assert [r['input'] for r in rows] == paths
  floats = predict.SavedModelClassifier(trained_export, 'serving_default')(
      np.concatenate([predict.load_input(p) for p in paths])
  )
  np.testing.assert_allclose(
      [r['logits'] for r in rows], floats['logits'], atol=1e-5
  )


def test_rest_request_of_bytes_is_what_tf_serving_documents(rest_server, pngs):
  address, requests = rest_server
  del requests[:]
  predict.RestClassifier(address, 'mnist', 'serving_bytes', 10.0)(
      predict.load_input(pngs[0], as_bytes=True)
  )
  request = json.loads(requests[-1][3])
  with open(pngs[0], 'rb') as f:
    encoded = base64.b64encode(f.read()).decode()
  assert request == {
      'signature_name': 'serving_bytes',
      'instances': [{'b64': encoded}],
  }


@pytest.mark.parametrize(
    'way, answer',
    [
        ('saved_model', 'the model refused it'),
        ('rest', 'server {} answered 400'),
        ('grpc', 'server {} answered INVALID_ARGUMENT'),
    ],
)
def test_bytes_that_are_not_an_image(
    way, answer, trained_export, rest_server, grpc_server, pngs, bad_inputs
):
  classifier = _classifiers(
      way, trained_export, rest_server, grpc_server, 'serving_bytes'
  )
  address = {'rest': rest_server, 'grpc': grpc_server}.get(way, ('',))[0]
  paths = [bad_inputs['not_image'], pngs[0], bad_inputs['good_npy']]
  failures, out, err = _classify(paths, classifier, as_bytes=True)
  assert failures == 2
  assert [line.split(':')[0] for line in out] == [pngs[0]]
  assert err == [
      f'error: {paths[0]}: {answer.format(address)}: Unknown image file '
      'format. One of JPEG, JPEG XL, PNG, GIF, BMP, WebP required.',
      f'error: {paths[2]}: an array, not an encoded image: leave out --bytes',
  ]


# Bad inputs: one line each, naming the input and the cause; the others
# are still classified.


def _check_bad_inputs(classifier, pngs, bad_inputs):
  paths = [
      bad_inputs['missing'],
      pngs[0],
      bad_inputs['not_image'],
      bad_inputs['wrong_shape'],
      pngs[1],
  ]
  failures, out, err = _classify(paths, classifier)
  assert failures == 3
  assert [line.split(':')[0] for line in out] == [pngs[0], pngs[1]]
  assert err == [
      f'error: {bad_inputs["missing"]}: no such file',
      f'error: {bad_inputs["not_image"]}: not an image that Pillow can read',
      f'error: {bad_inputs["wrong_shape"]}: array of shape (3, 32, 32), '
      'expected (28, 28), (28, 28, 1), (n, 28, 28) or (n, 28, 28, 1)',
  ]


def test_bad_files_rest(rest_server, pngs, bad_inputs):
  _check_bad_inputs(
      predict.RestClassifier(rest_server[0], 'mnist', 'serving_default', 10.0),
      pngs,
      bad_inputs,
  )


def test_bad_files_grpc(grpc_server, pngs, bad_inputs):
  _check_bad_inputs(
      predict.GrpcClassifier(grpc_server[0], 'mnist', 'serving_default', 10.0),
      pngs,
      bad_inputs,
  )


def test_a_server_that_does_not_answer(closed_port, pngs):
  for classifier in (
      predict.RestClassifier(closed_port, 'mnist', 'serving_default', 5.0),
      predict.GrpcClassifier(closed_port, 'mnist', 'serving_default', 5.0),
  ):
    failures, out, err = _classify(pngs[:2], classifier)
    assert (failures, out, len(err)) == (2, [], 2)
    for path, line in zip(pngs, err):
      assert line.startswith(
          f'error: {path}: server {closed_port} does not answer ('
      )


def test_a_server_that_does_not_answer_in_time(pngs):
  """A REST server that accepts the connection but never answers."""
  with socket.socket() as listener:
    listener.bind(('127.0.0.1', 0))
    listener.listen()
    address = f'127.0.0.1:{listener.getsockname()[1]}'
    classifier = predict.RestClassifier(
        address, 'mnist', 'serving_default', 0.5
    )
    failures, _, err = _classify(pngs[:1], classifier)
  assert failures == 1
  assert err == [
      f'error: {pngs[0]}: server {address} does not answer (timed out)'
  ]


@pytest.mark.parametrize(
    'model_name, signature, cause',
    [
        (
            'mnsit',
            'serving_default',
            'Servable not found for request: Latest(mnsit)',
        ),
        (
            'mnist',
            'predict',
            'Serving signature name: "predict" not found in signature def',
        ),
    ],
)
def test_a_server_that_answers_with_an_error(
    rest_server, grpc_server, pngs, model_name, signature, cause
):
  status = {'mnsit': ('404', 'NOT_FOUND'), 'mnist': ('400', 'INVALID_ARGUMENT')}
  rest_status, grpc_status = status[model_name]
  for classifier, answer in (
      (
          predict.RestClassifier(rest_server[0], model_name, signature, 10.0),
          f'server {rest_server[0]} answered {rest_status}: {cause}',
      ),
      (
          predict.GrpcClassifier(grpc_server[0], model_name, signature, 10.0),
          f'server {grpc_server[0]} answered {grpc_status}: {cause}',
      ),
  ):
    failures, out, err = _classify(pngs[:1], classifier)
    assert (failures, out) == (1, [])
    assert err == [f'error: {pngs[0]}: {answer}']


# The command line.


def _predict(
    *args: str, block_jax: bool = False
) -> subprocess.CompletedProcess:
  """Runs predict.py; with `block_jax`, in a Python that cannot import JAX."""
  prelude = 'import sys; '
  if block_jax:
    prelude += 'sys.modules["jax"] = sys.modules["jaxlib"] = None; '
  script = (
      prelude + 'import runpy; sys.argv = sys.argv[1:]; '
      'runpy.run_path(sys.argv[0], run_name="__main__")'
  )
  # As from a user's shell: JAX, imported here, sets TF_CPP_MIN_LOG_LEVEL.
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ('TF_CPP_MIN_LOG_LEVEL', 'TF_ENABLE_ONEDNN_OPTS')
  }
  return subprocess.run(
      [sys.executable, '-c', script, os.path.join(ROOT, 'predict.py'), *args],
      capture_output=True,
      text=True,
      cwd=ROOT,
      env=env,
      timeout=300,
  )


def test_command_saved_model_without_jax(
    trained_model, trained_export, signatures, pngs, bad_inputs
):
  result = _predict(
      f'--saved_model={os.path.dirname(trained_export)}',
      *pngs,
      bad_inputs['not_image'],
      bad_inputs['good_npy'],
      block_jax=True,
  )
  assert result.returncode == 1, result.stderr
  assert 'Traceback' not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f'error: {bad_inputs["not_image"]}: not an image that Pillow can read'
  )
  lines = result.stdout.splitlines()
  images = np.concatenate([predict.load_input(p) for p in pngs])
  digits = np.asarray(trained_model(images)).argmax(-1)
  probabilities = _run_signature(
      signatures[1], 'serving_default', {'image': images}
  )['probabilities']
  assert lines[:10] == [
      f'{p}: {d} ({probabilities[i, d]:.4f})'
      for i, (p, d) in enumerate(zip(pngs, digits))
  ]
  assert [line.split(':')[0] for line in lines[10:]] == [
      f'{bad_inputs["good_npy"]}[{i}]' for i in range(3)
  ]


def test_command_server_json(rest_server, grpc_server, pngs):
  for flag in (f'--server={rest_server[0]}', f'--grpc={grpc_server[0]}'):
    result = _predict(flag, '--json', *pngs[:2])
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r['input'] for r in rows] == pngs[:2]
    assert sorted(rows[0]) == [
        'digit',
        'input',
        'logits',
        'probabilities',
        'probability',
    ]


def test_command_bytes(trained_export, pngs, bad_inputs):
  model_dir = os.path.dirname(trained_export)
  result = _predict(
      f'--saved_model={model_dir}',
      '--bytes',
      *pngs[:2],
      bad_inputs['not_image'],
  )
  assert result.returncode == 1, result.stderr
  assert result.stderr.strip().splitlines() == [
      f'error: {bad_inputs["not_image"]}: the model refused it: Unknown image '
      'file format. One of JPEG, JPEG XL, PNG, GIF, BMP, WebP required.'
  ]
  floats = _predict(f'--saved_model={model_dir}', *pngs[:2])
  assert result.stdout == floats.stdout
  result = _predict(
      f'--saved_model={model_dir}', '--bytes', '--invert', pngs[0]
  )
  assert result.returncode == 1
  assert '--invert cannot change images sent as bytes' in result.stderr


def test_command_needs_one_model_and_one_input(tmp_path, pngs):
  result = _predict(pngs[0])
  assert result.returncode != 0
  assert 'saved_model' in result.stderr and 'server' in result.stderr
  result = _predict(f'--saved_model={tmp_path}')
  assert result.returncode != 0
  assert 'Name at least one image' in result.stderr
  result = _predict(f'--saved_model={tmp_path / "absent"}', pngs[0])
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f'error: --saved_model={tmp_path / "absent"}: no saved_model.pb in it nor '
      'in an integer version directory under it'
  )
