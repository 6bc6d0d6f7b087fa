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

What an operand is -- a node, a variable, a tensor, a number or another
value -- is decided here too, by ``classify_operand``.
"""

import sys

import numpy as np
import tensorflow as tf

from .node import VirtualNode


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


_PYTHON_NUMBERS = (int, float, bool)
SCALAR_SPECS = {kind: spec(None, (), kind) for kind in _PYTHON_NUMBERS}
# Types of the variables seen, each instance of which is a variable.
VARIABLE_TYPES = set()


# -- what an operand is --------------------------------------------------------
# A recorded op's operand is one of these, and ``classify_operand`` is the
# one place Python tells them apart (the C code keeps fast paths of its
# own: record's checks of scalars and variables, describe_graph's and
# match's caches by type).
NODE = "node"                  # a VirtualNode: a value to come
VARIABLE = "variable"          # a tf.Variable or Keras variable: shared by identity
TENSOR = "tensor"              # a tf.Tensor: shared by identity
NUMBER = "number"              # a Python int, float or bool: shared by value
NUMPY_SCALAR = "numpy scalar"  # np.float32(2)...: the batching layer shares it by
                               # value, as a number; a pattern cannot take it as
                               # a literal (the op that meets it decides its dtype)
VALUE = "value"                # anything else: a NumPy array, a list, ...
# Tensors, now or to come (a node): what inference runs on stand-ins for.
TENSOR_LIKE = frozenset({NODE, VARIABLE, TENSOR})


def classify_operand(operand):
    """Which of the names above ``operand`` is.  A number is of exactly
    int, float or bool (a subclass, such as an IntEnum, is a value)."""
    operand_type = type(operand)
    if operand_type is VirtualNode:   # (no subclasses: a C type)
        return NODE
    if operand_type in _PYTHON_NUMBERS:
        return NUMBER
    if is_variable(operand):
        return VARIABLE
    if isinstance(operand, tf.Tensor):
        return TENSOR
    if isinstance(operand, np.generic):
        return NUMPY_SCALAR
    return VALUE


def spec_of_foreign(value):
    """The spec of an operand that is not a VirtualNode.

    Tensors and variables give theirs; Python scalars and lists get a spec of
    their kind and shape only, since TensorFlow converts them to the dtype the
    op asks for (``x + 2`` on a float tensor adds 2.0).
    """
    operand_class = classify_operand(value)
    if operand_class == NUMBER:
        return SCALAR_SPECS[type(value)]
    if operand_class == VARIABLE:
        # Weights meet almost every recorded op: keep their spec on them.
        # A variable's dtype and shape never change (one made with an
        # unknown shape is not recorded lazily).  The recorder reads the
        # spec itself off instances of VARIABLE_TYPES (_native.c).
        known = getattr(value, "_subgraphjit_spec", None)
        if known is None:
            known = value._subgraphjit_spec = _spec_of_tensor(value)
            VARIABLE_TYPES.add(type(value))
        return known
    if operand_class == TENSOR:
        if not hasattr(value, "_numpy"):
            # A symbolic tensor: we are inside a tf.function trace, where
            # TensorFlow builds a graph anyway; record nothing.
            raise NotLazy
        return _spec_of_tensor(value)
    # A NumPy scalar or array, a list, or an operand not recorded (a node
    # here, a string, ...).
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


def dtype_of(value):
    """A tensor's or variable's tf.DType: a Keras 3 variable gives its
    dtype's name, a string."""
    return tf.as_dtype(value.dtype)


def _spec_of_tensor(value):
    shape = tf.TensorShape(value.shape)
    if shape.rank is None or None in shape:
        raise NotLazy
    return spec(dtype_of(value), tuple(shape))


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
