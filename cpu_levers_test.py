"""Tests of the CPU levers: the same results, only where enabled, undone after."""

import logging
import subprocess
import sys

import cpu_levers
import jax
from jax import lax
from jax._src.random import threefry2x32
import numpy as np
import pytest
import train
from configs import default


def _model():
  return train.create_model(default.get_config())


def _threefry_rolled() -> bool:
  """Whether threefry lowers, here and now, to a loop (JAX's CPU default)."""
  bits = jax.jit(lambda key: jax.random.bits(key, (4096,)))
  return 'stablehlo.while' in bits.lower(jax.random.key(0)).as_text()


def _convs(model) -> list:
  return [model.conv1.conv_general_dilated, model.conv2.conv_general_dilated]


def test_conv_same_gradients_are_the_convolutions_gradients():
  rng = np.random.default_rng(0)
  for cin in (1, 5):
    x = rng.normal(size=(2, 9, 7, cin)).astype(np.float32)
    kernel = rng.normal(size=(3, 3, cin, 4)).astype(np.float32)
    weights = rng.normal(size=(2, 9, 7, 4)).astype(np.float32)

    def loss(conv, x, kernel):
      return (conv(x, kernel) * weights).sum()

    stock = lambda x, k: lax.conv_general_dilated(
        x, k, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
    )
    want = jax.grad(loss, argnums=(1, 2))(stock, x, kernel)
    got = jax.grad(loss, argnums=(1, 2))(cpu_levers.conv_same, x, kernel)
    for a, b in zip(got, want):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_on_the_cpu_the_levers_apply_inside_the_block_only():
  model = _model()
  stock = _convs(model)
  assert _threefry_rolled()
  with cpu_levers.applied(default.get_config(), model, platform='cpu'):
    assert _convs(model) == [cpu_levers.conv_general_dilated] * 2
    assert not _threefry_rolled()
  assert _convs(model) == stock == [lax.conv_general_dilated] * 2
  assert _threefry_rolled()


@pytest.mark.parametrize(
    'platform, enabled',
    [
        ('gpu', True),
        ('tpu', True),
        ('cpu', False),
    ],
)
def test_elsewhere_or_switched_off_the_stock_code_runs(platform, enabled):
  config = default.get_config()
  config.cpu_levers = enabled
  model = _model()
  assert not cpu_levers.enabled(config, platform)
  with cpu_levers.applied(config, model, platform=platform):
    assert _convs(model) == [lax.conv_general_dilated] * 2
    assert _threefry_rolled()


def test_unrolled_threefry_draws_the_same_bits(tmp_path):
  # A fresh process keeps JAX's own (rolled) CPU lowering.
  script = (
      'import jax, numpy as np, sys\n'
      'key = jax.random.key(7)\n'
      'np.save(sys.argv[1], jax.random.bernoulli(key, 0.975, (64, 28, 28, 32)))\n'
  )
  path = str(tmp_path / 'bits.npy')
  subprocess.run([sys.executable, '-c', script, path], check=True)
  with cpu_levers.unrolled_threefry():
    got = jax.jit(jax.random.bernoulli, static_argnums=(1, 2))(
        jax.random.key(7), 0.975, (64, 28, 28, 32)
    )
  np.testing.assert_array_equal(np.asarray(got), np.load(path))


def test_without_jaxs_private_lowering_the_run_warns_once_and_trains(
    small_config, tmp_path, monkeypatch, caplog
):
  monkeypatch.delattr(threefry2x32, '_threefry2x32_lowering_rule')
  with caplog.at_level(logging.WARNING, logger='absl'):
    summary = train.train_and_evaluate(small_config(), str(tmp_path / 'w'))
  warnings = [
      r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
  ]
  assert len(warnings) == 1
  assert warnings[0].startswith('CPU lever unrolled_threefry is off: JAX ')
  assert np.isfinite(summary['train_loss'])
  assert _threefry_rolled()
