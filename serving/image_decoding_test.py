"""The graph's image preparation gives predict.py's (Pillow's) pixels, exactly."""

import io
import itertools

from serving import image_decoding
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
    ('RGB', 'GIF'),
    ('RGB', 'BMP'),
    ('RGB', 'WEBP'),
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
  options = {'lossless': True} if image_format == 'WEBP' else {}
  image.save(buffer, image_format, **options)
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


def test_not_an_image_is_refused():
  with pytest.raises(tf.errors.InvalidArgumentError, match='image'):
    image_decoding.decode(tf.constant([b'not a picture']))


def _claims(data: bytes) -> tuple[int, int, int]:
  return tuple(int(v) for v in image_decoding.claimed_size(tf.constant(data)))


@pytest.mark.parametrize('mode, image_format', CASES + [('RGBA', 'WEBP')])
def test_claimed_size_is_what_the_header_says(mode, image_format):
  data = _encoded((300, 200), mode, image_format, seed=0)
  frames = 300 * 200 if image_format == 'GIF' else 0
  assert _claims(data) == (300, 200, frames)


def test_lossy_webp_and_animated_gif_sizes():
  image = Image.new('RGB', (300, 200))
  lossy = io.BytesIO()
  image.save(lossy, 'WEBP', quality=80)
  frames = [Image.new('L', (120, 50), 255 * (i % 2)) for i in range(7)]
  gif = io.BytesIO()
  frames[0].save(gif, 'GIF', save_all=True, append_images=frames[1:])
  assert _claims(lossy.getvalue()) == (300, 200, 0)
  assert _claims(gif.getvalue()) == (120, 50, 7 * 120 * 50)


# The line of each oversized image (see conftest.oversized_images).
REFUSALS = {
    'blank.png': 'the image is 5000x5000 pixels',
    'blank.webp': 'the image is 5000x5000 pixels',
    'strip.png': 'the image is 20000x1 pixels',
    'claims.jpg': 'the image is 5000x5000 pixels',
    'claims.png': 'the image is 30000x30000 pixels',
    'claims.bmp': 'the image is 5000x5000 pixels',
    'frames.gif': 'the frames of the GIF hold more than 16777216 pixels',
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
