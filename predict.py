"""Classifies images of digits with the exported MNIST model.

The model runs in one of three places:

  python predict.py --saved_model=$HOME/mnist/export/mnist 7.png 3.png
  python predict.py --server=localhost:8501 7.png     # TF Serving, REST
  python predict.py --grpc=localhost:8500 digits.npy  # TF Serving, gRPC

A server behind TLS: `--server=https://HOST[:PORT]` (`http://` when no
scheme is given), `--grpc=HOST:PORT --grpc_tls`. The server's certificate is
verified with the system's CA certificates (REST) or gRPC's own (gRPC), or
with those of `--ca_file=PEM` (a self-signed certificate is its own CA).

Inputs are PNG (or any image Pillow reads) files of any size, grey or RGB, or
`.npy` arrays of 28x28 images. Images are prepared as training saw MNIST:
converted to grey, resized to 28x28, scaled from [0, 255] to [0, 1]. MNIST
digits are white (255) on black (0); scans of dark ink on white paper need
`--invert`. With `--bytes`, image files are sent as they are to the
`serving_bytes` signature, which prepares them the same way in the model.

One line per image: the input, the predicted digit and its probability (JSON
lines with `--json`). An input that cannot be classified gets one line on
stderr naming it and the cause; the others are still classified, and the exit
status is 1. Where TF Serving cannot run the export, the line says why: a
server started without XLA (TF Serving's default; the export's XlaCallModule
ops need it) names the flag that turns it on, a server built on a TensorFlow
older than 2.20 (which cannot read the export's StableHLO) says so.
"""

import sys

import tensorflow_startup

if __name__ == '__main__':  # Before TensorFlow's first import.
  # Level 2: TensorFlow's C++ warnings too, such as an op's failure, which
  # the one-line error that predict.py prints names already.
  tensorflow_startup.quiet(sys.argv, min_log_level=2)

# pylint: disable=g-import-not-at-top,wrong-import-position
import base64
import json
import os
import re
import ssl
import urllib.error
import urllib.request

from absl import app
from absl import flags
import numpy as np
from PIL import Image
from PIL import UnidentifiedImageError
from serving_signatures import BYTES_INPUT_NAME, BYTES_SIGNATURE, IMAGE_SIZE, INPUT_NAME

FLAGS = flags.FLAGS

flags.DEFINE_string(
    'saved_model',
    None,
    'Run the SavedModel locally in TensorFlow: a version directory, or the '
    'model directory (<workdir>/export/mnist), whose highest version is used.',
)
flags.DEFINE_string(
    'server',
    None,
    'TF Serving REST address: HOST:8501, http://HOST:8501 or '
    'https://HOST[:PORT].',
)
flags.DEFINE_string('grpc', None, 'TF Serving gRPC address, HOST:8500.')
flags.DEFINE_bool(
    'grpc_tls',
    False,
    "Connect to --grpc over TLS, verifying the server's certificate.",
)
flags.DEFINE_string(
    'ca_file',
    None,
    "PEM file of the CA certificates that verify the server's certificate "
    '(--server=https://... or --grpc_tls), instead of the default ones.',
)
flags.DEFINE_string('model_name', 'mnist', 'MODEL_NAME the server serves.')
flags.DEFINE_string(
    'signature',
    None,
    'Signature to call: serving_default, or serving_bytes with --bytes.',
)
flags.DEFINE_bool('invert', False, 'Images are dark digits on light ground.')
flags.DEFINE_bool(
    'bytes',
    False,
    'Send the image files as they are, encoded, for the model to decode '
    '(signature serving_bytes); no .npy inputs, no --invert.',
)
flags.DEFINE_bool('json', False, 'Print one JSON object per image.')
flags.DEFINE_float('timeout', 10.0, 'Seconds to wait for a server.')


class InputError(Exception):
  """An input cannot be classified; the message is the cause, in one line."""


def _one_line(text: str) -> str:
  return ' '.join(str(text).split())


# What TensorFlow says when it cannot run the export's XlaCallModule ops, and
# what to do about it. TF Serving turns XLA off unless told otherwise; TF 2.19
# runs XlaCallModule up to version 9 and cannot read the StableHLO of JAX 0.10
# at any, so the export needs TF 2.20.
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


def _tensorflow_error(message: str) -> str:
  """The cause in a TensorFlow error message, without its graph locations.

  Its last line that is not indented: TensorFlow puts the node (`[[...]]`)
  and the stack of the op's definition around it. A cause in CAUSES gets
  what to do about it.
  """
  lines = [l for l in str(message).splitlines() if l and not l[0].isspace()]
  cause = _one_line(lines[-1] if lines else message)
  for pattern, remedy in CAUSES:
    if pattern.search(str(message)):
      return f'{cause}: {remedy}'
  return cause


# Inputs.


def load_image(path: str, invert: bool = False) -> np.ndarray:
  """A `(1, 28, 28, 1)` float32 batch in [0, 1] from an image file.

  Grey by ITU-R 601 luma (Pillow's 'L'), then resized with Pillow's bilinear
  filter (a 28x28 image is left as it is), then divided by 255: on MNIST's
  own images this gives exactly the training data.
  """
  try:
    with Image.open(path) as image:
      grey = image.convert('L')
  except UnidentifiedImageError:
    raise InputError('not an image that Pillow can read') from None
  except OSError as e:
    raise InputError(e.strerror or _one_line(e)) from None
  if grey.size != (IMAGE_SIZE, IMAGE_SIZE):
    grey = grey.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)
  pixels = np.asarray(grey, np.float32) / 255.0
  if invert:
    pixels = 1.0 - pixels
  return pixels.reshape(1, IMAGE_SIZE, IMAGE_SIZE, 1)


def load_array(path: str) -> np.ndarray:
  """A `(n, 28, 28, 1)` float32 batch in [0, 1] from a `.npy` file.

  The array holds one image `(28, 28)`, `(28, 28, 1)` or a batch `(n, 28, 28)`,
  `(n, 28, 28, 1)`: uint8 in [0, 255] (as MNIST's files), or floats already
  in [0, 1] (as training saw them).
  """
  try:
    array = np.load(path, allow_pickle=False)
  except OSError as e:
    raise InputError(e.strerror or _one_line(e)) from None
  except ValueError as e:
    raise InputError(f'not a .npy array ({_one_line(e)})') from None
  if not isinstance(array, np.ndarray):  # np.load opens .npz archives too.
    array.close()
    raise InputError('an .npz archive, not a .npy array')
  shape = array.shape
  if shape[-1:] == (1,) and array.ndim in (3, 4):
    array = array[..., 0]
  if array.ndim == 2:
    array = array[None]
  if array.ndim != 3 or array.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
    raise InputError(
        f'array of shape {shape}, expected (28, 28), (28, 28, 1), '
        '(n, 28, 28) or (n, 28, 28, 1)'
    )
  if array.shape[0] == 0:
    raise InputError(f'array of shape {shape} holds no image')
  if array.dtype == np.uint8:
    array = array.astype(np.float32) / 255.0
  elif np.issubdtype(array.dtype, np.floating):
    if not (np.all(array >= 0.0) and np.all(array <= 1.0)):
      raise InputError('float array with values outside [0, 1]')
  else:
    raise InputError(f'array of dtype {array.dtype}, expected uint8 or float')
  return array.astype(np.float32)[..., None]


def load_bytes(path: str) -> np.ndarray:
  """A batch of one encoded image: the file's bytes, for `serving_bytes`."""
  if path.endswith('.npy'):
    raise InputError('an array, not an encoded image: leave out --bytes')
  try:
    with open(path, 'rb') as f:
      return np.array([f.read()], object)
  except OSError as e:
    raise InputError(e.strerror or _one_line(e)) from None


def load_input(
    path: str, invert: bool = False, as_bytes: bool = False
) -> np.ndarray:
  """The batch in `path`: its bytes, an array if it ends in .npy, or an image."""
  if not os.path.exists(path):
    raise InputError('no such file')
  if as_bytes:
    return load_bytes(path)
  if path.endswith('.npy'):
    return load_array(path)
  return load_image(path, invert)


# The model, in TensorFlow or behind TF Serving. Each takes a batch (float
# images, or encoded ones as an object array of bytes) and returns its
# 'probabilities' (n, 10) and 'logits' (n, 10) as numpy arrays.


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


class SavedModelClassifier:
  """Runs a signature of the SavedModel in this process, with TensorFlow only."""

  def __init__(self, directory: str, signature: str):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self._tf = tf
    loaded = tf.saved_model.load(find_saved_model(directory))
    if signature not in loaded.signatures:
      raise InputError(
          f'no signature {signature!r} (it has {", ".join(loaded.signatures)})'
      )
    self._loaded = loaded  # Holds the variables the signature reads.
    self._function = loaded.signatures[signature]
    (self._input_name,) = self._function.structured_input_signature[1]

  def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
    errors = self._tf.errors
    try:
      outputs = self._function(**{self._input_name: self._tf.constant(images)})
    except errors.OpError as e:
      if any(pattern.search(str(e)) for pattern, _ in CAUSES):
        raise InputError(
            f'TensorFlow {self._tf.__version__} cannot run the model: '
            f'{_tensorflow_error(e)}'
        ) from None
      if not isinstance(e, errors.InvalidArgumentError):
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

  https://www.tensorflow.org/tfx/serving/api_rest#request_format_2
  Encoded images go as base64 in {"b64": ...}, TF Serving's form for binary
  strings, one per instance: the bytes signature has that one input.
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
        f'--ca_file={ca_file}: {_one_line(getattr(e, "strerror", None) or e)}'
    ) from None


def _certificate_error(address: str, reason: str) -> InputError:
  return InputError(
      f'server {address}: certificate verify failed ({reason}): name the CA '
      'that signed it with --ca_file'
  )


class RestClassifier:
  """POSTs to TF Serving's REST API: /v1/models/<model>:predict."""

  def __init__(
      self,
      address: str,
      model_name: str,
      signature: str,
      timeout: float,
      ca_file: str | None = None,
  ):
    self.address = address
    self.url = f'{rest_url(address)}/v1/models/{model_name}:predict'
    self.signature = signature
    self.timeout = timeout
    self._context = (
        _tls_context(ca_file) if self.url.startswith('https://') else None
    )

  def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
    request = urllib.request.Request(
        self.url,
        data=json.dumps(rest_request(images, self.signature)).encode(),
        headers={'Content-Type': 'application/json'},
        method='POST',
    )
    try:
      with urllib.request.urlopen(
          request, timeout=self.timeout, context=self._context
      ) as response:
        body = json.loads(response.read())
    except urllib.error.HTTPError as e:
      raise InputError(
          f'server {self.address} answered {e.code}: {_rest_error(e)}'
      ) from None
    except (urllib.error.URLError, OSError) as e:
      reason = getattr(e, 'reason', e)
      if isinstance(reason, ssl.SSLCertVerificationError):
        raise _certificate_error(self.address, reason.verify_message) from None
      raise InputError(
          f'server {self.address} does not answer ({_one_line(reason)})'
      ) from None
    except json.JSONDecodeError:
      raise InputError(f'server {self.address} answered with no JSON') from None
    return _rest_outputs(body, len(images), self.address)


def _rest_error(error: urllib.error.HTTPError) -> str:
  """TF Serving's {"error": ...} message, else the HTTP reason."""
  try:
    return _tensorflow_error(json.loads(error.read())['error'])
  except (ValueError, KeyError, TypeError, OSError):
    return _one_line(error.reason)


def _rest_outputs(body, n: int, address: str) -> dict[str, np.ndarray]:
  """The named outputs of a row-format response: a list of n objects."""
  rows = body.get('predictions') if isinstance(body, dict) else None
  try:
    outputs = {
        k: np.array([row[k] for row in rows], np.float32)
        for k in ('probabilities', 'logits')
    }
  except (TypeError, KeyError, ValueError):
    raise InputError(
        f'server {address} answered without predictions of logits and '
        'probabilities'
    ) from None
  if any(v.shape != (n, 10) for v in outputs.values()):
    raise InputError(f'server {address} answered with {n} images not scored')
  return outputs


class GrpcClassifier:
  """Calls TF Serving's gRPC PredictionService.Predict."""

  def __init__(
      self,
      address: str,
      model_name: str,
      signature: str,
      timeout: float,
      tls: bool = False,
      ca_file: str | None = None,
  ):
    import grpc  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=g-import-not-at-top

    self._grpc, self._tf = grpc, tf
    self.address = address
    self.model_name = model_name
    self.signature = signature
    self.timeout = timeout
    if tls:
      root_certificates = None  # gRPC's own.
      if ca_file:
        _tls_context(ca_file)  # Else gRPC would fail only at the handshake.
        with open(ca_file, 'rb') as f:
          root_certificates = f.read()
      credentials = grpc.ssl_channel_credentials(root_certificates)
      self._channel = grpc.secure_channel(address, credentials)
    else:
      self._channel = grpc.insecure_channel(address)
    self._stub = prediction_service_pb2_grpc.PredictionServiceStub(
        self._channel
    )

  def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
    request = grpc_request(images, self.model_name, self.signature)
    try:
      response = self._stub.Predict(request, timeout=self.timeout)
    except self._grpc.RpcError as e:
      code = e.code()
      # gRPC's message of a failed handshake ends in BoringSSL's reason.
      verify_failed = re.search(
          r'CERTIFICATE_VERIFY_FAILED: (.*?)(: OK)?$', e.details() or ''
      )
      if verify_failed:
        raise _certificate_error(self.address, verify_failed.group(1)) from None
      if code in (
          self._grpc.StatusCode.UNAVAILABLE,
          self._grpc.StatusCode.DEADLINE_EXCEEDED,
      ):
        raise InputError(
            f'server {self.address} does not answer ({code.name}: '
            f'{_one_line(e.details())})'
        ) from None
      raise InputError(
          f'server {self.address} answered {code.name}: '
          f'{_tensorflow_error(e.details())}'
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
    if any(v.shape != (len(images), 10) for v in outputs.values()):
      raise InputError(
          f'server {self.address} answered with {len(images)} images not scored'
      )
    return outputs


def grpc_request(images: np.ndarray, model_name: str, signature: str):
  """TF Serving's PredictRequest: the batch as the signature's named input."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow_serving.apis import predict_pb2  # pylint: disable=g-import-not-at-top

  request = predict_pb2.PredictRequest()
  request.model_spec.name = model_name
  request.model_spec.signature_name = signature
  if images.dtype == object:
    name, dtype = BYTES_INPUT_NAME, tf.string
  else:
    name, dtype = INPUT_NAME, tf.float32
  request.inputs[name].CopyFrom(tf.make_tensor_proto(images, dtype=dtype))
  return request


# The command.


def classify(
    paths,
    classifier,
    invert=False,
    as_json=False,
    out=sys.stdout,
    err=sys.stderr,
    as_bytes=False,
) -> int:
  """Prints the digit of every image in `paths`; returns the number of failures.

  Every input is sent on its own, so that a bad one is named and the others
  are still classified.
  """
  failures = 0
  for path in paths:
    try:
      outputs = classifier(load_input(path, invert, as_bytes))
    except InputError as e:
      print(f'error: {path}: {e}', file=err)
      failures += 1
      continue
    many = len(outputs['probabilities']) > 1 or path.endswith('.npy')
    for i, probabilities in enumerate(outputs['probabilities']):
      name = f'{path}[{i}]' if many else path
      digit = int(np.argmax(probabilities))
      if as_json:
        print(
            json.dumps(
                {
                    'input': name,
                    'digit': digit,
                    'probability': float(probabilities[digit]),
                    'probabilities': [float(p) for p in probabilities],
                    'logits': [float(l) for l in outputs['logits'][i]],
                }
            ),
            file=out,
        )
      else:
        print(f'{name}: {digit} ({probabilities[digit]:.4f})', file=out)
  return failures


def make_classifier():
  """The classifier that the flags name; InputError names the flag at fault."""
  signature = FLAGS.signature or (
      BYTES_SIGNATURE if FLAGS.bytes else 'serving_default'
  )
  if FLAGS.saved_model:
    try:
      return SavedModelClassifier(FLAGS.saved_model, signature)
    except InputError as e:
      raise InputError(f'--saved_model={FLAGS.saved_model}: {e}') from None
    except Exception as e:  # pylint: disable=broad-except
      # TensorFlow raises many kinds of error for a SavedModel it cannot load.
      raise InputError(
          f'--saved_model={FLAGS.saved_model}: {_one_line(e)}'
      ) from None
  if FLAGS.server:
    return RestClassifier(
        FLAGS.server, FLAGS.model_name, signature, FLAGS.timeout, FLAGS.ca_file
    )
  return GrpcClassifier(
      FLAGS.grpc,
      FLAGS.model_name,
      signature,
      FLAGS.timeout,
      FLAGS.grpc_tls,
      FLAGS.ca_file,
  )


def main(argv):
  if len(argv) < 2:
    raise app.UsageError('Name at least one image (.png, ...) or .npy file.')
  if FLAGS.bytes and FLAGS.invert:
    raise app.UsageError(
        '--invert cannot change images sent as bytes: leave out one of them.'
    )
  try:
    classifier = make_classifier()
  except InputError as e:
    sys.exit(f'error: {e}')
  if classify(
      argv[1:], classifier, FLAGS.invert, FLAGS.json, as_bytes=FLAGS.bytes
  ):
    sys.exit(1)


if __name__ == '__main__':
  # Here, not on import: importing the module (its tests) needs no flags.
  flags.mark_flags_as_mutual_exclusive(['saved_model', 'server', 'grpc'], True)
  flags.register_validator(
      'server',
      lambda address: address is None
      or '://' not in address
      or address.startswith(('http://', 'https://')),
      'expected HOST:PORT, http://HOST:PORT or https://HOST[:PORT]',
  )
  flags.register_multi_flags_validator(
      ['grpc', 'grpc_tls'],
      lambda f: not f['grpc_tls'] or f['grpc'] is not None,
      '--grpc_tls is for --grpc',
  )
  flags.register_multi_flags_validator(
      ['server', 'grpc_tls', 'ca_file'],
      lambda f: f['ca_file'] is None
      or f['grpc_tls']
      or (f['server'] or '').startswith('https://'),
      '--ca_file verifies a server over TLS: --server=https://... or '
      '--grpc_tls',
  )
  app.run(main)
