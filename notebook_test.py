"""mnist.ipynb runs top to bottom, as CI runs it: a slice, one epoch.

The notebook is executed by nbclient in a kernel of this environment, from
the checkout, with MNIST_NOTEBOOK_QUICK=1 (the original files, 10,000
training images, one epoch); any cell's error fails the test.
"""

import os
import re
import time

import nbclient
import nbformat
import pytest

# Not in the quick tier (pytest -m "not slow"): a training run.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.abspath(__file__))
NOTEBOOK = os.path.join(ROOT, 'mnist.ipynb')


def _text(cell) -> str:
  return ''.join(o.get('text', '') for o in cell.outputs)


def test_the_notebook_runs_top_to_bottom(mnist_files, monkeypatch):
  monkeypatch.setenv('MNIST_NOTEBOOK_QUICK', '1')
  monkeypatch.setenv('MNIST_MANUAL_DIR', mnist_files)
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  start = time.monotonic()
  nbclient.NotebookClient(
      notebook,
      timeout=600,
      kernel_name='python3',
      resources={'metadata': {'path': ROOT}},
  ).execute()
  seconds = time.monotonic() - start
  print(f'mnist.ipynb ran in {seconds:.1f} s')
  outputs = '\n'.join(_text(c) for c in notebook.cells if c.cell_type == 'code')
  assert re.search(r'epoch:  1, train_loss: [\d.]+, train_accuracy', outputs)
  assert 'Exported the SavedModel to' in outputs
  assert re.search(r'test_00000_label_\d\.png: \d \(', outputs)


def test_the_saved_notebook_holds_a_real_run():
  """What GitHub shows: every cell run in order, on the whole test set."""
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  code = [c for c in notebook.cells if c.cell_type == 'code']
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
  outputs = '\n'.join(_text(c) for c in code)
  accuracy = re.search(r'epoch:  1, .*test_accuracy: ([\d.]+)', outputs)
  assert accuracy and float(accuracy.group(1)) >= 99.0
  assert "'test'" in outputs or 'test_split: test\n' in outputs
