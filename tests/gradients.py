"""Gradients compared as an optimizer sees them, not only as dense values.

Eager TensorFlow gives the gradient of a variable read by ``tf.gather`` or
``tf.nn.embedding_lookup`` as a ``tf.IndexedSlices`` with one entry per
gathered row.  Optimizers such as Adam, Adagrad and RMSprop apply those
entries one by one, so two gradients with equal dense values but different
entries train differently: a gradient equals eager's only when its type,
dense shape and multiset of (index, row) entries do.
"""

import numpy as np
import tensorflow


def _entries(slices):
    """The (index, row) entries of an IndexedSlices in a canonical order."""
    indices = slices.indices.numpy()
    values = slices.values.numpy().reshape(len(indices), -1)
    order = np.lexsort((*values.T[::-1], indices))
    return indices[order], values[order]


def assert_gradient_equal(got, expected, rtol=1e-4, atol=1e-6):
    """``got`` is eager's gradient ``expected``: both None (the variable took
    no part), or the same type, dense shape and values; for IndexedSlices the
    same entries."""
    assert (got is None) == (expected is None), (got, expected)
    if expected is None:
        return
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, tensorflow.IndexedSlices):
        assert got.dense_shape.numpy().tolist() == expected.dense_shape.numpy().tolist()
        got_indices, got_values = _entries(got)
        expected_indices, expected_values = _entries(expected)
        np.testing.assert_array_equal(got_indices, expected_indices)
        np.testing.assert_allclose(got_values, expected_values, rtol=rtol, atol=atol)
    else:
        assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(tensorflow.convert_to_tensor(got).numpy(),
                               tensorflow.convert_to_tensor(expected).numpy(),
                               rtol=rtol, atol=atol)


def assert_loss_and_gradients_equal(got, expected, atol=1e-6):
    """``got`` = (loss, gradients) is eager's ``expected``: the loss to
    float32 tolerance (``atol`` too: a sum of terms of both signs can end
    near zero, where batched sums' rounding is large relative to it), every
    gradient as ``assert_gradient_equal`` says."""
    (loss, gradients), (expected_loss, expected_gradients) = got, expected
    np.testing.assert_allclose(float(loss), float(expected_loss), rtol=1e-5, atol=atol)
    assert len(gradients) == len(expected_gradients)
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        assert_gradient_equal(gradient, expected_gradient, atol=atol)
