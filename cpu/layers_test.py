"""The layers a CPU builds the model with: where, which, and what they compute."""

import logging
import re

from configs import default
from cpu import batch_norm
from cpu import dropout
from cpu import layers
from cpu import matmuls
from flax import nnx
import jax
from jax import lax
import numpy as np
import optax
import pytest
from run import parallel
import train

BF16_CPU = frozenset({'avx512f', 'avx512_bf16'})


def _config(**fields):
  config = default.get_config()
  config.update(fields)
  return config


def _kernels(model) -> list:
  return [
      model.conv1.conv_general_dilated,
      model.conv2.conv_general_dilated,
      model.linear1.dot_general,
      model.linear2.dot_general,
      type(model.dropout1),
      type(model.batch_norm1),
  ]


@pytest.mark.parametrize(
    'precision, expected',
    [
        (
            'float32',
            [matmuls.conv_general_dilated] * 2
            + [lax.dot_general] * 2
            + [dropout.NarrowDropout, batch_norm.BatchNorm],
        ),
        (
            'bfloat16',
            [matmuls.conv_general_dilated_bf16] * 2
            + [matmuls.dot_general_bf16] * 2
            + [dropout.NarrowDropout, batch_norm.BatchNorm],
        ),
    ],
)
def test_on_the_cpu_the_model_is_built_with_the_levers(precision, expected):
  config = _config(matmul_precision=precision)
  model = train.create_model(config, layers.for_config(config, 'cpu'))
  assert _kernels(model) == expected


@pytest.mark.parametrize(
    'platform, fields',
    [
        ('gpu', {}),
        ('tpu', {}),
        ('cpu', {'cpu_levers': False}),
    ],
)
def test_elsewhere_or_switched_off_the_stock_layers(platform, fields):
  assert layers.for_config(_config(**fields), platform) is nnx


class _Model(nnx.Module):
  """A user's own model: a subclass of a lever's layer, then LayerNorm, which
  no lever covers, both named through a CPU's `layers`."""

  def __init__(self, layers, rngs: nnx.Rngs):
    class GatedConv(layers.Conv):  # pylint: disable=invalid-name

      def __call__(self, x):
        return nnx.sigmoid(super().__call__(x)) * x

    self.conv = GatedConv(1, 1, kernel_size=(3, 3), rngs=rngs)
    self.norm = layers.LayerNorm(28 * 28, rngs=rngs)
    self.linear = layers.Linear(28 * 28, 10, rngs=rngs)

  def __call__(self, x, rngs=None):
    del rngs  # No dropout.
    return self.linear(self.norm(self.conv(x).reshape(len(x), -1)))


@pytest.mark.parametrize('precision', ['float32', 'bfloat16'])
def test_any_flax_layer_and_subclasses_of_the_levers_train(precision):
  config = _config(matmul_precision=precision)
  cpu = layers.for_config(config, 'cpu')
  model = _Model(cpu, nnx.Rngs(0))
  assert isinstance(model.conv, cpu.Conv) and isinstance(model.conv, nnx.Conv)
  assert type(model.norm) is nnx.LayerNorm and cpu.Embed is nnx.Embed
  kernel = model.conv.conv_general_dilated  # The lever's, by default.
  assert kernel in (
      matmuls.conv_general_dilated,
      matmuls.conv_general_dilated_bf16,
  )
  optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  rng = np.random.RandomState(0)
  image = rng.randint(0, 256, (16, 28, 28, 1)).astype(np.uint8)
  batch = {'image': image, 'label': rng.randint(0, 10, 16)}
  # The same batch eight times, in one scanned dispatch: the loss falls.
  batches = {k: np.stack([v] * 8) for k, v in batch.items()}
  graphdef, state = nnx.split((model, optimizer, train.create_metrics()))
  _, losses = train.train_steps(
      graphdef, parallel.create_mesh(), state, batches
  )
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] / 2


def test_a_lever_s_construction_argument_given_is_kept():
  cpu = layers.for_config(_config(), 'cpu')
  conv = cpu.Conv(
      1,
      1,
      (3, 3),
      conv_general_dilated=lax.conv_general_dilated,
      rngs=nnx.Rngs(0),
  )
  assert conv.conv_general_dilated is lax.conv_general_dilated


def test_narrow_dropout_bits_off_keeps_flax_s_dropout():
  config = _config(narrow_dropout_bits=False)
  model = train.create_model(config, layers.for_config(config, 'cpu'))
  assert type(model.dropout1) is type(model.dropout2) is nnx.Dropout


def _leaves(model) -> list:
  """The model's state: (path, value) of each leaf, keys as their data."""
  return [
      (
          path,
          jax.random.key_data(x)
          if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
          else x,
      )
      for path, x in jax.tree.leaves_with_path(nnx.state(model))
  ]


def test_the_state_is_the_stock_model_s():
  """Checkpoints and the export do not depend on the layers."""
  config = _config(matmul_precision='bfloat16')
  fast = _leaves(train.create_model(config, layers.for_config(config, 'cpu')))
  stock = _leaves(train.create_model(config))
  assert [path for path, _ in fast] == [path for path, _ in stock]
  for (_, a), (_, b) in zip(fast, stock):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    'flags, expected',
    [
        (BF16_CPU, (True, 'matmul_precision=auto; this CPU has avx512_bf16')),
        (
            {'amx_bf16', 'amx_tile'},
            (True, 'matmul_precision=auto; this CPU has amx_bf16'),
        ),
        (
            {'avx2', 'avx512f'},
            (
                False,
                'matmul_precision=auto; this CPU has neither amx_bf16 nor '
                'avx512_bf16',
            ),
        ),
    ],
)
def test_auto_multiplies_bf16_where_the_cpu_does_natively(flags, expected):
  assert layers.bf16_matmuls(_config(), 'cpu', frozenset(flags)) == expected


@pytest.mark.parametrize(
    'fields, platform, expected',
    [
        (
            {'matmul_precision': 'float32'},
            'cpu',
            (False, 'matmul_precision=float32'),
        ),
        (
            {'matmul_precision': 'bfloat16'},
            'cpu',
            (True, 'matmul_precision=bfloat16'),
        ),
        (
            {},
            'gpu',
            (
                False,
                'matmul_precision=auto; the CPU levers do not apply on gpu',
            ),
        ),
        (
            {'cpu_levers': False},
            'cpu',
            (False, 'matmul_precision=auto; config.cpu_levers is off'),
        ),
    ],
)
def test_bf16_matmuls_otherwise(fields, platform, expected):
  config = _config(**fields)
  assert layers.bf16_matmuls(config, platform, BF16_CPU) == expected


@pytest.mark.parametrize(
    'platform, flags, expected',
    [
        (
            'cpu',
            BF16_CPU,
            'bfloat16 operands, float32 accumulation '
            '(matmul_precision=auto; this CPU has avx512_bf16)',
        ),
        (
            'cpu',
            frozenset(),
            'float32 (matmul_precision=auto; this CPU has neither amx_bf16 '
            'nor avx512_bf16)',
        ),
        (
            'tpu',
            BF16_CPU,
            "JAX's default "
            '(matmul_precision=auto; the CPU levers do not apply on tpu)',
        ),
    ],
)
def test_matmul_precision_says_what_the_matmuls_compute_in_and_why(
    platform, flags, expected
):
  assert layers.matmul_precision(_config(), platform, flags) == expected


@pytest.mark.slow
def test_a_run_logs_its_matmul_precision_and_learns_in_bf16(
    small_config, tmp_path, caplog
):
  with caplog.at_level(logging.INFO, logger='absl'):
    summary = train.train_and_evaluate(
        small_config(matmul_precision='bfloat16'), str(tmp_path / 'w')
    )
  messages = [r.getMessage() for r in caplog.records]
  assert [m for m in messages if m.startswith('Matmul precision:')] == [
      'Matmul precision: bfloat16 operands, float32 accumulation '
      '(matmul_precision=bfloat16).'
  ]
  # 16 steps on 1,024 images already learn something.
  assert summary['test_accuracy'] > 0.5


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


def _bf16_in_ynnpack(dots) -> tuple[int, list[str]]:
  """How many dots are bf16 x bf16 in YNNPACK fusions; the others' lines."""
  bf16 = [(ynn, dtypes) == (True, ('bf16',) * 2) for ynn, dtypes, _ in dots]
  return sum(bf16), [line for (*_, line), b in zip(dots, bf16) if not b]


def test_training_and_evaluation_multiply_bf16s_in_ynnpack():
  # The real steps as train_epoch and evaluate compile them: one scanned
  # batch of 64.
  config = _config(matmul_precision='bfloat16')
  model = train.create_model(config, layers.for_config(config, 'cpu'))
  optimizer = train.create_optimizer(model, config, 1)
  metrics = train.create_metrics()
  batches = {
      'image': np.zeros((1, 64, 28, 28, 1), np.uint8),
      'label': np.zeros((1, 64), np.int32),
      'mask': np.ones((1, 64), bool),
  }
  mesh = parallel.create_mesh()
  model.train()
  graphdef, state = nnx.split((model, optimizer, metrics))
  training = train.train_steps.lower(graphdef, mesh, state, batches)
  model.eval()
  graphdef, state = nnx.split((model, metrics))
  evaluation = train.eval_steps.lower(graphdef, state, batches)
  bf16, others = _bf16_in_ynnpack(_dots(training.compile().as_text()))
  # conv2 and the two dense layers: forward, input and kernel gradients.
  assert bf16 == 9, others
  # The one other: the 1->32 conv's kernel gradient, its patches times the
  # output gradient, float32 by design.
  assert len(others) == 1 and ' f32[9,32]' in others[0], others
  bf16, others = _bf16_in_ynnpack(_dots(evaluation.compile().as_text()))
  assert (bf16, others) == (3, [])
