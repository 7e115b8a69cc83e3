"""Tests of the CPU levers: the same results, only where enabled, undone after."""

import functools
import logging
import re
import subprocess
import sys

import cpu_levers
import cpu_matmuls
from flax import nnx
import jax
from jax import lax
from jax._src.random import threefry2x32
import jax.numpy as jnp
import numpy as np
import parallel
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
    got = jax.grad(loss, argnums=(1, 2))(cpu_matmuls.conv_same, x, kernel)
    for a, b in zip(got, want):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_on_the_cpu_the_levers_apply_inside_the_block_only():
  config = default.get_config()
  config.matmul_precision = 'float32'
  model = _model()
  stock = _convs(model)
  assert _threefry_rolled()
  with cpu_levers.applied(config, model, platform='cpu'):
    assert _convs(model) == [cpu_matmuls.conv_general_dilated] * 2
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


# The bf16 matmuls.

# An HLO instruction: its name, result dtype, opcode and the rest of the line.
_HLO_INSTRUCTION = re.compile(
    r'^\s*(?:ROOT )?%(\S+) = (\w+)\[[^\]]*\]\S* ([\w-]+)\((.*)$'
)


def _dots(hlo: str) -> list[tuple[bool, tuple[str, ...], str]]:
  """Each dot of compiled HLO text: in a YNNPACK fusion?, operand dtypes, line."""
  computations, lines = {}, None
  for line in hlo.splitlines():
    header = re.match(r'^(?:ENTRY )?%(\S+) .*\{$', line)
    if header:
      lines = computations[header.group(1)] = []
    elif lines is not None:
      lines.append(line)
  ynn = {
      called
      for body in computations.values()
      for line in body
      if '"__ynn_fusion"' in line
      for called in re.findall(r'calls=%([\w.-]+)', line)
  }
  dots = []
  for name, body in computations.items():
    instructions = [m for m in map(_HLO_INSTRUCTION.match, body) if m]
    dtypes = {m.group(1): m.group(2) for m in instructions}
    for m in instructions:
      if m.group(3) == 'dot':
        operands = re.findall(r'%([\w.-]+)', m.group(4).split(')')[0])
        dots.append((name in ynn, tuple(dtypes[o] for o in operands), m[0]))
  return dots


@pytest.mark.parametrize(
    'flags, environment, expected',
    [
        ({'avx512f', 'avx512_bf16'}, None, (True, 'this CPU has avx512_bf16')),
        ({'amx_bf16', 'amx_tile'}, None, (True, 'this CPU has amx_bf16')),
        (
            {'avx2', 'avx512f'},
            None,
            (False, 'this CPU has neither amx_bf16 nor avx512_bf16'),
        ),
        ({'avx512_bf16'}, '0', (False, '$MNIST_CPU_BF16=0')),
        (set(), '1', (True, '$MNIST_CPU_BF16=1')),
    ],
)
def test_native_bf16_reads_the_flags_unless_the_environment_decides(
    flags, environment, expected, monkeypatch
):
  if environment is None:
    monkeypatch.delenv(cpu_levers.BF16_ENV, raising=False)
  else:
    monkeypatch.setenv(cpu_levers.BF16_ENV, environment)
  assert cpu_levers.native_bf16(frozenset(flags)) == expected


def test_native_bf16_rejects_other_values_of_the_environment(monkeypatch):
  monkeypatch.setenv(cpu_levers.BF16_ENV, 'yes')
  with pytest.raises(ValueError, match=r'\$MNIST_CPU_BF16 must be 0 or 1'):
    cpu_levers.native_bf16()


@pytest.mark.parametrize(
    'precision, platform, levers, expected',
    [
        (
            'auto',
            'cpu',
            True,
            (True, 'matmul_precision=auto; $MNIST_CPU_BF16=1'),
        ),
        ('float32', 'cpu', True, (False, 'matmul_precision=float32')),
        (
            'auto',
            'gpu',
            True,
            (
                False,
                'matmul_precision=auto; the CPU levers do not apply on gpu',
            ),
        ),
        (
            'auto',
            'cpu',
            False,
            (False, 'matmul_precision=auto; config.cpu_levers is off'),
        ),
    ],
)
def test_bf16_matmuls_with_auto_where_the_cpu_levers_apply(
    precision, platform, levers, expected, monkeypatch
):
  monkeypatch.setenv(cpu_levers.BF16_ENV, '1')
  config = default.get_config()
  config.matmul_precision, config.cpu_levers = precision, levers
  assert cpu_levers.bf16_matmuls(config, platform) == expected


@pytest.mark.parametrize(
    'platform, bf16, expected',
    [
        (
            'cpu',
            '1',
            'bfloat16 operands, float32 accumulation '
            '(matmul_precision=auto; $MNIST_CPU_BF16=1)',
        ),
        ('cpu', '0', 'float32 (matmul_precision=auto; $MNIST_CPU_BF16=0)'),
        (
            'tpu',
            '1',
            "JAX's default "
            '(matmul_precision=auto; the CPU levers do not apply on tpu)',
        ),
    ],
)
def test_matmul_precision_says_what_the_matmuls_compute_in_and_why(
    platform, bf16, expected, monkeypatch
):
  monkeypatch.setenv(cpu_levers.BF16_ENV, bf16)
  config = default.get_config()
  assert cpu_levers.matmul_precision(config, platform) == expected


def _bf16(x):
  """`x` rounded to bf16, as float32."""
  return np.asarray(x, jnp.bfloat16).astype(np.float32)


def test_matmul_bf16_and_its_gradients_are_float32_products_of_bf16s():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(48, 40)), rng.normal(size=(40, 24))
  g = rng.normal(size=(48, 24)).astype(np.float32)
  a, b = a.astype(np.float32), b.astype(np.float32)
  y, vjp = jax.vjp(cpu_matmuls.matmul_bf16, a, b)
  da, db = vjp(g)
  a16, b16, g16 = _bf16(a), _bf16(b), _bf16(g)
  assert y.dtype == da.dtype == db.dtype == np.float32
  np.testing.assert_allclose(y, a16 @ b16, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(da, g16 @ b16.T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(db, a16.T @ g16, rtol=1e-5, atol=1e-5)
  assert np.abs(y - a @ b).max() > 1e-3  # Not float32's product.


# Its kernel gradient pairs images, its patches pairs of channels.
@pytest.mark.parametrize('batch', [2, 3])
@pytest.mark.parametrize('channels', [5, 6])
def test_conv_same_bf16_is_the_convolution_of_bf16_roundings(batch, channels):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(batch, 9, 7, channels)).astype(np.float32)
  kernel = rng.normal(size=(3, 3, channels, 4)).astype(np.float32)
  g = rng.normal(size=(batch, 9, 7, 4)).astype(np.float32)
  stock = lambda x, k: lax.conv_general_dilated(
      x, k, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
  )
  want, stock_vjp = jax.vjp(stock, _bf16(x), _bf16(kernel))
  got, vjp = jax.vjp(cpu_matmuls.conv_same_bf16, x, kernel)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      jax.jit(cpu_matmuls.conv_same_bf16)(x, kernel), want, rtol=1e-5, atol=1e-5
  )
  for a, b in zip(vjp(g), stock_vjp(_bf16(g))):
    assert a.dtype == np.float32
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_bf16_layers_apply_to_the_matmuls_inside_the_block_only(monkeypatch):
  monkeypatch.setenv(cpu_levers.BF16_ENV, '1')
  model = _model()
  with cpu_levers.applied(default.get_config(), model, platform='cpu'):
    assert _convs(model) == [
        cpu_matmuls.conv_general_dilated,  # One channel: not a matmul.
        cpu_matmuls.conv_general_dilated_bf16,
    ]
    assert model.linear1.dot_general == cpu_matmuls.dot_general_bf16
    assert model.linear2.dot_general == cpu_matmuls.dot_general_bf16
  assert _convs(model) == [lax.conv_general_dilated] * 2
  assert (
      model.linear1.dot_general == model.linear2.dot_general == lax.dot_general
  )


def test_a_run_logs_its_matmul_precision_and_learns_in_bf16(
    small_config, tmp_path, monkeypatch, caplog
):
  monkeypatch.setenv(cpu_levers.BF16_ENV, '1')
  with caplog.at_level(logging.INFO, logger='absl'):
    summary = train.train_and_evaluate(small_config(), str(tmp_path / 'w'))
  messages = [r.getMessage() for r in caplog.records]
  assert [m for m in messages if m.startswith('Matmul precision:')] == [
      'Matmul precision: bfloat16 operands, float32 accumulation '
      '(matmul_precision=auto; $MNIST_CPU_BF16=1).'
  ]
  # 16 steps on 1,024 images already learn something.
  assert summary['test_accuracy'] > 0.5


def _bf16_in_ynnpack(dots) -> tuple[int, list[str]]:
  """How many dots are bf16 x bf16 in YNNPACK fusions; the others' lines."""
  bf16 = [(ynn, dtypes) == (True, ('bf16',) * 2) for ynn, dtypes, _ in dots]
  return sum(bf16), [line for (*_, line), b in zip(dots, bf16) if not b]


def test_training_and_evaluation_multiply_bf16s_in_ynnpack(monkeypatch):
  # The real steps as train_epoch and evaluate compile them: one scanned
  # batch of 64.
  monkeypatch.setenv(cpu_levers.BF16_ENV, '1')
  config = default.get_config()
  model = _model()
  optimizer = train.create_optimizer(model, config, 1)
  metrics = train.create_metrics()
  batches = {
      'image': np.zeros((1, 64, 28, 28, 1), np.uint8),
      'label': np.zeros((1, 64), np.int32),
      'mask': np.ones((1, 64), bool),
  }
  mesh = parallel.create_mesh()
  with cpu_levers.applied(config, model, platform='cpu'):
    model.train()
    graphdef, state = nnx.split((model, optimizer, metrics))
    training = train._train_steps.lower(graphdef, mesh, state, batches)
    model.eval()
    graphdef, state = nnx.split((model, metrics))
    evaluation = train._eval_batches.lower(graphdef, state, batches)
  bf16, others = _bf16_in_ynnpack(_dots(training.compile().as_text()))
  # conv2 and the two dense layers: forward, input and kernel gradients.
  assert bf16 == 9, others
  # The one other: the 1->32 conv's kernel gradient, its patches times the
  # output gradient, float32 by design.
  assert len(others) == 1 and ' f32[9,32]' in others[0], others
  bf16, others = _bf16_in_ynnpack(_dots(evaluation.compile().as_text()))
  assert (bf16, others) == (3, [])


# Dropout from narrow draws.


@pytest.mark.parametrize(
    'keep, expected',
    [
        (0.5, (jnp.uint8, 128)),
        (0.75, (jnp.uint8, 192)),
        (0.975, (jnp.uint16, 63898)),  # 8 bits: 250 / 256 = 0.9766, 0.16% off.
        (0.001, (jnp.uint32, 4294967)),
        (1.0, None),
        (0.0, None),
    ],
)
def test_narrow_keep_bits_are_the_narrowest_within_a_thousandth(keep, expected):
  assert cpu_levers.narrow_keep_bits(keep) == expected


def test_every_keep_rate_is_kept_within_a_thousandth():
  for keep in np.linspace(0.001, 0.999, 999):
    dtype, threshold = cpu_levers.narrow_keep_bits(keep)
    got = threshold / 2 ** jnp.iinfo(dtype).bits
    assert abs(got - keep) <= keep / 1000, keep


@pytest.mark.parametrize('dtype', [jnp.uint8, jnp.uint16])
def test_narrow_draws_are_uniform_and_share_no_bits_without_a_transpose(dtype):
  shape = (64, 28, 28, 32)
  draw = functools.partial(cpu_levers.narrow_draws, shape=shape, dtype=dtype)
  draws = np.asarray(draw(jax.random.key(0)))
  assert draws.shape == shape and draws.dtype == dtype
  uniform = draws.ravel() / np.iinfo(dtype).max
  n = uniform.size
  assert abs(uniform.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
  # Draws i and i + words come from one word: their bits are independent.
  words = n // (32 // jnp.iinfo(dtype).bits)
  corr = np.corrcoef(uniform[:-words], uniform[words:])[0, 1]
  assert abs(corr) < 5 / np.sqrt(n - words)
  assert 'transpose' not in jax.jit(draw).lower(jax.random.key(0)).as_text()


@pytest.mark.parametrize('rate', [0.025, 0.5])
def test_narrow_dropout_keeps_at_the_rate_with_the_same_state(rate):
  model = train.create_model(default.get_config())
  model.dropout1.rate = rate
  model.train()
  before = jax.tree.structure(nnx.state(model))
  x = np.ones((128, 28, 28, 32), np.float32)
  stock = np.asarray(model.dropout1(x))
  count = int(model.dropout1.rngs.count[...])
  with cpu_levers.narrow_dropout(model):
    assert type(model.dropout1) is cpu_levers.NarrowBitsDropout
    assert jax.tree.structure(nnx.state(model)) == before
    got = np.asarray(nnx.jit(lambda m, x: m.dropout1(x))(model, x))
  assert type(model.dropout1) is nnx.Dropout
  assert int(model.dropout1.rngs.count[...]) == count + 1  # One key drawn.
  assert jax.tree.structure(nnx.state(model)) == before
  kept = got != 0
  # Within 5 standard deviations of the binomial's mean (3.2M draws).
  sigma = np.sqrt(rate * (1 - rate) / kept.size)
  assert abs(kept.mean() - (1 - rate)) < 5 * sigma + (1 - rate) / 1000
  assert abs(got.mean() - 1) < 5 * sigma / (1 - rate)  # Scaled to keep it.
  assert not np.array_equal(got != 0, stock != 0)  # Another stream.


def test_narrow_dropout_draws_threefry_unrolled_and_only_in_training(
    monkeypatch,
):
  monkeypatch.setenv(cpu_levers.BF16_ENV, '0')
  model = _model()
  x = np.ones((64, 28, 28, 32), np.float32)
  call = lambda m, x: m.dropout1(x)
  with cpu_levers.applied(default.get_config(), model, platform='cpu'):
    model.train()
    lowered = jax.jit(call).lower(model, x).as_text()
    model.eval()
    np.testing.assert_array_equal(call(model, x), x)
  assert 'stablehlo.while' not in lowered
  assert 'ui16' in lowered  # 0.975 takes 16-bit draws.
  config = default.get_config()
  config.narrow_dropout_bits = False
  with cpu_levers.applied(config, model, platform='cpu'):
    assert type(model.dropout1) is nnx.Dropout
