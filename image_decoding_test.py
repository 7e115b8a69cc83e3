"""The graph's image preparation gives predict.py's (Pillow's) pixels, exactly."""

import io
import itertools

import image_decoding
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
