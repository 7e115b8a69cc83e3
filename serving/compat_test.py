"""The export runs on the TensorFlow of the newest TF Serving image.

TF Serving is built on one TensorFlow: `tensorflow/serving:2.20.0` on 2.20.0,
the oldest that runs this export (docs/serving.md). The test installs
`tensorflow-cpu==2.20.0` into a virtual environment of its own (with
`tensorflow-serving-api` for its protos, without its dependencies), kept in
the temporary directory across runs: PyPI is needed the first time. There,
the export is loaded as the server loads it (`tools/serving_standin.load`:
the highest version in a session, tag 'serve', warm-up requests replayed),
and the warm-up requests and real digits are run through every signature;
the answers must be the project's TensorFlow's within 1e-5.

Another server's TensorFlow, by hand:
`SERVING_TENSORFLOW=tensorflow-cpu==2.19.1 pytest serving_compat_test.py`.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

from serving import export
import filelock
import numpy as np
import pytest
from serving import signatures as names
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

# Not in the quick tier (pytest -m "not slow"): another TensorFlow, an export.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# That of the newest TF Serving image, tensorflow/serving:2.20.0.
SERVING_TENSORFLOW = os.environ.get(
    'SERVING_TENSORFLOW', 'tensorflow-cpu==2.20.0'
)

# Run by each TensorFlow: loads the model directory argv[1] as the server
# does, runs the requests of the TFRecord file argv[2] (PredictionLogs) and
# saves the outputs to argv[3] (.npz, '<request>.<output>'); prints its
# version.
REPLAY = """
import sys
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2
from tools import serving_standin

try:
  servable = serving_standin.load('mnist', sys.argv[1], True, 0, 0)
except RuntimeError as e:
  sys.exit(f'TensorFlow {tf.__version__}: {" ".join(str(e).split())}')
outputs = {}
for i, record in enumerate(tf.compat.v1.io.tf_record_iterator(sys.argv[2])):
  request = prediction_log_pb2.PredictionLog.FromString(record)
  response = servable.predict(request.predict_log.request)
  for name, tensor in response.outputs.items():
    outputs[f'{i}.{name}'] = tf.make_ndarray(tensor)
np.savez(sys.argv[3], **outputs)
print(tf.__version__)
"""


def _python_with(requirement: str) -> str:
  """The Python of a virtual environment with `requirement` (NAME==VERSION).

  Made once, in the temporary directory; a lock makes parallel test
  processes wait for the first.
  """
  version = requirement.split('==')[1]
  directory = os.path.join(
      tempfile.gettempdir(),
      'mnist-tests-' + re.sub(r'[^\w.]+', '-', requirement),
  )
  python = os.path.join(directory, 'bin', 'python')
  installed = os.path.join(directory, 'installed')
  # uv, as `make` finds it, installs in parallel and from its cache; else pip.
  uv = shutil.which('uv') or os.path.join(ROOT, '.uv', 'bin', 'uv')
  if os.path.exists(uv):
    make = [uv, 'venv', '--quiet', '--python', sys.executable, directory]
    install = [uv, 'pip', 'install', '--quiet', '--python', python]
  else:
    make = [sys.executable, '-m', 'venv', '--clear', directory]
    install = [python, '-m', 'pip', 'install', '--quiet']
  with filelock.FileLock(directory + '.lock'):
    if os.path.exists(installed):
      return python
    for command in (
        make,
        [*install, requirement],
        [*install, '--no-deps', f'tensorflow-serving-api=={version}'],
    ):
      result = subprocess.run(
          command, capture_output=True, text=True, timeout=900
      )
      if result.returncode:
        last = (result.stderr.strip().splitlines() or [''])[-1]
        pytest.fail(
            f'could not install {requirement} into {directory} '
            f'({" ".join(command[1:])}: {last}); it needs PyPI once',
            pytrace=False,
        )
    open(installed, 'w').close()
  return python


def _requests(version_dir: str, images: np.ndarray) -> list:
  """The warm-up requests, then `images` for every signature (as PNGs too)."""
  records = tf.data.TFRecordDataset(
      os.path.join(version_dir, export.WARMUP_FILE)
  )
  logs = [
      prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in records
  ]
  pixels = np.round(images * 255).astype(np.uint8)
  return logs + export.requests('mnist', images, pixels)


def _replay(python: str, model_dir: str, requests: str, out: str):
  """The TensorFlow version of `python` and the outputs of the requests."""
  result = subprocess.run(
      [python, '-c', REPLAY, model_dir, requests, out],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=600,
  )
  if result.returncode:
    pytest.fail(result.stderr.strip().splitlines()[-1], pytrace=False)
  with np.load(out) as outputs:
    return result.stdout.split()[-1], dict(outputs)


def test_the_newest_serving_tensorflow_answers_as_the_project_does(
    trained_export, mnist_test_images, tmp_path
):
  python = _python_with(SERVING_TENSORFLOW)
  model_dir = os.path.dirname(trained_export)
  requests = _requests(trained_export, mnist_test_images[0][:16])
  signatures = [
      r.predict_log.request.model_spec.signature_name for r in requests
  ]
  assert sorted(set(signatures)) == sorted(
      names.SIGNATURES + (names.BYTES_SIGNATURE,)
  )
  path = str(tmp_path / 'requests.tfrecord')
  with tf.io.TFRecordWriter(path) as writer:
    for request in requests:
      writer.write(request.SerializeToString())
  version, served = _replay(python, model_dir, path, str(tmp_path / 's.npz'))
  assert version == SERVING_TENSORFLOW.split('==')[1]
  _, ours = _replay(sys.executable, model_dir, path, str(tmp_path / 'o.npz'))
  assert sorted(served) == sorted(ours)
  assert len(ours) == 2 * len(requests)
  for key, value in ours.items():
    np.testing.assert_allclose(
        served[key], value, rtol=0, atol=1e-5, err_msg=key
    )
