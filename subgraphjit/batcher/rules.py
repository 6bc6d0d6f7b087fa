"""Batch rules: run one op for a whole group of instances at once.

A rule receives, per operand, either the instances stacked along a new
leading axis (a per-instance operand, shape ``(n, *instance_shape)``) or the
one value every instance shares (a tf.Variable, a tensor, a Python number),
and returns the result for all instances stacked the same way (a list of
them for multi-output ops).  The batched op is the instance op with its
attributes moved one axis right, so ``batched[i]`` equals the op on instance
i -- the property the differential tests check for every op entry.

A group whose op has no rule, or whose operands a rule cannot take, raises
``NoRule`` with the reason; the executor then runs it per instance and counts
it in the statistics.
"""

import contextlib
import math

import tensorflow as tf
from tensorflow.python.ops import gen_math_ops
from tensorflow.python.ops.resource_variable_ops import ResourceVariable

from ..ir.table import FrozenSlice
from .eager_ops import reshape


class NoRule(Exception):
    """This group cannot run as one batched op (the message says why)."""


def _shift_axis(axis, rank):
    """An instance axis as an axis of the stacked tensor."""
    if axis is None:
        return None
    if isinstance(axis, (tuple, list)):
        return type(axis)(_shift_axis(a, rank) for a in axis)
    axis = int(axis)
    if not -rank <= axis < rank:
        raise NoRule(f"axis {axis} out of range for rank {rank}")
    return axis + 1 if axis >= 0 else axis


def _stacked_shape(count, dims):
    """The shape of ``count`` stacked instances of static shape ``dims``:
    with -1 for the count where that is unambiguous, so that a trace, where
    the count is a tensor, needs a constant rather than ops packing a shape
    (a step of a compiled program pays about a microsecond an op)."""
    if (type(count) is int or not all(type(size) is int for size in dims)
            or math.prod(dims) == 0):
        return (count, *dims)
    return (-1, *dims)


def _aligned(values, shared, instance_ranks, output_rank, count):
    """Stacked operands of lower rank get size-1 axes after the batch axis, so
    they broadcast against the others as each instance did."""
    aligned = []
    for value, is_shared, rank in zip(values, shared, instance_ranks):
        if is_shared:
            if rank > output_rank:
                raise NoRule("a shared operand outranks the result")
            aligned.append(value)
        elif rank < output_rank:
            dims = tuple(value.shape[1:])   # (of a tensor or a NumPy array)
            if all(type(size) is int for size in dims):
                aligned.append(reshape(value, _stacked_shape(
                    count, (*[1] * (output_rank - rank), *dims))))
                continue
            shape = tf.concat([[count], [1] * (output_rank - rank),
                               tf.shape(value)[1:]], 0)
            aligned.append(tf.reshape(value, shape))
        else:
            aligned.append(value)
    return aligned


def broadcasting_rule(entry, attrs, values, shared, ranks, output_spec, count):
    """Elementwise and broadcasting ops, matmul, losses: the op broadcasts
    over the batch axis by itself once ranks are aligned."""
    output_rank = len(output_spec.shape)
    aligned = _aligned(values, shared, ranks, output_rank, count)
    hook = _hooks["rows"]
    if (hook is not None and entry.name in ROWS_GRADIENTS and not any(shared)
            and _same_rows(*aligned)):
        x, y = aligned
        return hook(entry.name, aligned, lambda: entry.call(aligned, attrs),
                    lambda upstream: ROWS_GRADIENTS[entry.name](upstream, x, y))
    return entry.call(aligned, attrs)


# The gradients of binary ops on two operands of one shape, stacked rows
# against stacked rows: TensorFlow's own gradients, where a shape is only
# known at run time (a step's row count), add a Shape, a
# BroadcastGradientArgs, and a Sum and a Reshape per operand, to find that
# nothing broadcasts.  (upstream, x, y) -> (gradient of x, of y)
ROWS_GRADIENTS = {
    "operator.add": lambda g, x, y: (g, g),
    "math.add": lambda g, x, y: (g, g),
    "operator.sub": lambda g, x, y: (g, -g),
    "math.subtract": lambda g, x, y: (g, -g),
    "operator.mul": lambda g, x, y: (g * y, g * x),
    "math.multiply": lambda g, x, y: (g * y, g * x),
}


def _same_rows(*operands):
    """Two tensors of one real dtype and one static shape past the rows (the
    rows of a step: one count), so that neither broadcasts."""
    if len(operands) != 2 or not all(isinstance(x, tf.Tensor) for x in operands):
        return False
    x, y = operands
    return (x.dtype == y.dtype and x.dtype.is_floating
            and x.shape.rank is not None and x.shape.rank >= 1
            and x.shape[1:].is_fully_defined() and x.shape[1:] == y.shape[1:]
            and y.shape.rank == x.shape.rank)


# Where a compiled program's trace routes some ops (``hooks``).
_hooks = {"products": None, "rows": None, "lookups": None}


@contextlib.contextmanager
def hooks(products=None, rows=None, lookups=None):
    """While a compiled program traces this block, route through
    ``products(a, b, transpose_b, compute)`` every plain product a batch
    rule traces, which returns the product of the rows ``a`` and the
    shared ``b`` (``compute()`` computes it): the forward keeps the
    products it computes, and the backward replays them instead of
    computing them again (batcher/program.py; the gradient of a product
    needs its operands, not its value, but the ops after it in a pattern
    need the value).  And route through ``rows(name, operands, compute,
    gradient)`` each binary op of ``ROWS_GRADIENTS`` on two operands of the
    same rows, and each concat of stacked rows along an axis of static
    sizes: the backward records it with ``gradient``, its gradient for that
    case.  And through
    ``lookups(table, indices, compute)`` each lookup of rows of a shared
    table: the forward keeps the rows of the variables it captured, the
    backward replays them and takes their gradient as entries."""
    outer = dict(_hooks)
    _hooks.update(products=products, rows=rows, lookups=lookups)
    try:
        yield
    finally:
        _hooks.update(outer)


_PLAIN_MATMULS = ("linalg.matmul", "operator.matmul")


def matmul_rule(entry, attrs, values, shared, ranks, output_spec, count):
    """Stacked rows times a shared weight matrix: one plain matrix product of
    all instances' rows (a broadcast batched product would be far slower, and
    its gradient would materialise one weight-sized product per instance)."""
    options = dict(zip(entry.attr_params, attrs))
    flags = any(options.get(flag) for flag in (
        "transpose_a", "adjoint_a", "a_is_sparse", "b_is_sparse"))
    if (not flags and tuple(shared) == (False, True) and list(ranks) == [2, 2]
            and output_spec.dtype is not None):
        rows, inner = values[0].shape[1], values[0].shape[2]
        a = reshape(values[0], (-1, inner))
        transpose_b = bool(options.get("transpose_b") or options.get("adjoint_b"))
        # What tf.linalg.matmul runs for two real matrices of one dtype,
        # without its Python (about 55 us a call, eagerly).
        plain = (entry.name in _PLAIN_MATMULS and output_spec.dtype.is_floating
                 and getattr(values[1], "dtype", None) == a.dtype
                 and not (options.get("transpose_b") and options.get("adjoint_b"))
                 and not any(options.get(flag) for flag in ("output_type", "grad_a", "grad_b")))

        def compute():
            if plain and tf.executing_eagerly():
                return gen_math_ops.mat_mul(a, values[1], transpose_b=transpose_b)
            return entry.call([a, values[1]], attrs)

        hook = _hooks["products"]
        if hook is None or not output_spec.dtype.is_floating:
            product = compute()
        else:   # real: an adjoint is a transpose
            product = hook(a, values[1], transpose_b, compute)
        return reshape(product, _stacked_shape(count, (rows, product.shape[-1])))
    # Two stacked operands (MV-RNN) or higher ranks: a batched product.
    return broadcasting_rule(entry, attrs, values, shared, ranks, output_spec, count)


def _tensordot_axes(axes, rank_a, rank_b):
    """tf.tensordot's ``axes`` as two lists of non-negative axes."""
    if isinstance(axes, int):
        return list(range(rank_a - axes, rank_a)), list(range(axes))
    if len(axes) != 2:
        raise NoRule(f"tensordot axes {axes!r}")
    pair = [[a] if isinstance(a, int) else list(a) for a in axes]
    return ([a % rank_a for a in pair[0]], [b % rank_b for b in pair[1]])


def tensordot_rule(entry, attrs, values, shared, ranks, output_spec, count):
    """tf.tensordot, such as the matrix-vector idiom ``tf.tensordot(W, x,
    axes=1)`` with W shared: one tensordot of the shared operand with all
    instances stacked, whose batch axis is a free axis of the product (first
    among the stacked operand's free axes), moved to the front.  Both
    operands per instance: one einsum, the batch axis shared."""
    axes = dict(zip(entry.attr_params, attrs))["axes"]
    if not isinstance(axes, (int, tuple)):
        raise NoRule(f"tensordot axes {axes!r}")
    axes_a, axes_b = _tensordot_axes(axes, ranks[0], ranks[1])
    if not shared[0] and not shared[1]:
        letters = iter("abcdefghijklmnopqrstuvwxy")
        a = [next(letters) for _ in range(ranks[0])]
        b = [next(letters) for _ in range(ranks[1])]
        for axis_a, axis_b in zip(axes_a, axes_b):
            b[axis_b] = a[axis_a]
        free = [a[i] for i in range(ranks[0]) if i not in axes_a] + [
            b[i] for i in range(ranks[1]) if i not in axes_b]
        return tf.einsum(f"z{''.join(a)},z{''.join(b)}->z{''.join(free)}",
                         values[0], values[1])
    if shared[1]:   # a is stacked: its axes move one right, the batch axis leads
        return tf.tensordot(values[0], values[1],
                            axes=[[a + 1 for a in axes_a], axes_b])
    product = tf.tensordot(values[0], values[1],
                           axes=[axes_a, [b + 1 for b in axes_b]])
    batch_axis = ranks[0] - len(axes_a)   # after the free axes of a
    order = [batch_axis] + [i for i in range(len(output_spec.shape) + 1)
                            if i != batch_axis]
    return tf.transpose(product, order)


def _with(attrs, entry, **changes):
    names = entry.attr_params
    return tuple(changes.get(name, value) for name, value in zip(names, attrs))


def _reduction(attrs, rank, output_spec, count, entry):
    axis = dict(zip(entry.attr_params, attrs)).get("axis")
    if axis is None:
        if entry.name in ("math.argmax", "math.argmin"):
            axis = 0
        elif entry.name in ("nn.softmax", "nn.log_softmax"):
            axis = -1
        else:
            return _with(attrs, entry, axis=tuple(range(1, rank + 1)))
    return _with(attrs, entry, axis=_shift_axis(axis, rank))


def _list_axis(attrs, rank, output_spec, count, entry):
    axis = dict(zip(entry.attr_params, attrs)).get("axis")
    if axis is None:
        return attrs
    if entry.name == "stack":
        rank += 1  # stack may name the new axis
    return _with(attrs, entry, axis=_shift_axis(axis, rank))


def _reshape(attrs, rank, output_spec, count, entry):
    return _with(attrs, entry, shape=(count,) + tuple(output_spec.shape))


def _transpose(attrs, rank, output_spec, count, entry):
    perm = dict(zip(entry.attr_params, attrs))["perm"]
    if perm is None:
        perm = tuple(range(rank - 1, -1, -1))
    return _with(attrs, entry, perm=(0,) + tuple(int(p) % rank + 1 for p in perm))


def _squeeze(attrs, rank, output_spec, count, entry):
    axis = dict(zip(entry.attr_params, attrs))["axis"]
    if axis is None or axis == ():
        raise NoRule("squeeze without an axis depends on the batch size")
    return _with(attrs, entry, axis=_shift_axis(axis, rank))


def _expand_dims(attrs, rank, output_spec, count, entry):
    axis = int(dict(zip(entry.attr_params, attrs))["axis"])
    return _with(attrs, entry, axis=axis + 1 if axis >= 0 else axis)


def _tile(attrs, rank, output_spec, count, entry):
    multiples = dict(zip(entry.attr_params, attrs))["multiples"]
    return _with(attrs, entry, multiples=(1,) + tuple(multiples))


def _one_hot(attrs, rank, output_spec, count, entry):
    axis = dict(zip(entry.attr_params, attrs)).get("axis")
    if axis is None or axis == -1:
        return attrs
    return _with(attrs, entry, axis=_shift_axis(axis, rank + 1))


def _getitem(attrs, rank, output_spec, count, entry):
    slice_spec = attrs[0]
    if not isinstance(slice_spec, tuple) or isinstance(slice_spec, FrozenSlice):
        slice_spec = (slice_spec,)
    return ((FrozenSlice((None, None, None)),) + slice_spec,)


def gather_rule(entry, attrs, values, shared, ranks, output_spec, count):
    options = dict(zip(entry.attr_params, attrs))
    axis = options.get("axis") or 0
    batch_dims = options.get("batch_dims") or 0
    params_shared, indices_shared = shared[0], shared[1]
    if entry.name == "nn.embedding_lookup":
        if options.get("max_norm") is not None:
            raise NoRule("embedding lookup with max_norm")
        if params_shared:
            return _lookup(entry, attrs, values)  # one lookup of all instances' ids
        # Per-instance tables: a gather along each instance's first axis.
        return tf.gather(values[0], values[1], axis=1,
                         batch_dims=0 if indices_shared else 1)
    if params_shared:
        if axis != 0 or batch_dims != 0:
            raise NoRule("gather from a shared table along a later axis")
        return _lookup(entry, attrs, values)
    if axis < 0:
        axis += ranks[0]
    if indices_shared:
        if batch_dims:
            raise NoRule("gather with batch_dims and shared indices")
        return entry.call(values, _with(attrs, entry, axis=axis + 1))
    return entry.call(values, _with(attrs, entry, axis=axis + 1,
                                  batch_dims=batch_dims + 1))


def _lookup(entry, attrs, values):
    """Rows of a shared table, through the ``lookups`` hook.  Eagerly, rows
    of a variable are its ``sparse_read``: what tf.gather and
    tf.nn.embedding_lookup (axis 0, no max_norm) run for one, without their
    Python and identities (about 20 us against 100 for the lookup)."""
    hook = _hooks["lookups"]
    if hook is not None:
        return hook(values[0], values[1], lambda: entry.call(values, attrs))
    if type(values[0]) is ResourceVariable and tf.executing_eagerly():
        return values[0].sparse_read(values[1])
    return entry.call(values, attrs)


def concat_rule(entry, attrs, values, shared, ranks, output_spec, count):
    """A concat of stacked rows, along the instances' axis shifted past
    the batch axis.  Through the ``rows`` hook where each part's size along
    it is static: its gradient is then one split, where TensorFlow's finds
    the parts' offsets at run time (a Shape, ShapeN, ConcatOffset, FloorMod
    and a Slice per part, at each step of a compiled backward)."""
    if any(shared):
        raise NoRule("an operand of a layout op is shared")
    attrs = _list_axis(attrs, ranks[0], output_spec, count, entry)
    axis = dict(zip(entry.attr_params, attrs)).get("axis")
    hook = _hooks["rows"]
    if hook is None or type(axis) is not int or not all(
            isinstance(value, tf.Tensor) and value.dtype.is_floating
            and value.shape.rank is not None and -value.shape.rank <= axis < value.shape.rank
            and value.shape[axis] is not None for value in values):
        return entry.call(values, attrs)
    sizes = [value.shape[axis] for value in values]
    return hook(entry.name, values, lambda: entry.call(values, attrs),
                lambda upstream: tf.split(upstream, sizes, axis=axis))


def _split(attrs, rank, output_spec, count, entry):
    axis = dict(zip(entry.attr_params, attrs))["axis"]
    return _with(attrs, entry, axis=_shift_axis(axis, rank))


def _bound(transform):
    """Attribute transforms get their op entry too (they look up parameters)."""
    def rule(entry, attrs, values, shared, ranks, output_spec, count):
        if any(shared):
            raise NoRule("an operand of a layout op is shared")
        return entry.call(values, transform(attrs, ranks[0], output_spec, count, entry))
    return rule


def no_shared_rule(entry, attrs, values, shared, ranks, output_spec, count):
    """Ops that need equal operand shapes (add_n, the losses)."""
    if any(shared):
        raise NoRule(f"{entry.name} with a shared operand")
    return entry.call(values, attrs)


def sparse_cross_entropy_rule(entry, attrs, values, shared, ranks, output_spec, count):
    """``tf.nn.sparse_softmax_cross_entropy_with_logits`` of the stacked
    instances as the function computes logits of any rank: on the logits'
    rows, the losses reshaped to the labels' shape.  Eagerly, the entry's
    call of rank-2 logits takes the fused op without the function's Python
    (dropin/fast.py: its checks hold, every instance passed them when
    recorded): a minibatch's loss took 0.2 ms, not 1.2."""
    if any(shared):
        raise NoRule(f"{entry.name} with a shared operand")
    if not tf.executing_eagerly():   # (in a trace: rows of unknown count)
        return entry.call(values, attrs)
    labels, logits = tf.convert_to_tensor(values[0]), values[1]
    losses = entry.call([reshape(labels, (-1,)), reshape(logits, (-1, logits.shape[-1]))],
                        attrs)
    return reshape(losses, tuple(labels.shape))


def bias_add_rule(entry, attrs, values, shared, ranks, output_spec, count):
    if dict(zip(entry.attr_params, attrs)).get("data_format") not in (None, "NHWC"):
        raise NoRule("bias_add with a channels-first data format")
    if shared[1]:
        return entry.call(values, attrs)
    # A bias per instance: an add, with the bias on the value's last axis.
    value, bias = values
    bias = tf.reshape(bias, [count] + [1] * (ranks[0] - 1) + [bias.shape[-1]])
    return value + bias


# (The pattern family's rule is registered by patterns/codegen.py, and a
# Keras layer's by dropin/layers.py: register_family_rule.)
_FAMILY_RULES = {
    "elementwise": broadcasting_rule,
    "broadcasting": broadcasting_rule,
    "loss": no_shared_rule,
    "matmul": matmul_rule,
}

_ENTRY_RULES = {
    "tensordot": tensordot_rule,
    "nn.bias_add": bias_add_rule,
    "nn.sparse_softmax_cross_entropy_with_logits": sparse_cross_entropy_rule,
    "nn.softmax_cross_entropy_with_logits": _bound(  # no shared operands
        lambda attrs, rank, spec, count, entry: _with(attrs, entry, axis=_shift_axis(
            dict(zip(entry.attr_params, attrs))["axis"], rank))),
    "reshape": _bound(_reshape),
    "transpose": _bound(_transpose),
    "expand_dims": _bound(_expand_dims),
    "squeeze": _bound(_squeeze),
    "tile": _bound(_tile),
    "reverse": _bound(lambda attrs, rank, spec, count, entry: _with(
        attrs, entry,
        axis=_shift_axis(tuple(dict(zip(entry.attr_params, attrs))["axis"]), rank))),
    "concat": concat_rule,
    "stack": _bound(_list_axis),
    "math.add_n": no_shared_rule,
    "split": _bound(_split),
    "unstack": _bound(_split),
    "gather": gather_rule,
    "nn.embedding_lookup": gather_rule,
    "one_hot": _bound(_one_hot),
    "operator.getitem": _bound(_getitem),
}


def rule_for(entry):
    """The batch rule of an op entry, or None if it has none."""
    if entry.name in _ENTRY_RULES:
        return _ENTRY_RULES[entry.name]
    if entry.family == "reduction":
        return _bound(_reduction)
    return _FAMILY_RULES.get(entry.family)


def register_family_rule(family, rule):
    """Make ``rule`` the batch rule of every entry of ``family``: a family of
    entries made outside the op table registers its own when its module loads
    (patterns/codegen.py: a compiled pattern; dropin/layers.py: a Keras
    layer's call), so this module imports neither."""
    _FAMILY_RULES[family] = rule
