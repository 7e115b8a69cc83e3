"""The graph's image preparation: predict.py's (Pillow's) pixels, exactly, and
only from PNG, JPEG and BMP files within the bound; anything else refused."""

import itertools
import os
import struct
import subprocess
import sys
import zlib

from serving import image_decoding
from serving import signatures
import numpy as np
from PIL import ExifTags
from PIL import Image
import predict
import pytest
import tensorflow as tf
from tools import crafted_images

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


def _encoded(size, mode: str, image_format: str, seed: int, **options) -> bytes:
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
  return crafted_images.encoded(image.convert(mode), image_format, **options)


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


def _refusal(data: bytes, request=None) -> str:
  """The line of the assertion that refuses `data` (or the whole `request`)."""
  with pytest.raises(tf.errors.InvalidArgumentError) as refused:
    image_decoding.decode(tf.constant(request or [data]))
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


# The line of each file refused for what decoding it would cost (see
# conftest.costly_images).
COSTLY = {
    'scans.jpg': 'the JPEG holds 20006 scans; the model decodes JPEGs of at '
    'most 24 scans',
    'cmyk.jpg': 'the JPEG has 4 colour components; the model decodes JPEGs of '
    '1 or 3 (grey or colour)',
    'rgb16.png': 'the PNG is 4096x4096 pixels of 6 bytes; the model decodes '
    'PNGs of at most 50331648 bytes of pixels (4096x4096 8-bit RGB)',
}


@pytest.mark.parametrize('name', COSTLY)
def test_costly_files_are_refused_before_decoding(costly_images, name):
  with open(costly_images[name], 'rb') as f:
    assert _refusal(f.read()) == COSTLY[name]


def test_a_jpeg_of_the_scans_limit_is_decoded_one_more_refused(tmp_path):
  limit = signatures.MAX_JPEG_SCANS
  jpeg = crafted_images.progressive_jpeg('RGB', 40)
  at_limit = crafted_images.with_scans(jpeg, limit, 0)
  path = tmp_path / 'limit.jpg'
  path.write_bytes(at_limit)
  image = image_decoding.decode(tf.constant([at_limit])).numpy()
  np.testing.assert_array_equal(image, predict.load_image(str(path)))
  over = crafted_images.with_scans(jpeg, limit + 1, 0)
  assert _refusal(over) == (
      f'the JPEG holds {limit + 1} scans; the model decodes JPEGs of at most '
      f'{limit} scans'
  )


def _with_exif_thumbnail(jpeg: bytes, thumbnail: bytes) -> bytes:
  """`jpeg` with an EXIF APP1 segment after SOI, holding `thumbnail` as a
  camera writes it: IFD1's JPEGInterchangeFormat and its length."""
  entries = struct.pack('>HHII', 0x0201, 4, 1, 8 + 2 + 4 + 2 + 2 * 12 + 4)
  entries += struct.pack('>HHII', 0x0202, 4, 1, len(thumbnail))
  # TIFF header, an empty IFD0 that points to IFD1, IFD1, the thumbnail.
  tiff = b'MM\x00\x2a' + struct.pack('>I', 8) + struct.pack('>HI', 0, 14)
  tiff += struct.pack('>H', 2) + entries + struct.pack('>I', 0) + thumbnail
  app1 = b'Exif\x00\x00' + tiff
  return (
      jpeg[:2]
      + b'\xff\xe1'
      + struct.pack('>H', len(app1) + 2)
      + app1
      + jpeg[2:]
  )


def test_a_phone_jpeg_with_its_exif_thumbnail_is_classified(tmp_path):
  photo = _encoded((640, 480), 'RGB', 'JPEG', seed=0)
  thumbnail = _encoded((160, 120), 'RGB', 'JPEG', seed=1)
  data = _with_exif_thumbnail(photo, thumbnail)
  path = tmp_path / 'phone.jpg'
  path.write_bytes(data)
  with Image.open(path) as image:  # Pillow reads the thumbnail's place.
    ifd1 = image.getexif().get_ifd(ExifTags.IFD.IFD1)
  start, length = ifd1[0x0201], ifd1[0x0202]
  assert data[12 + start : 12 + start + length] == thumbnail
  assert data.count(b'\xff\xda') == 2
  image = image_decoding.decode(tf.constant([data])).numpy()
  np.testing.assert_array_equal(image, predict.load_image(str(path)))


def test_a_request_over_the_budget_is_refused_in_one_line(tmp_path):
  """Four images of the bound are decoded, five refused before any is."""
  path = tmp_path / 'bound.png'
  Image.new('L', (4096, 4096)).save(path)
  bound = path.read_bytes()
  images = image_decoding.decode(tf.constant([bound] * 4)).numpy()
  assert images.shape == (4, 28, 28, 1)
  with pytest.raises(tf.errors.InvalidArgumentError) as refused:
    image_decoding.decode(tf.constant([bound] * 5))
  assert refused.value.message.split('assertion failed: [')[1].split(']')[
      0
  ] == (
      'the images claim 83886080 pixels in all; the model decodes at most '
      '67108864 pixels a request (four 4096x4096 images)'
  )


def test_a_request_of_too_many_images_is_refused_in_one_line():
  png = _encoded((1, 1), 'L', 'PNG', 0)
  assert image_decoding.decode(tf.constant([png] * 256)).shape[0] == 256
  assert _refusal(None, [png] * 257) == (
      'the request holds 257 images; the model decodes at most 256 a request'
  )


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
  """`data` with bytes overwritten, a header field set large, truncated, or,
  of a progressive JPEG, a scan repeated (up to past the limit), two
  scans swapped, or a scan cut short."""
  spans = crafted_images.scan_spans(data) if data[:2] == b'\xff\xd8' else []
  kind = rng.randint(4 if len(spans) > 1 else 3)
  if kind == 3:
    start, end = spans[rng.randint(len(spans))]
    how = rng.randint(3)
    if how == 0:
      return data[:-2] + data[start:end] * rng.randint(1, 30) + data[-2:]
    if how == 1:
      first, second = sorted(spans[i] for i in rng.choice(len(spans), 2, False))
      return (
          data[: first[0]]
          + data[second[0] : second[1]]
          + data[first[1] : second[0]]
          + data[first[0] : first[1]]
          + data[second[1] :]
      )
    return data[: rng.randint(start, end)] + data[end:]
  data = bytearray(data)
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
  originals += [
      _encoded(size, mode, 'JPEG', seed, progressive=True)
      for seed, (size, mode) in enumerate(
          itertools.product(SIZES[:5], ['L', 'RGB'])
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
