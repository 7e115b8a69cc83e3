"""Tests of the command line: its errors, resuming after SIGKILL and SIGTERM, export.

The errors run `main.py`'s flag parsing and `main` in this process (what a
subprocess would add is the interpreter printing the one line, which one
test checks); the signals run real processes.
"""

import collections
import gc
import glob
import hashlib
import logging
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

from absl import flags
from configs import default
from run import checkpoints
from run import errors
from run import startup
import main
import numpy as np
import pytest
from run import stop_signals
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf
import tensorflow_datasets as tfds
from tools import plot
import train
from run import workdirs

# Not in the quick tier (pytest -m "not slow"): main.py itself, whole runs.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.abspath(__file__))
TAGS = ('train_loss', 'train_accuracy', 'test_loss', 'test_accuracy')


def _command(*args: str) -> list[str]:
  return [sys.executable, os.path.join(ROOT, 'main.py'), *args]


def _main(*args: str) -> subprocess.CompletedProcess:
  """main.py in a process of its own."""
  return subprocess.run(
      _command(*args), capture_output=True, text=True, cwd=ROOT, timeout=300
  )


@pytest.fixture
def run_main(monkeypatch):
  """Runs main.py's flag parsing and `main` in this process.

  Returns what the process would exit with: 0, the status absl exits with,
  or the one-line message that `sys.exit` prints before exiting with 1.
  The flags that config_flags registers for the overrides, the flag values,
  the signal handlers and the unraisable hook are put back after each run,
  and the objects that `main` froze for the garbage collector unfrozen.
  """
  monkeypatch.chdir(ROOT)
  monkeypatch.setattr(signal, 'signal', lambda signum, handler: None)
  monkeypatch.setattr(signal, 'set_wakeup_fd', lambda fd, **kwargs: -1)
  monkeypatch.setattr(sys, 'unraisablehook', sys.unraisablehook)

  def run(*args: str) -> int | str:
    argv = ['main.py', *args]
    monkeypatch.setattr(sys, 'argv', argv)  # config_flags reads it.
    stop_signals.install.cache_clear()  # A StopSignals of this run's own.
    try:
      main.main(startup.parse_flags(argv))
      return 0
    except SystemExit as e:
      return e.code
    finally:
      gc.unfreeze()
      flags.FLAGS.unparse_flags()
      for name in [n for n in flags.FLAGS if n.startswith('config.')]:
        delattr(flags.FLAGS, name)

  return run


def _flags(config) -> list[str]:
  """The command line of `config`, from the default config file."""
  changed = {
      k: v for k, v in config.to_dict().items() if v != default.get_config()[k]
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
          os.path.getsize(path),
          os.stat(path).st_mtime_ns,
          digest,
      )
  return files


def _assert_one_line_error(status, message: str) -> None:
  """The exit of a one-line error: `message` (a regex), and status 1.

  `status` is `run_main`'s (the message `sys.exit` prints before exiting
  with 1), or a process's.
  """
  if isinstance(status, subprocess.CompletedProcess):
    assert status.returncode == 1, status.stderr[-3000:]
    assert 'Traceback' not in status.stderr
    status = status.stderr.strip().splitlines()[-1]
  assert isinstance(status, str) and '\n' not in status, status
  assert re.fullmatch(message, status), status


def _assert_kept(before: dict, workdir) -> None:
  """No file of `before` was removed or changed in `workdir`."""
  after = _snapshot(workdir)
  assert {k: after.get(k) for k in before} == before


@pytest.fixture(scope='module')
def trained(small_config, tmp_path_factory):
  """A workdir after one epoch of 4 steps: summaries, checkpoint, export."""
  workdir = str(tmp_path_factory.mktemp('trained') / 'workdir')
  config = small_config(train_split='train[:256]')
  summary = train.train_and_evaluate(config, workdir)
  return config, workdir, summary


@pytest.fixture
def workdir(trained, tmp_path):
  """A copy of the trained workdir and its snapshot, to check it is kept."""
  config, original, _ = trained
  copy = str(tmp_path / 'workdir')
  shutil.copytree(original, copy)
  return config, copy, _snapshot(copy)


def test_tensorflow_is_imported_only_when_a_run_needs_it():
  """Not with the app's modules: it takes seconds, and a mistake needs none.

  A run imports it for its summaries and export, once its config and
  workdir are checked (`startup.hide_gpus`).
  """
  script = 'import sys, main; print("tensorflow" in sys.modules)'
  result = subprocess.run(
      [sys.executable, '-c', script],
      capture_output=True,
      text=True,
      cwd=ROOT,
      check=True,
  )
  assert result.stdout == 'False\n'


def test_the_garbage_collector_is_on_for_the_run(
    run_main, monkeypatch, tmp_path
):
  """main.py turns it off for its imports; `main` turns it back on."""
  enabled = []
  monkeypatch.setattr(
      train,
      'train_and_evaluate',
      lambda *args: enabled.append(gc.isenabled()),
  )
  gc.disable()
  try:
    assert run_main(f'--workdir={tmp_path}', '--config=configs/fast.py') == 0
  finally:
    gc.enable()
  assert enabled == [True]


def test_workdir_is_required(run_main, capsys):
  assert run_main('--config=configs/default.py') == 1
  assert 'Flag --workdir must have a value other than None' in (
      capsys.readouterr().err
  )


def test_config_is_required(run_main, capsys, tmp_path):
  assert run_main(f'--workdir={tmp_path}') == 1
  assert 'Flag --config must have a value other than None' in (
      capsys.readouterr().err
  )


def test_unknown_config_field_is_rejected(run_main, tmp_path):
  status = run_main(
      f'--workdir={tmp_path}',
      '--config=configs/default.py',
      '--config.learning_rat=0.05',
  )
  _assert_one_line_error(
      status,
      "error: the config has no field 'learning_rat'; did you mean "
      '"learning_rate" instead of "learning_rat"\\?',
  )
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    'field, value, allowed',
    [
        ('learning_rate', '-0.1', 'a number > 0'),
        ('batch_size', '0', 'an integer > 0'),
        ('num_epochs', '0', 'an integer > 0'),
        ('dataset', 'mnits', "one of 'mnist', 'fashion_mnist'"),
        ('lr_schedule', 'cosine', "one of 'constant', 'one_cycle'"),
        (
            'train_split',
            'trian[:10%]',
            "a TFDS split of 'train' and 'test', like 'train[:10%]' or "
            "'train[:50%]+test' (TFDS: Unknown split 'trian'. Should be one "
            "of ['train', 'test'].)",
        ),
    ],
)
def test_bad_values_are_named_with_what_is_allowed(
    run_main, workdir, field, value, allowed
):
  config, directory, before = workdir
  status = run_main(
      f'--workdir={directory}', *_flags(config), f'--config.{field}={value}'
  )
  shown = (
      repr(value)
      if field in ('dataset', 'lr_schedule', 'train_split')
      else value
  )
  _assert_one_line_error(
      status,
      re.escape(f'error: config.{field}={shown} is not allowed: use {allowed}'),
  )
  _assert_kept(before, directory)
  assert len(_snapshot(directory)) == len(before)


# What each config file holds, and the line that says what is wrong with it,
# as ml_collections' config_flags finds it.
BAD_CONFIG_FILES = {
    'missing.py': (
        None,
        r"\[Errno 2\] No such file or directory: '.*missing.py'",
    ),
    'syntax.py': ('def get_config(:\n', r'not valid Python: .* \(line 1\)'),
    'nothing.py': (
        'VALUE = 1\n',
        "AttributeError: module 'config_config' has no attribute 'get_config'",
    ),
    'raises.py': (
        'def get_config():\n  return {}["learning_rat"]\n',
        "KeyError: 'learning_rat'",
    ),
    'default.py:fast': (
        None,
        r'TypeError: get_config\(\) takes 0 positional arguments but 1 was given',
    ),
}


@pytest.mark.parametrize('name', BAD_CONFIG_FILES)
def test_a_bad_config_file_is_one_line_before_anything_is_written(
    name, tmp_path
):
  source, cause = BAD_CONFIG_FILES[name]
  path = os.path.join(ROOT, 'configs', name)
  if source is not None:
    path = str(tmp_path / name)
    with open(path, 'w') as f:
      f.write(source)
  workdir = tmp_path / 'workdir'
  result = _main(f'--workdir={workdir}', f'--config={path}')
  errors = result.stderr.splitlines()
  assert result.returncode == 1
  assert len(errors) == 1, errors
  assert re.fullmatch(f'error: --config={re.escape(path)}: {cause}', errors[0])
  assert not workdir.exists()


def test_a_bad_config_file_has_its_traceback_with_verbosity_1(tmp_path):
  path = tmp_path / 'raises.py'
  path.write_text(BAD_CONFIG_FILES['raises.py'][0])
  result = _main(f'--workdir={tmp_path}/w', f'--config={path}', '-v', '1')
  assert result.returncode == 1
  assert 'Traceback' in result.stderr
  assert result.stderr.strip().endswith("KeyError: 'learning_rat'")


def test_a_real_process_prints_the_one_line_and_exits_1(workdir):
  config, directory, before = workdir
  result = _main(
      f'--workdir={directory}', *_flags(config), '--config.batch_size=0'
  )
  _assert_one_line_error(
      result,
      re.escape(
          'error: config.batch_size=0 is not allowed: use an integer > 0'
      ),
  )
  _assert_kept(before, directory)


def test_traceback_with_verbosity_1(run_main, workdir):
  config, directory, before = workdir
  with pytest.raises(
      errors.UserError,
      match='^config.batch_size=0 is not allowed',
  ):
    run_main(
        f'--workdir={directory}',
        *_flags(config),
        '--config.batch_size=0',
        '--verbosity=1',
    )
  _assert_kept(before, directory)


def test_batch_size_larger_than_the_data(run_main, small_config, tmp_path):
  (tmp_path / 'notes.txt').write_text('kept')
  before = _snapshot(tmp_path)
  config = small_config(train_split='train[:256]', batch_size=300)
  status = run_main(f'--workdir={tmp_path}', *_flags(config))
  _assert_one_line_error(
      status,
      re.escape(
          'error: config.batch_size=300 is larger than the 256 examples of '
          "config.train_split='train[:256]': use at most 256"
      ),
  )
  assert _snapshot(tmp_path) == before


def test_workdir_that_cannot_be_created(run_main, tmp_path):
  (tmp_path / 'file').write_text('kept')
  status = run_main(
      f'--workdir={tmp_path / "file" / "w"}', '--config=configs/default.py'
  )
  _assert_one_line_error(
      status,
      re.escape(
          f'error: cannot create or write the workdir {tmp_path / "file" / "w"} '
          f'({tmp_path / "file" / "w"}: Not a directory): choose a --workdir '
          'that can be created and written'
      ),
  )
  assert (tmp_path / 'file').read_text() == 'kept'


def test_checkpoint_of_another_config(run_main, workdir):
  config, directory, before = workdir
  status = run_main(
      f'--workdir={directory}',
      *_flags(config),
      '--config.learning_rate=0.05',
      '--config.seed=1',
      '--config.num_epochs=2',
  )
  checkpoints_dir = os.path.join(directory, 'checkpoints')
  _assert_one_line_error(
      status,
      re.escape(
          f'error: {checkpoints_dir} holds a checkpoint (step 4, end of epoch 1) '
          'of another config: learning_rate 0.1 -> 0.05; seed 0 -> 1; to start '
          f'afresh, use a new --workdir or move {checkpoints_dir} away'
      ),
  )
  _assert_kept(before, directory)


def test_a_one_cycle_run_keeps_its_epochs_on_resume(
    run_main, small_config, tmp_path
):
  """The cycle spans every epoch: another num_epochs is refused, unwritten."""
  config = small_config(train_split='train[:256]', lr_schedule='one_cycle')
  directory = str(tmp_path / 'workdir')
  train.train_and_evaluate(config, directory)
  before = _snapshot(directory)
  status = run_main(
      f'--workdir={directory}', *_flags(config), '--config.num_epochs=2'
  )
  checkpoints_dir = os.path.join(directory, 'checkpoints')
  _assert_one_line_error(
      status,
      re.escape(
          f'error: {checkpoints_dir} holds a checkpoint (step 4, end of epoch 1) '
          "of another config: num_epochs 1 -> 2 (lr_schedule='one_cycle' spans "
          'every epoch); to start afresh, use a new --workdir or move '
          f'{checkpoints_dir} away'
      ),
  )
  _assert_kept(before, directory)


def test_flax_s_own_layers_train_as_the_levers_do_step_for_step(
    run_main, small_config, tmp_path
):
  """The levers off: the layers every GPU and TPU user trains, here one step
  a dispatch; in float32 with dropout's own bits, the same losses as the
  levers' (a step an epoch, so that each epoch's train_loss is one step's)."""
  config = small_config(
      train_split='train[:64]',
      test_split='test[:64]',
      num_epochs=4,
      matmul_precision='float32',
      narrow_dropout_bits=False,
  )
  losses = []
  for levers in (True, False):
    directory = str(tmp_path / f'levers_{levers}')
    flags_ = [*_flags(config), f'--config.cpu_levers={levers}']
    assert run_main(f'--workdir={directory}', *flags_) == 0
    losses.append(plot.read_scalars(directory)['train_loss'])
  assert sorted(losses[1]) == [1, 2, 3, 4]
  np.testing.assert_allclose(
      [losses[1][e] for e in range(1, 5)],
      [losses[0][e] for e in range(1, 5)],
      rtol=2e-4,
  )


def test_missing_data_is_one_line_error(run_main, workdir, tmp_path):
  config, directory, before = workdir
  status = run_main(
      f'--workdir={directory}',
      *_flags(config),
      f'--config.data_dir={tmp_path / "tfds"}',
      f'--config.manual_dir={tmp_path / "empty"}',
  )
  _assert_one_line_error(
      status,
      re.escape(f'error: {tmp_path / "empty"}: missing t10k-images') + '.*',
  )
  _assert_kept(before, directory)


def test_offline_without_data_is_one_line_at_once(tmp_path):
  """No files and no server: one line, in seconds, not minutes of retries.

  In a real process, as a user's: no manual directory in the environment,
  and a download address where nothing listens, as offline.
  """
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  env = {
      k: v
      for k, v in os.environ.items()
      if k
      not in (
          'MNIST_MANUAL_DIR',
          'TF_CPP_MIN_LOG_LEVEL',
          'TF_ENABLE_ONEDNN_OPTS',
      )
  }
  start = time.monotonic()
  result = subprocess.run(
      _command(
          f'--workdir={tmp_path / "workdir"}',
          '--config=configs/default.py',
          f'--config.data_dir={tmp_path / "tfds"}',
          f'--config.download_url=http://127.0.0.1:{port}/',
      ),
      capture_output=True,
      text=True,
      cwd=ROOT,
      env=env,
      timeout=300,
  )
  _assert_one_line_error(
      result,
      re.escape(
          f'error: cannot download http://127.0.0.1:{port}/t10k-images-idx3-'
          'ubyte.gz ([Errno 111] Connection refused); offline, put the four '
          'original files ('
      )
      + '.*',
  )
  # Start-up (imports) takes most of it.
  assert time.monotonic() - start < 60
  # Nor TensorFlow's start-up lines, on CPUs where it turns oneDNN on.
  assert 'oneDNN' not in result.stderr
  assert 'absl::InitializeLog' not in result.stderr
  # Nor TFDS' warning that it found no prepared data set.
  assert 'dataset_info.json' not in result.stderr
  assert not os.listdir(tmp_path / 'tfds' / 'downloads' / 'mnist')


@pytest.mark.parametrize('damage', ['truncated', 'one byte changed'])
def test_corrupt_data_file(
    run_main, workdir, copy_of_mnist_files, tmp_path, damage
):
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
  status = run_main(
      f'--workdir={directory}',
      *_flags(config),
      f'--config.data_dir={tmp_path / "tfds"}',
      f'--config.manual_dir={copy_of_mnist_files}',
  )
  _assert_one_line_error(
      status,
      re.escape(
          f'error: {copy_of_mnist_files}: train-images-idx3-ubyte.gz does not '
          'match the size and SHA-256 that TFDS registers for mnist: the file '
          'is corrupt, truncated or recompressed; replace it with the original, '
          "or read the files with data_source='idx', which checks their "
          'contents instead'
      ),
  )
  _assert_kept(before, directory)


def test_loss_that_becomes_nan_keeps_the_last_good_checkpoint(
    run_main, small_config, tmp_path
):
  # With this learning rate, epoch 1 ends finite and epoch 2 diverges (to
  # a NaN or an infinity): in float32 with dropout's own bits, the same math
  # on every CPU (bf16 matmuls or narrow dropout bits move where it diverges).
  config = small_config(
      train_split='train[:256]',
      learning_rate=3.0,
      matmul_precision='float32',
      narrow_dropout_bits=False,
  )
  directory = str(tmp_path / 'workdir')
  train.train_and_evaluate(config, directory)
  before = _snapshot(directory)
  status = run_main(
      f'--workdir={directory}', *_flags(config), '--config.num_epochs=3'
  )
  _assert_one_line_error(
      status,
      'error: loss became (nan|inf) at step [5-8]'
      + re.escape(
          ' (epoch 2); the last good checkpoint (step 4, end of epoch 1) is '
          'kept; try a lower learning rate, e.g. --config.learning_rate=0.3'
      ),
  )
  _assert_kept(before, directory)
  assert os.listdir(os.path.join(directory, 'checkpoints')) == ['4']


def test_the_same_command_on_a_finished_workdir_exports_again(
    run_main, workdir, mnist_test_images
):
  config, directory, before = workdir
  assert run_main(f'--workdir={directory}', *_flags(config)) == 0
  _assert_kept(before, directory)
  # Version 1 is the export of the trained model itself, at the end of training.
  images = tf.constant(mnist_test_images[0])
  logits = [
      tf.saved_model.load(os.path.join(directory, 'export', 'mnist', version))
      .signatures['serving_default'](image=images)['logits']
      .numpy()
      for version in ('1', '2')
  ]
  np.testing.assert_array_equal(logits[1], logits[0])


# Resuming: a run killed in the middle of epoch 2 of 3, then rerun, ends with
# the same metrics as an uninterrupted one.


@pytest.fixture(scope='module')
def resume_config(small_config):
  """64 steps an epoch, 8 per dispatch, a progress line after each."""
  return small_config(
      train_split='train[:2048]',
      batch_size=32,
      num_epochs=3,
      steps_per_call=8,
      progress_every_secs=0.01,
  )


@pytest.fixture(scope='module')
def uninterrupted(resume_config, tmp_path_factory):
  """The final summary of an uninterrupted run of `resume_config`."""
  workdir = str(tmp_path_factory.mktemp('uninterrupted'))
  return train.train_and_evaluate(resume_config, workdir)


def _start(workdir, config) -> subprocess.Popen:
  """main.py on `config` in a process of its own, its stderr a text pipe."""
  return subprocess.Popen(
      _command(f'--workdir={workdir}', *_flags(config)),
      stderr=subprocess.PIPE,
      text=True,
      cwd=ROOT,
  )


def _read_until(process, reached) -> list[str]:
  """The lines of `process`'s stderr up to the first one that `reached`."""
  lines = []
  for line in process.stderr:
    lines.append(line)
    if reached(line):
      break
  return lines


def _in_epoch(epoch: int):
  """Whether a progress line of `resume_config` is in the middle of `epoch`."""

  def reached(line: str) -> bool:
    progress = re.search(r'\((\d+)/192\)', line)
    return (
        bool(progress)
        and 64 * (epoch - 1) < int(progress.group(1)) < 64 * epoch
    )

  return reached


_in_epoch_2 = _in_epoch(2)


def _epoch_1_saved(line: str) -> bool:
  return 'Saved a checkpoint (step 64, end of epoch 1)' in line


def _resuming_from(step: int):
  return lambda line: f'Resuming from the checkpoint (step {step}, ' in line


def _run_until(workdir, config, reached, *signals) -> tuple[int, str]:
  """Starts a run, sends `signals` once a line `reached`; exit status, stderr.

  Signals after the first follow 50 ms apart: two presses, not one signal
  delivered once.
  """
  process = _start(workdir, config)
  lines = _read_until(process, reached)
  for i, sig in enumerate(signals):
    if i:
      time.sleep(0.05)
    process.send_signal(sig)
  lines.extend(process.stderr)
  return process.wait(timeout=300), ''.join(lines)


def _summary_counts(workdir) -> collections.Counter:
  """How many times each (tag, epoch) of TAGS is in the event files."""
  events = event_accumulator.EventAccumulator(
      workdir, {event_accumulator.TENSORS: 0}  # All of them.
  ).Reload()
  return collections.Counter(
      (tag, e.step) for tag in TAGS for e in events.Tensors(tag)
  )


def _assert_resumes_to(run_main, caplog, workdir, config, expected) -> None:
  """The last rerun, in this process (the processes before tested the start
  of one), ends with the metrics and summaries of `expected`'s run."""
  caplog.set_level(logging.INFO)
  status = run_main(f'--workdir={workdir}', *_flags(config), '--verbosity=0')
  assert status == 0
  assert 'Resuming from the checkpoint (step ' in caplog.text
  assert 'Saved a checkpoint (step 192, end of epoch 3) in ' in caplog.text
  scalars = plot.read_scalars(workdir)
  assert {tag: scalars[tag][3] for tag in TAGS} == {
      tag: expected[tag] for tag in TAGS
  }
  assert _summary_counts(workdir) == {
      (t, e): 1 for t in TAGS for e in (1, 2, 3)
  }


def _assert_stopped(status: int, stderr: str, sig, workdir, epoch: int) -> int:
  """A clean stop by `sig` in `epoch`, with a checkpoint: its step."""
  assert status == 128 + sig, stderr[-3000:]
  assert 'Traceback' not in stderr
  checkpoints_dir = os.path.join(workdir, 'checkpoints')
  (step,) = [
      s
      for s in checkpoints.manager(workdir).all_steps()
      if s > 64 * (epoch - 1)
  ]
  # In the epoch, between dispatches.
  assert 64 * (epoch - 1) < step < 64 * epoch and step % 8 == 0
  assert (
      stderr.strip()
      .splitlines()[-1]
      .endswith(
          f'{sig.name}: stopped (step {step}, in epoch {epoch}) with a '
          f'checkpoint in {checkpoints_dir}: rerun the same command to resume'
      )
  )
  return step


def test_a_run_stopped_every_way_resumes_to_the_uninterrupted_metrics(
    run_main, caplog, resume_config, uninterrupted, tmp_path
):
  """One workdir, its runs stopped one after another, each another way.

  SIGKILL in the middle of an epoch loses only that epoch, and a second run
  on the workdir in use refuses; a second Ctrl-C exits at once, without a
  checkpoint; SIGTERM (exit 143, as a preempted job) and Ctrl-C (SIGINT,
  130) save where they are and exit cleanly. Each rerun resumes; the last
  ends with the metrics of an uninterrupted run. (One chain of runs, for the
  time each process takes to start.)
  """
  config, workdir = resume_config, str(tmp_path / 'workdir')
  lock = os.path.join(workdir, workdirs.LOCK_FILE)

  def refused_then_killed(process):
    """A second run refuses while `process` holds the workdir; then SIGKILL."""
    process.send_signal(signal.SIGSTOP)  # Still in epoch 2 while we check.
    status = run_main(f'--workdir={workdir}', *_flags(config))
    _assert_one_line_error(
        status,
        re.escape(
            f'error: the workdir {workdir} is in use by another run (The file '
            f"lock '{lock}' could not be acquired.): wait for it to end, or "
            'use another --workdir'
        ),
    )
    process.send_signal(signal.SIGKILL)

  process = _start(workdir, config)
  try:
    _read_until(process, _in_epoch_2)
    refused_then_killed(process)
  finally:
    process.kill()
    process.stderr.read()
  assert process.wait(timeout=300) == -signal.SIGKILL
  assert checkpoints.manager(workdir).all_steps() == [64]  # End of epoch 1.
  # The system released the killed run's lock: the next run takes it.
  with workdirs.exclusive(workdir):
    pass

  # Ctrl-C twice in epoch 2, resumed from epoch 1's end: out at once.
  status, stderr = _run_until(
      workdir, config, _in_epoch_2, signal.SIGINT, signal.SIGINT
  )
  assert status == 128 + signal.SIGINT, stderr[-3000:]
  assert 'Resuming from the checkpoint (step 64, end of epoch 1)' in stderr
  assert 'SIGINT again: exiting now, without a checkpoint.' in stderr
  assert 'stopped (step' not in stderr
  # What was written before is kept: the checkpoint of epoch 1.
  assert checkpoints.manager(workdir).all_steps() == [64]

  # SIGTERM in epoch 2, then Ctrl-C in epoch 3: each saves where it is.
  status, stderr = _run_until(workdir, config, _in_epoch_2, signal.SIGTERM)
  step = _assert_stopped(status, stderr, signal.SIGTERM, workdir, 2)
  # The run's own line for each checkpoint; orbax's are left out.
  assert 'checkpoint_manager.py' not in stderr
  status, stderr = _run_until(workdir, config, _in_epoch(3), signal.SIGINT)
  assert f'Resuming from the checkpoint (step {step}, in epoch 2)' in stderr
  _assert_stopped(status, stderr, signal.SIGINT, workdir, 3)
  _assert_resumes_to(run_main, caplog, workdir, config, uninterrupted)


def test_a_stop_during_data_preparation_is_prompt(mnist_files, tmp_path):
  """SIGTERM while TFDS prepares MNIST: exit 143 at once, nothing prepared."""
  workdir, data_dir = tmp_path / 'workdir', tmp_path / 'tfds'
  process = subprocess.Popen(
      _command(
          f'--workdir={workdir}',
          '--config=configs/default.py',
          f'--config.data_dir={data_dir}',
          f'--config.manual_dir={mnist_files}',
      ),
      stderr=subprocess.PIPE,
      text=True,
      cwd=ROOT,
  )
  lines = _read_until(process, lambda line: 'Generating dataset mnist' in line)
  time.sleep(0.5)
  process.send_signal(signal.SIGTERM)
  sent = time.monotonic()
  lines.extend(process.stderr)
  assert process.wait(timeout=60) == 128 + signal.SIGTERM
  assert time.monotonic() - sent < stop_signals.GRACE_SECS + 1
  stderr = ''.join(lines)
  assert 'Traceback' not in stderr
  assert (
      len(
          re.findall(
              'SIGTERM: stopped before training began, with nothing to save; '
              'rerun the same command to continue$',
              stderr,
              re.M,
          )
      )
      == 1
  )
  # Nothing that a later run would take for MNIST prepared (TFDS' own
  # incomplete.* directory aside, which TFDS ignores), and the lock released.
  # Its file is removed unless the grace period ended the process (a signal
  # that landed in a finalizer, as TFDS' preparation runs many).
  assert not tfds.builder('mnist', data_dir=str(data_dir)).is_prepared()
  left = [p.name for p in (data_dir / 'mnist').glob('*')]
  assert all(name.startswith('incomplete.') for name in left), left
  assert set(os.listdir(workdir)) <= {workdirs.LOCK_FILE}
  with workdirs.exclusive(str(workdir)):
    pass


# A damaged checkpoint costs that checkpoint, not the run.


@pytest.fixture(scope='module')
def two_epochs(small_config, tmp_path_factory):
  """A workdir with the checkpoints of steps 4 and 8, and the final summary
  of a run of 3 epochs."""
  config = small_config(train_split='train[:256]', num_epochs=2)
  workdir = str(tmp_path_factory.mktemp('two_epochs') / 'workdir')
  train.train_and_evaluate(config, workdir)
  config.num_epochs = 3
  three = train.train_and_evaluate(
      config, str(tmp_path_factory.mktemp('three_epochs'))
  )
  return config, workdir, three


def _damage(workdir, step: int, how: str) -> None:
  """Truncates or deletes the largest file of the checkpoint of `step`."""
  files = glob.glob(
      os.path.join(workdir, 'checkpoints', str(step), '**', '*'),
      recursive=True,
  )
  largest = max((f for f in files if os.path.isfile(f)), key=os.path.getsize)
  if how == 'truncate':
    os.truncate(largest, os.path.getsize(largest) // 2)
  else:
    os.remove(largest)


# Orbax leaves the reads of a damaged checkpoint as coroutines never awaited;
# collected here, the warnings they raise are about this test, and expected.
UNAWAITED_READS = pytest.mark.filterwarnings(
    'ignore::pytest.PytestUnraisableExceptionWarning'
)


@UNAWAITED_READS
@pytest.mark.parametrize('how', ['truncate', 'delete'])
def test_a_damaged_latest_checkpoint_costs_only_it(
    run_main, two_epochs, tmp_path, caplog, how
):
  caplog.set_level(logging.INFO)
  config, original, three = two_epochs
  workdir = str(tmp_path / 'workdir')
  shutil.copytree(original, workdir)
  _damage(workdir, 8, how)
  status = run_main(f'--workdir={workdir}', *_flags(config), '--verbosity=0')
  assert status == 0
  directory = os.path.join(workdir, 'checkpoints')
  warnings = [
      r.getMessage() for r in caplog.records if r.levelname == 'WARNING'
  ]
  assert warnings[0].startswith(
      f'The checkpoint of step 8 in {directory} cannot be restored ('
  )
  (moved,) = glob.glob(os.path.join(workdir, 'damaged_checkpoints', '8-*'))
  assert warnings[0].endswith(f'): moved to {moved}.')
  assert (
      f'Resuming from the checkpoint (step 4, end of epoch 1) in {directory}.'
  ) in caplog.text
  assert checkpoints.manager(workdir).all_steps() == [4, 8, 12]
  scalars = plot.read_scalars(workdir)
  assert {tag: scalars[tag][3] for tag in TAGS} == {
      tag: three[tag] for tag in TAGS
  }
  gc.collect()


@UNAWAITED_READS
def test_no_checkpoint_that_restores_is_one_line(
    run_main, two_epochs, tmp_path
):
  config, original, _ = two_epochs
  workdir = str(tmp_path / 'workdir')
  shutil.copytree(original, workdir)
  for step in (4, 8):
    _damage(workdir, step, 'truncate')
  before = _snapshot(workdir)
  status = run_main(f'--workdir={workdir}', *_flags(config))
  directory = os.path.join(workdir, 'checkpoints')
  _assert_one_line_error(
      status,
      re.escape(
          f'error: no checkpoint in {directory} can be restored (the newest, '
          'of step 8: '
      )
      + '.+'
      + re.escape(
          f'); to start afresh, use a new --workdir or move {directory} away'
      ),
  )
  assert _snapshot(workdir) == before
  gc.collect()


# A write that fails mid-run.


def _write_fails(process, after, limit: int) -> list[str]:
  """The stderr of `process` once a line `after`, with files cut at `limit`.

  Asserts that it exits 1, without a traceback.
  """
  _read_until(process, after)
  resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (limit, limit))
  stderr = process.stderr.read()
  assert process.wait(timeout=300) == 1, stderr[-3000:]
  assert 'Traceback' not in stderr
  # TensorFlow's C++ threads may still log after the line: find it.
  return [l for l in stderr.splitlines() if l.startswith('error: ')]


def test_writes_that_fail_mid_run_keep_the_last_checkpoint(
    run_main, caplog, resume_config, uninterrupted, tmp_path
):
  """A full disk, which root meets too: a file size limit set from outside.

  Checkpoints hold files of about 3 MB, the event file grows past 100 kB in
  epoch 1: a limit of 1 kB set after epoch 1 stops its summaries of epoch 2;
  on the rerun, one of 1 MB stops the checkpoint of epoch 2, written after
  its summaries. The last rerun resumes to the uninterrupted run's metrics.
  (One chain of runs, for the time each process takes to start.)
  """
  config, workdir = resume_config, str(tmp_path / 'workdir')
  directory = os.path.join(workdir, 'checkpoints')
  errors = _write_fails(_start(workdir, config), _epoch_1_saved, 1 << 10)
  (events,) = glob.glob(os.path.join(workdir, 'events.out.tfevents.*'))
  assert errors == [
      f'error: cannot write the summaries ({events}; File too large): '
      'free space or make the workdir writable, then rerun the same '
      'command to resume'
  ]
  assert checkpoints.manager(workdir).all_steps() == [64]
  errors = _write_fails(_start(workdir, config), _resuming_from(64), 1 << 20)
  assert errors == [
      f'error: cannot write the checkpoint (step 128, end of epoch 2) in '
      f'{directory} (File too large); the checkpoint of step 64 is kept: '
      'free space or make it writable, then rerun the same command to '
      'resume'
  ]
  assert checkpoints.manager(workdir).all_steps() == [64]
  _assert_resumes_to(run_main, caplog, workdir, config, uninterrupted)


# A model changed as users change the example's: layers the CPU levers do
# not cover (VALID padding, an even kernel, stride 2, a dilation), which
# compute as stock Flax computes them.
CHANGED_MODEL = """
import functools
from flax import nnx
from serving.signatures import NUM_CLASSES


class CNN(nnx.Module):

  def __init__(self, rngs, *, dropout_rate=0.025, layers=nnx):
    self.conv1 = layers.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
    self.batch_norm1 = nnx.BatchNorm(32, rngs=rngs)
    self.dropout1 = layers.Dropout(rate=dropout_rate, rngs=rngs)
    self.conv2 = layers.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
    self.batch_norm2 = nnx.BatchNorm(64, rngs=rngs)
    self.conv3 = layers.Conv(64, 64, kernel_size=(2, 2), padding='VALID', rngs=rngs)
    self.conv4 = layers.Conv(64, 32, kernel_size=(3, 3), strides=2, rngs=rngs)
    self.conv5 = layers.Conv(32, 32, kernel_size=(3, 3), kernel_dilation=2, rngs=rngs)
    self.avg_pool = functools.partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
    self.linear1 = layers.Linear(288, 256, rngs=rngs)
    self.dropout2 = layers.Dropout(rate=dropout_rate, rngs=rngs)
    self.linear2 = layers.Linear(256, NUM_CLASSES, rngs=rngs)

  def __call__(self, x, rngs=None):
    x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs))))
    x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
    x = nnx.relu(self.conv5(nnx.relu(self.conv4(nnx.relu(self.conv3(x))))))
    x = x.reshape(x.shape[0], -1)  # 3x3x32
    x = nnx.relu(self.dropout2(self.linear1(x), rngs=rngs))
    return self.linear2(x)
"""


def test_a_changed_model_trains_through_the_default_command(
    mnist_data_dir, tmp_path, monkeypatch
):
  """And its compiled steps are kept in the --compilation_cache_dir named.

  (One process for both: the changed model compiles afresh anyway.)
  """
  # The tests' own cache, and its threshold: main.py sets its own.
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR')
  monkeypatch.delenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS')
  cache = tmp_path / 'cache'
  checkout = tmp_path / 'checkout'
  shutil.copytree(
      ROOT,
      checkout,
      ignore=shutil.ignore_patterns('.*', '__pycache__', '*.ipynb', 'docs'),
  )
  (checkout / 'models.py').write_text(CHANGED_MODEL)
  workdir = tmp_path / 'workdir'
  result = subprocess.run(
      [
          sys.executable,
          'main.py',
          f'--workdir={workdir}',
          f'--compilation_cache_dir={cache}',
          '--config=configs/default.py',
          f'--config.data_dir={mnist_data_dir}',
          '--config.train_split=train[:1024]',
          '--config.test_split=test[:256]',
          '--config.num_epochs=1',
      ],
      capture_output=True,
      text=True,
      cwd=checkout,
      timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r'epoch:  1, train_loss: \d', result.stderr)
  assert os.path.isfile(workdir / 'export' / 'mnist' / '1' / 'saved_model.pb')
  kept = {name.split('-')[0] for name in os.listdir(cache)}
  # The training and evaluation steps, and the small computations too (the
  # model's initialisers compile in well under JAX's default 1 s).
  assert {'jit_train_steps', 'jit_eval_steps'} <= kept
  assert 'jit__truncated_normal' in kept
