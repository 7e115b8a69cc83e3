"""A stand-in for TF Serving's model server, for the tests: predict.py, web/.

  python -m tools.serving_standin --port=8500 --rest_api_port=8501 \
      --model_name=mnist --model_base_path=$HOME/mnist/export/mnist \
      --xla_cpu_compilation_enabled=true

TF Serving has no binary or image here. This program takes the flags of
`tensorflow_model_server` that README.md gives it, and does with them what
the server does, in TensorFlow's own code:

- Unless --xla_cpu_compilation_enabled or --xla_gpu_compilation_enabled is
  true, it turns XLA compilation off for the whole process with TensorFlow's
  `tensorflow::DisableXlaCompilation()`, as the server's main.cc does. The
  export's XlaCallModule ops then fail with TensorFlow's own error.
- It loads the highest integer version under --model_base_path into a
  TensorFlow session (tag 'serve') and replays its warm-up requests. A load
  that fails is tried again --max_num_load_retries times,
  --load_retry_interval_micros apart; then the program prints the server's
  'Failed to start server' line and exits with status 255.
- Only then does it listen: gRPC (PredictionService.Predict,
  ModelService.GetModelStatus) on --port, behind TLS with --ssl_config_file
  (an SSLConfig text proto), and REST (predict, model status) on
  --rest_api_port if it is not 0.
- With --rest_api_enable_cors_support=true (false by default, as the
  server's), every answer of the REST API (any path under /v1/, errors
  included) carries the server's three CORS headers:
  Access-Control-Allow-Origin: *, Access-Control-Allow-Methods: POST, GET,
  and Access-Control-Allow-Headers: Content-Type. An OPTIONS request under
  /v1/ (a browser's preflight) is answered with or without the flag: 200 and
  an empty body when its Origin header holds http:// or https:// (anywhere
  in it, not only at its start), else 400 and an empty body; without the flag
  the 200 lacks the headers, so a browser refuses to send the request.
- A request's Content-Type is not read: a POST's body is parsed as JSON
  whatever type it claims. So the POST that a browser sends without a
  preflight (a text/plain body) is answered as a JSON one, from a page of
  any origin, a file's (Origin: null) included.

The CORS behaviour follows these files of tensorflow/serving, under
tensorflow_serving/:
- model_servers/main.cc: the flag; model_servers/server.cc hands it to the
  server core.
- model_servers/http_server.cc: the REST dispatcher (paths matching
  (?i)/v1/.*); its ProcessRequest (lines 152-203 at the 2.20.0 tag), which
  reads no header but an OPTIONS request's Origin (170-177), hands every
  other request's method, path and body to the handler (179-181), and adds
  the CORS headers to every answer (183-185).
- model_servers/http_rest_api_handler.cc: ProcessRequest (lines 65-109),
  which dispatches on the method and path alone, the body parsed as JSON.
- model_servers/http_rest_api_util.cc: the headers.
- util/net_http/server/internal/evhttp_server.cc: OPTIONS let through to the
  dispatcher; paths that no handler takes answered 404.

Unlike the server, it listens on the loopback interface only, serves one
version and does not look for new ones. --rest_api_ssl_config_file is not
the server's (its REST API is plain HTTP): it serves REST over TLS, as an
HTTPS ingress in front of the server does.
"""

import sys

from run import startup

if __name__ == '__main__':  # Before TensorFlow's first import.
  startup.begin(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
import base64
import concurrent.futures
import ctypes
import functools
import glob
import http.server
import json
import os
import re
import ssl
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import json_format
from google.protobuf import message_factory
from google.protobuf import text_format
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

FLAGS = flags.FLAGS

# The server's flags, with its defaults.
flags.DEFINE_integer('port', 8500, 'gRPC port; 0 turns gRPC off.')
flags.DEFINE_integer('rest_api_port', 0, 'REST port; 0 turns REST off.')
flags.DEFINE_string('model_name', 'default', 'Name of the model served.')
flags.DEFINE_string(
    'model_base_path', None, 'Directory of the integer versions of the model.'
)
flags.DEFINE_bool(
    'xla_cpu_compilation_enabled', False, 'XLA:CPU JIT (off by default).'
)
flags.DEFINE_bool(
    'xla_gpu_compilation_enabled', False, 'XLA:CPU and XLA:GPU JIT.'
)
flags.DEFINE_bool(
    'enable_model_warmup', True, 'Replay assets.extra/ warm-up requests.'
)
flags.DEFINE_integer(
    'max_num_load_retries', 5, 'Loads tried again after the first failure.'
)
flags.DEFINE_integer(
    'load_retry_interval_micros', 60_000_000, 'Wait between load tries.'
)
flags.DEFINE_string(
    'ssl_config_file', '', 'SSLConfig text proto: gRPC over TLS.'
)
flags.DEFINE_bool(
    'rest_api_enable_cors_support', False, 'CORS headers on REST answers.'
)
# Not the server's.
flags.DEFINE_string(
    'rest_api_ssl_config_file',
    '',
    'SSLConfig text proto: REST over TLS, as an HTTPS ingress serves it.',
)

WARMUP_FILE = os.path.join('assets.extra', 'tf_serving_warmup_requests')
# How TF Serving's REST API answers each canonical error code.
HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}  # Any other: 500.


def disable_xla_compilation() -> None:
  """Calls TensorFlow's `tensorflow::DisableXlaCompilation()`, in its library.

  TF Serving calls it when started without an XLA flag; it turns XLA off for
  every op of the process that would compile, XlaCallModule among them.
  """
  (library,) = glob.glob(
      os.path.join(tf.sysconfig.get_lib(), 'libtensorflow_cc.*')
  )
  ctypes.CDLL(library)._ZN10tensorflow21DisableXlaCompilationEv()


class ServingError(Exception):
  """A failed request: its canonical code and the server's message."""

  def __init__(self, code: grpc.StatusCode, message: str):
    super().__init__(message)
    self.code = code
    self.message = message


def _status_message(error: tf.errors.OpError) -> str:
  """The status message of a failed run, as the server sends it.

  TensorFlow's Python adds a header and the op's definition in front; the C++
  status that TF Serving sends starts at the cause.
  """
  lines = error.message.splitlines()
  causes = [i for i, l in enumerate(lines) if l and not l[0].isspace()]
  return '\n'.join(lines[causes[-1] :]) if causes else error.message


def _code(error: tf.errors.OpError) -> grpc.StatusCode:
  """The canonical code of a TensorFlow error (gRPC's codes are the same)."""
  for code in grpc.StatusCode:
    if code.value[0] == error.error_code:
      return code
  return grpc.StatusCode.UNKNOWN


def highest_version(model_base_path: str) -> int | None:
  """The highest integer version directory under `model_base_path`, if any."""
  names = os.listdir(model_base_path) if os.path.isdir(model_base_path) else []
  return max((int(n) for n in names if n.isdigit()), default=None)


class Servable:
  """One version of a SavedModel in a session, run as TF Serving runs it.

  The server loads the MetaGraph tagged 'serve' into a session and runs a
  signature by its SignatureDef's tensor names, feeding the request's inputs.
  """

  def __init__(self, name: str, version: int, path: str):
    self.name, self.version, self.path = name, version, path
    self._graph = tf.Graph()
    self._session = tf.compat.v1.Session(graph=self._graph)
    with self._graph.as_default():
      meta_graph = tf.compat.v1.saved_model.load(self._session, ['serve'], path)
    self.signatures = dict(meta_graph.signature_def)

  def run(self, signature_name: str, inputs: dict) -> dict[str, np.ndarray]:
    """Runs a signature on named arrays (or lists); raises ServingError."""
    signature_name = signature_name or 'serving_default'
    signature = self.signatures.get(signature_name)
    if signature is None:
      raise ServingError(
          grpc.StatusCode.INVALID_ARGUMENT,
          f'Serving signature name: "{signature_name}" not found in '
          'signature def',
      )
    sent, wanted = set(inputs), set(signature.inputs)
    if sent != wanted:
      names = lambda keys: '{' + ','.join(sorted(keys)) + '}'
      raise ServingError(
          grpc.StatusCode.INVALID_ARGUMENT,
          f'input size does not match signature: {len(sent)}!={len(wanted)} '
          f'len({names(sent)}) != len({names(wanted)}). Sent extra: '
          f'{names(sent - wanted)}. Missing but required: '
          f'{names(wanted - sent)}.',
      )
    feed = {}
    for name, value in inputs.items():
      dtype = tf.dtypes.as_dtype(signature.inputs[name].dtype)
      feed[signature.inputs[name].name] = np.asarray(
          value, object if dtype == tf.string else dtype.as_numpy_dtype
      )
    fetches = {k: v.name for k, v in signature.outputs.items()}
    try:
      return self._session.run(fetches, feed)
    except tf.errors.OpError as e:
      raise ServingError(_code(e), _status_message(e)) from None
    except (TypeError, ValueError) as e:
      raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None

  def predict(
      self, request: predict_pb2.PredictRequest
  ) -> predict_pb2.PredictResponse:
    """TF Serving's Predict: named TensorProtos in and out."""
    inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
    signature_name = request.model_spec.signature_name or 'serving_default'
    outputs = self.run(signature_name, inputs)
    response = predict_pb2.PredictResponse()
    response.model_spec.name = self.name
    response.model_spec.version.value = self.version
    response.model_spec.signature_name = signature_name
    for k, v in outputs.items():
      response.outputs[k].CopyFrom(tf.make_tensor_proto(v))
    return response

  def warmup_requests(self) -> list[predict_pb2.PredictRequest]:
    """The Predict requests of the version's warm-up file (none if no file)."""
    path = os.path.join(self.path, WARMUP_FILE)
    if not os.path.isfile(path):
      return []
    return [
        prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        for record in tf.compat.v1.io.tf_record_iterator(path)
    ]


def load(
    name: str, base_path: str, warmup: bool, retries: int, interval_s: float
) -> Servable:
  """The highest version, loaded and warmed up, as the server loads it.

  Waits for a first version to appear, as the server does. A load that fails
  is tried again `retries` times; the last failure is raised as RuntimeError
  with the server's message.
  """
  while (version := highest_version(base_path)) is None:
    logging.log_first_n(
        logging.WARNING,
        'No versions of servable %s found under base path %s',
        1,
        name,
        base_path,
    )
    time.sleep(1)
  path = os.path.join(base_path, str(version))
  for attempt in range(retries + 1):
    try:
      servable = Servable(name, version, path)
      if warmup:
        for request in servable.warmup_requests():
          servable.predict(request)
      logging.info('Successfully loaded servable version %s %s', name, version)
      return servable
    except ServingError as e:
      error = f'{e.code.name}: {e.message}'
    except tf.errors.OpError as e:
      error = f'{_code(e).name}: {_status_message(e)}'
    logging.error('Loading servable %s version %s: %s', name, version, error)
    if attempt < retries:
      time.sleep(interval_s)
  raise RuntimeError(
      '1 servable(s) did not become available: '
      f'{{{{name: {name} version: {version}}} due to error: {error}}}, }}'
  )


# The front ends.


def _rest_value(value):
  """A REST value as TF Serving reads it: {"b64": ...} is a binary string."""
  if isinstance(value, dict) and list(value) == ['b64']:
    return base64.b64decode(value['b64'])
  return value


def _model_status(
    servable: Servable, name: str, version: int | None
) -> get_model_status_pb2.GetModelStatusResponse:
  if name != servable.name:
    raise ServingError(
        grpc.StatusCode.NOT_FOUND,
        f'Could not find any versions of model {name}',
    )
  if version is not None and version != servable.version:
    raise ServingError(
        grpc.StatusCode.NOT_FOUND,
        f'Could not find version {version} of model {name}',
    )
  response = get_model_status_pb2.GetModelStatusResponse()
  status = response.model_version_status.add(version=servable.version)
  status.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
  status.status.SetInParent()  # OK, as the server's ToStatusProto makes it.
  return response


def _check_servable(servable: Servable, name: str, version: int | None):
  if name != servable.name or version not in (None, servable.version):
    wanted = f'Specific({name}, {version})' if version else f'Latest({name})'
    raise ServingError(
        grpc.StatusCode.NOT_FOUND, f'Servable not found for request: {wanted}'
    )


class RestHandler(http.server.BaseHTTPRequestHandler):
  """TF Serving's REST API: predict (row format) and model status."""

  servable: Servable = None  # Set on the subclass that a server uses.
  cors = False  # --rest_api_enable_cors_support, set there too.
  PATH = re.compile(r'/v1/models/([^/:]+)(?:/versions/(\d+))?(:predict)?')
  API = re.compile(r'(?i)/v1/.*')  # The paths the server's dispatcher takes.
  CORS_HEADERS = {
      'Access-Control-Allow-Origin': '*',
      'Access-Control-Allow-Methods': 'POST, GET',
      'Access-Control-Allow-Headers': 'Content-Type',
  }

  def do_OPTIONS(self):  # pylint: disable=invalid-name
    """A CORS preflight: 200 if the Origin names an http(s) page, else 400.

    The server answers it without looking at the model or the flag, with an
    empty body either way; outside /v1/, its HTTP library's 404.
    """
    if not self._in_api():
      return self.send_error(404)
    origin = self.headers.get('Origin', '')
    return self._send(200 if re.search('https?://', origin) else 400, b'', {})

  def _in_api(self) -> bool:
    """Whether the path, its query aside, is one the dispatcher takes."""
    return bool(self.API.fullmatch(self.path.split('?')[0]))

  def do_GET(self):  # pylint: disable=invalid-name
    self._serve(self._status, predict=False)

  def do_POST(self):  # pylint: disable=invalid-name
    body = self.rfile.read(int(self.headers['Content-Length']))
    self._serve(functools.partial(self._predict, body=body), predict=True)

  def _serve(self, answer, predict: bool) -> None:
    """Answers `answer(model name, version or None)`, or the error raised."""
    match = self.PATH.fullmatch(self.path)
    if not match or bool(match.group(3)) != predict:
      return self._answer(404, {'error': f'Malformed request: {self.path}'})
    version = int(match.group(2)) if match.group(2) else None
    try:
      return self._answer(200, answer(match.group(1), version))
    except ServingError as e:
      return self._answer(HTTP_STATUS.get(e.code, 500), {'error': e.message})

  def _status(self, name: str, version: int | None) -> dict:
    response = _model_status(self.servable, name, version)
    return json.loads(
        json_format.MessageToJson(
            response, always_print_fields_with_no_presence=True
        )
    )

  def _predict(self, name: str, version: int | None, body: bytes) -> dict:
    _check_servable(self.servable, name, version)
    try:
      request = json.loads(body)
      signature = request.get('signature_name', 'serving_default')
      instances = [_rest_value(row) for row in request['instances']]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
    if instances and isinstance(instances[0], dict):
      inputs = {
          k: [_rest_value(row[k]) for row in instances] for k in instances[0]
      }
    else:  # The signature's only input.
      signature_def = self.servable.signatures.get(signature)
      names = list(signature_def.inputs) if signature_def else ['']
      inputs = {names[0]: instances}
    outputs = self.servable.run(signature, inputs)
    names = sorted(outputs)
    return {
        'predictions': [
            {k: outputs[k][i].tolist() for k in names}
            for i in range(len(outputs[names[0]]))
        ]
    }

  def _answer(self, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    self._send(status, data, {'Content-Type': 'application/json'})

  def _send(self, status: int, data: bytes, headers: dict) -> None:
    """Answers `data`, with the CORS headers if on and the path is the API's."""
    if self.cors and self._in_api():
      headers = {**headers, **self.CORS_HEADERS}
    self.send_response(status)
    for name, value in headers.items():
      self.send_header(name, value)
    self.send_header('Content-Length', str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    del args  # Quiet, as the server is.


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
  """TF Serving's gRPC Predict."""

  def __init__(self, servable: Servable):
    self.servable = servable

  def Predict(self, request, context):  # pylint: disable=invalid-name
    spec = request.model_spec
    try:
      _check_servable(
          self.servable,
          spec.name,
          spec.version.value if spec.HasField('version') else None,
      )
      return self.servable.predict(request)
    except ServingError as e:
      context.abort(e.code, e.message)


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
  """TF Serving's gRPC GetModelStatus."""

  def __init__(self, servable: Servable):
    self.servable = servable

  def GetModelStatus(self, request, context):  # pylint: disable=invalid-name
    spec = request.model_spec
    try:
      return _model_status(
          self.servable,
          spec.name,
          spec.version.value if spec.HasField('version') else None,
      )
    except ServingError as e:
      context.abort(e.code, e.message)


# TLS.


def _ssl_config_class():
  """TF Serving's SSLConfig message (ssl_config.proto; not in its pip API)."""
  file = descriptor_pb2.FileDescriptorProto(
      name='tensorflow_serving/config/ssl_config.proto',
      package='tensorflow.serving',
      syntax='proto3',
  )
  message = file.message_type.add(name='SSLConfig')
  string, boolean = (
      descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
      descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
  )
  for number, (name, kind) in enumerate(
      [
          ('server_key', string),
          ('server_cert', string),
          ('custom_ca', string),
          ('client_verify', boolean),
      ],
      1,
  ):
    message.field.add(
        name=name,
        number=number,
        type=kind,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
  pool = descriptor_pool.DescriptorPool()
  pool.Add(file)
  return message_factory.GetMessageClass(
      pool.FindMessageTypeByName('tensorflow.serving.SSLConfig')
  )


SSLConfig = _ssl_config_class()


def read_ssl_config(path: str):
  with open(path) as f:
    return text_format.Parse(f.read(), SSLConfig())


def grpc_credentials(config) -> grpc.ServerCredentials:
  """The server's TLS credentials of an SSLConfig, as its server.cc builds them."""
  return grpc.ssl_server_credentials(
      [(config.server_key.encode(), config.server_cert.encode())],
      root_certificates=config.custom_ca.encode() or None,
      require_client_auth=config.client_verify,
  )


def tls_context(config) -> ssl.SSLContext:
  """A server-side TLS context with the key and certificate of an SSLConfig."""
  context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  with tempfile.TemporaryDirectory() as directory:
    paths = [os.path.join(directory, n) for n in ('cert.pem', 'key.pem')]
    for path, pem in zip(paths, (config.server_cert, config.server_key)):
      with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), 'w') as f:
        f.write(pem)
    context.load_cert_chain(*paths)
  return context


def serve(servable: Servable) -> None:
  """Starts the gRPC and REST front ends that the flags name, and waits."""
  servers = []
  if FLAGS.port:
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=4),
        options=[
            ('grpc.max_receive_message_length', 2**31 - 1),
            ('grpc.max_send_message_length', 2**31 - 1),
        ],
    )
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(servable), server
    )
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(
        ModelService(servable), server
    )
    address = f'127.0.0.1:{FLAGS.port}'
    if FLAGS.ssl_config_file:
      credentials = grpc_credentials(read_ssl_config(FLAGS.ssl_config_file))
      server.add_secure_port(address, credentials)
    else:
      server.add_insecure_port(address)
    server.start()
    servers.append(server)
    logging.info('Running gRPC ModelServer at %s ...', address)
  if FLAGS.rest_api_port:
    handler = type(
        'Handler',
        (RestHandler,),
        {'servable': servable, 'cors': FLAGS.rest_api_enable_cors_support},
    )
    rest = http.server.ThreadingHTTPServer(
        ('127.0.0.1', FLAGS.rest_api_port), handler
    )
    rest.daemon_threads = True
    if FLAGS.rest_api_ssl_config_file:
      context = tls_context(read_ssl_config(FLAGS.rest_api_ssl_config_file))
      rest.socket = context.wrap_socket(rest.socket, server_side=True)
    logging.info(
        'Exporting HTTP/REST API at:127.0.0.1:%d ...', FLAGS.rest_api_port
    )
    rest.serve_forever()
  for server in servers:
    server.wait_for_termination()


def main(argv):
  del argv
  if not (
      FLAGS.xla_cpu_compilation_enabled or FLAGS.xla_gpu_compilation_enabled
  ):
    disable_xla_compilation()
  try:
    servable = load(
        FLAGS.model_name,
        FLAGS.model_base_path,
        FLAGS.enable_model_warmup,
        FLAGS.max_num_load_retries,
        FLAGS.load_retry_interval_micros / 1e6,
    )
  except RuntimeError as e:
    print(f'Failed to start server. Error: UNKNOWN: {e}', flush=True)
    sys.exit(255)
  serve(servable)


if __name__ == '__main__':
  flags.mark_flag_as_required('model_base_path')
  app.run(main)
