"""Speed levers for training on a CPU, kept apart from the model and the loop.

Each lever computes what the stock code computes (the same math; the bits of
dropout are the same too) in a form that XLA runs faster on a CPU. They were
measured on 2-core x86 CPUs with jax 0.10.2 and nowhere else, so `applied`
uses them only where JAX's default backend is the CPU and
`config.cpu_levers` is on; on a GPU or TPU the stock code runs (cuDNN's and
the TPU's own convolution gradients are what those platforms are built for).

Nothing changes on import. `applied` is a context manager: on entry it sets
the levers on the model it is given and on JAX's CPU lowering of threefry,
and on exit it puts back what was there, so that a library caller's JAX and
model are as they were.
"""

import contextlib

from absl import logging
from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp
from jax.interpreters import mlir
import ml_collections

_NHWC = ('NHWC', 'HWIO', 'NHWC')


def enabled(
    config: ml_collections.ConfigDict, platform: str | None = None
) -> bool:
  """Whether the levers apply: `config.cpu_levers` on a 'cpu' platform.

  `platform` defaults to JAX's default backend ('cpu', 'gpu', 'tpu').
  """
  return config.cpu_levers and (platform or jax.default_backend()) == 'cpu'


@contextlib.contextmanager
def applied(
    config: ml_collections.ConfigDict,
    model: nnx.Module,
    platform: str | None = None,
):
  """Within the block, `model` trains with the CPU levers where they apply.

  The one call that turns them on (see `enabled`): training run inside the
  block compiles with them. On exit the model's convolutions and JAX's
  threefry lowering are what they were before.
  """
  with contextlib.ExitStack() as stack:
    if enabled(config, platform):
      stack.enter_context(conv_gradients(model))
      stack.enter_context(unrolled_threefry())
    yield


# Lever 1: the convolutions' gradients as convolutions and matmuls.


def _conv(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """Stride-1 'SAME' convolution, NHWC images and HWIO kernel."""
  return lax.conv_general_dilated(
      x, kernel, (1, 1), 'SAME', dimension_numbers=_NHWC
  )


def _shifted(x: jax.Array, kh: int, kw: int) -> list[jax.Array]:
  """The `kh * kw` windows of zero-padded `x` that a 'SAME' kernel tap reads."""
  h, w = x.shape[1:3]
  padded = jnp.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
  return [padded[:, i : i + h, j : j + w] for i in range(kh) for j in range(kw)]


def _patches(x: jax.Array, kh: int, kw: int) -> jax.Array:
  """im2col: `(B*H*W, kh*kw*C)`, the inputs of each output pixel in a row."""
  return jnp.concatenate(_shifted(x, kh, kw), axis=-1).reshape(
      -1, kh * kw * x.shape[-1]
  )


def _col2im(patch_grads: jax.Array, shape, kh: int, kw: int) -> jax.Array:
  """The transpose of `_patches`: each tap's part added back where it read."""
  b, h, w, c = shape
  taps = patch_grads.reshape(b, h, w, kh * kw, c)
  padded = jnp.zeros((b, h + kh - 1, w + kw - 1, c), patch_grads.dtype)
  for t in range(kh * kw):
    i, j = divmod(t, kw)
    padded = padded.at[:, i : i + h, j : j + w].add(taps[:, :, :, t])
  return padded[:, kh // 2 : kh // 2 + h, kw // 2 : kw // 2 + w]


@jax.custom_vjp
def conv_same(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`_conv`, trained as matmuls: im2col forward, its transposes backward.

  The same function as `lax.conv_general_dilated` (which computes it where
  no gradient is taken, as in evaluation). XLA's CPU transposed
  convolutions are slow, above all inside `lax.scan` (where the training
  loop runs): the kernel gradient of the 32->64 conv took 1.7 s a step
  there, against 20 ms as matmuls. In training the forward pass is the
  patches times the kernel, and the patches serve the kernel gradient too.
  """
  return _conv(x, kernel)


def _conv_same_fwd(x, kernel):
  kh, kw, cin, cout = kernel.shape
  patches = _patches(x, kh, kw)
  if cin == 1:  # Nine taps of one channel: XLA's own convolution is faster.
    return _conv(x, kernel), (patches, kernel)
  y = patches @ kernel.reshape(-1, cout)
  return y.reshape(*x.shape[:3], cout), (patches, kernel)


def _conv_same_bwd(residuals, g):
  patches, kernel = residuals
  kh, kw, cin, cout = kernel.shape
  g2 = g.reshape(-1, cout)
  dkernel = (patches.T @ g2).reshape(kernel.shape)
  dpatches = g2 @ kernel.reshape(-1, cout).T
  return _col2im(dpatches, (*g.shape[:3], cin), kh, kw), dkernel


conv_same.defvjp(_conv_same_fwd, _conv_same_bwd)


def conv_general_dilated(
    lhs,
    rhs,
    window_strides,
    padding,
    *,
    lhs_dilation,
    rhs_dilation,
    dimension_numbers,
    feature_group_count,
    precision,
    **unused_kwargs,
):
  """`lax.conv_general_dilated` for `nnx.Conv`, computed by `conv_same`.

  Only for what `conv_same` computes: stride 1, 'SAME' padding, odd kernels,
  no dilation or groups, NHWC. Anything else is a programming error,
  reported rather than computed some other way.
  """
  supported = (
      tuple(window_strides) == (1, 1)
      and padding == 'SAME'
      and tuple(lhs_dilation) == (1, 1)
      and tuple(rhs_dilation) == (1, 1)
      and feature_group_count == 1
      and precision is None
      and dimension_numbers
      == lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC)
      and rhs.shape[0] % 2 == 1
      and rhs.shape[1] % 2 == 1
  )
  if not supported:
    raise ValueError(
        'conv_same supports only stride-1 SAME NHWC convolutions '
        'with odd kernels, no dilation and no groups'
    )
  return conv_same(lhs, rhs)


@contextlib.contextmanager
def conv_gradients(model: nnx.Module):
  """Within the block, `model`'s `nnx.Conv`s compute through `conv_same`.

  `nnx.Conv` takes its convolution function as a field; this sets it on each
  of the model's convolutions, and puts back the previous one on exit.
  """
  convs = [m for _, m in nnx.iter_modules(model) if isinstance(m, nnx.Conv)]
  previous = [conv.conv_general_dilated for conv in convs]
  for conv in convs:
    conv.conv_general_dilated = conv_general_dilated
  try:
    yield
  finally:
    for conv, function in zip(convs, previous):
      conv.conv_general_dilated = function


# Lever 2: threefry's random bits compiled unrolled on the CPU.


def _threefry_rules():
  """JAX's threefry primitive, its CPU lowering now and its unrolled rule.

  These are private to JAX (there is no public switch, jax 0.10): returns
  None, after one warning, where they are missing or not what this lever
  was written against (another JAX version).
  """
  try:
    # pylint: disable-next=g-import-not-at-top
    from jax._src.interpreters import mlir as mlir_internal
    # pylint: disable-next=g-import-not-at-top
    from jax._src.random import threefry2x32 as threefry

    primitive = threefry.threefry2x32_p
    current = mlir_internal._platform_specific_lowerings['cpu'][primitive]
    if current.rule is not threefry._threefry2x32_cpu_lowering_rule:
      raise ValueError('the CPU lowering is not the rolled one')
    return primitive, current, threefry._threefry2x32_lowering_rule
  except (ImportError, AttributeError, KeyError, ValueError) as e:
    logging.warning(
        'CPU lever unrolled_threefry is off: JAX %s lacks the private '
        'threefry lowering it replaces (%s); training goes on without it.',
        jax.__version__,
        e,
    )
    return None


@contextlib.contextmanager
def unrolled_threefry():
  """Within the block, JAX compiles threefry unrolled on the CPU too.

  JAX lowers threefry with a rolled loop on the CPU (to compile faster),
  which XLA runs as five passes over memory; dropout draws 3.2 million
  random words a step, and unrolled (JAX's own lowering for the other
  platforms) they fuse into one pass: 113.7 against 131.1 ms a step here
  (x1.15). The bits are the same, so dropout masks do not change. Code
  compiled inside the block keeps the unrolled form; JAX's own CPU rule is
  registered again on exit.
  """
  rules = _threefry_rules()
  if rules is None:
    yield
    return
  primitive, cpu_rule, unrolled_rule = rules
  mlir.register_lowering(primitive, unrolled_rule, platform='cpu', inline=False)
  try:
    yield
  finally:
    mlir.register_lowering(
        primitive, cpu_rule.rule, platform='cpu', inline=cpu_rule.inline
    )
