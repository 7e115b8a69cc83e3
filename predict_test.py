"""Tests of predict.py: inputs, the three ways to the model, and bad inputs.

TF Serving itself cannot be installed here. It is stood in for by
tools/serving_standin.py, a program of its own that takes the server's flags
and runs the exported SavedModel in TensorFlow as the server does (XLA off
unless a flag turns it on, warm-up replayed at load). The tests start it with
the flags that README.md gives the real server, read from README.md, on free
loopback ports, and stop it at the end. Recording proxies in front of it
check that the clients send exactly the requests TF Serving documents.
"""

import base64
import concurrent.futures
import contextlib
import http.server
import io
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from serving import classifiers
import grpc
from serving import image_decoding_test
import numpy as np
from PIL import Image
import predict
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tools import mnist_pngs

ROOT = os.path.dirname(os.path.abspath(__file__))
# The image whose run README.md documents (CPU), and the one message of TF
# Serving's XLA gate.
SERVING_IMAGE = 'tensorflow/serving:2.20.0'
XLA_DISABLED = (
    'XLA compilation disabled: TF Serving runs without XLA unless started '
    'with --xla_cpu_compilation_enabled=true '
    '(--xla_gpu_compilation_enabled=true on its GPU image)'
)


def _run_signature(signatures, name: str, inputs: dict) -> dict:
  """Runs signature `name` on `inputs` in this process's TensorFlow."""
  function = signatures[name or 'serving_default']
  specs = function.structured_input_signature[1]
  outputs = function(
      **{k: tf.constant(v, specs[k].dtype) for k, v in inputs.items()}
  )
  return {k: v.numpy() for k, v in outputs.items()}


# TF Serving, stood in for by tools/serving_standin.py.


def readme_server_flags(model_base_path: str, xla: bool = True) -> list[str]:
  """The flags README.md gives TF Serving's CPU image, for `model_base_path`.

  The image runs `tensorflow_model_server --port=8500 --rest_api_port=8501`
  with the flags after its name; the export that README.md mounts at
  --model_base_path is `model_base_path` here. Without `xla`, as README.md
  gave them before it knew of TF Serving's XLA flag.
  """
  with open(os.path.join(ROOT, 'README.md')) as f:
    (command,) = re.findall(
        re.escape(SERVING_IMAGE) + r' \\\n(.*?)\n```', f.read(), re.S
    )
  server_flags = []
  for flag in command.replace('\\\n', ' ').split():
    name, _, value = flag.partition('=')
    if name == '--model_base_path':
      flag = f'{name}={model_base_path}'
    if xla or name != '--xla_cpu_compilation_enabled':
      server_flags.append(flag)
  return server_flags


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class StandIn:
  """tools/serving_standin.py in a process of its own, on free ports.

  `grpc` and `rest` are its HOST:PORT addresses; with `ca_file` (of its
  certificate), its REST API is waited for over TLS.
  """

  def __init__(self, server_flags: list[str], log: str, ca_file=None):
    self.grpc = f'127.0.0.1:{_free_port()}'
    self.rest = f'127.0.0.1:{_free_port()}'
    self.ca_file = ca_file
    self.log = log
    with open(log, 'wb') as out:
      self.process = subprocess.Popen(
          [
              sys.executable,
              '-m',
              'tools.serving_standin',
              f'--port={self.grpc.split(":")[1]}',
              f'--rest_api_port={self.rest.split(":")[1]}',
              *server_flags,
          ],
          cwd=ROOT,
          stdout=out,
          stderr=subprocess.STDOUT,
      )

  def output(self) -> str:
    with open(self.log, errors='replace') as f:
      return f.read()

  def wait_until_served(self, timeout: float = 300) -> None:
    """Returns once the model's status answers; fails if it never does."""
    context = ssl.create_default_context(cafile=self.ca_file)
    scheme = 'https' if self.ca_file else 'http'
    url = f'{scheme}://{self.rest}/v1/models/mnist'
    deadline = time.monotonic() + timeout
    while self.process.poll() is None and time.monotonic() < deadline:
      try:
        with urllib.request.urlopen(url, timeout=5, context=context) as answer:
          status = json.loads(answer.read())['model_version_status']
          assert [s['state'] for s in status] == ['AVAILABLE']
          return
      except (urllib.error.URLError, OSError):
        time.sleep(0.2)
    pytest.fail(
        f'the stand-in served nothing: {self.output()[-3000:]}', pytrace=False
    )

  def stop(self) -> None:
    self.process.terminate()
    try:
      self.process.wait(30)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()


@pytest.fixture(scope='module')
def signatures(trained_export):
  loaded = tf.saved_model.load(trained_export)
  return loaded, loaded.signatures


@pytest.fixture(scope='module')
def model_base_path(trained_export) -> str:
  """The model directory, what README.md mounts at /models/mnist."""
  return os.path.dirname(trained_export)


@pytest.fixture(scope='module')
def standin(model_base_path, tmp_path_factory):
  """The stand-in, started as README.md starts TF Serving."""
  server = StandIn(
      readme_server_flags(model_base_path),
      str(tmp_path_factory.mktemp('standin') / 'log'),
  )
  try:
    server.wait_until_served()
    yield server
  finally:
    server.stop()


@pytest.fixture(scope='module')
def rest_server(standin) -> str:
  """The stand-in's REST API, HOST:PORT."""
  return standin.rest


@pytest.fixture(scope='module')
def grpc_server(standin) -> str:
  """The stand-in's gRPC API, HOST:PORT."""
  return standin.grpc


class _RecordingProxy(http.server.BaseHTTPRequestHandler):
  """Records each POST, forwards it to `target` and relays the answer."""

  target = None  # Set on the subclass that a server uses.
  requests = None

  def do_POST(self):  # pylint: disable=invalid-name
    body = self.rfile.read(int(self.headers['Content-Length']))
    self.requests.append((self.command, self.path, dict(self.headers), body))
    request = urllib.request.Request(
        f'http://{self.target}{self.path}',
        data=body,
        headers={'Content-Type': self.headers['Content-Type']},
        method='POST',
    )
    try:
      with urllib.request.urlopen(request, timeout=60) as answer:
        status, data = answer.status, answer.read()
    except urllib.error.HTTPError as e:
      status, data = e.code, e.read()
    self.send_response(status)
    self.send_header('Content-Type', 'application/json')
    self.send_header('Content-Length', str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    del args  # Quiet.


@pytest.fixture(scope='module')
def rest_recorder(rest_server):
  """A proxy in front of the REST stand-in: its HOST:PORT, the requests."""
  handler = type(
      'Handler', (_RecordingProxy,), {'target': rest_server, 'requests': []}
  )
  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
  server.daemon_threads = True
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f'127.0.0.1:{server.server_address[1]}', handler.requests
  server.shutdown()
  server.server_close()


class _RecordingServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
  """Records each Predict request and forwards it to `target`."""

  def __init__(self, target: str):
    self.requests = []
    self._channel = grpc.insecure_channel(target)
    self._stub = prediction_service_pb2_grpc.PredictionServiceStub(
        self._channel
    )

  def Predict(self, request, context):  # pylint: disable=invalid-name
    self.requests.append(request)
    return self._stub.Predict(request, timeout=60)


@pytest.fixture(scope='module')
def grpc_recorder(grpc_server):
  """A proxy in front of the gRPC stand-in: its HOST:PORT, the requests."""
  servicer = _RecordingServicer(grpc_server)
  server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
  prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
      servicer, server
  )
  port = server.add_insecure_port('127.0.0.1:0')
  server.start()
  yield f'127.0.0.1:{port}', servicer.requests
  server.stop(0).wait()
  servicer._channel.close()


@pytest.fixture(scope='module')
def closed_port() -> str:
  """A loopback HOST:PORT that nothing listens on."""
  return f'127.0.0.1:{_free_port()}'


@pytest.fixture(scope='module')
def pngs(small_config, tmp_path_factory) -> list[str]:
  """The first 10 images of TFDS' test split as PNG files, by mnist_pngs."""
  images, labels = mnist_pngs.test_images(small_config(), 10)
  out = str(tmp_path_factory.mktemp('pngs'))
  return mnist_pngs.write_pngs(images, labels, out)


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
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    failures = predict.classify(paths, classifier, **kwargs)
  return failures, out.getvalue().splitlines(), err.getvalue().splitlines()


# Inputs.


def test_pngs_of_mnist_are_read_as_training_reads_mnist(
    pngs, mnist_test_images
):
  images = np.concatenate([predict.load_input(p) for p in pngs])
  seen, labels = mnist_test_images  # input_pipeline.normalize's floats.
  # TFDS' order, not the original files' (7, 2, 1, 0, ...).
  assert labels[:10].tolist() == [2, 0, 4, 8, 7, 6, 0, 6, 3, 1]
  assert [os.path.basename(p) for p in pngs[:2]] == [
      'test_00000_label_2.png',
      'test_00001_label_0.png',
  ]
  np.testing.assert_array_equal(images, seen[:10])


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
  with pytest.raises(classifiers.InputError, match=re.escape(cause)):
    predict.load_input(str(tmp_path / 'a.npy'))


# The three ways to the model agree with the JAX model.


def test_saved_model_classifier_predicts_the_jax_logits(
    trained_model, trained_export, mnist_test_images
):
  images = mnist_test_images[0]
  # The model directory: the highest version is used, as TF Serving does.
  classifier = classifiers.SavedModelClassifier(
      os.path.dirname(trained_export), 'serving_default'
  )
  outputs = classifier(images)
  np.testing.assert_allclose(
      outputs['logits'], np.asarray(trained_model(images)), atol=1e-4
  )


def test_rest_request_is_what_tf_serving_documents(rest_recorder, pngs):
  address, requests = rest_recorder
  del requests[:]
  classifiers.RestClassifier(address, 'mnist', 'mnist_server', 10.0)(
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


def test_grpc_request_is_what_tf_serving_documents(grpc_recorder, pngs):
  address, requests = grpc_recorder
  del requests[:]
  images = np.concatenate([predict.load_input(p) for p in pngs[:3]])
  classifiers.GrpcClassifier(address, 'mnist', 'mnist_server', 10.0)(images)
  (request,) = requests
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
      'saved_model': lambda: classifiers.SavedModelClassifier(
          trained_export, 'serving_default'
      ),
      'rest': lambda: classifiers.RestClassifier(
          rest_server, 'mnist', 'serving_default', 10.0
      ),
      'grpc': lambda: classifiers.GrpcClassifier(
          grpc_server, 'mnist', 'serving_default', 10.0
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
      'saved_model': lambda: classifiers.SavedModelClassifier(
          trained_export, signature
      ),
      'rest': lambda: classifiers.RestClassifier(
          rest_server, 'mnist', signature, 10.0
      ),
      'grpc': lambda: classifiers.GrpcClassifier(
          grpc_server, 'mnist', signature, 10.0
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
  floats = classifiers.SavedModelClassifier(trained_export, 'serving_default')(
      np.concatenate([predict.load_input(p) for p in paths])
  )
  np.testing.assert_allclose(
      [r['logits'] for r in rows], floats['logits'], atol=1e-5
  )


def test_rest_request_of_bytes_is_what_tf_serving_documents(
    rest_recorder, pngs
):
  address, requests = rest_recorder
  del requests[:]
  classifiers.RestClassifier(address, 'mnist', 'serving_bytes', 10.0)(
      predict.load_input(pngs[0], as_bytes=True)
  )
  request = json.loads(requests[-1][3])
  with open(pngs[0], 'rb') as f:
    encoded = base64.b64encode(f.read()).decode()
  assert request == {
      'signature_name': 'serving_bytes',
      'instances': [{'b64': encoded}],
  }


def test_predict_sends_as_bytes_only_what_the_signature_decodes(
    trained_export, pngs, bad_inputs, heap_corrupting_webp
):
  classifier = classifiers.SavedModelClassifier(trained_export, 'serving_bytes')
  paths = [bad_inputs['not_image'], heap_corrupting_webp, pngs[0]]
  paths.append(bad_inputs['good_npy'])
  failures, out, err = _classify(paths, classifier, as_bytes=True)
  assert failures == 3
  assert [line.split(':')[0] for line in out] == [pngs[0]]
  not_sent = (
      'not a PNG, JPEG or BMP file, the formats that serving_bytes decodes: '
      'leave out --bytes to decode it here'
  )
  assert err == [
      f'error: {paths[0]}: {not_sent}',
      f'error: {paths[1]}: {not_sent}',
      f'error: {paths[3]}: an array, not an encoded image: leave out --bytes',
  ]


# Each way to the bytes signature, and how it says that the model refused.
_EACH_WAY_REFUSES = pytest.mark.parametrize(
    'way, answer',
    [
        ('saved_model', 'the model refused it'),
        ('rest', 'server {} answered 400'),
        ('grpc', 'server {} answered INVALID_ARGUMENT'),
    ],
)


@_EACH_WAY_REFUSES
def test_the_bytes_signature_refuses_other_bytes_and_goes_on(
    way, answer, trained_export, standin, pngs, heap_corrupting_webp
):
  """The stand-in lives through the WebP that aborts TensorFlow's decoder."""
  classifier = _classifiers(
      way, trained_export, standin.rest, standin.grpc, 'serving_bytes'
  )
  address = {'rest': standin.rest, 'grpc': standin.grpc}.get(way, '')
  with open(heap_corrupting_webp, 'rb') as f:
    webp = f.read()
  with open(pngs[0], 'rb') as f:
    png = f.read()
  formats = 'PNG, JPEG or BMP image, the formats the model decodes'
  for data, why in [
      (webp, f'the input is not a {formats}'),
      (b'', f'the input is 0 bytes, too short to be a {formats}'),
      (png[:7], f'the input is 7 bytes, too short to be a {formats}'),
  ]:
    with pytest.raises(predict.InputError) as refused:
      classifier(np.array([data], object))
    assert str(refused.value) == f'{answer.format(address)}: {why}'
  logits = classifier(np.array([png], object))['logits']
  floats = classifiers.SavedModelClassifier(trained_export, 'serving_default')
  expected = floats(predict.load_input(pngs[0]))['logits']
  np.testing.assert_allclose(logits, expected, atol=1e-5)
  if way != 'saved_model':
    assert standin.process.poll() is None


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
      classifiers.RestClassifier(rest_server, 'mnist', 'serving_default', 10.0),
      pngs,
      bad_inputs,
  )


def test_bad_files_grpc(grpc_server, pngs, bad_inputs):
  _check_bad_inputs(
      classifiers.GrpcClassifier(grpc_server, 'mnist', 'serving_default', 10.0),
      pngs,
      bad_inputs,
  )


def test_a_server_that_does_not_answer(closed_port, pngs):
  for classifier in (
      classifiers.RestClassifier(closed_port, 'mnist', 'serving_default', 5.0),
      classifiers.GrpcClassifier(closed_port, 'mnist', 'serving_default', 5.0),
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
    classifier = classifiers.RestClassifier(
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
          classifiers.RestClassifier(rest_server, model_name, signature, 10.0),
          f'server {rest_server} answered {rest_status}: {cause}',
      ),
      (
          classifiers.GrpcClassifier(grpc_server, model_name, signature, 10.0),
          f'server {grpc_server} answered {grpc_status}: {cause}',
      ),
  ):
    failures, out, err = _classify(pngs[:1], classifier)
    assert (failures, out) == (1, [])
    assert err == [f'error: {pngs[0]}: {answer}']


# Images over the decoding bound: one line each, in bounded memory.


def _peak_rss_growth(pid: int, send) -> float:
  """MB that process `pid`'s peak resident memory rose over its RSS, by `send()`.

  Linux resets the peak (VmHWM) when 5 is written to /proc/PID/clear_refs.
  """

  def status(field: str) -> float:
    with open(f'/proc/{pid}/status') as f:
      line = next(l for l in f if l.startswith(field + ':'))
    return int(line.split()[1]) / 1024

  with open(f'/proc/{pid}/clear_refs', 'w') as f:
    f.write('5')
  before = status('VmRSS')
  send()
  return status('VmHWM') - before


@_EACH_WAY_REFUSES
def test_the_bytes_signature_refuses_images_over_the_bound(
    way, answer, trained_export, standin, pngs, oversized_images
):
  """Refused before decoding: the stand-in's peak memory barely moves.

  Decoded, the blank 5000x5000 PNG alone would cost it hundreds of MB.
  """
  classifier = _classifiers(
      way, trained_export, standin.rest, standin.grpc, 'serving_bytes'
  )
  paths = [*oversized_images.values(), pngs[0]]
  result = []
  send = lambda: result.append(_classify(paths, classifier, as_bytes=True))
  if way == 'saved_model':
    send()
  else:
    assert _peak_rss_growth(standin.process.pid, send) < 100
  failures, out, err = result[0]
  assert failures == len(oversized_images)
  assert [line.split(':')[0] for line in out] == [pngs[0]]
  address = {'rest': standin.rest, 'grpc': standin.grpc}.get(way, '')
  assert err == [
      f'error: {path}: {answer.format(address)}: '
      + image_decoding_test.REFUSALS[name]
      + image_decoding_test.BOUND
      for name, path in oversized_images.items()
  ]


@_EACH_WAY_REFUSES
def test_the_bytes_signature_refuses_costly_files_and_goes_on(
    way, answer, trained_export, standin, pngs, costly_images
):
  """The crafted JPEG of 20,006 scans among them; then a PNG is classified."""
  classifier = _classifiers(
      way, trained_export, standin.rest, standin.grpc, 'serving_bytes'
  )
  paths = [*costly_images.values(), pngs[0]]
  failures, out, err = _classify(paths, classifier, as_bytes=True)
  assert failures == len(costly_images)
  assert [line.split(':')[0] for line in out] == [pngs[0]]
  address = {'rest': standin.rest, 'grpc': standin.grpc}.get(way, '')
  assert err == [
      f'error: {path}: {answer.format(address)}: '
      + image_decoding_test.COSTLY[name]
      for name, path in costly_images.items()
  ]
  if way != 'saved_model':
    assert standin.process.poll() is None


def test_predict_refuses_costly_files_before_pillow_decodes(
    trained_export, pngs, costly_images
):
  """Pillow decodes a CMYK JPEG, which serving_bytes refuses for its cost."""
  scans, png = costly_images['scans.jpg'], costly_images['rgb16.png']
  paths = [scans, png, costly_images['cmyk.jpg'], pngs[0]]
  floats = classifiers.SavedModelClassifier(trained_export, 'serving_default')
  failures, out, err = _classify(paths, floats)
  assert failures == 2
  assert [line.split(':')[0] for line in out] == paths[2:]
  assert err == [
      f'error: {scans}: the JPEG holds 20006 scans; predict.py decodes JPEGs '
      'of at most 24 scans',
      f'error: {png}: the PNG is 4096x4096 pixels of 6 bytes; predict.py '
      'decodes PNGs of at most 50331648 bytes of pixels (4096x4096 8-bit RGB)',
  ]


@pytest.mark.parametrize('way', ['rest', 'grpc'])
def test_a_request_over_the_budget_is_one_line(way, standin, tmp_path):
  path = tmp_path / 'bound.png'
  Image.new('L', (4096, 4096)).save(path)
  classifier = _classifiers(
      way, None, standin.rest, standin.grpc, 'serving_bytes'
  )
  with pytest.raises(predict.InputError) as refused:
    classifier(np.array([path.read_bytes()] * 5, object))
  assert str(refused.value).endswith(
      ': the images claim 83886080 pixels in all; the model decodes at most '
      '67108864 pixels a request (four 4096x4096 images)'
  )
  assert standin.process.poll() is None


def _peak_rss_mb(args: list[str], tmp_path) -> tuple[list[str], float]:
  """predict.py's output lines and error lines, and its peak memory (MB)."""
  out, err = tmp_path / 'out', tmp_path / 'err'
  with open(out, 'w') as stdout, open(err, 'w') as stderr:
    process = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, 'predict.py'), *args],
        stdout=stdout,
        stderr=stderr,
        cwd=ROOT,
    )
    _, status, usage = os.wait4(process.pid, 0)  # Waited for, with its usage.
  assert os.waitstatus_to_exitcode(status) == (1 if len(args) > 2 else 0)
  lines = out.read_text().splitlines(), err.read_text().strip().splitlines()
  return lines, usage.ru_maxrss / 1024


def test_predict_refuses_images_over_the_bound_before_decoding(
    trained_export, pngs, oversized_images, tmp_path
):
  """Its own decoding (Pillow) too; the others are classified.

  Pillow refuses sizes past twice its own bound by itself.
  """
  model = f'--saved_model={os.path.dirname(trained_export)}'
  refused = oversized_images
  (out, err), peak = _peak_rss_mb([model, *refused.values(), pngs[0]], tmp_path)
  (alone, _), peak_alone = _peak_rss_mb([model, pngs[0]], tmp_path)
  assert out == alone and len(out) == 1
  bound = 'at most 16777216 pixels (4096x4096), 16384 on a side'
  assert err == [
      f'error: {path}: '
      + (
          'the image claims over 178956970 pixels'
          if name == 'claims.png'
          else image_decoding_test.REFUSALS[name]
      )
      + f'; predict.py decodes {bound}'
      for name, path in refused.items()
  ]
  assert peak < peak_alone + 50


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
  for flag in (f'--server={rest_server}', f'--grpc={grpc_server}'):
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
      f'error: {bad_inputs["not_image"]}: not a PNG, JPEG or BMP file, the '
      'formats that serving_bytes decodes: leave out --bytes to decode it here'
  ]
  # What the command prints from the float signature (test_command_saved_model
  # _without_jax runs it), here in this process: one process fewer.
  floats = classifiers.SavedModelClassifier(model_dir, 'serving_default')
  assert result.stdout.splitlines() == _classify(pngs[:2], floats)[1]
  result = _predict(
      f'--saved_model={model_dir}', '--bytes', '--invert', pngs[0]
  )
  assert result.returncode == 1
  assert '--invert cannot change images sent as bytes' in result.stderr


@pytest.mark.slow  # A process that starts TensorFlow.
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


# TF Serving as README.md starts it: XLA on, on an image that runs the export.


def test_readme_starts_pinned_servers_detached_with_xla():
  with open(os.path.join(ROOT, 'README.md')) as f:
    blocks = re.findall(r'```sh\n(.*?)```', f.read(), re.S)
  cpu, gpu = [b for b in blocks if b.startswith('docker run -d ')]
  for run, image, xla in (
      (cpu, SERVING_IMAGE, '--xla_cpu_compilation_enabled=true'),
      (gpu, f'{SERVING_IMAGE}-gpu', '--xla_gpu_compilation_enabled=true'),
  ):
    words = run.replace('\\\n', ' ').split()
    assert '$HOME/mnist/export/mnist:/models/mnist' in words
    assert words[words.index(image) + 1 :] == [
        '--model_name=mnist',
        '--model_base_path=/models/mnist',
        xla,
        '--rest_api_enable_cors_support=true',
    ]
  assert '--gpus' in gpu.split() and '--gpus' not in cpu.split()


def test_without_xla_the_server_loads_no_model(model_base_path, tmp_path):
  """Started as README.md started it before: the warm-up meets the XLA gate.

  TF Serving tries 5 more loads, a minute apart; here none.
  """
  server = StandIn(
      readme_server_flags(model_base_path, xla=False)
      + ['--max_num_load_retries=0'],
      str(tmp_path / 'log'),
  )
  try:
    assert server.process.wait(300) == 255
  finally:
    server.stop()
  assert [
      line
      for line in server.output().splitlines()
      if line.startswith('Failed to start server.')
  ] == [
      'Failed to start server. Error: UNKNOWN: 1 servable(s) did not become '
      'available: {{name: mnist version: 1} due to error: INTERNAL: XLA '
      'compilation disabled'
  ]


def test_without_xla_predict_names_the_flag(model_base_path, tmp_path, pngs):
  """Without its warm-up, the model loads; then every request meets the gate."""
  server = StandIn(
      readme_server_flags(model_base_path, xla=False)
      + ['--enable_model_warmup=false'],
      str(tmp_path / 'log'),
  )
  try:
    server.wait_until_served()
    for classifier, answer in (
        (
            classifiers.RestClassifier(
                server.rest, 'mnist', 'mnist_server', 60.0
            ),
            f'server {server.rest} answered 500',
        ),
        (
            classifiers.GrpcClassifier(
                server.grpc, 'mnist', 'mnist_server', 60.0
            ),
            f'server {server.grpc} answered INTERNAL',
        ),
    ):
      failures, out, err = _classify(pngs[:1], classifier)
      assert (failures, out) == (1, [])
      assert err == [f'error: {pngs[0]}: {answer}: {XLA_DISABLED}']
  finally:
    server.stop()


@pytest.mark.parametrize(
    'message',
    [
        # TensorFlow 2.19.1's, running this export, then one exported with
        # JAX_EXPORT_CALLING_CONVENTION_VERSION=9.
        'XlaCallModuleOp with version 10 is not supported by this build. '
        'Must be <= 9\n\t [[{{node XlaCallModule}}]]\n\ttf2xla conversion '
        'failed while converting __inference_predict_fn_110[].',
        'Cannot deserialize computation\n\t [[{{node XlaCallModule}}]]\n'
        '\ttf2xla conversion failed while converting '
        '__inference_predict_fn_110[].',
    ],
)
def test_a_tensorflow_too_old_for_the_export_is_named(message):
  assert classifiers.tensorflow_error(message) == (
      f'{message.splitlines()[0]}: the export needs TensorFlow 2.20 or later '
      '(a TF Serving built on it: tensorflow/serving:2.20.0 or later)'
  )


# Servers behind TLS.


@pytest.fixture(scope='module')
def certificate(tmp_path_factory) -> dict[str, str]:
  """A self-signed certificate of 127.0.0.1 (its own CA) and its SSLConfig."""
  directory = tmp_path_factory.mktemp('tls')
  cert, key = directory / 'cert.pem', directory / 'key.pem'
  subprocess.run(
      [
          'openssl',
          'req',
          '-x509',
          '-newkey',
          'rsa:2048',
          '-nodes',
          '-days',
          '1',
          '-subj',
          '/CN=127.0.0.1',
          '-addext',
          'subjectAltName=IP:127.0.0.1',
          '-keyout',
          str(key),
          '-out',
          str(cert),
      ],
      check=True,
      capture_output=True,
  )
  # TF Serving's SSLConfig, a text proto; JSON's string escapes are its own.
  (directory / 'ssl_config.txt').write_text(
      f'server_key: {json.dumps(key.read_text())}\n'
      f'server_cert: {json.dumps(cert.read_text())}\n'
  )
  return {'ca_file': str(cert), 'ssl_config': str(directory / 'ssl_config.txt')}


@pytest.fixture(scope='module')
def tls_standin(model_base_path, certificate, tmp_path_factory):
  """The stand-in with gRPC over TLS (TF Serving's --ssl_config_file), and
  REST over TLS as an HTTPS ingress in front of TF Serving serves it."""
  server = StandIn(
      readme_server_flags(model_base_path)
      + [
          f'--ssl_config_file={certificate["ssl_config"]}',
          f'--rest_api_ssl_config_file={certificate["ssl_config"]}',
      ],
      str(tmp_path_factory.mktemp('tls_standin') / 'log'),
      ca_file=certificate['ca_file'],
  )
  try:
    server.wait_until_served()
    yield server
  finally:
    server.stop()


def _tls_classifier(way: str, server: StandIn, ca_file):
  if way == 'rest':
    return classifiers.RestClassifier(
        f'https://{server.rest}', 'mnist', 'serving_default', 60.0, ca_file
    )
  return classifiers.GrpcClassifier(
      server.grpc, 'mnist', 'serving_default', 60.0, True, ca_file
  )


@pytest.mark.parametrize('way', ['rest', 'grpc'])
def test_tls_with_the_ca_file_of_the_server(
    way, tls_standin, certificate, signatures, pngs
):
  classifier = _tls_classifier(way, tls_standin, certificate['ca_file'])
  failures, out, err = _classify(pngs[:3], classifier, as_json=True)
  assert (failures, err) == (0, [])
  images = np.concatenate([predict.load_input(p) for p in pngs[:3]])
  expected = _run_signature(signatures[1], 'serving_default', {'image': images})
  np.testing.assert_allclose(
      [json.loads(line)['logits'] for line in out],
      expected['logits'],
      atol=1e-5,
  )


@pytest.mark.parametrize('way', ['rest', 'grpc'])
def test_tls_refuses_a_certificate_that_does_not_verify(way, tls_standin, pngs):
  classifier = _tls_classifier(way, tls_standin, None)
  failures, out, err = _classify(pngs[:1], classifier)
  assert (failures, out, len(err)) == (1, [], 1)
  address = f'https://{tls_standin.rest}' if way == 'rest' else tls_standin.grpc
  # OpenSSL's words (REST), or BoringSSL's (gRPC).
  assert re.fullmatch(
      f'error: {re.escape(pngs[0])}: server {re.escape(address)}: certificate '
      r'verify failed \(self.signed certificate\): name the CA that signed it '
      'with --ca_file',
      err[0],
  ), err[0]


def test_command_tls(
    tls_standin, grpc_server, certificate, pngs, model_base_path
):
  ca_file = f'--ca_file={certificate["ca_file"]}'
  # The served model's answer, as predict.py prints it from the SavedModel
  # (test_command_saved_model_without_jax runs that command), in this process.
  model = classifiers.SavedModelClassifier(model_base_path, 'serving_default')
  failures, lines, _ = _classify(pngs[:1], model)
  assert failures == 0 and lines[0].startswith(f'{pngs[0]}: ')
  for server_flags in (
      [f'--server=https://{tls_standin.rest}', ca_file],
      [f'--grpc={tls_standin.grpc}', '--grpc_tls', ca_file],
  ):
    result = _predict(*server_flags, pngs[0])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == lines
  for server_flags, cause in (
      (
          [f'--server={tls_standin.rest}', ca_file],
          '--ca_file verifies a server over TLS: --server=https://... or '
          '--grpc_tls',
      ),
      (
          [f'--server=grpc://{tls_standin.grpc}'],
          f'flag --server=grpc://{tls_standin.grpc}: expected HOST:PORT, '
          'http://HOST:PORT or https://HOST[:PORT]',
      ),
  ):
    result = _predict(*server_flags, pngs[0])
    assert result.returncode == 1
    assert cause in result.stderr
  # A failed handshake, with no CA named or over TLS to a plain server: the
  # one-line error alone, without gRPC's log line of the handshake before it.
  for server_flags, cause in (
      (
          [f'--grpc={tls_standin.grpc}', '--grpc_tls'],
          f'server {tls_standin.grpc}: certificate verify failed',
      ),
      (
          [f'--grpc={grpc_server}', '--grpc_tls'],
          f'server {grpc_server} does not answer (UNAVAILABLE',
      ),
  ):
    result = _predict(*server_flags, pngs[0])
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f'error: {pngs[0]}: {cause}'), lines[0]
