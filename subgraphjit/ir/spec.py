"""Output specs (dtype and shape) of recorded ops, known at record time.

A ``Spec`` is interned: equal (dtype, shape) pairs are the same object, so a
spec hashes and compares by identity.  That makes the inference cache key of a
recorded op -- its attributes plus the specs of its operands -- cheap to build
and to look up, which matters because every recorded op does it once.

Inference itself runs the real TensorFlow op once, on stand-in tensors of the
right specs (ones, or zeros for index operands) and on the Python and NumPy
operands themselves, and caches the result per key.
So the specs and the error messages are TensorFlow's own, for every op, with
no hand-written shape functions to drift from TensorFlow's behaviour.
"""

import sys

import numpy as np
import tensorflow as tf


class Spec:
    """The dtype and static shape of a value, interned (compare with ``is``)."""

    __slots__ = ("dtype", "shape", "python_type")

    def __init__(self, dtype, shape, python_type=None):
        self.dtype = dtype            # a tf.DType, or None for a Python value
        self.shape = shape            # a tuple of ints
        self.python_type = python_type  # int/float/bool/list for Python values

    def __repr__(self):
        if self.python_type is not None:
            return f"Spec(python {self.python_type.__name__}, shape={self.shape})"
        return f"Spec({self.dtype.name}, shape={self.shape})"


_interned = {}


def spec(dtype, shape, python_type=None):
    key = (dtype, shape, python_type)
    found = _interned.get(key)
    if found is None:
        found = _interned[key] = Spec(dtype, shape, python_type)
    return found


SCALAR_SPECS = {kind: spec(None, (), kind) for kind in (int, float, bool)}
# Types of the variables seen, each instance of which is a variable.
VARIABLE_TYPES = set()


def spec_of_foreign(value):
    """The spec of an operand that is not a VirtualNode.

    Tensors and variables give theirs; Python scalars and lists get a spec of
    their kind and shape only, since TensorFlow converts them to the dtype the
    op asks for (``x + 2`` on a float tensor adds 2.0).
    """
    scalar_spec = SCALAR_SPECS.get(type(value))
    if scalar_spec is not None:
        return scalar_spec
    if is_variable(value):
        # Weights meet almost every recorded op: keep their spec on them.
        # A variable's dtype and shape never change (one made with an
        # unknown shape is not recorded lazily).  The recorder reads the
        # spec itself off instances of VARIABLE_TYPES (_native.c).
        known = getattr(value, "_subgraphjit_spec", None)
        if known is None:
            known = value._subgraphjit_spec = _spec_of_tensor(value)
            VARIABLE_TYPES.add(type(value))
        return known
    if isinstance(value, tf.Tensor):
        if not hasattr(value, "_numpy"):
            # A symbolic tensor: we are inside a tf.function trace, where
            # TensorFlow builds a graph anyway; record nothing.
            raise NotLazy
        return _spec_of_tensor(value)
    if isinstance(value, np.ndarray) or np.isscalar(value):
        array = np.asarray(value)
        return spec(tf.as_dtype(array.dtype), array.shape)
    if isinstance(value, (list, tuple)):
        array = np.asarray(value)
        if array.dtype == object:
            raise NotLazy
        kind = {"b": bool, "i": int, "u": int, "f": float}.get(array.dtype.kind)
        if kind is None:
            raise NotLazy
        return spec(None, array.shape, kind)
    raise NotLazy


def is_variable(value):
    """A tf.Variable, or a Keras 3 variable (which wraps one)."""
    if isinstance(value, tf.Variable):
        return True
    keras = sys.modules.get("keras")  # no Keras variables before Keras loads
    return keras is not None and isinstance(value, keras.Variable)


def _spec_of_tensor(value):
    shape = tf.TensorShape(value.shape)
    if shape.rank is None or None in shape:
        raise NotLazy
    return spec(tf.as_dtype(value.dtype), tuple(shape))


class NotLazy(Exception):
    """An operand the recorder cannot describe; the op runs eagerly instead."""


def stand_in(value_spec, index):
    """A tensor of ``value_spec`` to run an op on for shape inference: ones,
    or zeros where the operand holds indices (always in range)."""
    if value_spec.dtype == tf.string:
        return tf.fill(value_spec.shape, "")
    return (tf.zeros if index else tf.ones)(value_spec.shape, value_spec.dtype)


def spec_of_result(result):
    """The spec (or tuple of specs, for a multi-output op) of an op's result."""
    if isinstance(result, (list, tuple)):
        return tuple(spec_of_result(item) for item in result)
    return spec(result.dtype, tuple(result.shape))
