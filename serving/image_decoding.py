"""Turns encoded images into the model's input, inside the SavedModel's graph.

`serving_bytes` takes PNG, JPEG, GIF, BMP or WebP files and makes the very
pixels that predict.py makes with Pillow: Pillow's integer luma and bilinear
resize, as TensorFlow's own ops differ by a grey level here and there. A
header that claims more than the bound (serving/signatures.py) is refused
before decoding: TensorFlow's decoders fill out any size a few bytes claim.
"""

from serving.signatures import BOUND, IMAGE_SIZE, MAX_PIXELS, MAX_SIDE, PIXEL_VALUES
import tensorflow as tf

# Pillow's fixed-point resampling of 8-bit images (libImaging/Resample.c).
PRECISION_BITS = 22


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


def _decode_grey(encoded: tf.Tensor) -> tf.Tensor:
  """The `(height, width)` int32 luma of one image, as Pillow's 'L' makes it.

  JPEGs by Pillow's accurate integer DCT; alpha ignored, as Pillow does.
  """
  image = tf.cond(
      tf.io.is_jpeg(encoded),
      lambda: tf.io.decode_jpeg(encoded, dct_method='INTEGER_ACCURATE'),
      lambda: tf.io.decode_image(encoded, expand_animations=False),
  )
  # Grey (and alpha) as R = G = B; RGB(A) as R, G, B.
  channels = tf.where(tf.shape(image)[-1] < 3, [0, 0, 0], [0, 1, 2])
  rgb = tf.gather(image, channels, axis=-1)
  weighted = tf.cast(rgb, tf.int32) * tf.constant([19595, 38470, 7471])
  return tf.bitwise.right_shift(tf.reduce_sum(weighted, axis=-1) + 2**15, 16)


def _uint(data: tf.Tensor, offset, length: int, big_endian=False):
  """The unsigned integer of `length` bytes of `data` (int64) at `offset`."""
  value = tf.constant(0, tf.int64)
  for i in range(length) if big_endian else reversed(range(length)):
    value = value * 256 + data[offset + i]
  return value


def _gif_frame_pixels(encoded: tf.Tensor, header: tf.Tensor) -> tf.Tensor:
  """The pixels of a GIF's frames together, by their image descriptors.

  giflib holds every frame decoded: many small frames cost as much as one
  huge. The blocks are walked as giflib reads them, extensions (0x21) and
  images (0x2C: left, top, width, height), each followed by sub-blocks (a
  size byte, then the data; the last of size 0), up to anything else (the
  trailer) or past the bound.
  """
  data = tf.cast(tf.io.decode_raw(encoded, tf.uint8), tf.int64)
  n = tf.size(data, out_type=tf.int64)
  data = tf.concat([data, tf.zeros([16], tf.int64)], 0)  # Reads past the end.

  def colour_table(packed):  # Its size in bytes, by a packed fields byte.
    size = 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), packed % 8)
    return tf.where(packed >= 128, size, 0)

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

  PNG's IHDR, JPEG's SOF, GIF's screen and frame descriptors, BMP's header,
  WebP's VP8, VP8L or VP8X chunk; zeros for other bytes, which decoding refuses.
  """
  head = tf.strings.substr(encoded, 0, 32)
  header = tf.cast(tf.io.decode_raw(head, tf.uint8, fixed_length=32), tf.int64)
  zero = tf.constant(0, tf.int64)
  starts = lambda magic: tf.strings.substr(head, 0, len(magic)) == magic

  def png():
    return _uint(header, 16, 4, True), _uint(header, 20, 4, True), zero

  def jpeg():
    shape = tf.image.extract_jpeg_shape(encoded, tf.int64)
    return shape[1], shape[0], zero

  def gif():
    frames = _gif_frame_pixels(encoded, header)
    return _uint(header, 6, 2), _uint(header, 8, 2), frames

  def bmp():  # Signed: a negative height is a top-down image.
    signed = lambda v: tf.abs(tf.where(v >= 2**31, v - 2**32, v))
    return signed(_uint(header, 18, 4)), signed(_uint(header, 22, 4)), zero

  def webp():  # VP8: 14 bits; VP8L: 14 bits, less one; VP8X: 24, less one.
    chunk, vp8l = tf.strings.substr(head, 12, 4), _uint(header, 21, 4)
    width = height = zero
    for name, (w, h) in {
        b'VP8 ': (_uint(header, 26, 2) % 2**14, _uint(header, 28, 2) % 2**14),
        b'VP8L': (vp8l % 2**14 + 1, vp8l // 2**14 % 2**14 + 1),
        b'VP8X': (_uint(header, 24, 3) + 1, _uint(header, 27, 3) + 1),
    }.items():
      width = tf.where(chunk == name, w, width)
      height = tf.where(chunk == name, h, height)
    return width, height, zero

  webp_file = starts(b'RIFF') & (tf.strings.substr(head, 8, 4) == b'WEBP')
  return tf.case(
      [
          (starts(b'\x89PNG\r\n\x1a\n'), png),
          (tf.io.is_jpeg(encoded), jpeg),
          (starts(b'GIF8'), gif),
          (starts(b'BM'), bmp),
          (webp_file, webp),
      ],
      default=lambda: (zero, zero, zero),
  )


def _prepare(encoded: tf.Tensor) -> tf.Tensor:
  """One encoded image as a `(28, 28, 1)` float32 image in [0, 1].

  An image over the bound fails `assertion failed: [<its size; the bound>]`,
  INVALID_ARGUMENT; decoding takes the checked tensor, so it runs after.
  """
  width, height, frame_pixels = claimed_size(encoded)
  claimed = tf.maximum(width * height, frame_pixels)
  within = (claimed <= MAX_PIXELS) & (tf.maximum(width, height) <= MAX_SIDE)
  message = tf.where(
      frame_pixels > MAX_PIXELS,
      f'the frames of the GIF hold more than {MAX_PIXELS} pixels',
      tf.strings.format('the image is {}x{} pixels', (width, height)),
  )
  message = tf.strings.join([message, '; the model decodes ' + BOUND])
  with tf.control_dependencies([tf.debugging.Assert(within, [message])]):
    pixels = tf.cast(_decode_grey(tf.identity(encoded)), tf.float64)
  # Across, then down; an image of 28x28 already is left as it is.
  pixels = _resample(_resample(pixels))
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
