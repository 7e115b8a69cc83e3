"""TensorBoard summaries by clu's writer: scalars, texts, uint8 RGB images."""

import contextlib
import functools
import re

from clu import asynclib
from clu import metric_writers
import jax
from matplotlib import figure
from matplotlib.backends import backend_agg
import numpy as np
from PIL import Image
from PIL import ImageDraw
from run import errors
from run import progress
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf

# The misclassified grid: GRID x GRID digits SCALE times their size, captioned,
# under a header; the same size every epoch, for TensorBoard's step slider.
GRID, SCALE, CAPTION, HEADER = 10, 3, 16, 20


@contextlib.contextmanager
def _write_errors():
  """What a failed write raises (clu's writer defers it) as a UserError."""
  try:
    yield
  except (asynclib.AsyncError, tf.errors.OpError, OSError) as e:
    error = e
    while error.__cause__ is not None:  # clu's writer wraps it twice.
      error = error.__cause__
    text = getattr(error, 'message', None) or str(error)
    text = re.sub(r'\{\{[^}]*\}\}\s*', '', text).strip().splitlines()[0]
    raise errors.UserError(
        f'cannot write the summaries ({text}): free space or make the workdir '
        'writable, then rerun the same command to resume'
    ) from e


class NewStepsWriter:
  """Writes each tag only past its `last` step: a resumed run repeats the steps
  after its checkpoint, which the interrupted run may have summarised."""

  def __init__(self, writer: metric_writers.MetricWriter, last: dict):
    self._writer, self._last = writer, last

  def _write(self, method: str, step: int, values: dict) -> None:
    new = {k: v for k, v in values.items() if step > self._last.get(k, -1)}
    if new:
      with _write_errors():
        getattr(self._writer, method)(step, new)

  write_scalars = functools.partialmethod(_write, 'write_scalars')
  write_images = functools.partialmethod(_write, 'write_images')
  write_texts = functools.partialmethod(_write, 'write_texts')

  def flush(self) -> None:
    with _write_errors():
      self._writer.flush()


def create_writer(workdir: str, config, params) -> NewStepsWriter:
  """The writer of `workdir`'s summaries (process 0's files, others' logs)."""
  # Each tag's last step; a killed run's unfinished last record is left out.
  events = event_accumulator.EventAccumulator(
      workdir, {event_accumulator.TENSORS: 1}
  )
  if tf.io.gfile.isdir(workdir):  # Not yet made where the caller did not.
    events.Reload()
  last = {t: events.Tensors(t)[-1].step for t in events.Tags()['tensors']}
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0
  )
  if not last:  # A fresh run.
    writer.write_hparams(config.to_dict())
  writer = NewStepsWriter(writer, last)
  count = sum(x.size for x in jax.tree.leaves(params))
  texts = {'config': f'```\n{config}```', 'num_params': f'{count:,} parameters'}
  writer.write_texts(0, texts)
  return writer


def misclassified_grid(images, labels, predicted, title='') -> np.ndarray:
  """The first GRID**2 misclassified test digits, tiled and captioned, RGB."""
  wrong = np.flatnonzero(predicted != labels)
  size = images.shape[1] * SCALE
  grid = Image.new('RGB', (GRID * size, HEADER + GRID * (size + CAPTION)))
  draw = ImageDraw.Draw(grid)
  header = f'{title}{len(wrong)} of {len(labels)} misclassified'
  draw.text((4, 4), header, fill='white')
  for n, i in enumerate(wrong[: GRID * GRID]):
    x, y = (n % GRID) * size, HEADER + (n // GRID) * (size + CAPTION)
    digit = images[i, ..., 0].repeat(SCALE, axis=0).repeat(SCALE, axis=1)
    grid.paste(Image.fromarray(digit).convert('RGB'), (x, y))
    draw.text((x + 4, y + size + 1), f'pred {predicted[i]}', fill=(255, 90, 90))
    draw.text((x + 46, y + size + 1), f'true {labels[i]}', fill=(90, 220, 90))
  return np.asarray(grid)


def confusion_matrix(labels, predicted, classes: int = 10) -> np.ndarray:
  """Counts `(true, predicted)`."""
  counts = np.bincount(labels * classes + predicted, minlength=classes**2)
  return counts.reshape(classes, classes)


def confusion_matrix_image(matrix: np.ndarray, title: str = '') -> np.ndarray:
  """The confusion matrix drawn with its counts, as a uint8 RGB array; colours
  follow log(1 + count), lest the diagonal's thousands hide the mistakes."""
  fig = figure.Figure(figsize=(6, 6), dpi=100)
  canvas = backend_agg.FigureCanvasAgg(fig)  # No display, no pyplot state.
  ax = fig.add_subplot()
  ax.imshow(np.log1p(matrix), cmap='Blues')
  threshold = np.log1p(matrix).max() / 2
  for (true, pred), count in np.ndenumerate(matrix):
    color = 'white' if np.log1p(count) > threshold else 'black'
    ax.text(pred, true, count, ha='center', va='center', size=8, color=color)
  ticks = range(len(matrix))
  ax.set(xticks=ticks, yticks=ticks, xlabel='predicted', ylabel='true')
  ax.set_title(title)
  fig.tight_layout()
  canvas.draw()
  return np.asarray(canvas.buffer_rgba())[..., :3].copy()


@progress.timed('summaries')
def write_epoch(writer, epoch, scalars, test, predicted, *, last) -> None:
  """All of an epoch's summaries, flushed, before the epoch's checkpoint."""
  writer.write_scalars(epoch, scalars)
  grid = misclassified_grid(
      test['image'], test['label'], predicted, title=f'epoch {epoch}: '
  )
  writer.write_images(epoch, {'misclassified': grid[None]})
  if last:
    matrix = confusion_matrix(test['label'], predicted)
    image = confusion_matrix_image(matrix, f'test set after epoch {epoch}')
    writer.write_images(epoch, {'confusion_matrix': image[None]})
  writer.flush()
