"""The step-by-step executor's own eager ops, at the cost of the op.

Run one at a time, the ops that move rows between batches (slices, rows,
stacks, gathers, reshapes) cost more in TensorFlow's Python front than in
their kernels: ``t[3:50]`` took 108-136 us where its StridedSlice kernel,
given its bounds as tensors, took 15-19; ``tf.stack`` of 10 small tensors
twice its Pack; ``tf.range`` 66-71 us against 11 for a constant; a
Python list converted as an op's input about 30 us (measured one by one,
3,000 calls each, on this project's VM).  These helpers call the same ops,
so values and gradients are exactly those of the ops they replace, with
their integer operands from a cache of small tensors.

``gather_rows`` is the exception: its gradient is one segment sum (see
there), recorded on the tapes directly rather than through
``tf.custom_gradient`` (136 us a call, against 16 for the gather), and
with no tape to record it (inference), only the gather runs.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_array_ops

try:   # TensorFlow's tape, as tf.custom_gradient uses it (no public API)
    from tensorflow.python.eager import record as _tape
except ImportError:   # then gather_rows always takes the custom gradient
    _tape = None

# Small int32 vectors (slice bounds, shapes) by their values; cleared when
# full, so a long run of new bounds costs at most a conversion each.
_VECTORS = {}
_MOST_VECTORS = 4096


def int_vector(values):
    """An int32 tensor of the tuple ``values``, from the cache."""
    vector = _VECTORS.get(values)
    if vector is None:
        if len(_VECTORS) >= _MOST_VECTORS:
            _VECTORS.clear()
        vector = _VECTORS[values] = tf.constant(np.array(values, np.int32))
    return vector


def rows(table, start, stop):
    """``table[start:stop]`` (0 <= start <= stop): the same StridedSlice."""
    if not tf.executing_eagerly():   # (the cache holds eager tensors only)
        return table[start:stop]
    return gen_array_ops.strided_slice(table, int_vector((start,)),
                                       int_vector((stop,)), int_vector((1,)))


def row(table, number):
    """``table[number]`` (number >= 0): the same StridedSlice."""
    if not tf.executing_eagerly():
        return table[number]
    return gen_array_ops.strided_slice(table, int_vector((number,)),
                                       int_vector((number + 1,)), int_vector((1,)),
                                       shrink_axis_mask=1)


def stack(values):
    """``tf.stack(values)``: the same Pack."""
    return gen_array_ops.pack(values, axis=0)


def concat(values):
    """``tf.concat(values, 0)``: the same ConcatV2."""
    if not tf.executing_eagerly():
        return tf.concat(values, 0)
    return gen_array_ops.concat_v2(values, 0)


def reshape(value, shape):
    """``tf.reshape(value, shape)``; a shape of Python ints (-1 for one of
    them) from the cache."""
    if not tf.executing_eagerly() or not all(type(size) is int for size in shape):
        return tf.reshape(value, shape)
    return gen_array_ops.reshape(value, int_vector(tuple(shape)))


def zeros(shape, dtype):
    """``tf.zeros(shape, dtype)``, eagerly a constant (no Fill, no Python
    around it: 11 us against 69)."""
    if not tf.executing_eagerly():
        return tf.zeros(shape, dtype)
    return tf.constant(np.zeros(shape, dtype.as_numpy_dtype))


def row_numbers(start, stop):
    """``tf.range(start, stop)`` as int32 row numbers."""
    if not tf.executing_eagerly():
        return tf.range(start, stop)
    return tf.constant(np.arange(start, stop, dtype=np.int32))


@tf.custom_gradient
def _gather_rows_traced(table, indices):
    def gradient(upstream):
        size = table.shape[0]
        if size is None:  # inside a compiled pattern: known at run time
            size = tf.shape(table)[0]
        return tf.math.unsorted_segment_sum(upstream, indices, size), None
    return tf.gather(table, indices), gradient


def gather_rows(table, indices):
    """tf.gather of rows whose gradient is a dense tensor.

    tf.gather's own gradient is an IndexedSlices, which TensorFlow turns
    dense only after dozens of small ops when it meets a concat or another
    gradient of the same tensor; one segment sum does it at once.
    ``indices`` is an int32 tensor.
    """
    if _tape is None or not tf.executing_eagerly():
        return _gather_rows_traced(table, indices)
    if not _tape.could_possibly_record():
        return gen_array_ops.gather_v2(table, indices, 0)
    with _tape.stop_recording():
        result = gen_array_ops.gather_v2(table, indices, 0)
    size = table.shape[0]

    def gradient(upstream):
        return [tf.math.unsorted_segment_sum(upstream, indices, size), None]

    _tape.record_operation("GatherRows", [result], [table, indices], gradient)
    return result
