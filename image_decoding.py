"""Turns encoded images into the model's input, inside the SavedModel's graph.

The export's `serving_bytes` signature takes PNG, JPEG, GIF, BMP or WebP bytes,
so that a client needs neither NumPy nor Pillow. Its graph prepares them as
`predict.load_image` does with Pillow, to the same pixel values: grey by
Pillow's integer ITU-R 601 luma, resized to 28x28 by Pillow's bilinear filter
(its fixed-point arithmetic, the horizontal pass first), divided by 255.
TensorFlow's own `rgb_to_grayscale` and `resize` differ from Pillow's by a
grey level here and there, which would change the logits. Images are 8-bit.
"""

from serving_signatures import IMAGE_SIZE
import tensorflow as tf

# Pillow's fixed-point resampling of 8-bit images (libImaging/Resample.c).
PRECISION_BITS = 22


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


def prepare(encoded: tf.Tensor) -> tf.Tensor:
  """One encoded image as a `(28, 28, 1)` float32 image in [0, 1]."""
  pixels = tf.cast(grey(decode_rgb(encoded)), tf.float64)
  height, width = tf.shape(pixels)[0], tf.shape(pixels)[1]
  # Resizing to the size an image has already leaves it as it is.
  pixels = _resample(pixels, pillow_bilinear_weights(width, IMAGE_SIZE))
  pixels = _resample(
      tf.transpose(pixels), pillow_bilinear_weights(height, IMAGE_SIZE)
  )
  image = tf.cast(tf.transpose(pixels), tf.float32) / 255.0
  return image[..., None]


def decode(encoded: tf.Tensor) -> tf.Tensor:
  """A `(n,)` batch of encoded images as a `(n, 28, 28, 1)` float32 batch."""
  return tf.map_fn(
      prepare,
      encoded,
      fn_output_signature=tf.TensorSpec(
          (IMAGE_SIZE, IMAGE_SIZE, 1), tf.float32
      ),
  )
