"""Tests of the command line: its errors, resuming after SIGKILL and SIGTERM, export."""

import collections
import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys

from configs import default
import checkpoints
import numpy as np
import pytest
import summaries
import tensorflow as tf
import train

ROOT = os.path.dirname(os.path.abspath(__file__))
TAGS = ('train_loss', 'train_accuracy', 'test_loss', 'test_accuracy')


def _command(*args: str) -> list[str]:
  return [sys.executable, os.path.join(ROOT, 'main.py'), *args]


def _main(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      _command(*args), capture_output=True, text=True, cwd=ROOT, timeout=300
  )


def _flags(config) -> list[str]:
  """The command line of `config`, from the default config file."""
  changed = {
      k: v for k, v in config.to_dict().items()
      if v != default.get_config()[k]
  }
  return ['--config=configs/default.py'] + [
      f'--config.{k}={v}' for k, v in changed.items()
  ]


def _snapshot(directory) -> dict[str, tuple]:
  """Each file under `directory`: its size, modification time and SHA-256."""
  files = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
      files[os.path.relpath(path, directory)] = (
          os.path.getsize(path), os.stat(path).st_mtime_ns, digest,
      )
  return files


def _assert_one_line_error(result, message: str) -> None:
  """Exit status 1, and `message` (a regex) as the last line, no traceback."""
  assert result.returncode == 1, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert re.fullmatch(message, last), last


def _assert_kept(before: dict, workdir) -> None:
  """No file of `before` was removed or changed in `workdir`."""
  after = _snapshot(workdir)
  assert {k: after.get(k) for k in before} == before


def _config(data_dir, **fields):
  config = default.get_config()
  config.update(
      data_dir=data_dir, train_split='train[:256]', test_split='test[:300]',
      batch_size=64, num_epochs=1,
  )
  config.update(fields)
  return config


@pytest.fixture(scope='module')
def trained(mnist_data_dir, tmp_path_factory):
  """A workdir after one epoch of `_config`: summaries, checkpoint, export."""
  workdir = str(tmp_path_factory.mktemp('trained') / 'workdir')
  config = _config(mnist_data_dir)
  summary = train.train_and_evaluate(config, workdir)
  return config, workdir, summary


@pytest.fixture
def workdir(trained, tmp_path):
  """A copy of the trained workdir and its snapshot, to check it is kept."""
  config, original, _ = trained
  copy = str(tmp_path / 'workdir')
  shutil.copytree(original, copy)
  return config, copy, _snapshot(copy)


def test_workdir_is_required():
  result = _main('--config=configs/default.py')
  assert result.returncode != 0
  assert 'Flag --workdir must have a value other than None' in result.stderr


def test_config_is_required(tmp_path):
  result = _main(f'--workdir={tmp_path}')
  assert result.returncode != 0
  assert 'Flag --config must have a value other than None' in result.stderr


def test_unknown_config_field_is_rejected(tmp_path):
  result = _main(
      f'--workdir={tmp_path}', '--config=configs/default.py',
      '--config.learning_rat=0.05',
  )
  _assert_one_line_error(
      result,
      "error: the config has no field 'learning_rat'; did you mean "
      '"learning_rate" instead of "learning_rat"\\?',
  )
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('field, value, allowed', [
    ('learning_rate', '-0.1', 'a number > 0'),
    ('batch_size', '0', 'an integer > 0'),
    ('num_epochs', '0', 'an integer > 0'),
])
def test_bad_values_are_named_with_what_is_allowed(workdir, field, value, allowed):
  config, directory, before = workdir
  result = _main(f'--workdir={directory}', *_flags(config), f'--config.{field}={value}')
  _assert_one_line_error(
      result, re.escape(f'error: config.{field}={value} is not allowed: use {allowed}')
  )
  _assert_kept(before, directory)
  assert len(_snapshot(directory)) == len(before)


def test_traceback_with_verbosity_1(workdir):
  config, directory, before = workdir
  result = _main(
      f'--workdir={directory}', *_flags(config), '--config.batch_size=0',
      '--verbosity=1',
  )
  assert result.returncode == 1
  assert 'Traceback' in result.stderr
  assert 'TrainingError: config.batch_size=0 is not allowed' in result.stderr
  _assert_kept(before, directory)


def test_batch_size_larger_than_the_data(mnist_data_dir, tmp_path):
  (tmp_path / 'notes.txt').write_text('kept')
  before = _snapshot(tmp_path)
  config = _config(mnist_data_dir, batch_size=300)
  result = _main(f'--workdir={tmp_path}', *_flags(config))
  _assert_one_line_error(
      result, re.escape(
          "error: config.batch_size=300 is larger than the 256 examples of "
          "config.train_split='train[:256]': use at most 256"
      ),
  )
  assert _snapshot(tmp_path) == before


def test_unknown_dataset(tmp_path, mnist_data_dir):
  result = _main(
      f'--workdir={tmp_path}', *_flags(_config(mnist_data_dir, dataset='mnits'))
  )
  _assert_one_line_error(result, "error: unknown dataset 'mnits': use .*")


def test_workdir_that_cannot_be_created(tmp_path):
  (tmp_path / 'file').write_text('kept')
  result = _main(f'--workdir={tmp_path / "file" / "w"}', '--config=configs/default.py')
  _assert_one_line_error(
      result, re.escape(
          f'error: cannot create or write the workdir {tmp_path / "file" / "w"} '
          f'({tmp_path / "file"} is not a directory): choose a --workdir that '
          'can be created and written'
      ),
  )
  assert (tmp_path / 'file').read_text() == 'kept'


def test_checkpoint_of_another_config(workdir):
  config, directory, before = workdir
  result = _main(
      f'--workdir={directory}', *_flags(config), '--config.learning_rate=0.05',
      '--config.seed=1', '--config.num_epochs=2',
  )
  checkpoints_dir = os.path.join(directory, 'checkpoints')
  _assert_one_line_error(
      result, re.escape(
          f'error: {checkpoints_dir} holds a checkpoint (step 4, end of epoch 1) '
          'of another config: learning_rate 0.1 -> 0.05; seed 0 -> 1; to start '
          f'afresh, use a new --workdir or move {checkpoints_dir} away'
      ),
  )
  _assert_kept(before, directory)


def test_missing_data_is_one_line_error(workdir, tmp_path):
  config, directory, before = workdir
  result = _main(
      f'--workdir={directory}', *_flags(config),
      f'--config.data_dir={tmp_path / "tfds"}',
      f'--config.manual_dir={tmp_path / "empty"}',
  )
  _assert_one_line_error(
      result, re.escape(f'error: {tmp_path / "empty"}: missing t10k-images') + '.*'
  )
  _assert_kept(before, directory)


@pytest.mark.parametrize('damage', ['truncated', 'one byte changed'])
def test_corrupt_data_file(workdir, copy_of_mnist_files, tmp_path, damage):
  config, directory, before = workdir
  path = os.path.join(copy_of_mnist_files, 'train-images-idx3-ubyte.gz')
  with open(path, 'r+b') as f:
    if damage == 'truncated':
      f.truncate(os.path.getsize(path) // 2)
    else:
      f.seek(5000)
      byte = f.read(1)
      f.seek(5000)
      f.write(bytes([byte[0] ^ 1]))
  result = _main(
      f'--workdir={directory}', *_flags(config),
      f'--config.data_dir={tmp_path / "tfds"}',
      f'--config.manual_dir={copy_of_mnist_files}',
  )
  _assert_one_line_error(
      result, re.escape(
          f'error: {copy_of_mnist_files}: train-images-idx3-ubyte.gz does not '
          'match the size and SHA-256 that TFDS registers for mnist: the file '
          'is corrupt, truncated or recompressed; replace it with the original, '
          "or read the files with data_source='idx', which checks their "
          'contents instead'
      ),
  )
  _assert_kept(before, directory)


def test_loss_that_becomes_nan_keeps_the_last_good_checkpoint(
    mnist_data_dir, tmp_path
):
  # With this learning rate, epoch 1 ends finite and epoch 2 diverges.
  config = _config(mnist_data_dir, learning_rate=3.0)
  directory = str(tmp_path / 'workdir')
  train.train_and_evaluate(config, directory)
  before = _snapshot(directory)
  result = _main(f'--workdir={directory}', *_flags(config), '--config.num_epochs=3')
  _assert_one_line_error(
      result, re.escape('error: loss became nan at step ') + '[5-8]' + re.escape(
          ' (epoch 2); the last good checkpoint (step 4, end of epoch 1) is '
          'kept; try a lower learning rate, e.g. --config.learning_rate=0.3'
      ),
  )
  _assert_kept(before, directory)
  assert os.listdir(os.path.join(directory, 'checkpoints')) == ['4']


def test_export_of_a_finished_workdir(workdir, mnist_test_images):
  config, directory, before = workdir
  result = _main(f'--workdir={directory}', *_flags(config), '--mode=export')
  assert result.returncode == 0, result.stderr[-3000:]
  _assert_kept(before, directory)
  # Version 1 is the export of the trained model itself, at the end of training.
  images = tf.constant(mnist_test_images[0])
  logits = [
      tf.saved_model.load(os.path.join(directory, 'export', 'mnist', version))
      .signatures['serving_default'](image=images)['logits'].numpy()
      for version in ('1', '2')
  ]
  np.testing.assert_array_equal(logits[1], logits[0])


def test_export_without_a_checkpoint(tmp_path):
  result = _main(f'--workdir={tmp_path}', '--config=configs/default.py', '--mode=export')
  _assert_one_line_error(
      result, re.escape(
          f'error: no checkpoint in {tmp_path / "checkpoints"}: train first, '
          'with the same --workdir and --config'
      ),
  )


# Resuming: a run killed in the middle of epoch 2 of 3, then rerun, ends with
# the same metrics as an uninterrupted one.


def _resume_config(data_dir):
  # 64 steps an epoch, 8 per dispatch, a progress line after each.
  return _config(
      data_dir, train_split='train[:2048]', batch_size=32, num_epochs=3,
      steps_per_call=8, progress_every_secs=0.01,
  )


@pytest.fixture(scope='module')
def uninterrupted(mnist_data_dir, tmp_path_factory):
  """The final summary of an uninterrupted run of `_resume_config`."""
  workdir = str(tmp_path_factory.mktemp('uninterrupted'))
  return train.train_and_evaluate(_resume_config(mnist_data_dir), workdir)


def _run_until_mid_epoch_2(workdir, config, sig) -> tuple[int, str]:
  """Starts a run, sends `sig` during epoch 2; its exit status and stderr."""
  process = subprocess.Popen(
      _command(f'--workdir={workdir}', *_flags(config)),
      stderr=subprocess.PIPE, text=True, cwd=ROOT,
  )
  lines = []
  for line in process.stderr:
    lines.append(line)
    progress = re.search(r'\((\d+)/192\)', line)
    if progress and 64 < int(progress.group(1)) < 128:
      process.send_signal(sig)
      break
  lines.extend(process.stderr)
  return process.wait(timeout=300), ''.join(lines)


def _summary_counts(workdir) -> collections.Counter:
  """How many times each (tag, epoch) of TAGS is in the event files."""
  counts = collections.Counter()
  for path in glob.glob(os.path.join(workdir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag in TAGS:
          counts[value.tag, event.step] += 1
  return counts


def _assert_resumes_to(workdir, config, expected) -> None:
  result = _main(f'--workdir={workdir}', *_flags(config))
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Resuming from the checkpoint (step ' in result.stderr
  scalars = summaries.read_scalars(workdir)
  assert {tag: scalars[tag][3][0] for tag in TAGS} == {
      tag: expected[tag] for tag in TAGS
  }
  assert _summary_counts(workdir) == {(t, e): 1 for t in TAGS for e in (1, 2, 3)}


def test_sigkill_in_the_middle_of_an_epoch_loses_only_that_epoch(
    mnist_data_dir, uninterrupted, tmp_path
):
  config, workdir = _resume_config(mnist_data_dir), str(tmp_path / 'workdir')
  status, _ = _run_until_mid_epoch_2(workdir, config, signal.SIGKILL)
  assert status == -signal.SIGKILL
  assert checkpoints.manager(workdir).all_steps() == [64]  # End of epoch 1.
  _assert_resumes_to(workdir, config, uninterrupted)


def test_sigterm_saves_where_it_is_and_exits_cleanly(
    mnist_data_dir, uninterrupted, tmp_path
):
  config, workdir = _resume_config(mnist_data_dir), str(tmp_path / 'workdir')
  status, stderr = _run_until_mid_epoch_2(workdir, config, signal.SIGTERM)
  assert status == 128 + signal.SIGTERM, stderr[-3000:]
  assert 'Traceback' not in stderr
  (step,) = [s for s in checkpoints.manager(workdir).all_steps() if s > 64]
  assert 64 < step < 128 and step % 8 == 0  # In epoch 2, between dispatches.
  assert (
      f'SIGTERM: stopped (step {step}, in epoch 2) with a checkpoint in '
      f'{os.path.join(workdir, "checkpoints")}: rerun the same command to resume'
  ) in stderr
  _assert_resumes_to(workdir, config, uninterrupted)
