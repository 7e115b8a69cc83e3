"""Learning curves of a run, from its workdir's summaries, as a PNG.

  python -m tools.plot --workdir=DIR [--out=curves.png]

Train and test loss, and train and test accuracy, per epoch; the test curves
are over the whole test split, as logged.
"""

import sys

from run import startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  startup.begin(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position

from absl import app
from absl import flags
from matplotlib import figure
from matplotlib.backends import backend_agg
from tensorboard.backend.event_processing import directory_watcher
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

FLAGS = flags.FLAGS

SIZE = (10, 4)  # Inches; at DPI dots per inch, a 1000x400 PNG.
DPI = 100


def read_scalars(workdir: str) -> dict[str, dict[int, float]]:
  """tag -> step -> value of the scalar summaries in `workdir`."""
  events = event_accumulator.EventAccumulator(
      workdir, {event_accumulator.TENSORS: 0}  # All of them.
  ).Reload()
  return {
      tag: {
          e.step: tensor_util.make_ndarray(e.tensor_proto).item()
          for e in events.Tensors(tag)
      }
      for tag in events.Tags()['tensors']
      if events.SummaryMetadata(tag).plugin_data.plugin_name == 'scalars'
  }


def plot_curves(scalars, path: str) -> None:
  """Writes loss and accuracy per epoch, train and test, to the PNG `path`."""
  if 'test_accuracy' not in scalars:
    raise ValueError('no epoch summaries (test_accuracy) to plot')
  fig = figure.Figure(figsize=SIZE, dpi=DPI)
  backend_agg.FigureCanvasAgg(fig)
  loss_ax, accuracy_ax = fig.subplots(1, 2)
  for split in ('train', 'test'):
    for ax, name, scale in (
        (loss_ax, 'loss', 1),
        (accuracy_ax, 'accuracy', 100),
    ):
      points = sorted(scalars.get(f'{split}_{name}', {}).items())
      ax.plot(
          [epoch for epoch, _ in points],
          [v * scale for _, v in points],
          marker='o',
          label=split,
      )
  loss_ax.set(
      xlabel='epoch', ylabel='loss', title='cross-entropy', yscale='log'
  )
  accuracy_ax.set(xlabel='epoch', ylabel='accuracy (%)', title='accuracy')
  for ax in (loss_ax, accuracy_ax):
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path)


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')
  try:
    plot_curves(read_scalars(FLAGS.workdir), FLAGS.out)
  except directory_watcher.DirectoryDeletedError:
    sys.exit(f'error: {FLAGS.workdir}: no such directory')
  except ValueError as e:
    sys.exit(f'error: {FLAGS.workdir}: {e}')
  print(f'wrote {FLAGS.out}')


if __name__ == '__main__':
  # Here, not on import: a program that imports plot_curves (the notebook,
  # beside main.py, whose flags have the same names) gets no flags from it.
  flags.DEFINE_string('workdir', None, 'Workdir of a run (its summaries).')
  flags.DEFINE_string('out', 'curves.png', 'Path of the PNG to write.')
  flags.mark_flag_as_required('workdir')
  app.run(main)
