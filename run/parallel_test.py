"""Data parallelism on forced CPU devices, and over two real processes."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

from run import config_checks
from configs import default
import input_pipeline
import jax
import numpy as np
from run import parallel
import pytest
import train

# Not in the quick tier (pytest -m "not slow"): whole runs, several devices.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_run(config, workdir) -> dict:
  """Checks and trains `config` on every device; its summary and sharding.

  The summary, what the first batches' sharding is, and the number of test
  examples evaluation scored.
  """
  config_checks.validate(config, jax.device_count())  # As main.py does.
  summary = train.train_and_evaluate(config, workdir)
  mesh = parallel.create_mesh()
  train_data, test_data = input_pipeline.load(config)
  order = input_pipeline.epoch_order(0, 1, 1024, 64)[:3]
  batch = parallel.global_batches(
      mesh, {k: v[order] for k, v in train_data.items()}
  )
  model, metrics = train.create_model(config), train.create_metrics()
  test = parallel.global_batches(
      mesh, input_pipeline.eval_batches(test_data, config.eval_batch_size)
  )
  _, predicted = train.evaluate(model, metrics, test)
  return {
      'summary': summary,
      'devices': len(batch['image'].sharding.device_set),
      'shard_shape': list(batch['image'].addressable_shards[0].data.shape),
      'test_batch_shape': list(test['image'].shape),
      'eval_count': len(predicted),
  }


def dropout_masks() -> tuple[int, float]:
  """The default config's dropout masks of a batch split over the devices,
  and of the batch whole: how many outputs differ, and the rate dropped."""
  # pylint: disable=g-import-not-at-top
  from cpu import layers
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec

  config = default.get_config()
  whole = np.ones((64, 28, 28, 32), np.float32)
  split = NamedSharding(parallel.create_mesh(), PartitionSpec(parallel.AXIS))
  outputs = []
  for batch in (whole, jax.device_put(whole, split)):
    model = train.create_model(config, layers.for_config(config, 'cpu'))
    model.train()
    outputs.append(
        np.asarray(nnx.jit(lambda m, b: m.dropout1(b))(model, batch))
    )
  return int((outputs[0] != outputs[1]).sum()), float((outputs[0] == 0).mean())


# What the tests of four devices check, in one process of 4 forced CPU
# devices (each process takes seconds to start): the error of a batch that
# does not divide over them, the dropout masks, and `small_run`. argv: the
# config as JSON, workdir.
FOUR_DEVICES = """
import json, sys
import jax, ml_collections
from run import config_checks, errors, parallel_test
config = ml_collections.ConfigDict(json.loads(sys.argv[1]))
odd = ml_collections.ConfigDict(json.loads(sys.argv[1]))
odd.batch_size = 30
try:
  config_checks.validate(odd, jax.device_count())
  odd_batch = None
except errors.UserError as e:
  odd_batch = str(e)
print(json.dumps({
    'odd_batch': odd_batch,
    'dropout_masks': parallel_test.dropout_masks(),
    **parallel_test.small_run(config, sys.argv[2]),
}))
"""


def _run(script, *args, devices=1, extra_env=None):
  env = dict(
      os.environ, XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}'
  )
  env.update(extra_env or {})
  return subprocess.run(
      [sys.executable, '-c', script, *args],
      capture_output=True,
      text=True,
      cwd=ROOT,
      env=env,
      timeout=600,
  )


def _json(result):
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def _four_config(small_config):
  # float32 matmuls: bf16's roundings turn the all-reduce's other order of
  # float32 sums (1e-7) into 1e-4 in a step's gradients, and up to 2% in
  # the summary after 16 steps. In float32 the 1e-7 grows too, by how much
  # depends on the dropout masks: 1e-7 to 4e-4 in the test loss after
  # these 16 steps at learning rate 0.1 (the masks themselves are the same
  # on 4 devices as on one: test_four_devices_draw_the_dropout_masks_of_one).
  return small_config(eval_batch_size=32, matmul_precision='float32')


@pytest.fixture(scope='module')
def four_devices(small_config, tmp_path_factory) -> dict:
  """FOUR_DEVICES' report, on `_four_config`."""
  config = json.dumps(_four_config(small_config).to_dict())
  workdir = str(tmp_path_factory.mktemp('four'))
  return _json(_run(FOUR_DEVICES, config, workdir, devices=4))


def test_four_devices_shard_the_batch_and_match_one_device(
    small_config, four_devices, tmp_path
):
  config = _four_config(small_config)
  one = small_run(config, str(tmp_path / 'one'))  # This process: 1 device.
  four = four_devices
  assert one['devices'] == 1 and one['shard_shape'] == [3, 64, 28, 28, 1]
  # Each of the 4 devices holds a quarter of every batch.
  assert four['devices'] == 4 and four['shard_shape'] == [3, 16, 28, 28, 1]
  # 300 test examples in 10 batches of 32 (the last padded with 20):
  # every example counted once, on any device count.
  for run in (one, four):
    assert run['test_batch_shape'] == [10, 32, 28, 28, 1]
    assert run['eval_count'] == 300
  assert four['summary'] == pytest.approx(one['summary'], rel=1e-3, abs=1e-6)


def test_four_devices_draw_the_dropout_masks_of_one(four_devices):
  differ, dropped = four_devices['dropout_masks']
  assert differ == 0
  assert abs(dropped - default.get_config().dropout_rate) < 0.001


def test_batch_size_must_divide_over_the_devices(four_devices):
  assert four_devices['odd_batch'] == (
      'config.batch_size=30 is not allowed: use a multiple of the 4 devices'
  )


# Two processes of main.py on one workdir, as a two-host job runs.


def _start_two_processes(config, workdir: str, logs) -> list:
  """main.py --distributed as processes 0 and 1; their stderr goes to `logs`."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=1')
  changed = {
      k: v for k, v in config.to_dict().items() if v != default.get_config()[k]
  }
  flags = [f'--config.{k}={v}' for k, v in changed.items()]
  return [
      subprocess.Popen(
          [
              sys.executable,
              'main.py',
              f'--workdir={workdir}',
              '--config=configs/default.py',
              *flags,
              '--distributed',
              f'--coordinator_address=127.0.0.1:{port}',
              '--num_processes=2',
              f'--process_id={i}',
          ],
          stdout=subprocess.DEVNULL,
          stderr=log,
          cwd=ROOT,
          env=env,
      )
      for i, log in enumerate(logs)
  ]


def _two_process_run(config, workdir: str, tmp_path, name: str, stop=None):
  """Both processes' exit status and stderr; `stop(processes, log 0)` first."""
  paths = [tmp_path / f'{name}.{i}.log' for i in range(2)]
  logs = [open(p, 'w') for p in paths]
  processes = _start_two_processes(config, workdir, logs)
  try:
    if stop:
      stop(processes, paths[0])
    statuses = [p.wait(timeout=600) for p in processes]
  finally:
    for p in processes:
      p.kill()
    for log in logs:
      log.close()
  return statuses, [p.read_text() for p in paths]


def _last_epoch_line(stderr: str) -> str:
  return re.findall(r'epoch: +\d+, train_loss.*', stderr)[-1]


def test_sigterm_to_one_process_stops_both_at_one_step(small_config, tmp_path):
  config = small_config(steps_per_call=2, progress_every_secs=0.01)
  statuses, uninterrupted = _two_process_run(
      config, str(tmp_path / 'uninterrupted'), tmp_path, 'uninterrupted'
  )
  assert statuses == [0, 0], uninterrupted[0][-3000:]
  # Two processes of one device each, each training on its half of the
  # data (16 steps of 32 a process, 512 of the 1,024 examples), agree.
  for i, stderr in enumerate(uninterrupted):
    assert f'JAX process: {i} / 2' in stderr
    assert (
        "Training on 1024 examples of 'train[:1024]' (16 steps/epoch) on 2 "
        'devices.'
    ) in stderr
  assert re.findall(r'epoch: +\d+, train_loss.*', uninterrupted[1]) == (
      re.findall(r'epoch: +\d+, train_loss.*', uninterrupted[0])
  )

  def sigterm_to_process_1_in_epoch_1(processes, log_0):
    deadline = time.monotonic() + 300
    while not re.search(r'\([4-9]/16\)', log_0.read_text()):
      assert time.monotonic() < deadline and processes[0].poll() is None
      time.sleep(0.05)
    processes[1].send_signal(signal.SIGTERM)

  workdir = str(tmp_path / 'workdir')
  statuses, stderr = _two_process_run(
      config, workdir, tmp_path, 'stopped', sigterm_to_process_1_in_epoch_1
  )
  assert statuses == [143, 143], stderr[0][-3000:]
  stopped = [
      re.search(r'(.*): stopped \(step (\d+), in epoch 1\)', s) for s in stderr
  ]
  assert stopped[0].group(1).endswith('another process was asked to stop')
  assert stopped[1].group(1).endswith('SIGTERM')
  step = int(stopped[0].group(2))
  assert int(stopped[1].group(2)) == step and 0 < step < 16
  assert 'Traceback' not in stderr[0] + stderr[1]

  statuses, resumed = _two_process_run(config, workdir, tmp_path, 'resumed')
  assert statuses == [0, 0], resumed[0][-3000:]
  assert f'Resuming from the checkpoint (step {step}, in epoch 1)' in resumed[0]
  for i in range(2):
    assert _last_epoch_line(resumed[i]) == _last_epoch_line(uninterrupted[0])
