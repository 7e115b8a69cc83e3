"""Turns encoded images into the model's input, inside the SavedModel's graph.

The export's `serving_bytes` signature takes PNG, JPEG, GIF, BMP or WebP bytes,
so that a client needs neither NumPy nor Pillow. Its graph prepares them as
`predict.load_image` does with Pillow, to the same pixel values: grey by
Pillow's integer ITU-R 601 luma, resized to 28x28 by Pillow's bilinear filter
(its fixed-point arithmetic, the horizontal pass first), divided by 255.
TensorFlow's own `rgb_to_grayscale` and `resize` differ from Pillow's by a
grey level here and there, which would change the logits. Images are 8-bit.

Before an image is decoded, the size that its header claims is checked
against `serving_signatures.MAX_PIXELS` and `MAX_SIDE`: a few hundred bytes
can claim 20000x20000 pixels, which TensorFlow's decoders would fill in
(gigabytes). An image over the bound is refused with an INVALID_ARGUMENT
error that names its size, which TF Serving returns as HTTP 400.
"""

import numpy as np
from serving.signatures import BOUND, IMAGE_SIZE, MAX_PIXELS, MAX_SIDE
import tensorflow as tf

# Pillow's fixed-point resampling of 8-bit images (libImaging/Resample.c).
PRECISION_BITS = 22
# Grey level k as a float, k / 255 as NumPy rounds it: looked up, since in a
# graph TensorFlow turns a division by 255 into a product by its reciprocal.
PIXEL_VALUES = np.arange(256, dtype=np.float32) / np.float32(255)


def pillow_bilinear_weights(in_size: tf.Tensor, out_size: int) -> tf.Tensor:
  """`(in_size, out_size)` integer weights of Pillow's bilinear resize.

  As Pillow computes them (`precompute_coeffs`, `normalize_coeffs_8bpc`): a
  triangle widened by the reduction factor when shrinking, normalised per
  output pixel, times 2**22 and rounded. Held as float64, in which the
  resize's sums of 8-bit pixels times these weights are exact.
  """
  in_size = tf.cast(in_size, tf.float64)
  scale = in_size / out_size
  filter_scale = tf.maximum(scale, 1.0)
  support = filter_scale  # The bilinear filter's support is 1.
  center = (tf.range(out_size, dtype=tf.float64) + 0.5) * scale
  first = tf.maximum(tf.floor(center - support + 0.5), 0.0)
  end = tf.minimum(tf.floor(center + support + 0.5), in_size)
  x = tf.range(in_size, dtype=tf.float64)[:, None]
  triangle = tf.maximum(
      1.0 - tf.abs((x - center + 0.5) * (1.0 / filter_scale)), 0.0
  )
  weights = tf.where((x >= first) & (x < end), triangle, 0.0)
  weights /= tf.reduce_sum(weights, axis=0)
  return tf.floor(weights * 2**PRECISION_BITS + 0.5)


def _resample(pixels: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
  """One pass of Pillow's resize: rounded, clipped to 8 bits."""
  total = tf.matmul(pixels, weights) + 2 ** (PRECISION_BITS - 1)
  return tf.clip_by_value(tf.floor(total / 2**PRECISION_BITS), 0.0, 255.0)


def grey(rgb: tf.Tensor) -> tf.Tensor:
  """Pillow's RGB to 'L' conversion: (19595 R + 38470 G + 7471 B + 2**15) >> 16."""
  weighted = tf.cast(rgb, tf.int32) * tf.constant([19595, 38470, 7471])
  return tf.bitwise.right_shift(tf.reduce_sum(weighted, axis=-1) + 2**15, 16)


def decode_rgb(encoded: tf.Tensor) -> tf.Tensor:
  """The `(height, width, 3)` uint8 pixels of one image, as Pillow decodes it.

  JPEGs with the accurate integer DCT, Pillow's (TensorFlow's default is the
  fast one). Grey images are repeated over the three channels, which Pillow's
  luma leaves unchanged; alpha is dropped, as Pillow's 'L' conversion ignores it.
  """
  image = tf.cond(
      tf.io.is_jpeg(encoded),
      lambda: tf.io.decode_jpeg(encoded, dct_method='INTEGER_ACCURATE'),
      lambda: tf.io.decode_image(encoded, expand_animations=False),
  )
  return tf.cond(
      tf.shape(image)[-1] < 3,
      lambda: tf.repeat(image[..., :1], 3, axis=-1),
      lambda: image[..., :3],
  )


def _uint(data: tf.Tensor, offset, length: int, big_endian=False):
  """The unsigned integer of `length` bytes of `data` (int64) at `offset`."""
  value = tf.constant(0, tf.int64)
  for i in range(length) if big_endian else reversed(range(length)):
    value = value * 256 + data[offset + i]
  return value


def _gif_frame_pixels(encoded: tf.Tensor, header: tf.Tensor) -> tf.Tensor:
  """The pixels of a GIF's frames together, by their image descriptors.

  giflib holds every frame decoded, so a small file of many frames costs
  as much as one huge frame. The blocks are walked as giflib reads them:
  extensions (0x21) and images (0x2C, whose descriptor holds the frame's
  size) each followed by data sub-blocks, a size byte then the data, the
  last of size 0. The walk stops at anything else (the trailer, or bytes
  that giflib refuses too), or once the count is over the bound.
  """
  data = tf.cast(tf.io.decode_raw(encoded, tf.uint8), tf.int64)
  n = tf.size(data, out_type=tf.int64)
  data = tf.concat([data, tf.zeros([16], tf.int64)], 0)  # Reads past the end.

  def colour_table(packed):
    two = tf.constant(2, tf.int64)
    return tf.where(
        packed >= 128, 3 * tf.bitwise.left_shift(two, packed % 8), 0
    )

  def more(position, in_sub_blocks, pixels):
    byte = data[tf.minimum(position, n)]
    block = in_sub_blocks | (byte == 0x21) | (byte == 0x2C)
    return (position < n) & block & (pixels <= MAX_PIXELS)

  def step(position, in_sub_blocks, pixels):
    byte = data[position]
    image = byte == 0x2C
    after_block = tf.where(
        image, position + 11 + colour_table(data[position + 9]), position + 2
    )
    frame = _uint(data, position + 5, 2) * _uint(data, position + 7, 2)
    return (
        tf.where(in_sub_blocks, position + 1 + byte, after_block),
        ~in_sub_blocks | (byte != 0),
        pixels + tf.where(image & ~in_sub_blocks, frame, 0),
    )

  start = 13 + colour_table(header[10])  # After the global colour table.
  zero = tf.constant(0, tf.int64)
  return tf.while_loop(more, step, (start, tf.constant(False), zero))[2]


def claimed_size(encoded: tf.Tensor):
  """Width, height and (GIF) frames' pixels that an image's header claims.

  Read from the header of each format that TensorFlow decodes (PNG's IHDR,
  JPEG's SOF, GIF's screen and frame descriptors, BMP's header, WebP's VP8,
  VP8L or VP8X chunk); zeros for other bytes, which decoding refuses.
  """
  head = tf.strings.substr(encoded, 0, 32)
  header = tf.cast(tf.io.decode_raw(head, tf.uint8, fixed_length=32), tf.int64)
  zero = tf.constant(0, tf.int64)
  starts = lambda magic: tf.strings.substr(head, 0, len(magic)) == magic

  def jpeg():
    shape = tf.cast(tf.image.extract_jpeg_shape(encoded), tf.int64)
    return shape[1], shape[0], zero

  def bmp():  # Signed: a negative height is a top-down image.
    signed = lambda v: tf.abs(tf.where(v >= 2**31, v - 2**32, v))
    return signed(_uint(header, 18, 4)), signed(_uint(header, 22, 4)), zero

  def webp():
    chunk = tf.strings.substr(head, 12, 4)
    vp8l = _uint(header, 21, 4)  # Width - 1 and height - 1, 14 bits each.
    width, height = tf.case(
        [
            (
                chunk == b'VP8 ',
                lambda: (
                    _uint(header, 26, 2) % 2**14,
                    _uint(header, 28, 2) % 2**14,
                ),
            ),
            (
                chunk == b'VP8L',
                lambda: (vp8l % 2**14 + 1, vp8l // 2**14 % 2**14 + 1),
            ),
            (
                chunk == b'VP8X',
                lambda: (_uint(header, 24, 3) + 1, _uint(header, 27, 3) + 1),
            ),
        ],
        default=lambda: (zero, zero),
    )
    return width, height, zero

  return tf.case(
      [
          (
              starts(b'\x89PNG\r\n\x1a\n'),
              lambda: (
                  _uint(header, 16, 4, True),
                  _uint(header, 20, 4, True),
                  zero,
              ),
          ),
          (tf.io.is_jpeg(encoded), jpeg),
          (
              starts(b'GIF8'),
              lambda: (
                  _uint(header, 6, 2),
                  _uint(header, 8, 2),
                  _gif_frame_pixels(encoded, header),
              ),
          ),
          (starts(b'BM'), bmp),
          (starts(b'RIFF') & (tf.strings.substr(head, 8, 4) == b'WEBP'), webp),
      ],
      default=lambda: (zero, zero, zero),
  )


def bounded(encoded: tf.Tensor) -> tf.Tensor:
  """`encoded`, once its claimed size is within the bound; else an error.

  INVALID_ARGUMENT, `assertion failed: [<the size and the bound>]`; the
  decoding ops take the returned tensor, so they run only after the check.
  """
  width, height, frame_pixels = claimed_size(encoded)
  within = (
      (width * height <= MAX_PIXELS)
      & (tf.maximum(width, height) <= MAX_SIDE)
      & (frame_pixels <= MAX_PIXELS)
  )
  message = tf.where(
      frame_pixels > MAX_PIXELS,
      f'the frames of the GIF hold more than {MAX_PIXELS} pixels',
      tf.strings.format('the image is {}x{} pixels', (width, height)),
  )
  message = tf.strings.join([message, '; the model decodes ' + BOUND])
  check = tf.debugging.Assert(within, [message])
  with tf.control_dependencies([check]):
    return tf.identity(encoded)


def prepare(encoded: tf.Tensor) -> tf.Tensor:
  """One encoded image as a `(28, 28, 1)` float32 image in [0, 1]."""
  pixels = tf.cast(grey(decode_rgb(bounded(encoded))), tf.float64)
  height, width = tf.shape(pixels)[0], tf.shape(pixels)[1]
  # Resizing to the size an image has already leaves it as it is.
  pixels = _resample(pixels, pillow_bilinear_weights(width, IMAGE_SIZE))
  pixels = _resample(
      tf.transpose(pixels), pillow_bilinear_weights(height, IMAGE_SIZE)
  )
  image = tf.gather(PIXEL_VALUES, tf.cast(tf.transpose(pixels), tf.int32))
  return image[..., None]


@tf.function(input_signature=[tf.TensorSpec((None,), tf.string)])
def decode(encoded: tf.Tensor) -> tf.Tensor:
  """A `(n,)` batch of encoded images as a `(n, 28, 28, 1)` float32 batch.

  One image at a time: a request costs the memory of decoding one image,
  within the bound, however many it holds.
  """
  return tf.map_fn(
      prepare,
      encoded,
      parallel_iterations=1,
      fn_output_signature=tf.TensorSpec(
          (IMAGE_SIZE, IMAGE_SIZE, 1), tf.float32
      ),
  )
