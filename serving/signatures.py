"""The exported SavedModel's signatures: their names, what they take and give.

Shared by the exporter, its client (predict.py, which imports neither JAX
nor TensorFlow's graph code) and training, whose inputs they fix.
"""

import numpy as np

# Those in SIGNATURES take float images in [0, 1]; TF Serving's REST API uses
# 'serving_default' when a request names none.
SIGNATURES = ('serving_default', 'mnist_server')
INPUT_NAME = 'image'
IMAGE_SIZE = 28
IMAGE_SHAPE = (IMAGE_SIZE, IMAGE_SIZE, 1)
# Grey level k as the model's input: k / 255 in float32, rounded as NumPy and
# the Flax example's tf.data round it. Looked up, in training and in the bytes
# signature: compiled, XLA and TensorFlow turn a division by 255 into a
# product by its reciprocal, one rounding off.
PIXEL_VALUES = np.arange(256, dtype=np.float32) / np.float32(255)
# Each gives 'logits' and 'probabilities', (n, NUM_CLASSES): the digits 0-9.
NUM_CLASSES = 10
# Takes encoded images and decodes them in the graph: the formats below, told
# apart by the bytes each file starts with, as TensorFlow's decoders tell them.
BYTES_SIGNATURE = 'serving_bytes'
BYTES_INPUT_NAME = 'image_bytes'
BYTES_FORMATS = {
    'PNG': b'\x89PNG\r\n\x1a\n',
    'JPEG': b'\xff\xd8\xff',
    'BMP': b'BM',
}
FORMATS = 'PNG, JPEG or BMP'

# The largest image that the bytes signature and predict.py decode, by the
# size its header claims, which bounds what one image costs a server. 4096x4096
# holds a 12 MP phone photo of a digit; a side is bounded too, as the resize's
# weights grow with it.
MAX_PIXELS = 4096 * 4096
MAX_SIDE = 16384
BOUND = f'at most {MAX_PIXELS} pixels (4096x4096), {MAX_SIDE} on a side'
# A progressive JPEG's decoder passes over the whole image once per scan, so a
# small file of many scans costs seconds. Encoders write 1 (baseline), 6 and 10
# (libjpeg's progressive grey and colour), up to 16 (mozjpeg's searched
# scripts), one more per thumbnail; 24 leaves room above those, and keeps the
# costliest JPEG of the bound near the costliest PNG's cost (docs/serving.md).
MAX_JPEG_SCANS = 24
SCANS_BOUND = f'JPEGs of at most {MAX_JPEG_SCANS} scans'
# A PNG's decoder unfilters every byte of its samples, so its pixels' bytes
# are bounded too, by those of the bound's pixels in 8-bit RGB: alpha and
# 16-bit samples hold fewer pixels. Channels by IHDR's colour type.
PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
MAX_PNG_BYTES = 3 * MAX_PIXELS
PNG_BOUND = (
    f'PNGs of at most {MAX_PNG_BYTES} bytes of pixels (4096x4096 8-bit RGB)'
)
# A request's images together, by the pixels their headers claim: four
# images of the bound, so that a request costs at most four times the worst
# image. And by their number: each image takes the model's activations,
# however few bytes it was sent in.
MAX_REQUEST_PIXELS = 4 * MAX_PIXELS
MAX_REQUEST_IMAGES = 256
REQUEST_BOUND = (
    f'at most {MAX_REQUEST_PIXELS} pixels a request (four 4096x4096 images)'
)
