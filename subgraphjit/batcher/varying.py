"""Batching over varying shapes: instances that differ in their lengths.

A sentence of n tokens gives ``[n, d] @ W``, ``tanh`` of ``[n, d]``, a
``reduce_mean`` over its n rows.  Their batching types (graph.py) hold
every operand's full shape, so sentences of different lengths never share a
launch.  For the ops below the instances' rows are independent, so their
operands concatenated along axis 0 (``[n_1 + n_2 + ..., d]``) give, through
the very same op, every instance's rows one after another: the same per-row
arithmetic as eager, and the same gradients (TensorFlow differentiates the
concatenation and the slices).  No padding is computed.

``merge_types(graph)`` joins the types of such ops that differ only in the
first axis of their per-instance operands (the n3ldg++ idea of a batching
key that leaves a size out, ../shared/seeds/n3ldg-jit-batching.txt), after
``describe_graph`` typed the nodes by full shapes; a type no other type
joins is left as it is, so a model whose shapes never vary batches as before.
``run(executor, indices, kind)`` runs one batch of a joined type.  How each
op batches, its *kind*:

``ROWS``      row-wise ops: the result's rows are the instances' rows, in
              order (elementwise and broadcasting ops, ``bias_add``, a
              product ``[n, k] @ W`` with W shared, a lookup of ``[n]`` ids
              in a shared table, reductions and softmax over later axes,
              losses over rows); instance i's value is a slice of it.
``SEGMENTS``  ``reduce_sum``, ``reduce_mean``, ``reduce_max``, ``reduce_min``
              over axis 0: one segment op over the concatenated rows, whose
              row i is instance i's value (a stacked result, as usual).
``SOFTMAX``   ``softmax`` / ``log_softmax`` over axis 0: a segment softmax
              (segment max, exp, segment sum), row-wise in its output.

A score matrix ``[n, n]`` differs in two axes and cannot be concatenated.
A second pass joins the types left whose values have the same rank, padded
to the largest instance (``run_padded``):

``PADDED``          a product of two instances' matrices, elementwise ops,
                    ops with a Python number;
``PADDED_SOFTMAX``  softmax and log-softmax, the padding masked out.

Only types with a value of rank 2 or more join: a vector's one axis is as
likely a feature size (a child-sum cell's ``[h]`` and ``[3h]``) as a
length, and the padded pass joins only types whose first axes differ
(``[1, 4]`` and ``[1, 12]`` gates are features).  Programs are not
compiled for an evaluation with joined types (batcher/__init__.py): their
buffers hold rows of one shape.  An evaluation holding patterns is not
joined (``merge_types``).
"""

import collections
import math

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_math_ops

from ..ir.table import PATTERN_KINDS
from .graph import NodeOperand
from .plan import NUMPY_OF_PYTHON
from . import eager_ops
from .eager_ops import gather_rows

ROWS, SEGMENTS, SOFTMAX = "rows", "segments", "softmax"
PADDED, PADDED_SOFTMAX = "padded", "padded softmax"

_SEGMENT_OPS = {"math.reduce_sum": tf.math.segment_sum,
                "math.reduce_mean": tf.math.segment_mean,
                "math.reduce_max": tf.math.segment_max,
                "math.reduce_min": tf.math.segment_min}
_MATMUL_ENTRIES = ("linalg.matmul", "operator.matmul")
_MATMUL_FLAGS = ("transpose_a", "adjoint_a", "a_is_sparse", "b_is_sparse")
_ROW_WISE_LOSSES = ("nn.sparse_softmax_cross_entropy_with_logits",
                    "nn.sigmoid_cross_entropy_with_logits",
                    "nn.softmax_cross_entropy_with_logits")


# What a batching type's own content decides, kept across evaluations (a
# minibatch of sentences has hundreds of types, each looked at in every
# evaluation; Specs are interned, so types hash cheaply): per type, its
# keys (``_length_free_key``, ``_shape_free_key``); per type and the
# shapes and dtypes of its shared tensors (``_type_key``: an id in a type
# may be another tensor's in another minibatch), its kind and padded kind.
# Cleared when full.
_BY_TYPE = {}
_MOST_CACHED = 16384


def _cached(key, compute):
    found = _BY_TYPE.get(key)
    if found is None:
        if len(_BY_TYPE) >= _MOST_CACHED:
            _BY_TYPE.clear()
        found = _BY_TYPE[key] = (compute(),)
    return found[0]


def merge_types(graph):
    """Join the graph's types that differ only in the first axis of their
    per-instance operands and whose op batches over it (module docstring).
    Sets ``graph.varying``: joined type -> kind (empty if nothing joined)."""
    graph.varying = {}
    batching_types = graph.types
    if any(batching_type.entry.node_kind in PATTERN_KINDS
           for batching_type in batching_types):
        # Patterns (granularity "subgraph") run per input shape; joining
        # the ops around them made the minibatch slower, not faster
        # (self_attention_varlen: 0.85x eager against 1.42x unjoined).
        return
    # Only types whose op another type shares can join (a small graph
    # has few: this is most of its evaluation's analysis otherwise).
    ops = collections.Counter(batching_type.entry for batching_type in batching_types)
    candidates = [node_type for node_type, batching_type in enumerate(batching_types)
                  if ops[batching_type.entry] > 1]
    if not candidates:
        return
    groups = {}
    for node_type in candidates:
        batching_type = batching_types[node_type]
        key = _cached(("lengths", batching_type), lambda: _length_free_key(batching_type))
        if key is not None:
            groups.setdefault(key, []).append(node_type)
    groups = [types for types in groups.values() if len(types) > 1]
    # Only now are nodes looked at: one example per candidate type.
    merged_into, kinds = {}, {}
    first_of_type = {}

    def example_of(node_type):
        """The index of a node of the type (a loop over the nodes, made
        only for a graph with types to join)."""
        if not first_of_type:
            for index in range(len(graph.type_of) - 1, -1, -1):
                first_of_type[graph.type_of[index]] = index
        return first_of_type[node_type]

    for types in groups:
        joined = []
        for node_type in types:
            example = example_of(node_type)
            operands, shared = graph.operands[example], graph.shared_operand[node_type]
            kind = _cached(
                ("kind", *_type_key(graph, node_type, example)),
                lambda: _kind(graph.nodes[example], operands, shared,
                              batching_types[node_type]))
            if kind is not None:
                joined.append((node_type, kind))
        if len(joined) < 2:
            continue
        for node_type, _ in joined:
            merged_into[node_type] = joined[0][0]
        kinds[joined[0][0]] = joined[0][1]
    # Then the types that differ in later axes too (a score matrix [n, n]):
    # padded to the largest instance.
    groups = {}
    for node_type in candidates:
        if node_type not in merged_into:
            batching_type = batching_types[node_type]
            key = _cached(("shapes", batching_type), lambda: _shape_free_key(batching_type))
            if key is not None:
                groups.setdefault(key, []).append(node_type)
    for types in groups.values():
        if len(types) < 2:
            continue
        examples = {node_type: graph.nodes[example_of(node_type)]
                    for node_type in types}
        padded = {node_type: _cached(
            ("padded", *_type_key(graph, node_type, example_of(node_type))),
            lambda: _padded_kind(examples[node_type], graph.shared_operand[node_type],
                                 batching_types[node_type]))
            for node_type in types}
        joined = [node_type for node_type in types if padded[node_type] is not None]
        if len({examples[node_type].spec.shape[0] for node_type in joined}) < 2:
            # Lengths differ, not only later axes: [1, 4] and [1, 12] gates
            # are features of two sizes, batched as they are.
            continue
        for node_type in joined:
            merged_into[node_type] = joined[0]
        kinds[joined[0]] = padded[joined[0]]
    if not merged_into:
        return
    # Renumber the types densely (schedulers count per type).
    number_of = {}
    kept_types, kept_shared = [], []
    for node_type, batching_type in enumerate(batching_types):
        if merged_into.get(node_type, node_type) == node_type:
            number_of[node_type] = len(kept_types)
            kept_types.append(batching_type)
            kept_shared.append(graph.shared_operand[node_type])
    renumber = [number_of[merged_into.get(t, t)] for t in range(len(batching_types))]
    renumber.append(-1)   # type_of's -1 (not scheduled) indexes this
    graph.type_of = [renumber[t] for t in graph.type_of]
    graph.types, graph.shared_operand = kept_types, kept_shared
    graph.varying = {number_of[t]: kind for t, kind in kinds.items()}
    graph._type_names = None


def _type_key(graph, node_type, example):
    """A type and its shared tensors' shapes and dtypes, as a key (node
    ``example`` is of the type): its output spec, which the kinds read,
    follows from them."""
    return (graph.types[node_type], *(
        _shared_key(operand) if is_shared else None
        for operand, is_shared in zip(graph.operands[example],
                                      graph.shared_operand[node_type])))


def _shared_key(value):
    """A shared value's shape and dtype, hashable (None for a number; a
    variable made with ``shape=None`` has no tuple of sizes)."""
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    sizes = "unknown rank" if getattr(shape, "rank", 0) is None else tuple(shape)
    return sizes, getattr(value, "dtype", None)


def _length_free_key(batching_type):
    """The batching type with each per-instance operand's first axis left
    out, or None when no operand has one to leave out.  (A batching type's
    operands are a Spec per per-instance operand, a tuple for a shared one;
    see graph.BatchingType.)"""
    return _key(batching_type, lambda shape: shape[1:])


def _shape_free_key(batching_type):
    """The batching type with per-instance operands described by dtype and
    rank only (types padded together), or None."""
    return _key(batching_type, len)


def _key(batching_type, describe):
    entry = batching_type.entry
    if entry.multi_output or entry.family not in (
            "elementwise", "broadcasting", "matmul", "reduction", "gather", "loss"):
        return None
    parts = []
    varies = False
    for part in batching_type.operands:
        if type(part) is tuple:   # shared: by identity or value, as it is
            parts.append(part)
        elif not part.shape:
            return None
        else:
            varies = True
            parts.append((part.dtype, part.python_type, describe(part.shape)))
    if not varies:
        return None
    return (entry, batching_type.attrs, batching_type.attr_types, tuple(parts))


def _padded_kind(node, shared, batching_type):
    """PADDED for ops whose instances may be zero-padded to the largest
    (each output element reads the same input elements, padding adds only
    zeros: a product of two instance matrices, elementwise ops, ops with
    a Python number); PADDED_SOFTMAX for softmax, padding masked out; else
    None.  Every consumer reads only an instance's own elements (``run``),
    so what the padding computes never reaches a value or a gradient."""
    entry, output = node.entry, node.spec
    if isinstance(output, tuple) or output.dtype is None or len(output.shape) < 2:
        return None   # (vectors: see _kind)
    specs = [part for part, is_shared in zip(batching_type.operands, shared)
             if not is_shared]
    if any(spec.python_type is not None or spec.dtype is None for spec in specs):
        return None
    options = dict(zip(entry.attr_params, node.attrs))
    if entry.name in _MATMUL_ENTRIES:
        if any(shared) or any(options.get(flag) for flag in (
                "adjoint_a", "adjoint_b", "a_is_sparse", "b_is_sparse")) or any(
                len(spec.shape) != 2 for spec in specs):
            return None
        return PADDED
    if entry.family == "elementwise":
        return PADDED
    if entry.family == "broadcasting" and entry.name != "nn.bias_add":
        if any(spec.shape != output.shape for spec in specs) or any(
                part[0] == "shared"
                for part, is_shared in zip(batching_type.operands, shared) if is_shared):
            return None   # only Python numbers shared: (float, 0.5) parts
        return PADDED
    if entry.name in ("nn.softmax", "nn.log_softmax") and output.dtype.is_floating:
        axis = options.get("axis")
        if axis is not None and not isinstance(axis, (int, np.integer)):
            return None
        return PADDED_SOFTMAX
    return None


def _kind(node, operands, shared, batching_type):
    """How nodes of this type batch over their first axis (ROWS, SEGMENTS,
    SOFTMAX), or None if they cannot.  A type's specs and shared operands
    are its nodes', so one node decides for all."""
    entry, output = node.entry, node.spec
    if isinstance(output, tuple) or output.dtype is None:
        return None
    specs = [None if is_shared else part
             for part, is_shared in zip(batching_type.operands, shared)]
    rows = [spec.shape[0] for spec in specs if spec is not None]
    if min(rows) < 1:
        return None   # an empty instance: segment ops differ from reductions there
    if max(len(output.shape), *(len(spec.shape) for spec in specs if spec is not None)) < 2:
        # Vectors only: their one axis is as likely a feature size (a
        # child-sum cell's [h] and [3h]) as a length, and such types batch
        # well, and compile, as they are.
        return None
    options = dict(zip(entry.attr_params, node.attrs))
    output_rows = output.shape[0] if output.shape else None
    family = entry.family

    def rows_match():
        return all(spec is None or spec.shape[0] == output_rows for spec in specs)

    if family == "elementwise":
        return ROWS if rows_match() else None
    if family == "broadcasting":
        if entry.name == "nn.bias_add" and options.get("data_format") not in (None, "NHWC"):
            return None
        rank = len(output.shape)
        if not rank or not rows_match():
            return None
        for operand, spec in zip(operands, specs):
            if spec is not None and len(spec.shape) != rank:
                return None   # a lower-rank instance operand repeats per row
            if spec is None and hasattr(operand, "shape"):
                shape = tuple(operand.shape)   # a shared tensor broadcasts
                if len(shape) == rank and shape[0] != 1:
                    return None
        return ROWS
    if family == "matmul":
        if (entry.name not in _MATMUL_ENTRIES or tuple(shared) != (False, True)
                or any(options.get(flag) for flag in _MATMUL_FLAGS)
                or len(specs[0].shape) != 2 or len(tuple(operands[1].shape)) != 2):
            return None
        return ROWS
    if family == "gather":
        if (entry.name not in ("gather", "nn.embedding_lookup")
                or tuple(shared) != (True, False)
                or options.get("axis") not in (None, 0)
                or options.get("batch_dims") not in (None, 0)
                or options.get("max_norm") is not None):
            return None
        return ROWS if rows_match() else None
    if family == "loss":
        if entry.name not in _ROW_WISE_LOSSES or any(shared) or not rows_match():
            return None
        axis = options.get("axis", -1)
        if axis is not None and int(axis) % len(specs[1].shape) == 0:
            return None
        return ROWS
    if family == "reduction":
        return _reduction_kind(entry, options, specs[0], output, rows_match())
    return None


def _reduction_kind(entry, options, spec, output, rows_match):
    rank = len(spec.shape)
    axis = options.get("axis")
    if entry.name in ("nn.softmax", "nn.log_softmax"):
        axis = -1 if axis is None else axis
        if not isinstance(axis, (int, np.integer)) or not spec.dtype.is_floating:
            return None
        return SOFTMAX if int(axis) % rank == 0 else (ROWS if rows_match else None)
    if axis is None:
        if entry.name in ("math.argmax", "math.argmin"):
            axes = {0}
        elif rank == 1:
            axes = {0}
        else:
            return None   # every axis: neither rows nor segments
    else:
        items = axis if isinstance(axis, (tuple, list)) else (axis,)
        if not all(isinstance(a, (int, np.integer)) for a in items):
            return None
        axes = {int(a) % rank for a in items}
    if 0 not in axes:
        return ROWS if rows_match else None
    if axes == {0} and entry.name in _SEGMENT_OPS and (
            spec.dtype.is_floating or entry.name != "math.reduce_mean"):
        return SEGMENTS
    return None


# -- running a batch -------------------------------------------------------------

def run(executor, indices, kind):
    """Run the nodes ``indices`` of one joined type as one op over their
    concatenated rows (or padded, for PADDED kinds); record each node's
    value as rows of the result."""
    if kind in (PADDED, PADDED_SOFTMAX):
        run_padded(executor, indices, kind)
        return
    graph = executor.graph
    first = graph.nodes[indices[0]]
    node_type = graph.type_of[indices[0]]
    shared = graph.shared_operand[node_type]
    specs = graph.types[node_type].operands
    varying_position = shared.index(False)
    # (The first axis of each instance's operand: its length.)
    lengths = [_shape_of(graph.operands[i][varying_position])[0] for i in indices]
    # Instances in order of length (stable): then the rows of each length are
    # one run of the result, which the ops batched per length (score
    # matrices) read as a slice, and the next batch over varying lengths,
    # in the same order, reads as a whole.
    order = sorted(range(len(indices)), key=lengths.__getitem__)
    indices = [indices[k] for k in order]
    lengths = [lengths[k] for k in order]
    values = [shared_value if operands is None
              else _concatenated(executor, operands, specs[position])
              for position, shared_value, operands in _by_position(graph, indices)]
    statistics = executor.statistics
    statistics["varying_batches"][first.entry.name] += 1
    statistics["varying_instances"][first.entry.name] += len(indices)
    if kind == ROWS:
        batched = first.entry.call(values, first.attrs)
        places = _row_slices(lengths)
    else:
        segment_ids = tf.constant(np.repeat(np.arange(len(indices), dtype=np.int32),
                                            lengths))
        if kind == SEGMENTS:
            batched = _SEGMENT_OPS[first.entry.name](values[0], segment_ids)
            if dict(zip(first.entry.attr_params, first.attrs)).get("keepdims"):
                batched = tf.expand_dims(batched, 1)
            places = range(len(indices))
        else:
            batched = segment_softmax(values[0], segment_ids, len(indices),
                                      log=first.entry.name == "nn.log_softmax")
            places = _row_slices(lengths)
    for index, place in zip(indices, places):
        executor.batched_of[index] = batched
        executor.row_of[index] = place


def _by_position(graph, indices):
    """Per operand position of the batch's nodes: (position, the shared
    value, None) or (position, None, every instance's operand)."""
    shared = graph.shared_operand[graph.type_of[indices[0]]]
    for position, is_shared in enumerate(shared):
        if is_shared:
            yield position, graph.operands[indices[0]][position], None
        else:
            yield position, None, [graph.operands[i][position] for i in indices]


def run_padded(executor, indices, kind):
    """One op over the instances zero-padded to the largest shape: operands
    gathered by rows where they can be, else by elements (padding reads a
    zero), or the padded result of the batch before with its padding
    selected away (or as it is, where that is safe); the result kept
    padded, each node's value its own corner of it (its place a tuple: its
    row, then a slice per axis).  Consumers read only those
    corners, so the padding's values never reach a value or a gradient
    (its gradient goes to the zero it read, which no variable holds)."""
    graph = executor.graph
    first = graph.nodes[indices[0]]
    node_type = graph.type_of[indices[0]]
    shared = graph.shared_operand[node_type]
    specs = graph.types[node_type].operands
    count = len(indices)
    values = []
    for position, shared_value, operands in _by_position(graph, indices):
        if operands is None:
            values.append(shared_value)
            continue
        shapes = [_shape_of(operand) for operand in operands]
        locations = _locations(executor, operands, specs[position])
        padded_shape = _largest(shapes)
        source = locations[0][0]
        if all(where is source and type(row) is tuple and row[0] == k
               for k, (where, row) in enumerate(locations)) and (
                tuple(source.shape) == (count, *padded_shape)):
            # The padded result of the batch before, in the same order.
            if kind == PADDED_SOFTMAX or _padding_safe(first.entry.name, shared):
                # As it is: these ops' values and gradients in an
                # instance's corner read only that corner (_PADDING_SAFE).
                values.append(source)
            else:
                # Its padding selected away to zeros (a select: whatever the
                # padding holds, inf or NaN, reaches neither value nor gradient).
                values.append(_masked(source, _corners_mask(shapes, padded_shape), 0))
            continue
        values.append(gather_elements(executor.statistics, locations, shapes,
                                      padded_shape=padded_shape))
    output_shapes = [graph.nodes[i].spec.shape for i in indices]
    padded_shape = _largest(output_shapes)
    attrs = first.attrs
    if kind == PADDED_SOFTMAX:
        # Masked logits at the dtype's lowest: exp gives an exact 0 beside
        # any real logit (a row all padding is uniform, and never read).
        values[0] = _masked(values[0], _corners_mask(output_shapes, padded_shape),
                            values[0].dtype.min)
        options = dict(zip(first.entry.attr_params, attrs))
        axis = options.get("axis")
        axis = -1 if axis is None else int(axis)
        attrs = tuple(axis + 1 if name == "axis" and axis >= 0 else value
                      for name, value in zip(first.entry.attr_params, attrs))
    batched = first.entry.call(values, attrs)
    statistics = executor.statistics
    statistics["varying_batches"][first.entry.name] += 1
    statistics["varying_instances"][first.entry.name] += count
    statistics["padding_elements"] += count * math.prod(padded_shape) - sum(
        map(math.prod, output_shapes))
    for instance, (index, shape) in enumerate(zip(indices, output_shapes)):
        executor.batched_of[index] = batched
        executor.row_of[index] = (instance, *map(slice, shape))


def _largest(shapes):
    """The shape that holds each of ``shapes`` (of one rank)."""
    return tuple(map(max, zip(*shapes)))


def _corners_mask(shapes, padded_shape):
    """True in each instance's own corner of a padded value."""
    mask = np.zeros((len(shapes), *padded_shape), bool)
    for instance, shape in enumerate(shapes):
        mask[(instance, *map(slice, shape))] = True
    return mask


def _masked(value, mask, fill):
    """``value`` where ``mask``, else ``fill`` (tf.where's op, called
    directly: its gradient reaches ``value`` only where ``mask``)."""
    return gen_math_ops.select_v2(tf.constant(mask), value,
                                  tf.constant(fill, value.dtype))


# Ops that may read the padded result of the batch before as it is, padding
# and all: with a number as the other operand their derivative is constant,
# so the padding's values (even inf or NaN) reach no value and, times the
# zero gradient every padding element gets, no gradient either.  (Softmax
# too: it selects its logits with a mask.)  A product of two instances'
# matrices does not: it sums over padding, which must be zeros.
_PADDING_SAFE = {"operator.add": (0, 1), "operator.sub": (0, 1), "operator.mul": (0, 1),
                 "math.add": (0, 1), "math.subtract": (0, 1), "math.multiply": (0, 1),
                 "operator.truediv": (0,), "math.truediv": (0,), "math.divide": (0,)}


def _padding_safe(name, shared):
    """May op ``name`` read a padded operand as it is (``_PADDING_SAFE``):
    every other operand a shared number, the padded one where allowed."""
    positions = _PADDING_SAFE.get(name, ())
    return shared.count(False) == 1 and shared.index(False) in positions


def gather_elements(statistics, locations, shapes, padded_shape=None):
    """The values at ``locations`` (as ``rows_of_locations`` takes them, or
    padded places (instance, slice, ...)) of ``shapes``, by one gather of
    their elements from the sources flattened: stacked and zero-padded to
    ``padded_shape`` if given, else every value's elements one after
    another (flat).  (Per value a few NumPy calls on ints: this runs for
    every instance of a batch over varying shapes.)"""
    if padded_shape is not None and all(
            tuple(shape[1:]) == tuple(padded_shape[1:]) for shape in shapes) and (
            _whole_rows(locations, shapes)):
        return _gather_padded_rows(statistics, locations, shapes, padded_shape)
    tables, sources, total = [], {}, 0   # sources: id -> (offset, strides)
    element_indices = []
    for (source, row), shape in zip(locations, shapes):
        shape = tuple(shape)
        known = sources.get(id(source))
        if known is None:
            source_shape = tuple(source.shape)
            # Elements per step of each axis, and of the whole source.
            strides = [math.prod(source_shape[axis + 1:])
                       for axis in range(len(source_shape))]
            known = sources[id(source)] = (total, strides)
            tables.append(eager_ops.reshape(source, (-1,)))
            total += math.prod(source_shape)
        offset, strides = known
        if type(row) is tuple:   # a padded place: its corner of the source
            found = offset + row[0] * strides[0]
            for axis, (length, stride) in enumerate(zip(shape, strides[1:])):
                found = found + (np.arange(length) * stride).reshape(
                    [-1 if a == axis else 1 for a in range(len(shape))])
            element_indices.append(np.broadcast_to(found, shape))
            continue
        if row is None:
            start = 0
        elif type(row) is slice:
            start = row.start * strides[0]
        else:
            start = row * math.prod(shape)
        element_indices.append(np.arange(offset + start, offset + start + math.prod(shape))
                               .reshape(shape))
    zero = total   # the index of a zero appended to the table
    tables.append(eager_ops.zeros((1,), tables[0].dtype))
    if padded_shape is None:
        indices = np.concatenate([i.reshape(-1) for i in element_indices])
    else:
        indices = np.full((len(shapes), *padded_shape), zero, np.int64)
        for instance, found in enumerate(element_indices):
            indices[(instance, *map(slice, found.shape))] = found
    statistics["gathers"] += 1
    return gather_rows(eager_ops.concat(tables), tf.constant(indices, tf.int32))


def _gather_padded_rows(statistics, locations, shapes, padded_shape):
    """``gather_elements`` for values whose shapes differ in the first axis
    only: one gather of rows (not elements), a padding row reading zeros."""
    tables, total, starts = _row_tables(locations, shapes)
    indices = np.full((len(shapes), padded_shape[0]), total, np.int32)   # the zero row
    columns = np.arange(padded_shape[0])
    for instance, (start, shape) in enumerate(zip(starts, shapes)):
        indices[instance, :shape[0]] = start + columns[:shape[0]]
    tables.append(eager_ops.zeros((1, *padded_shape[1:]), tables[0].dtype))
    statistics["gathers"] += 1
    return gather_rows(eager_ops.concat(tables), tf.constant(indices))


def _whole_rows(locations, shapes):
    """Whether every padded place (instance, slice, ...) covers its
    source's later axes whole: then its values are rows of the source
    ``[count, N, ...]`` read as ``[count * N, ...]`` (``_row_tables``),
    gathered as rows rather than element by element."""
    return all(type(row) is not tuple or (
        shape and tuple(shape[1:]) == tuple(source.shape[2:]) and len(row) == len(shape) + 1)
        for (source, row), shape in zip(locations, shapes))


def _row_tables(locations, shapes):
    """(tables, their total rows, each value's first row in them): each
    distinct source once, a stacked result ``[count, n, ...]`` as its rows;
    a value at ``(source, row)`` of ``shape`` starts at its source's offset
    plus 0 (the source itself), the slice's start, ``row`` times its
    length (a row of a stacked result), or for a padded place (instance,
    slice, ...) covering whole rows (``_whole_rows``) the instance's first
    row in the padded result's rows."""
    tables, offsets, starts, total = [], {}, [], 0
    for (source, row), shape in zip(locations, shapes):
        offset = offsets.get(id(source))
        if offset is None:
            table = source
            if row is not None and type(row) is not slice:   # [count, n, ...]: rows
                table = eager_ops.reshape(source, (-1, *tuple(source.shape)[2:]))
            offset = offsets[id(source)] = total
            total += table.shape[0]
            tables.append(table)
        if row is None:
            starts.append(offset)
        elif type(row) is slice:
            starts.append(offset + row.start)
        elif type(row) is tuple:
            starts.append(offset + row[0] * source.shape[1] + (row[1].start or 0))
        else:
            starts.append(offset + row * shape[0])
    return tables, total, starts


def _shape_of(operand):
    if isinstance(operand, NodeOperand):
        spec = operand.node.spec if operand.pick is None else operand.node.spec[operand.pick]
        return spec.shape
    return np.shape(operand)


def segment_softmax(logits, segment_ids, count, log=False):
    """Softmax (or log-softmax) over each segment of rows of ``logits``, as
    ``tf.nn.softmax(x, axis=0)`` computes it per instance: exp(x - max) over
    its sum.  The max is a constant shift (the result does not depend on
    it), so no gradient flows through it, as none does in TensorFlow's own
    softmax gradient."""
    largest = tf.stop_gradient(tf.math.segment_max(logits, segment_ids))
    shifted = logits - tf.gather(largest, segment_ids)
    exponentials = tf.exp(shifted)
    sums = tf.math.segment_sum(exponentials, segment_ids)
    if log:
        return shifted - tf.gather(tf.math.log(sums), segment_ids)
    return exponentials / tf.gather(sums, segment_ids)


def _row_slices(lengths):
    places, start = [], 0
    for length in lengths:
        places.append(slice(start, start + length))
        start += length
    return places


def _concatenated(executor, operands, spec):
    """The operands' rows one after another (``rows_of_locations``); Python
    lists of each instance concatenated."""
    if not any(isinstance(operand, NodeOperand) for operand in operands):
        kind = NUMPY_OF_PYTHON.get(getattr(spec, "python_type", None))
        return np.concatenate([np.asarray(operand, dtype=kind) for operand in operands])
    return rows_of_locations(executor.statistics, _locations(executor, operands, spec),
                             [_shape_of(operand) for operand in operands])


def _locations(executor, operands, spec):
    """Where each operand's value is, (source, row) as the executor keeps
    them; a NumPy or list value (of one type's instances, beside nodes of
    the same spec) is its own source."""
    kind = NUMPY_OF_PYTHON.get(getattr(spec, "python_type", None))
    return [executor._location(operand) if isinstance(operand, NodeOperand)
            else (tf.constant(np.asarray(operand, dtype=kind)), None)
            for operand in operands]


def rows_of_locations(statistics, locations, shapes):
    """The rows of values at ``locations`` ((source, row) as the executor
    keeps them: row None for the source itself, an int for row ``row`` of a
    stacked result, a slice for rows of a result over varying lengths), of
    ``shapes``, one after another: one source itself, a slice of
    it, a concat of whole sources, or one gather from their rows (whose
    gradient is one segment sum, where slices would each give a dense
    gradient of the whole source).  Values in padded results
    (``run_padded``) are rows of them where they cover whole rows
    (``_whole_rows``), else gathered element by element."""
    if not _whole_rows(locations, shapes):
        flat = gather_elements(statistics, locations, shapes)
        return eager_ops.reshape(flat, (-1, *shapes[0][1:]))
    tables, total, starts = _row_tables(locations, shapes)
    pieces = [(start, shape[0]) for start, shape in zip(starts, shapes)]
    first, expected, contiguous = pieces[0][0], pieces[0][0], True
    for start, length in pieces:
        if start != expected:
            contiguous = False
            break
        expected += length
    table = tables[0] if len(tables) == 1 else eager_ops.concat(tables)
    if len(tables) > 1:
        statistics["stacks"] += 1
    if contiguous:
        if first == 0 and expected == total:
            return table
        statistics["slices"] += 1
        return eager_ops.rows(table, first, expected)
    rows = np.concatenate([np.arange(start, start + length, dtype=np.int32)
                           for start, length in pieces])
    statistics["gathers"] += 1
    statistics["bytes_gathered"] += len(rows) * int(
        np.prod(table.shape[1:])) * table.dtype.size
    return gather_rows(table, tf.constant(rows))
