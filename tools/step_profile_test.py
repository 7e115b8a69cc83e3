"""The step profile covers the whole step, and profiles the real one."""

import json
import os
import re
import subprocess
import sys

from configs import default
from cpu import layers as cpu_layers
from flax import nnx
import jax
from jax.experimental.compilation_cache import compilation_cache
import numpy as np
from run import parallel
import train
from tools import step_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_table_shares_the_step_among_its_ops():
  result = subprocess.run(
      [
          sys.executable,
          '-m',
          'tools.step_profile',
          '--batch=8',
          '--steps=1',
          '--dispatches=1',
          '--top=0',
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  start = next(i for i, l in enumerate(lines) if l.startswith('op '))
  rows = []
  for line in lines[start + 1 :]:
    if not line.strip():
      break
    rows.append(line)
  shares = [float(re.search(r' (\d+\.\d)% ', r).group(1)) for r in rows]
  assert abs(sum(shares) - 100) < 0.1 * len(rows) + 0.5
  summary = json.loads(lines[-1])
  assert len(summary['ops']) == len(rows)
  matmuls = [
      o for o in summary['ops'] if o['kind'].split()[0] in ('conv', 'dot')
  ]
  assert matmuls and all(o['flops'] > 0 for o in matmuls), matmuls
  for layer in ('conv1', 'conv2', 'linear1', 'linear2', 'batch_norm1'):
    ms = summary['layers'][layer]
    assert ms['fwd'] > 0 and ms['bwd'] > 0, layer
  assert summary['gflop'] > 0 and summary['ops_ms'] > 0


def _step_hlo(scoped: bool) -> str:
  """The optimized HLO of a one-step dispatch, the layers scoped or not."""
  config = default.get_config()
  config.batch_size = 8
  model = train.create_model(config, cpu_layers.for_config(config))
  if scoped:
    step_profile.scope_layers(model)
  optimizer = train.create_optimizer(model, config, 1)
  objects = (model, optimizer, train.create_metrics())
  mesh = parallel.create_mesh()
  model.train()
  graphdef, state = nnx.split(objects)
  batches = parallel.global_batches(
      mesh,
      {
          'image': np.zeros((1, 8, 28, 28, 1), np.uint8),
          'label': np.zeros((1, 8), np.int32),
      },
  )
  lowered = train.train_steps.lower(graphdef, mesh, state, batches)
  return lowered.compile().as_text()


def _canonical(text: str) -> str:
  """`text` without metadata, its instructions numbered in order."""
  text = re.sub(
      r'\nFileNames\n.*?\nStackFrames\n.*?\n\n', '\n', text, flags=re.S
  )
  text = re.sub(r', metadata=\{[^}]*\}', '', text)
  names = {}
  return re.sub(
      r'%([\w.\-]+)',
      lambda m: f'%{names.setdefault(m.group(1), len(names))}',
      text,
  )


def test_the_layers_scopes_change_names_and_metadata_alone():
  # Compiled, not taken from the tests' persistent cache with another's
  # metadata.
  # JAX decides whether to use the cache once a process: decided again.
  cached = jax.config.jax_enable_compilation_cache
  jax.config.update('jax_enable_compilation_cache', False)
  compilation_cache.reset_cache()
  try:
    unscoped, scoped = _step_hlo(False), _step_hlo(True)
  finally:
    jax.config.update('jax_enable_compilation_cache', cached)
    compilation_cache.reset_cache()
  assert 'jvp(conv1)' in scoped and 'jvp(conv1)' not in unscoped
  assert _canonical(scoped) == _canonical(unscoped)
