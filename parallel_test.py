"""Data parallelism on forced CPU devices, and over two real processes."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.abspath(__file__))

# Trains the small config (see conftest.small_config) and prints JSON: the
# summary, what the first batches' sharding is, and the number of test
# examples evaluation counted. argv: data_dir, workdir.
SMALL_RUN = '''
import json, sys
import jax
from flax import nnx
import numpy as np
from configs import default
import input_pipeline, parallel, train
config = default.get_config()
config.data_dir, workdir = sys.argv[1], sys.argv[2]
config.train_split, config.test_split = 'train[:1024]', 'test[:300]'
config.batch_size, config.eval_batch_size, config.num_epochs = 64, 32, 1
summary = train.train_and_evaluate(config, workdir)
mesh = parallel.create_mesh()
train_data, test_data = input_pipeline.load(config)
order = input_pipeline.epoch_order(0, 1, 1024, 64)[:3]
batch = parallel.global_batches(mesh, {k: v[order] for k, v in train_data.items()})
model, metrics = train.create_model(config), train.create_metrics()
test = parallel.global_batches(mesh, input_pipeline.eval_batches(test_data, 32))
model.eval()
graphdef, state = nnx.split((model, metrics))
nnx.update((model, metrics), train._eval_batches(graphdef, state, test)[0])
print(json.dumps({
    'summary': summary,
    'devices': len(batch['image'].sharding.device_set),
    'shard_shape': list(batch['image'].addressable_shards[0].data.shape),
    'test_batch_shape': list(test['image'].shape),
    'eval_count': int(metrics.accuracy.count),
}))
'''


def _run(script, *args, devices=1, extra_env=None):
  env = dict(os.environ, XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
  env.update(extra_env or {})
  return subprocess.run(
      [sys.executable, '-c', script, *args], capture_output=True, text=True,
      cwd=ROOT, env=env, timeout=600,
  )


def _json(result):
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def test_four_devices_shard_the_batch_and_match_one_device(mnist_data_dir, tmp_path):
  one = _json(_run(SMALL_RUN, mnist_data_dir, str(tmp_path / 'one'), devices=1))
  four = _json(_run(SMALL_RUN, mnist_data_dir, str(tmp_path / 'four'), devices=4))
  assert one['devices'] == 1 and one['shard_shape'] == [3, 64, 28, 28, 1]
  # Each of the 4 devices holds a quarter of every batch.
  assert four['devices'] == 4 and four['shard_shape'] == [3, 16, 28, 28, 1]
  # 300 test examples in 10 batches of 32 (the last padded with 20):
  # every example counted once, on any device count.
  for run in (one, four):
    assert run['test_batch_shape'] == [10, 32, 28, 28, 1]
    assert run['eval_count'] == 300
  assert four['summary'] == pytest.approx(one['summary'], rel=1e-4, abs=1e-6)


def test_batch_size_must_divide_over_the_devices(mnist_data_dir, tmp_path):
  script = (
      'import sys, train\n'
      'from configs import default\n'
      'config = default.get_config()\n'
      'config.data_dir, config.batch_size = sys.argv[1], 30\n'
      'train.train_and_evaluate(config, sys.argv[2])\n'
  )
  result = _run(script, mnist_data_dir, str(tmp_path / 'w'), devices=4)
  assert result.returncode != 0
  assert 'config.batch_size=30 is not divisible by the 4 devices: use a multiple of 4' in result.stderr


# One of two processes: trains 4 steps of 128 (64 from each process's half of
# the data) and prints the sums of the final parameters. argv: data_dir,
# coordinator port, process id.
TWO_PROCESS_STEPS = '''
import json, sys
import jax
jax.distributed.initialize(f'127.0.0.1:{sys.argv[2]}', 2, int(sys.argv[3]))
from flax import nnx
import numpy as np
from configs import default
import input_pipeline, parallel, train
config = default.get_config()
config.data_dir, config.train_split = sys.argv[1], 'train[:1024]'
mesh = parallel.create_mesh()
data, _ = input_pipeline.load(config)
order = input_pipeline.epoch_order(config.seed, 1, len(data['label']), 64)[:4]
model = train.create_model(config)
optimizer = train.create_optimizer(model, config, 4)
metrics = train.create_metrics()
objects = (model, optimizer, metrics)
nnx.update(objects, parallel.replicate(nnx.state(objects), mesh))
train.train_epoch(model, optimizer, metrics, data, order, 2, mesh)
params = parallel.local_copy(nnx.state(model, nnx.Param))
print(json.dumps({
    'processes': jax.process_count(), 'devices': jax.device_count(),
    'examples': len(data['label']),
    'sums': [float(np.abs(np.asarray(x)).sum()) for x in jax.tree.leaves(params)],
    'loss': float(metrics.compute()['loss']),
}))
'''


def test_two_processes_train_together_and_agree(mnist_data_dir):
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = str(s.getsockname()[1])
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=1')
  processes = [
      subprocess.Popen(
          [sys.executable, '-c', TWO_PROCESS_STEPS, mnist_data_dir, port, str(i)],
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
          env=env,
      )
      for i in range(2)
  ]
  results = []
  for p in processes:
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    results.append(json.loads(out.strip().splitlines()[-1]))
  first, second = results
  assert first['processes'] == second['processes'] == 2
  assert first['devices'] == 2
  # Each process read only its half of the 1,024 training examples.
  assert first['examples'] == second['examples'] == 512
  assert first['sums'] == second['sums']
  assert first['loss'] == second['loss']
  assert np.isfinite(first['loss'])
