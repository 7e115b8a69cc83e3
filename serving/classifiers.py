"""The model behind predict.py: in TensorFlow, or behind TF Serving.

Each classifier takes a batch (float images, or encoded ones as an object
array of bytes) and returns its 'probabilities' and 'logits', `(n, 10)`
NumPy arrays, or raises InputError with the cause in one line. Only the
classifier that needs TensorFlow or gRPC imports them: REST needs neither.
"""

import base64
import glob
import os
import re
import ssl

import numpy as np
import requests
from run import errors
from serving.signatures import BYTES_INPUT_NAME, INPUT_NAME, NUM_CLASSES

OUTPUTS = ('probabilities', 'logits')


class InputError(Exception):
  """An input cannot be classified; the message is the cause, in one line."""


# What TensorFlow says when it cannot run the export's XlaCallModule ops, and
# what to do about it. TF Serving turns XLA off unless told otherwise; TF 2.19
# cannot read the StableHLO of JAX 0.10, so the export needs TF 2.20.
CAUSES = {
    'XLA compilation disabled': (
        'TF Serving runs without XLA unless started with '
        '--xla_cpu_compilation_enabled=true '
        '(--xla_gpu_compilation_enabled=true on its GPU image)'
    ),
    (
        r'XlaCallModuleOp with version \d+ is not supported'
        r'|Cannot deserialize computation'
    ): (
        'the export needs TensorFlow 2.20 or later (a TF Serving built on '
        'it: tensorflow/serving:2.20.0 or later)'
    ),
}


def tensorflow_error(message) -> str:
  """The cause in a TensorFlow error message, and the remedy of CAUSES.

  The cause is its last line that is not indented (the node and the op's
  stack are), or an assertion's own words (the bytes signature's bound).
  """
  lines = [l for l in str(message).splitlines() if l and not l[0].isspace()]
  cause = errors.one_line(lines[-1] if lines else message)
  cause = re.sub(r'^assertion failed: \[(.*)\]$', r'\1', cause)
  for pattern, remedy in CAUSES.items():
    if re.search(pattern, str(message)):
      return f'{cause}: {remedy}'
  return cause


def find_saved_model(directory: str) -> str:
  """`directory` if it holds a SavedModel, else its highest integer version."""
  if os.path.isfile(os.path.join(directory, 'saved_model.pb')):
    return directory
  pattern = os.path.join(glob.escape(directory), '*', 'saved_model.pb')
  names = [os.path.basename(os.path.dirname(p)) for p in glob.glob(pattern)]
  versions = [int(name) for name in names if name.isdigit()]
  if not versions:
    raise InputError(
        'no saved_model.pb in it nor in an integer version directory under it'
    )
  return os.path.join(directory, str(max(versions)))


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
    refusals = (self._tf.errors.InvalidArgumentError, TypeError, ValueError)
    try:
      outputs = self._function(**{self._input_name: self._tf.constant(images)})
    except (self._tf.errors.OpError, *refusals) as e:
      if any(re.search(pattern, str(e)) for pattern in CAUSES):
        what = f'TensorFlow {self._tf.__version__} cannot run the model'
      elif isinstance(e, refusals):
        what = 'the model refused it'
      else:
        raise
      raise InputError(f'{what}: {tensorflow_error(e)}') from None
    return {k: v.numpy() for k, v in outputs.items()}


def _ca_certificates(ca_file: str | None) -> bytes | None:
  """`ca_file`'s certificates, checked now: else a bad file fails at the call."""
  if not ca_file:
    return None  # Verified by the default CA certificates.
  try:
    ssl.create_default_context(cafile=ca_file)
    with open(ca_file, 'rb') as f:
      return f.read()
  except OSError as e:  # ssl.SSLError too.
    cause = errors.one_line(e.strerror or e)
    raise InputError(f'--ca_file={ca_file}: {cause}') from None


def _certificate_error(address: str, reason: str) -> InputError:
  return InputError(
      f'server {address}: certificate verify failed ({reason}): name the CA '
      'that signed it with --ca_file'
  )


class _Server:
  """A classifier behind TF Serving at `address`; its errors name it."""

  def __init__(self, address, model_name, signature, timeout):
    self.address, self.model_name = address, model_name
    self.signature, self.timeout = signature, timeout

  def _error(self, what: str) -> InputError:
    return InputError(f'server {self.address} {what}')

  def _checked(self, outputs: dict, n: int) -> dict[str, np.ndarray]:
    """The logits and probabilities, if they score the `n` images."""
    if any(v.shape != (n, NUM_CLASSES) for v in outputs.values()):
      raise self._error(f'answered with {n} images not scored')
    return outputs


class RestClassifier(_Server):
  """POSTs rows to TF Serving's REST API, /v1/models/<model>:predict.

  Encoded images go as {"b64": ...}, its form for binary strings
  (https://www.tensorflow.org/tfx/serving/api_rest).
  """

  def __init__(self, address, model_name, signature, timeout, ca_file=None):
    super().__init__(address, model_name, signature, timeout)
    url = address.rstrip('/') if '://' in address else f'http://{address}'
    self.url = f'{url}/v1/models/{model_name}:predict'
    _ca_certificates(ca_file)  # A bad file's line now, not at each call.
    self._verify = ca_file or True  # Else requests' CA certificates.

  def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
    if images.dtype == object:
      instances = [{'b64': base64.b64encode(data).decode()} for data in images]
    else:
      instances = [{INPUT_NAME: image.tolist()} for image in images]
    payload = {'signature_name': self.signature, 'instances': instances}
    try:
      response = requests.post(
          self.url, json=payload, timeout=self.timeout, verify=self._verify
      )
    except requests.RequestException as e:
      cause = errors.innermost(e)
      if isinstance(cause, ssl.SSLCertVerificationError):
        raise _certificate_error(self.address, cause.verify_message) from None
      raise self._error(f'does not answer ({errors.one_line(cause)})') from None
    if not response.ok:
      try:
        cause = tensorflow_error(response.json()['error'])
      except (ValueError, KeyError, TypeError):
        cause = errors.one_line(response.reason)
      raise self._error(f'answered {response.status_code}: {cause}')
    try:
      rows = response.json()['predictions']
      outputs = {k: np.array([r[k] for r in rows], np.float32) for k in OUTPUTS}
    except (TypeError, KeyError, ValueError):
      raise self._error(
          'answered without predictions of logits and probabilities'
      ) from None
    return self._checked(outputs, len(images))


class GrpcClassifier(_Server):
  """Calls TF Serving's gRPC PredictionService.Predict."""

  def __init__(
      self, address, model_name, signature, timeout, tls=False, ca_file=None
  ):
    # pylint: disable=g-import-not-at-top
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    super().__init__(address, model_name, signature, timeout)
    self._grpc, self._tf, self._predict_pb2 = grpc, tf, predict_pb2
    if tls:
      credentials = grpc.ssl_channel_credentials(_ca_certificates(ca_file))
      channel = grpc.secure_channel(address, credentials)
    else:
      channel = grpc.insecure_channel(address)
    self._stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

  def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
    tf = self._tf
    encoded = images.dtype == object
    tensor = tf.make_tensor_proto(images, tf.string if encoded else tf.float32)
    request = self._predict_pb2.PredictRequest(
        model_spec={'name': self.model_name, 'signature_name': self.signature},
        inputs={BYTES_INPUT_NAME if encoded else INPUT_NAME: tensor},
    )
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
        cause = f'{code.name}: {errors.one_line(details)}'
        raise self._error(f'does not answer ({cause})') from None
      cause = tensorflow_error(details)
      raise self._error(f'answered {code.name}: {cause}') from None
    try:
      outputs = {k: tf.make_ndarray(response.outputs[k]) for k in OUTPUTS}
    except (KeyError, TypeError, ValueError):
      raise self._error('answered without logits and probabilities') from None
    return self._checked(outputs, len(images))
