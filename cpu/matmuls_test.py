"""The kernels compute the convolutions and products they stand for."""

import itertools

from cpu import matmuls
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

NHWC = ('NHWC', 'HWIO', 'NHWC')


def _stock(x, kernel):
  return lax.conv_general_dilated(
      x, kernel, (1, 1), 'SAME', dimension_numbers=NHWC
  )


def _bf16(x):
  """`x` rounded to bf16, as float32."""
  return np.asarray(x, jnp.bfloat16).astype(np.float32)


def test_conv_same_gradients_are_the_convolutions_gradients():
  rng = np.random.default_rng(0)
  for cin in (1, 5):
    x = rng.normal(size=(2, 9, 7, cin)).astype(np.float32)
    kernel = rng.normal(size=(3, 3, cin, 4)).astype(np.float32)
    weights = rng.normal(size=(2, 9, 7, 4)).astype(np.float32)

    def loss(conv, x, kernel):
      return (conv(x, kernel) * weights).sum()

    want = jax.grad(loss, argnums=(1, 2))(_stock, x, kernel)
    got = jax.grad(loss, argnums=(1, 2))(matmuls.conv_same, x, kernel)
    for a, b in zip(got, want):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_matmul_bf16_and_its_gradients_are_float32_products_of_bf16s():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(48, 40)), rng.normal(size=(40, 24))
  g = rng.normal(size=(48, 24)).astype(np.float32)
  a, b = a.astype(np.float32), b.astype(np.float32)
  y, vjp = jax.vjp(matmuls.matmul_bf16, a, b)
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
  want, stock_vjp = jax.vjp(_stock, _bf16(x), _bf16(kernel))
  got, vjp = jax.vjp(matmuls.conv_same_bf16, x, kernel)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      jax.jit(matmuls.conv_same_bf16)(x, kernel), want, rtol=1e-5, atol=1e-5
  )
  for a, b in zip(vjp(g), stock_vjp(_bf16(g))):
    assert a.dtype == np.float32
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# Convolutions beyond stride-1 'SAME' ones of odd kernels: each computed by
# `lax`, as stock Flax computes it (`nnx.Conv`'s arguments for them).
OTHER_CONVS = {
    'valid': dict(window_strides=(1, 1), padding='VALID'),
    'stride 2': dict(window_strides=(2, 2), padding='SAME'),
    'even kernel': dict(window_strides=(1, 1), padding='SAME', kernel=(2, 2)),
    'dilated': dict(window_strides=(1, 1), padding='SAME', rhs_dilation=(2, 2)),
    'grouped': dict(
        window_strides=(1, 1), padding='SAME', feature_group_count=2
    ),
    'explicit padding': dict(window_strides=(1, 1), padding=((1, 1), (0, 2))),
}


@pytest.mark.parametrize(
    'name, kernel_of', itertools.product(OTHER_CONVS, ['float32', 'bf16'])
)
def test_convolutions_they_do_not_cover_are_lax_s(name, kernel_of):
  conv = {
      'float32': matmuls.conv_general_dilated,
      'bf16': matmuls.conv_general_dilated_bf16,
  }[kernel_of]
  options = dict(OTHER_CONVS[name])
  kh, kw = options.pop('kernel', (3, 3))
  groups = options.get('feature_group_count', 1)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 9, 8, 4)).astype(np.float32)
  kernel = rng.normal(size=(kh, kw, 4 // groups, 6)).astype(np.float32)
  numbers = lax.conv_dimension_numbers(x.shape, kernel.shape, NHWC)

  def loss(conv, x, kernel):
    return (conv(x, kernel, dimension_numbers=numbers, **options) ** 2).sum()

  want = jax.value_and_grad(loss, argnums=(1, 2))(
      lax.conv_general_dilated, x, kernel
  )
  got = jax.value_and_grad(loss, argnums=(1, 2))(conv, x, kernel)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)


def test_products_they_do_not_cover_are_lax_s():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 3, 5)).astype(np.float32)
  y = rng.normal(size=(5, 3, 2)).astype(np.float32)
  numbers = (((2,), (0,)), ((), ()))
  np.testing.assert_array_equal(
      matmuls.dot_general_bf16(x, y, numbers),
      lax.dot_general(x, y, numbers),
  )
  kernel = rng.normal(size=(5, 2)).astype(np.float32)
  np.testing.assert_array_equal(  # A precision asked for: lax's.
      matmuls.dot_general_bf16(
          x, kernel, numbers, precision=lax.Precision.HIGHEST
      ),
      lax.dot_general(x, kernel, numbers, precision=lax.Precision.HIGHEST),
  )
