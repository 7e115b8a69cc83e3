"""TensorBoard summaries: the writer, the images and texts, reading them back.

`create_writer` gives the run's clu metric writer, which leaves out what an
interrupted run already wrote. clu's writers write with TensorFlow, which
takes seconds to import: it is imported when a writer is created or event
files are read, not with this module. The images (mistakes, confusion
matrix) are drawn here as uint8 RGB arrays (matplotlib draws into an Agg
canvas of its own: no display, no pyplot state) and written through that
writer, like the scalars; train.py calls the `write_*` functions.
`read_scalars`, `read_images` and `read_texts` read a workdir's event files
back, for plot.py, the benchmark and the tests.
"""

import contextlib
import os
import re
import typing

from clu import asynclib
from run import errors
import jax
from matplotlib import figure
from matplotlib.backends import backend_agg
import ml_collections
import models
import numpy as np
from PIL import Image
from PIL import ImageDraw

if typing.TYPE_CHECKING:
  from clu import metric_writers  # Imports TensorFlow.

# The misclassified grid: GRID x GRID cells of a digit SCALE times its size,
# a caption under each and a header line. Its size is the same every epoch,
# however many mistakes, so that TensorBoard's step slider compares like
# with like.
GRID = 10
SCALE = 3
CAPTION = 16
HEADER = 20


class WriteError(errors.UserError):
  """Summaries could not be written; the message is one line for the user."""

  @classmethod
  def of(cls, error: Exception) -> 'WriteError':
    """The error that the write's innermost cause (TensorFlow's) words."""
    while error.__cause__ is not None:  # clu's writer wraps it twice.
      error = error.__cause__
    text = getattr(error, 'message', None) or str(error)
    text = re.sub(r'\{\{[^}]*\}\}\s*', '', text).strip().splitlines()[0]
    return cls(
        f'cannot write the summaries ({text}): free space or make the workdir '
        'writable, then rerun the same command to resume'
    )


@contextlib.contextmanager
def _write_errors():
  """Raises what a failed write raises, deferred by clu's writer, as WriteError."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    yield
  except (asynclib.AsyncError, tf.errors.OpError, OSError) as e:
    raise WriteError.of(e) from e


class NewStepsWriter:
  """A metric writer that writes each tag only past a given step.

  A resumed run repeats the steps after its checkpoint. Those that the
  interrupted run summarised already (the same values: they are
  deterministic) are not summarised twice. A write that fails (a full disk),
  here or in the writer's thread, raises WriteError.
  """

  def __init__(
      self, writer: 'metric_writers.MetricWriter', last: dict[str, int]
  ):
    self._writer, self._last = writer, last

  def _new(self, step: int, values: dict) -> dict:
    return {
        k: v
        for k, v in values.items()
        if k not in self._last or step > self._last[k]
    }

  def write_scalars(self, step: int, scalars: dict) -> None:
    if new := self._new(step, scalars):
      with _write_errors():
        self._writer.write_scalars(step, new)

  def write_images(self, step: int, images: dict) -> None:
    if new := self._new(step, images):
      with _write_errors():
        self._writer.write_images(step, new)

  def write_texts(self, step: int, texts: dict) -> None:
    if new := self._new(step, texts):
      with _write_errors():
        self._writer.write_texts(step, new)

  def flush(self) -> None:
    with _write_errors():
      self._writer.flush()


def create_writer(
    workdir: str, config: ml_collections.ConfigDict, params
) -> NewStepsWriter:
  """The writer of `workdir`'s summaries, the run's information written.

  On a fresh start, the hyperparameters, the config and the number of
  `params` (a pytree of the trained parameters); a resumed run has them.
  Only process 0 writes event files; the others log.
  """
  from clu import metric_writers  # pylint: disable=g-import-not-at-top

  last = last_steps(workdir)
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0
  )
  if not last:
    writer.write_hparams(config.to_dict())
  writer = NewStepsWriter(writer, last)
  write_run_info(writer, config, params)
  return writer


def misclassified_grid(
    images: np.ndarray,
    labels: np.ndarray,
    predicted: np.ndarray,
    title: str = '',
) -> np.ndarray:
  """The first GRID**2 test digits whose prediction is wrong, tiled.

  Each digit is captioned with its predicted label (red) and its true label
  (green). `images` are uint8, as `input_pipeline.load` returns them.
  Returns a uint8 RGB array; cells without a mistake stay black.
  """
  wrong = np.flatnonzero(predicted != labels)
  size = images.shape[1] * SCALE
  cell_h = size + CAPTION
  grid = Image.new('RGB', (GRID * size, HEADER + GRID * cell_h))
  draw = ImageDraw.Draw(grid)
  draw.text(
      (4, 4),
      f'{title}{len(wrong)} of {len(labels)} misclassified',
      fill='white',
  )
  for n, i in enumerate(wrong[: GRID * GRID]):
    x, y = (n % GRID) * size, HEADER + (n // GRID) * cell_h
    digit = (
        images[i]
        .reshape(images.shape[1:3])
        .repeat(SCALE, axis=0)
        .repeat(SCALE, axis=1)
    )
    grid.paste(Image.fromarray(digit).convert('RGB'), (x, y))
    draw.text((x + 4, y + size + 1), f'pred {predicted[i]}', fill=(255, 90, 90))
    draw.text((x + 46, y + size + 1), f'true {labels[i]}', fill=(90, 220, 90))
  return np.asarray(grid)


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray) -> np.ndarray:
  """Counts `(true, predicted)` of the model's classes."""
  matrix = np.zeros((models.NUM_CLASSES,) * 2, np.int64)
  np.add.at(matrix, (labels, predicted), 1)
  return matrix


def confusion_matrix_image(matrix: np.ndarray, title: str = '') -> np.ndarray:
  """The confusion matrix drawn with its counts, as a uint8 RGB array.

  Colours follow log(1 + count): on a linear scale the diagonal's thousands
  would hide the off-diagonal mistakes, which are what the picture is for.
  """
  fig = figure.Figure(figsize=(6, 6), dpi=100)
  canvas = backend_agg.FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  ax.imshow(np.log1p(matrix), cmap='Blues')
  threshold = np.log1p(matrix).max() / 2
  for (true, pred), count in np.ndenumerate(matrix):
    ax.text(
        pred,
        true,
        str(count),
        ha='center',
        va='center',
        fontsize=8,
        color='white' if np.log1p(count) > threshold else 'black',
    )
  ticks = range(len(matrix))
  ax.set(
      xticks=ticks, yticks=ticks, xlabel='predicted', ylabel='true', title=title
  )
  fig.tight_layout()
  canvas.draw()
  return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def write_run_info(
    writer: 'metric_writers.MetricWriter',
    config: ml_collections.ConfigDict,
    params,
) -> None:
  """The config and the parameter count, as text (markdown in TensorBoard).

  `params` is a pytree of the trained parameters (not BatchNorm statistics).
  """
  count = sum(x.size for x in jax.tree.leaves(params))
  writer.write_texts(
      0,
      {
          'config': '```\n' + str(config) + '```',
          'num_params': f'{count:,} parameters',
      },
  )


def write_epoch(
    writer: 'metric_writers.MetricWriter',
    epoch: int,
    scalars: dict[str, float],
    test: dict[str, np.ndarray],
    predicted: np.ndarray,
    learning_rate,
    steps_done: int,
    last: bool,
) -> None:
  """All of an epoch's summaries, flushed, before the epoch's checkpoint.

  A run killed between the two repeats the epoch, and the writer leaves out
  what is already written.

  Its `scalars`; its misclassified test digits; its learning rate (that of
  its last step) if it is scheduled, since a constant rate is among the
  hyperparameters already; after the `last` epoch, the confusion matrix.
  """
  writer.write_scalars(epoch, scalars)
  grid = misclassified_grid(
      test['image'], test['label'], predicted, title=f'epoch {epoch}: '
  )
  writer.write_images(epoch, {'misclassified': grid[None]})
  if callable(learning_rate):
    writer.write_scalars(
        epoch, {'learning_rate': float(learning_rate(steps_done - 1))}
    )
  if last:
    matrix = confusion_matrix_image(
        confusion_matrix(test['label'], predicted),
        title=f'test set after epoch {epoch}',
    )
    writer.write_images(epoch, {'confusion_matrix': matrix[None]})
  writer.flush()


def _events(workdir: str):
  """(step, wall time, summary value, its tensor) of each value in the events.

  Those of `workdir`, the tensor as an array. A killed run may leave its last
  record unfinished: what precedes it is read.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  pattern = os.path.join(workdir, 'events.out.tfevents.*')
  for path in sorted(tf.io.gfile.glob(pattern)):
    try:
      for record in tf.data.TFRecordDataset(path):
        event = tf.compat.v1.Event.FromString(record.numpy())
        for value in event.summary.value:
          tensor = tf.make_ndarray(value.tensor)
          yield event.step, event.wall_time, value, tensor
    except tf.errors.DataLossError:
      pass


def last_steps(workdir: str) -> dict[str, int]:
  """tag -> the last step of it that the event files in `workdir` hold."""
  last = {}
  for step, _, value, _ in _events(workdir):
    last[value.tag] = max(step, last.get(value.tag, 0))
  return last


def read_scalars(workdir: str) -> dict[str, dict[int, tuple[float, float]]]:
  """tag -> step -> (value, wall time) of the scalar summaries in `workdir`."""
  scalars = {}
  for step, wall_time, value, tensor in _events(workdir):
    if tensor.ndim == 0 and tensor.dtype.kind == 'f':
      scalars.setdefault(value.tag, {})[step] = (float(tensor), wall_time)
  return scalars


def read_images(workdir: str) -> dict[str, dict[int, bytes]]:
  """tag -> step -> encoded PNG of the image summaries in `workdir`.

  An image summary holds width, height, then one encoded image per image
  written; these summaries hold one.
  """
  images = {}
  for step, _, value, tensor in _events(workdir):
    if value.metadata.plugin_data.plugin_name == 'images':
      images.setdefault(value.tag, {})[step] = tensor[2]
  return images


def read_texts(workdir: str) -> dict[str, str]:
  """tag -> the last text summary of that tag in `workdir` (markdown)."""
  texts = {}
  for _, _, value, tensor in _events(workdir):
    if value.metadata.plugin_data.plugin_name == 'text':
      texts[value.tag] = tensor.item().decode()
  return texts
