"""Turns encoded images into the model's input, inside the SavedModel's graph.

`serving_bytes` takes PNG, JPEG and BMP files and makes the very pixels that
predict.py makes with Pillow: Pillow's integer luma and bilinear resize, as
TensorFlow's own ops differ by a grey level here and there. Everything is
checked before a decoder runs: the format, by the bytes a file starts with
(every TensorFlow decode op decodes whatever format it finds, and its WebP
decoder corrupts the heap on a malformed animation), and the size the header
claims (the decoders fill out any size a few bytes claim).
"""

from serving.signatures import BOUND, BYTES_FORMATS, FORMATS, IMAGE_SIZE, MAX_PIXELS, MAX_SIDE, PIXEL_VALUES
import tensorflow as tf

# Pillow's fixed-point resampling of 8-bit images (libImaging/Resample.c).
PRECISION_BITS = 22
# Bytes read for the checks: BMP's width and height end at byte 26, PNG's at
# 24. A shorter input is none of the three.
HEADER_BYTES = 26


def pillow_bilinear_weights(in_size: tf.Tensor, out_size: int) -> tf.Tensor:
  """`(in_size, out_size)` integer weights of Pillow's bilinear resize.

  Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc`: a triangle,
  widened when shrinking, normalised per output pixel, times 2**22, rounded;
  float64, in which the sums of 8-bit pixels times them are exact.
  """
  in_size = tf.cast(in_size, tf.float64)
  scale = in_size / out_size
  support = tf.maximum(scale, 1.0)
  center = (tf.range(out_size, dtype=tf.float64) + 0.5) * scale
  first = tf.maximum(tf.floor(center - support + 0.5), 0.0)
  end = tf.minimum(tf.floor(center + support + 0.5), in_size)
  x = tf.range(in_size, dtype=tf.float64)[:, None]
  triangle = tf.maximum(1.0 - tf.abs((x - center + 0.5) * (1.0 / support)), 0.0)
  weights = tf.where((x >= first) & (x < end), triangle, 0.0)
  weights /= tf.reduce_sum(weights, axis=0)
  return tf.floor(weights * 2**PRECISION_BITS + 0.5)


def _resample(pixels: tf.Tensor) -> tf.Tensor:
  """One pass of Pillow's resize, of the rows, rounded to 8 bits; transposed."""
  weights = pillow_bilinear_weights(tf.shape(pixels)[1], IMAGE_SIZE)
  total = tf.matmul(pixels, weights) + 2 ** (PRECISION_BITS - 1)
  pixels = tf.clip_by_value(tf.floor(total / 2**PRECISION_BITS), 0.0, 255.0)
  return tf.transpose(pixels)


def _grey(image: tf.Tensor) -> tf.Tensor:
  """The `(height, width)` int32 luma of decoded pixels, as Pillow's 'L'."""
  channels = tf.where(tf.shape(image)[-1] < 3, [0, 0, 0], [0, 1, 2])
  rgb = tf.gather(image, channels, axis=-1)
  weighted = tf.cast(rgb, tf.int32) * tf.constant([19595, 38470, 7471])
  return tf.bitwise.right_shift(tf.reduce_sum(weighted, axis=-1) + 2**15, 16)


def _uint(header: tf.Tensor, offset: int, length: int, big_endian=False):
  """The unsigned integer of `length` bytes of `header` (int64) at `offset`."""
  value = tf.constant(0, tf.int64)
  for i in range(length) if big_endian else reversed(range(length)):
    value = value * 256 + header[offset + i]
  return value


def claimed_size(encoded: tf.Tensor):
  """The format's index in BYTES_FORMATS, and the width and height it claims.

  By PNG's IHDR, JPEG's SOF, BMP's header (signed: a negative height is a
  top-down image). An input of none of them, or shorter than HEADER_BYTES,
  is of index -1, width and height 0.
  """
  head = tf.strings.substr(encoded, 0, HEADER_BYTES)
  header = tf.io.decode_raw(head, tf.uint8, fixed_length=HEADER_BYTES)
  header = tf.cast(header, tf.int64)  # Zeros past the end.
  index = tf.constant(-1)
  for i, magic in enumerate(BYTES_FORMATS.values()):
    starts = tf.reduce_all(header[: len(magic)] == list(magic))
    index = tf.where(starts, i, index)
  index = tf.where(tf.strings.length(encoded) < HEADER_BYTES, -1, index)
  zero = tf.constant(0, tf.int64)
  signed = lambda v: tf.abs(tf.where(v >= 2**31, v - 2**32, v))

  def jpeg():
    shape = tf.image.extract_jpeg_shape(encoded, tf.int64)
    return shape[1], shape[0]

  width, height = tf.switch_case(
      index,
      [
          lambda: (_uint(header, 16, 4, True), _uint(header, 20, 4, True)),
          jpeg,
          lambda: (signed(_uint(header, 18, 4)), signed(_uint(header, 22, 4))),
      ],
      default=lambda: (zero, zero),
  )
  return index, width, height


def _prepare(encoded: tf.Tensor) -> tf.Tensor:
  """One encoded image as a `(28, 28, 1)` float32 image in [0, 1].

  An input refused fails `assertion failed: [<why>]`, INVALID_ARGUMENT;
  decoding takes the checked tensor, so it runs after. The message never
  holds the input's bytes.
  """
  index, width, height = claimed_size(encoded)
  within = width * height <= MAX_PIXELS
  within &= tf.maximum(width, height) <= MAX_SIDE
  size = tf.strings.length(encoded)
  short = tf.strings.format('the input is {} bytes, too short to be a ', size)
  unknown = tf.where(size < HEADER_BYTES, short, 'the input is not a ')
  unknown += f'{FORMATS} image, the formats the model decodes'
  large = tf.strings.format('the image is {}x{} pixels', (width, height))
  large += f'; the model decodes {BOUND}'
  message = tf.where(index < 0, unknown, large)
  check = tf.debugging.Assert((index >= 0) & within, [message])
  with tf.control_dependencies([check]):
    encoded = tf.identity(encoded)
  # Each decoder on its own format only (the index was checked above).
  image = tf.switch_case(
      index,
      [
          lambda: tf.io.decode_png(encoded),
          lambda: tf.io.decode_jpeg(encoded, dct_method='INTEGER_ACCURATE'),
          lambda: tf.io.decode_bmp(encoded),
      ],
  )
  # Across, then down; an image of 28x28 already is left as it is.
  pixels = _resample(_resample(tf.cast(_grey(image), tf.float64)))
  return tf.gather(PIXEL_VALUES, tf.cast(pixels, tf.int32))[..., None]


@tf.function(input_signature=[tf.TensorSpec((None,), tf.string)])
def decode(encoded: tf.Tensor) -> tf.Tensor:
  """A `(n,)` batch of encoded images as a `(n, 28, 28, 1)` float32 batch.

  One image at a time: a request of many costs the memory of one.
  """
  image = tf.TensorSpec((IMAGE_SIZE, IMAGE_SIZE, 1), tf.float32)
  return tf.map_fn(
      _prepare, encoded, parallel_iterations=1, fn_output_signature=image
  )
