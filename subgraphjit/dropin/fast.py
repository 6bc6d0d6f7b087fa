"""Eager fast paths: TensorFlow's own op, without TensorFlow's Python
around it.

Where nothing records (a scope run eagerly because the user's Python reads
values, ``mode="eager"``, a minibatch of one), a wrapper passes the call
on to TensorFlow's function, and that function's Python costs more than
its op: ``tf.matmul`` of a row by a variable took 59 us where its MatMul,
called directly, took 21; ``tf.reduce_sum`` 33 against 13;
``tf.ones((1, 1))`` 56 against 15; ``tf.nn.embedding_lookup`` 138
against 66 (one at a time, 3,000 calls each, on this project's VM).  So
a plain loop over instances ran 5-10% slower than eager TensorFlow.

Each function here takes the parameters of TensorFlow's function (all
but ``name``; the wrapper takes this path only when ``name`` is the
default) and, for the common case only (operands already eager tensors
or resource variables of one dtype, the options TensorFlow's function
passes straight through), calls the op that function calls, with the
same inputs and attributes: the same kernel, so the same values, and the
same op on the tapes, so the same gradients and gradient types.  Anything
else returns NotImplemented, and the wrapper calls TensorFlow's function.
"""

import tensorflow as tf

from ..batcher.eager_ops import int_vector

try:   # the ops TensorFlow's functions call (no public API)
    from tensorflow.python.framework import ops as _ops
    from tensorflow.python.framework import config as _config
    from tensorflow.python.ops import (gen_array_ops, gen_math_ops, gen_nn_ops,
                                       gen_resource_variable_ops)
    from tensorflow.python.ops.resource_variable_ops import (ResourceVariable,
                                                             variable_accessed)
except ImportError:   # then every call takes TensorFlow's function
    _ops = None

_EAGER = type(tf.constant(0))
# Scalars Fill repeats, by (dtype, value): inputs only, never a result.
_SCALARS = {}


def _plain():
    """Whether TensorFlow's functions take their plain path: eagerly, with
    no dtype conversion mode that changes what an op's result is."""
    return (tf.executing_eagerly() and not _ops.is_auto_dtype_conversion_enabled()
            and not _ops.is_numpy_style_type_promotion())


def _tensor_or_variable(value):
    kind = type(value)
    return kind is _EAGER or kind is ResourceVariable


def matmul(a, b, transpose_a, transpose_b, adjoint_a, adjoint_b, a_is_sparse,
           b_is_sparse, output_type, grad_a, grad_b):
    """Two matrices of one dtype: MatMul, as ``tf.linalg.matmul`` calls it
    for rank 2 (a variable is read by the op's own conversion, as
    TensorFlow's function reads it)."""
    if (adjoint_a or adjoint_b or a_is_sparse or b_is_sparse or output_type is not None
            or grad_a or grad_b or type(transpose_a) is not bool
            or type(transpose_b) is not bool
            or not (_tensor_or_variable(a) and _tensor_or_variable(b))
            or a.dtype != b.dtype or a.shape.rank != 2 or b.shape.rank != 2
            or not _plain()):
        return NotImplemented
    return gen_math_ops.mat_mul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)


def sigmoid(x):
    if type(x) is not _EAGER or not _plain():
        return NotImplemented
    return gen_math_ops.sigmoid(x)


def _reduction(op):
    """``tf.reduce_sum``-like over a floating eager tensor: the op over the
    axes TensorFlow's ``_ReductionDims`` gives (every axis, as int32, for
    ``axis=None``; else the axis as given)."""
    def reduce(input_tensor, axis, keepdims):
        if type(input_tensor) is not _EAGER or not input_tensor.dtype.is_floating \
                or not _plain():
            return NotImplemented
        if axis is None:
            rank = len(input_tensor.shape)
            if not rank:   # (TensorFlow's function makes a Range op)
                return NotImplemented
            axis = int_vector(tuple(range(rank)))
        return op(input_tensor, axis, False if keepdims is None else bool(keepdims))
    reduce.__name__ = op.__name__
    return reduce


def add_n(inputs):
    """Two or more eager tensors: AddN (of one, TensorFlow returns it)."""
    if type(inputs) not in (list, tuple) or len(inputs) < 2 \
            or any(type(value) is not _EAGER for value in inputs) or not _plain():
        return NotImplemented
    return gen_math_ops.add_n(list(inputs))


def concat(values, axis):
    """Two or more eager tensors along an int axis: ConcatV2."""
    if type(values) not in (list, tuple) or len(values) < 2 or type(axis) is not int \
            or any(type(value) is not _EAGER for value in values) or not _plain():
        return NotImplemented
    return gen_array_ops.concat_v2(values, axis)


def _filled(value):
    """``tf.zeros``-like: Fill of a shape of Python ints with a scalar of a
    numeric dtype, as TensorFlow's function fills it eagerly."""
    def fill(shape, dtype, layout):
        if layout is not None or type(shape) not in (list, tuple) \
                or any(type(size) is not int or not 0 <= size < 2 ** 31 for size in shape) \
                or not _plain():
            return NotImplemented
        try:
            dtype = tf.as_dtype(dtype).base_dtype
        except TypeError:
            return NotImplemented   # (TensorFlow's function says why)
        if not (dtype.is_floating or dtype.is_integer) or dtype.is_quantized:
            return NotImplemented
        scalar = _SCALARS.get((dtype, value))
        if scalar is None:
            scalar = _SCALARS[dtype, value] = tf.constant(value, dtype)
        return gen_array_ops.fill(int_vector(tuple(shape)), scalar)
    fill.__name__ = "zeros" if value == 0 else "ones"
    return fill


def _indices(values):
    """A list of Python ints as the int32 tensor TensorFlow converts it to
    (from the cache), an int eager tensor as it is, else None."""
    if type(values) is list and values and all(type(index) is int and 0 <= index < 2 ** 31
                                               for index in values):
        return int_vector(tuple(values))
    if type(values) is _EAGER and values.dtype in (tf.int32, tf.int64):
        return values
    return None


def sparse_softmax_cross_entropy_with_logits(labels, logits):
    """Logits of rank 2 (float32 or float64) and their rows' labels: the
    fused op, as the function calls it for rank 2 (deterministic ops take
    the function, which computes another way)."""
    if type(logits) is not _EAGER or logits.dtype not in (tf.float32, tf.float64) \
            or len(logits.shape) != 2 or not _plain() or _config.is_op_determinism_enabled():
        return NotImplemented
    labels = _indices(labels)
    if labels is None or labels.shape != logits.shape[:1]:
        return NotImplemented   # (the function says what is wrong)
    return gen_nn_ops.sparse_softmax_cross_entropy_with_logits(logits, labels)[0]


def embedding_lookup(params, ids, max_norm):
    """Rows of one floating resource variable: ResourceGather, and the
    Identity ``tf.nn.embedding_lookup`` puts after it; the tapes told the
    variable was read, as ``sparse_read`` tells them (so its gradient is
    the same IndexedSlices)."""
    if max_norm is not None or type(params) is not ResourceVariable \
            or not params.dtype.is_floating or not _plain():
        return NotImplemented
    ids = _indices(ids)
    if ids is None:
        return NotImplemented
    variable_accessed(params)
    rows = gen_resource_variable_ops.resource_gather(params.handle, ids, dtype=params.dtype)
    return gen_array_ops.identity(rows)


# By op entry name: what the wrapper tries before TensorFlow's function.
FAST = {} if _ops is None else {
    "linalg.matmul": matmul,
    "math.sigmoid": sigmoid,
    "math.reduce_sum": _reduction(gen_math_ops._sum),
    "math.reduce_mean": _reduction(gen_math_ops.mean),
    "math.add_n": add_n,
    "concat": concat,
    "zeros": _filled(0),
    "ones": _filled(1),
    "nn.embedding_lookup": embedding_lookup,
    "nn.sparse_softmax_cross_entropy_with_logits": sparse_softmax_cross_entropy_with_logits,
}
