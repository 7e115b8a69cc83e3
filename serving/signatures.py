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
