"""Classifies images of digits with the exported MNIST model.

  python predict.py --saved_model=$HOME/mnist/export/mnist 7.png 3.png
  python predict.py --server=localhost:8501 7.png     # TF Serving, REST
  python predict.py --grpc=localhost:8500 digits.npy  # TF Serving, gRPC

Inputs: images up to 4096x4096 pixels (what Pillow reads), prepared as
training saw MNIST (`--invert` for dark ink on white); `.npy` arrays of 28x28
images; with `--bytes`, PNG, JPEG or BMP files as they are, for the
`serving_bytes` signature to prepare. Behind TLS: `--server=https://HOST[:PORT]` or
`--grpc_tls`, verified with the default CA certificates or `--ca_file`'s.

One line per image: the input, the digit and its probability (JSON lines
with `--json`). An input that cannot be classified gets one line on stderr
naming it and the cause; the others are still classified; exit status 1.
"""

import os
import sys

from run import startup

if __name__ == '__main__':  # Before TensorFlow's and gRPC's first import.
  # TensorFlow's C++ warnings too (level 2), such as an op's failure, which
  # the one-line error that predict.py prints names already.
  startup.begin(sys.argv, tensorflow_log_level=2)

# pylint: disable=g-import-not-at-top,wrong-import-position
import io
import json
import struct
import warnings

from absl import app
from absl import flags
import numpy as np
from PIL import Image
from PIL import UnidentifiedImageError
from run import errors
from serving import classifiers
from serving import signatures

FLAGS = flags.FLAGS
InputError = classifiers.InputError

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
    'grpc_tls', False, 'Connect to --grpc over TLS, verifying its certificate.'
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


def _cause(error: OSError) -> str:
  return error.strerror or errors.one_line(error)


def _check_header(data: bytes) -> None:
  """Refuses, as serving_bytes does, a PNG of too many bytes of pixels and a
  JPEG of too many scans: what its header (or its markers) says."""
  if data.startswith(signatures.BYTES_FORMATS['PNG']) and len(data) >= 26:
    width, height, depth, colour = struct.unpack('>IIBB', data[16:26])
    size = signatures.PNG_CHANNELS.get(colour, 1) * (2 if depth == 16 else 1)
    if width * height * size > signatures.MAX_PNG_BYTES:
      raise InputError(
          f'the PNG is {width}x{height} pixels of {size} bytes; predict.py '
          f'decodes {signatures.PNG_BOUND}'
      )
  jpeg = data.startswith(signatures.BYTES_FORMATS['JPEG'])
  scans = data.count(b'\xff\xda') if jpeg else 0
  if scans > signatures.MAX_JPEG_SCANS:
    raise InputError(
        f'the JPEG holds {scans} scans; predict.py decodes '
        f'{signatures.SCANS_BOUND}'
    )


def load_image(path: str, invert: bool = False) -> np.ndarray:
  """A `(1, 28, 28, 1)` float32 batch: on MNIST's images, the training data.

  Bounded before it is decoded, as in serving_bytes.
  """
  bound = f'predict.py decodes {signatures.BOUND}'
  try:
    with open(path, 'rb') as f:
      data = f.read()
    with warnings.catch_warnings():  # Pillow warns of sizes over its bound.
      warnings.simplefilter('ignore', Image.DecompressionBombWarning)
      with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        too_many = width * height > signatures.MAX_PIXELS
        if too_many or max(width, height) > signatures.MAX_SIDE:
          raise InputError(f'the image is {width}x{height} pixels; {bound}')
        _check_header(data)
        # A colour JPEG's luma is its Y channel: decoded alone, as
        # serving_bytes decodes it, without the chroma.
        image.draft('L', None)
        grey = image.convert('L')
  except Image.DecompressionBombError:  # Over twice Pillow's bound.
    most = 2 * Image.MAX_IMAGE_PIXELS
    raise InputError(f'the image claims over {most} pixels; {bound}') from None
  except UnidentifiedImageError:
    raise InputError('not an image that Pillow can read') from None
  except OSError as e:
    raise InputError(_cause(e)) from None
  size = (signatures.IMAGE_SIZE,) * 2
  grey = grey.resize(size, Image.Resampling.BILINEAR)
  pixels = np.asarray(grey, np.float32) / 255.0
  return (1.0 - pixels if invert else pixels).reshape(1, *size, 1)


def load_array(path: str) -> np.ndarray:
  """A `(n, 28, 28, 1)` float32 batch from a `.npy` of uint8 or [0, 1] floats."""
  try:
    array = np.load(path, allow_pickle=False)
  except OSError as e:
    raise InputError(_cause(e)) from None
  except ValueError as e:
    raise InputError(f'not a .npy array ({errors.one_line(e)})') from None
  if not isinstance(array, np.ndarray):  # np.load opens .npz archives too.
    array.close()
    raise InputError('an .npz archive, not a .npy array')
  shape, image_shapes = array.shape, ((28, 28), (28, 28, 1))
  if shape not in image_shapes and shape[1:] not in image_shapes:
    raise InputError(
        f'array of shape {shape}, expected (28, 28), (28, 28, 1), '
        '(n, 28, 28) or (n, 28, 28, 1)'
    )
  array = array.reshape(-1, 28, 28, 1)
  if array.shape[0] == 0:
    raise InputError(f'array of shape {shape} holds no image')
  if array.dtype == np.uint8:
    array = array.astype(np.float32) / 255.0
  elif not np.issubdtype(array.dtype, np.floating):
    raise InputError(f'array of dtype {array.dtype}, expected uint8 or float')
  elif not (np.all(array >= 0.0) and np.all(array <= 1.0)):
    raise InputError('float array with values outside [0, 1]')
  return array.astype(np.float32)


def load_bytes(path: str) -> np.ndarray:
  """A batch of one encoded image: the file's bytes, for `serving_bytes`."""
  if path.endswith('.npy'):
    raise InputError('an array, not an encoded image: leave out --bytes')
  try:
    with open(path, 'rb') as f:
      data = f.read()
  except OSError as e:
    raise InputError(_cause(e)) from None
  if not data.startswith(tuple(signatures.BYTES_FORMATS.values())):
    raise InputError(
        f'not a {signatures.FORMATS} file, the formats that serving_bytes '
        'decodes: leave out --bytes to decode it here'
    )
  return np.array([data], object)


def load_input(path: str, invert=False, as_bytes=False) -> np.ndarray:
  """The batch in `path`: its bytes, an array if it ends in .npy, or an image."""
  if not os.path.exists(path):
    raise InputError('no such file')
  if as_bytes:
    return load_bytes(path)
  if path.endswith('.npy'):
    return load_array(path)
  return load_image(path, invert)


def classify(paths, classifier, invert=False, as_json=False, as_bytes=False):
  """Prints each image's digit, each sent alone; returns how many failed."""
  failures = 0
  for path in paths:
    try:
      outputs = classifier(load_input(path, invert, as_bytes))
    except InputError as e:
      print(f'error: {path}: {e}', file=sys.stderr)
      failures += 1
      continue
    probabilities, logits = outputs['probabilities'], outputs['logits']
    many = len(logits) > 1 or path.endswith('.npy')
    for i, digit in enumerate(probabilities.argmax(-1).tolist()):
      row = {
          'input': f'{path}[{i}]' if many else path,
          'digit': digit,
          'probability': float(probabilities[i, digit]),
          'probabilities': probabilities[i].tolist(),
          'logits': logits[i].tolist(),
      }
      line = '{input}: {digit} ({probability:.4f})'.format(**row)
      print(json.dumps(row) if as_json else line)
  return failures


def make_classifier():
  """The classifier that the flags name; InputError names the flag at fault."""
  default = signatures.BYTES_SIGNATURE if FLAGS.bytes else 'serving_default'
  signature = FLAGS.signature or default
  server = (FLAGS.model_name, signature, FLAGS.timeout)
  if FLAGS.server:
    return classifiers.RestClassifier(FLAGS.server, *server, FLAGS.ca_file)
  if FLAGS.grpc:
    tls = (FLAGS.grpc_tls, FLAGS.ca_file)
    return classifiers.GrpcClassifier(FLAGS.grpc, *server, *tls)
  try:
    return classifiers.SavedModelClassifier(FLAGS.saved_model, signature)
  except Exception as e:  # pylint: disable=broad-except
    # TensorFlow raises many kinds of error for a SavedModel it cannot load.
    cause = errors.one_line(e)
    raise InputError(f'--saved_model={FLAGS.saved_model}: {cause}') from None


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
  startup.imports_done()
  if classify(argv[1:], classifier, FLAGS.invert, FLAGS.json, FLAGS.bytes):
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
