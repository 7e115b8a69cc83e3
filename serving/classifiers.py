"""The model behind predict.py: in TensorFlow, or behind TF Serving.

Each classifier takes a batch (float images, or encoded ones as an object
array of bytes) and returns its 'probabilities' and 'logits', `(n, 10)`
NumPy arrays, or raises InputError with the cause in one line: the model's
refusal, a server that does not answer or answers an error, a certificate
that does not verify. Only the classifier that needs TensorFlow or gRPC
imports them: REST needs neither.
"""

import base64
import json
import os
import re
import ssl
import urllib.error
import urllib.request

import numpy as np
from serving.signatures import BYTES_INPUT_NAME, INPUT_NAME, NUM_CLASSES


class InputError(Exception):
  """An input cannot be classified; the message is the cause, in one line."""


def one_line(text) -> str:
  return ' '.join(str(text).split())


# What TensorFlow says when it cannot run the export's XlaCallModule ops, and
# what to do about it. TF Serving turns XLA off unless told otherwise; TF 2.19
# cannot read the StableHLO of JAX 0.10, so the export needs TF 2.20.
CAUSES = (
    (
        re.compile(r'XLA compilation disabled'),
        'TF Serving runs without XLA unless started with '
        '--xla_cpu_compilation_enabled=true '
        '(--xla_gpu_compilation_enabled=true on its GPU image)',
    ),
    (
        re.compile(
            r'XlaCallModuleOp with version \d+ is not supported'
            r'|Cannot deserialize computation'
        ),
        'the export needs TensorFlow 2.20 or later (a TF Serving built on '
        'it: tensorflow/serving:2.20.0 or later)',
    ),
)


def _tensorflow_error(message) -> str:
  """The cause in a TensorFlow error message, and what to do about it.

  Its last line that is not indented (the node and the op's stack are), an
  assertion's own words (the bytes signature's bound), a remedy of CAUSES.
  """
  lines = [l for l in str(message).splitlines() if l and not l[0].isspace()]
  cause = one_line(lines[-1] if lines else message)
  cause = re.sub(r'^assertion failed: \[(.*)\]$', r'\1', cause)
  for pattern, remedy in CAUSES:
    if pattern.search(str(message)):
      return f'{cause}: {remedy}'
  return cause


def find_saved_model(directory: str) -> str:
  """`directory` if it holds a SavedModel, else its highest integer version."""
  if os.path.isfile(os.path.join(directory, 'saved_model.pb')):
    return directory
  versions = [
      int(d)
      for d in (os.listdir(directory) if os.path.isdir(directory) else [])
      if d.isdigit()
      and os.path.isfile(os.path.join(directory, d, 'saved_model.pb'))
  ]
  if not versions:
    raise InputError(
        'no saved_model.pb in it nor in an integer version directory under it'
    )
  return os.path.join(directory, str(max(versions)))


def _checked(outputs: dict, n: int, address: str) -> dict[str, np.ndarray]:
  """A server's logits and probabilities, if they score the `n` images."""
  if any(v.shape != (n, NUM_CLASSES) for v in outputs.values()):
    raise InputError(f'server {address} answered with {n} images not scored')
  return outputs


class SavedModelClassifier:
  """Runs a signature of the SavedModel in this process, with TensorFlow only."""

  def __init__(self, directory: str, signature: str):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self._tf = tf
    self._loaded = tf.saved_model.load(find_saved_model(directory))
    if signature not in self._loaded.signatures:
      raise InputError(
          f'no signature {signature!r} (it has '
          f'{", ".join(self._loaded.signatures)})'
      )
    self._function = self._loaded.signatures[signature]
    (self._input_name,) = self._function.structured_input_signature[1]

  def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
    try:
      outputs = self._function(**{self._input_name: self._tf.constant(images)})
    except self._tf.errors.OpError as e:
      if any(pattern.search(str(e)) for pattern, _ in CAUSES):
        raise InputError(
            f'TensorFlow {self._tf.__version__} cannot run the model: '
            f'{_tensorflow_error(e)}'
        ) from None
      if not isinstance(e, self._tf.errors.InvalidArgumentError):
        raise
      raise InputError(
          f'the model refused it: {_tensorflow_error(e)}'
      ) from None
    except (TypeError, ValueError) as e:
      raise InputError(
          f'the model refused it: {_tensorflow_error(e)}'
      ) from None
    return {k: v.numpy() for k, v in outputs.items()}


def rest_request(images: np.ndarray, signature: str) -> dict:
  """The body of TF Serving's REST predict request, in its row format.

  Encoded images go as base64 in {"b64": ...}, TF Serving's form for binary
  strings (https://www.tensorflow.org/tfx/serving/api_rest).
  """
  if images.dtype == object:
    instances = [{'b64': base64.b64encode(data).decode()} for data in images]
  else:
    instances = [{INPUT_NAME: image.tolist()} for image in images]
  return {'signature_name': signature, 'instances': instances}


def rest_url(address: str) -> str:
  """The URL of a REST address: `http://` is the scheme if it names none."""
  return address.rstrip('/') if '://' in address else f'http://{address}'


def _tls_context(ca_file: str | None) -> ssl.SSLContext:
  """Verifies servers with the CA certificates of `ca_file`, else the system's."""
  try:
    return ssl.create_default_context(cafile=ca_file)
  except (OSError, ssl.SSLError) as e:
    raise InputError(
        f'--ca_file={ca_file}: {one_line(getattr(e, "strerror", None) or e)}'
    ) from None


def _certificate_error(address: str, reason: str) -> InputError:
  return InputError(
      f'server {address}: certificate verify failed ({reason}): name the CA '
      'that signed it with --ca_file'
  )


class RestClassifier:
  """POSTs to TF Serving's REST API: /v1/models/<model>:predict."""

  def __init__(self, address, model_name, signature, timeout, ca_file=None):
    self.address, self.signature, self.timeout = address, signature, timeout
    self.url = f'{rest_url(address)}/v1/models/{model_name}:predict'
    https = self.url.startswith('https://')
    self._context = _tls_context(ca_file) if https else None

  def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
    request = urllib.request.Request(
        self.url,
        data=json.dumps(rest_request(images, self.signature)).encode(),
        headers={'Content-Type': 'application/json'},
    )
    try:
      with urllib.request.urlopen(
          request, timeout=self.timeout, context=self._context
      ) as response:
        body = json.loads(response.read())
    except urllib.error.HTTPError as e:
      try:
        cause = _tensorflow_error(json.loads(e.read())['error'])
      except (ValueError, KeyError, TypeError, OSError):
        cause = one_line(e.reason)
      raise InputError(
          f'server {self.address} answered {e.code}: {cause}'
      ) from None
    except (urllib.error.URLError, OSError) as e:
      reason = getattr(e, 'reason', e)
      if isinstance(reason, ssl.SSLCertVerificationError):
        raise _certificate_error(self.address, reason.verify_message) from None
      raise InputError(
          f'server {self.address} does not answer ({one_line(reason)})'
      ) from None
    except json.JSONDecodeError:
      raise InputError(f'server {self.address} answered with no JSON') from None
    rows = body.get('predictions') if isinstance(body, dict) else None
    try:
      outputs = {
          k: np.array([row[k] for row in rows], np.float32)
          for k in ('probabilities', 'logits')
      }
    except (TypeError, KeyError, ValueError):
      raise InputError(
          f'server {self.address} answered without predictions of logits '
          'and probabilities'
      ) from None
    return _checked(outputs, len(images), self.address)


class GrpcClassifier:
  """Calls TF Serving's gRPC PredictionService.Predict."""

  def __init__(
      self, address, model_name, signature, timeout, tls=False, ca_file=None
  ):
    # pylint: disable=g-import-not-at-top
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    self._grpc, self._tf = grpc, tf
    self.address, self.model_name = address, model_name
    self.signature, self.timeout = signature, timeout
    if tls:
      root_certificates = None  # gRPC's own.
      if ca_file:
        _tls_context(ca_file)  # Else gRPC would fail only at the handshake.
        with open(ca_file, 'rb') as f:
          root_certificates = f.read()
      credentials = grpc.ssl_channel_credentials(root_certificates)
      channel = grpc.secure_channel(address, credentials)
    else:
      channel = grpc.insecure_channel(address)
    self._stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

  def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
    request = grpc_request(images, self.model_name, self.signature)
    try:
      response = self._stub.Predict(request, timeout=self.timeout)
    except self._grpc.RpcError as e:
      code, details = e.code(), e.details() or ''
      # gRPC's message of a failed handshake ends in BoringSSL's reason.
      failed = re.search(r'CERTIFICATE_VERIFY_FAILED: (.*?)(: OK)?$', details)
      if failed:
        raise _certificate_error(self.address, failed.group(1)) from None
      codes = self._grpc.StatusCode
      if code in (codes.UNAVAILABLE, codes.DEADLINE_EXCEEDED):
        raise InputError(
            f'server {self.address} does not answer ({code.name}: '
            f'{one_line(details)})'
        ) from None
      raise InputError(
          f'server {self.address} answered {code.name}: '
          f'{_tensorflow_error(details)}'
      ) from None
    try:
      outputs = {
          k: self._tf.make_ndarray(response.outputs[k])
          for k in ('probabilities', 'logits')
      }
    except (KeyError, TypeError, ValueError):
      raise InputError(
          f'server {self.address} answered without logits and probabilities'
      ) from None
    return _checked(outputs, len(images), self.address)


def grpc_request(images: np.ndarray, model_name: str, signature: str):
  """TF Serving's PredictRequest: the batch as the signature's named input."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tensorflow_serving.apis import predict_pb2

  request = predict_pb2.PredictRequest()
  request.model_spec.name = model_name
  request.model_spec.signature_name = signature
  name, dtype = (
      (BYTES_INPUT_NAME, tf.string)
      if images.dtype == object
      else (INPUT_NAME, tf.float32)
  )
  request.inputs[name].CopyFrom(tf.make_tensor_proto(images, dtype=dtype))
  return request
