"""The graph's image preparation: predict.py's (Pillow's) pixels, exactly, and
only from PNG, JPEG and BMP files within the bound; anything else refused."""

import io
import itertools
import os
import subprocess
import sys
import zlib

from serving import image_decoding
from serving import signatures
import numpy as np
from PIL import Image
import predict
import pytest
import tensorflow as tf

# Sizes (width, height): as they are, halved, enlarged, shrunk by odd
# factors, one dimension at 28, and a photograph's.
SIZES = [(28, 28), (56, 56), (100, 37), (28, 300), (13, 11), (1, 1), (640, 480)]
# Pillow modes and the formats that hold them both in Pillow and TensorFlow.
CASES = [
    ('L', 'PNG'),
    ('RGB', 'PNG'),
    ('RGBA', 'PNG'),
    ('P', 'PNG'),
    ('LA', 'PNG'),
    ('1', 'PNG'),
    ('L', 'JPEG'),
    ('RGB', 'JPEG'),
    ('RGB', 'BMP'),
    ('L', 'BMP'),
]


def _encoded(size, mode: str, image_format: str, seed: int) -> bytes:
  """An image of noise over a smooth ramp, so that both kinds of detail count."""
  width, height = size
  rng = np.random.RandomState(seed)
  ramp = np.linspace(0, 255, width * height * 4).reshape(height, width, 4)
  noise = rng.randint(-64, 64, (height, width, 4))
  pixels = np.clip(ramp + noise, 0, 255).astype(np.uint8)
  pixels[..., 3] = np.maximum(pixels[..., 3], 1)  # No fully transparent pixel.
  image = Image.fromarray(pixels, 'RGBA')
  if 'A' not in mode:
    image = image.convert('RGB')
  image = image.convert(mode)
  buffer = io.BytesIO()
  image.save(buffer, image_format)
  return buffer.getvalue()


@pytest.mark.parametrize('mode, image_format', CASES)
def test_same_pixels_as_pillow(tmp_path, mode, image_format):
  encoded = [
      _encoded(size, mode, image_format, seed)
      for seed, size in enumerate(SIZES)
  ]
  expected = []
  for i, data in enumerate(encoded):
    path = tmp_path / f'{i}.{image_format.lower()}'
    path.write_bytes(data)
    expected.append(predict.load_image(str(path)))
  images = image_decoding.decode(tf.constant(encoded)).numpy()
  np.testing.assert_array_equal(images, np.concatenate(expected))


@pytest.mark.parametrize(
    'in_size, out_size', itertools.product([1, 7, 28, 29, 55, 1000], [28])
)
def test_resize_weights_sum_to_one_in_fixed_point(in_size, out_size):
  weights = image_decoding.pillow_bilinear_weights(in_size, out_size).numpy()
  assert weights.shape == (in_size, out_size)
  # Rounding each weight moves the sum by at most half a unit per weight.
  error = np.abs(weights.sum(0) - 2**image_decoding.PRECISION_BITS)
  assert np.all(error <= (weights > 0).sum(0) / 2)


def _refusal(data: bytes) -> str:
  """The line of the assertion that refuses `data`."""
  with pytest.raises(tf.errors.InvalidArgumentError) as refused:
    image_decoding.decode(tf.constant([data]))
  return refused.value.message.split('assertion failed: [')[1].split(']')[0]


def _other_formats() -> dict[str, bytes]:
  return {
      'GIF': _encoded((28, 28), 'RGB', 'GIF', 0),
      'WEBP': _encoded((28, 28), 'RGB', 'WEBP', 0),
      'TIFF': _encoded((28, 28), 'RGB', 'TIFF', 0),
      'text': b'not a picture, but long enough for a header',
  }


@pytest.mark.parametrize('name', ['GIF', 'WEBP', 'TIFF', 'text'])
def test_other_formats_are_refused(name):
  assert _refusal(_other_formats()[name]) == (
      'the input is not a PNG, JPEG or BMP image, the formats the model decodes'
  )


@pytest.mark.parametrize('image_format', ['PNG', 'JPEG', 'BMP'])
def test_inputs_shorter_than_a_header_are_refused_in_plain_words(image_format):
  data = _encoded((28, 28), 'RGB', image_format, 0)
  for size in range(image_decoding.HEADER_BYTES):
    assert _refusal(data[:size]) == (
        f'the input is {size} bytes, too short to be a PNG, JPEG or BMP '
        'image, the formats the model decodes'
    )


def _claims(data: bytes) -> tuple[int, int, int]:
  return tuple(int(v) for v in image_decoding.claimed_size(tf.constant(data)))


@pytest.mark.parametrize('mode, image_format', CASES)
def test_claimed_size_is_what_the_header_says(mode, image_format):
  data = _encoded((300, 200), mode, image_format, seed=0)
  index = list(signatures.BYTES_FORMATS).index(image_format)
  assert _claims(data) == (index, 300, 200)


# The line of each oversized image (see conftest.oversized_images).
REFUSALS = {
    'blank.png': 'the image is 5000x5000 pixels',
    'strip.png': 'the image is 20000x1 pixels',
    'claims.jpg': 'the image is 5000x5000 pixels',
    'claims.png': 'the image is 30000x30000 pixels',
    'claims.bmp': 'the image is 5000x5000 pixels',
}
BOUND = (
    '; the model decodes at most 16777216 pixels (4096x4096), 16384 on a side'
)


@pytest.mark.parametrize('name', REFUSALS)
def test_images_over_the_bound_are_refused(oversized_images, name):
  with open(oversized_images[name], 'rb') as f:
    data = f.read()
  with pytest.raises(tf.errors.InvalidArgumentError) as refused:
    image_decoding.decode(tf.constant([data]))
  assert REFUSALS[name] + BOUND in refused.value.message


def test_an_image_of_the_bound_is_decoded(tmp_path):
  path = tmp_path / 'bound.png'
  pixels = np.zeros((4096, 4096), np.uint8)
  pixels[1000:3000, 1800:2300] = 255  # A one.
  Image.fromarray(pixels).save(path)
  image = image_decoding.decode(tf.constant([path.read_bytes()])).numpy()
  np.testing.assert_array_equal(image, predict.load_image(str(path)))


# Mutated files, as an attacker would send them: each is classified or
# refused (INVALID_ARGUMENT), never a crash, in a process of its own whose
# peak memory stays bounded. An input that once crashed it is kept above,
# or in serving/export_test.py, as a test of its own.
FUZZ_CASES = 300
FUZZ_PEAK_MB = 1536
# Header fields: PNG's IHDR width and height (big-endian, checksum made
# again), BMP's width, height, bits per pixel, data offset and header size.
LARGE = [0, 1, 4096, 4097, 16384, 65535, 2**31 - 1, 2**32 - 1]


def _mutated(data: bytes, rng: np.random.RandomState) -> bytes:
  """`data` with bytes overwritten, a header field set large, or truncated."""
  data = bytearray(data)
  kind = rng.randint(3)
  if kind == 0:
    for at in rng.randint(len(data), size=rng.randint(1, 9)):
      data[at] = rng.randint(256)
  elif kind == 1 and data.startswith(b'\x89PNG'):
    at = 16 + 4 * rng.randint(2)
    data[at : at + 4] = int(rng.choice(LARGE)).to_bytes(4, 'big')
    data[29:33] = zlib.crc32(data[12:29]).to_bytes(4, 'big')
  elif kind == 1 and data.startswith(b'BM'):
    at = int(rng.choice([18, 22, 10, 14]))
    data[at : at + 4] = int(rng.choice(LARGE)).to_bytes(4, 'little')
    if rng.randint(2):
      data[28:30] = int(rng.choice([1, 4, 8, 16, 24, 32, 255])).to_bytes(
          2, 'little'
      )
  elif kind == 1:  # JPEG: the frame's height and width.
    sof = data.find(b'\xff\xc0')
    at = sof + 5 + 2 * rng.randint(2)
    data[at : at + 2] = int(rng.choice(LARGE) % 65536).to_bytes(2, 'big')
  else:
    data = data[: rng.randint(len(data))]
  return bytes(data)


# Decodes each file named on its command line, one line per file.
_DECODE_EACH = """
import sys
from run import startup
startup.quiet([])
from serving import image_decoding
import tensorflow as tf
for path in sys.argv[1:]:
  print(path, end=' ', flush=True)
  with open(path, 'rb') as f:
    data = f.read()
  try:
    image = image_decoding.decode(tf.constant([data])).numpy()
    print('classified', image.shape, image.min() >= 0, image.max() <= 1)
  except tf.errors.InvalidArgumentError:
    print('refused')
# Its own peak: a forked process's usage counts its parent's pages too.
with open('/proc/self/status') as f:
  print('VmHWM', next(l for l in f if l.startswith('VmHWM:')).split()[1])
"""


def test_mutated_files_are_classified_or_refused_never_a_crash(tmp_path):
  rng = np.random.RandomState(0)
  originals = [
      _encoded(size, mode, image_format, seed)
      for seed, (size, (mode, image_format)) in enumerate(
          itertools.product(SIZES[:5], CASES)
      )
  ]
  paths = []
  for i in range(FUZZ_CASES):
    path = tmp_path / f'{i}'
    path.write_bytes(_mutated(originals[rng.randint(len(originals))], rng))
    paths.append(str(path))
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(tmp_path / 'out', 'w') as out:
    status = subprocess.run(
        [sys.executable, '-c', _DECODE_EACH, *paths], stdout=out, cwd=root
    ).returncode
  *lines, peak = (tmp_path / 'out').read_text().splitlines()
  assert status == 0, f'decoding {peak.split()[0]} ended the process'
  outcomes = [line.split(' ', 1)[1] for line in lines]
  assert len(outcomes) == FUZZ_CASES
  assert set(outcomes) <= {'refused', 'classified (1, 28, 28, 1) True True'}
  assert 0 < outcomes.count('refused') < FUZZ_CASES
  assert int(peak.split()[1]) / 1024 < FUZZ_PEAK_MB
