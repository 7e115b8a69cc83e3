"""Turns encoded images into the model's input, inside the SavedModel's graph.

`serving_bytes` takes PNG, JPEG and BMP files and makes the very pixels that
predict.py makes with Pillow (its integer luma and bilinear resize: TF's own
ops differ by a grey level here and there). Before a decoder runs, the format
is checked by the bytes a file starts with (a TensorFlow decode op decodes any
format it finds, and its WebP decoder corrupts the heap on a malformed
animation), and signatures.py's bounds by the header's claims (the decoders
fill out any size a few bytes claim): the size, a PNG's bytes of pixels, a
JPEG's components and scans, a request's images and their pixels together.
"""

from serving.signatures import BOUND, BYTES_FORMATS, FORMATS, IMAGE_SIZE, MAX_JPEG_SCANS, MAX_PIXELS, MAX_REQUEST_IMAGES, MAX_REQUEST_PIXELS, MAX_SIDE, PIXEL_VALUES, PNG_BOUND, PNG_CHANNELS, MAX_PNG_BYTES, REQUEST_BOUND, SCANS_BOUND
import tensorflow as tf

PNG, JPEG = list(BYTES_FORMATS).index('PNG'), list(BYTES_FORMATS).index('JPEG')

# Pillow's fixed-point resampling of 8-bit images (libImaging/Resample.c).
PRECISION_BITS = 22
BLOCK_PIXELS = 2**20
# Bytes read for the checks: BMP's width and height end at byte 26, PNG's at
# 24. A shorter input is none of the three.
HEADER_BYTES = 26


def pillow_bilinear_weights(in_size: tf.Tensor, out_size: int) -> tf.Tensor:
  """`(in_size, out_size)` integer weights of Pillow's bilinear resize.

  Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc`, in float64, in
  which the sums of 8-bit pixels times them are exact.
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


def _resampled(pixels: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
  """Pillow's resize of the rows of `pixels`, its sums rounded to 8 bits."""
  total = tf.matmul(pixels, weights) + 2 ** (PRECISION_BITS - 1)
  return tf.clip_by_value(tf.floor(total / 2**PRECISION_BITS), 0.0, 255.0)


def _across(image: tf.Tensor) -> tf.Tensor:
  """`_resampled` luma (`_grey`) of the image, a block of rows at a time.

  Each block's buffers are small enough for the allocator to keep and reuse:
  the whole image's would be mapped afresh, and faulted in page by page,
  for every request.
  """
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  weights = pillow_bilinear_weights(width, IMAGE_SIZE)
  rows = tf.maximum(BLOCK_PIXELS // width, 1)
  count = (height + rows - 1) // rows

  def block(i, done):
    luma = _grey(image[i * rows : (i + 1) * rows])
    return i + 1, done.write(i, _resampled(luma, weights))

  done = tf.TensorArray(
      tf.float64, count, infer_shape=False, element_shape=[None, IMAGE_SIZE]
  )
  _, done = tf.while_loop(lambda i, _: i < count, block, (0, done))
  return tf.transpose(done.concat())


def _grey(image: tf.Tensor) -> tf.Tensor:
  """The `(height, width)` float64 luma of decoded pixels, as Pillow's 'L'."""

  def luma():
    weighted = [
        tf.cast(image[..., i], tf.int32) * weight
        for i, weight in enumerate([19595, 38470, 7471])
    ]
    return tf.bitwise.right_shift(tf.add_n(weighted) + 2**15, 16)

  # Grey, with or without alpha, is its own luma.
  grey = lambda: tf.cast(image[..., 0], tf.int32)
  return tf.cast(tf.cond(tf.shape(image)[-1] < 3, grey, luma), tf.float64)


def _uint(header: tf.Tensor, offset: int, length: int, big_endian=False):
  """The unsigned integer of `length` bytes of `header` (int64) at `offset`."""
  value = tf.constant(0, tf.int64)
  for i in range(length) if big_endian else reversed(range(length)):
    value = value * 256 + header[offset + i]
  return value


def _header(encoded: tf.Tensor) -> tf.Tensor:
  """The first HEADER_BYTES bytes, as int64s; zeros past the end."""
  head = tf.strings.substr(encoded, 0, HEADER_BYTES)
  header = tf.io.decode_raw(head, tf.uint8, fixed_length=HEADER_BYTES)
  return tf.cast(header, tf.int64)


def claimed_size(encoded: tf.Tensor):
  """The format's index in BYTES_FORMATS, and the width and height it claims.

  By PNG's IHDR, JPEG's SOF, BMP's header (signed: a negative height is a
  top-down image). An input of none of them, or shorter than HEADER_BYTES,
  is of index -1, width and height 0.
  """
  header = _header(encoded)
  index = tf.constant(-1)
  for i, magic in enumerate(BYTES_FORMATS.values()):
    starts = tf.reduce_all(header[: len(magic)] == list(magic))
    index = tf.where(starts, i, index)
  index = tf.where(tf.strings.length(encoded) < HEADER_BYTES, -1, index)
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
      default=lambda: (tf.constant(0, tf.int64),) * 2,
  )
  return index, width, height


def jpeg_scans(encoded: tf.Tensor) -> tf.Tensor:
  """The scans of a JPEG, at most: how many times the bytes FF DA occur.

  In entropy-coded data a byte FF is followed by 00 or a restart marker, so
  each FF DA starts a scan (of the image or of a thumbnail in it) or lies in
  metadata: never fewer than the scans.
  """
  data = tf.io.decode_raw(encoded, tf.uint8)
  starts = (data[:-1] == 0xFF) & (data[1:] == 0xDA)
  return tf.reduce_sum(tf.cast(starts, tf.int32))


def png_format(encoded: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """A PNG's bit depth and colour type (IHDR's), as int32s; zeros if short."""
  header = tf.cast(_header(encoded), tf.int32)
  return header[24], header[25]


def _once(ok: tf.Tensor, message: tf.Tensor, tensor: tf.Tensor) -> tf.Tensor:
  """`tensor`, computed only once `ok` holds; else the run fails
  `assertion failed: [<message>]`, INVALID_ARGUMENT."""
  with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
    return tf.identity(tensor)


def _checked(encoded: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """The format's index and the pixels claimed, once the image passes.

  The message of a refusal never holds the input's bytes.
  """
  index, width, height = claimed_size(encoded)
  within = width * height <= MAX_PIXELS
  within &= tf.maximum(width, height) <= MAX_SIDE
  depth, colour = png_format(encoded)
  channels = [PNG_CHANNELS.get(c, 1) for c in range(7)]
  channels = tf.gather(channels, tf.clip_by_value(colour, 0, 6))
  pixel_bytes = tf.cast(tf.where(depth == 16, 2, 1) * channels, tf.int64)
  png_ok = (index != PNG) | (width * height * pixel_bytes <= MAX_PNG_BYTES)
  scans, components = tf.cond(
      index == JPEG,
      lambda: (jpeg_scans(encoded), tf.image.extract_jpeg_shape(encoded)[2]),
      lambda: (0, 1),
  )
  # CMYK costs the most a scan, and a conversion.
  one_or_three = (components == 1) | (components == 3)
  colours = 'JPEGs of 1 or 3 (grey or colour)'
  size = tf.strings.length(encoded)
  short = tf.strings.format('the input is {} bytes, too short to be a ', size)
  why = tf.where(size < HEADER_BYTES, short, 'the input is not a ')
  passes = index >= 0
  message = why + f'{FORMATS} image, the formats the model decodes'
  sizes = (width, height, pixel_bytes)
  refusals = [
      (within, 'the image is {}x{} pixels', sizes[:2], BOUND),
      (png_ok, 'the PNG is {}x{} pixels of {} bytes', sizes, PNG_BOUND),
      (one_or_three, 'the JPEG has {} colour components', components, colours),
      (scans <= MAX_JPEG_SCANS, 'the JPEG holds {} scans', scans, SCANS_BOUND),
  ]
  for ok, line, values, bound in refusals:  # The first refusal's line.
    line = tf.strings.format(line, values) + f'; the model decodes {bound}'
    message = tf.where(passes & ~ok, line, message)
    passes &= ok
  return _once(passes, message, index), width * height


def _prepare(encoded: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
  """One checked image as a `(28, 28, 1)` float32 image in [0, 1]."""
  # Each decoder on its own format only (the index was checked), and to no
  # more channels than the luma reads: a JPEG's is its Y channel, decoded
  # alone as Pillow's draft('L') decodes it; a PNG's alpha is left out.
  image = tf.switch_case(
      index,
      [
          lambda: tf.cond(
              png_format(encoded)[1] % 4 == 0,  # Grey, or grey and alpha.
              lambda: tf.io.decode_png(encoded, 1),
              lambda: tf.io.decode_png(encoded, 3),
          ),
          lambda: tf.io.decode_jpeg(encoded, 1, dct_method='INTEGER_ACCURATE'),
          lambda: tf.io.decode_bmp(encoded),
      ],
  )
  # Across, then down; an image of 28x28 already is left as it is.
  across = _across(image)
  weights = pillow_bilinear_weights(tf.shape(across)[1], IMAGE_SIZE)
  pixels = tf.transpose(_resampled(across, weights))
  return tf.gather(PIXEL_VALUES, tf.cast(pixels, tf.int32))[..., None]


@tf.function(input_signature=[tf.TensorSpec((None,), tf.string)])
def decode(encoded: tf.Tensor) -> tf.Tensor:
  """A `(n,)` batch of encoded images as a `(n, 28, 28, 1)` float32 batch.

  Every bound is checked before any image is decoded; then one at a time: a
  request of many costs the decoding memory of one.
  """
  count = tf.size(encoded)
  many = tf.strings.format('the request holds {} images', count)
  many += f'; the model decodes at most {MAX_REQUEST_IMAGES} a request'
  encoded = _once(count <= MAX_REQUEST_IMAGES, many, encoded)
  index, pixels = tf.map_fn(
      _checked, encoded, fn_output_signature=(tf.int32, tf.int64)
  )
  total = tf.reduce_sum(pixels)
  message = tf.strings.format('the images claim {} pixels in all', total)
  message += f'; the model decodes {REQUEST_BOUND}'
  index = _once(total <= MAX_REQUEST_PIXELS, message, index)
  image = tf.TensorSpec((IMAGE_SIZE, IMAGE_SIZE, 1), tf.float32)
  return tf.map_fn(
      lambda args: _prepare(*args),
      (encoded, index),
      parallel_iterations=1,
      fn_output_signature=image,
  )
