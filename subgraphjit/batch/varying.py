"""Batching over varying lengths: instances that differ only in their first axis.

A sentence of n tokens gives ``[n, d] @ W``, ``tanh`` of ``[n, d]``, a
``reduce_mean`` over its n rows.  Their batching signatures (graph.py) hold
every operand's full shape, so sentences of different lengths never share a
launch.  For the ops below the instances' rows are independent, so their
operands concatenated along axis 0 (``[n_1 + n_2 + ..., d]``) give, through
the very same op, every instance's rows one after another: the same per-row
arithmetic as eager, and the same gradients (TensorFlow differentiates the
concatenation and the slices).  No padding is computed.

``merge_types(graph)`` joins the types of such ops whose signatures differ
only in the first axis of their per-instance operands (the n3ldg++ idea of
signatures that leave a size out, ../shared/seeds/n3ldg-jit-batching.txt),
after ``describe_graph`` typed the nodes by full shapes; a type no other type
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
              row i is instance i's value (a stacked batch, as usual).
``SOFTMAX``   ``softmax`` / ``log_softmax`` over axis 0: a segment softmax
              (segment max, exp, segment sum), row-wise in its output.

A score matrix ``[n, n]`` differs in two axes: it keeps its full-shape type
and batches with instances of its length only.  Programs are not compiled
for an evaluation with joined types (batch/__init__.py): their buffers hold
rows of one shape.
"""

import numpy as np
import tensorflow as tf

from .graph import NodeOperand
from .plan import NUMPY_OF_PYTHON
from .rules import gather_rows

ROWS, SEGMENTS, SOFTMAX = "rows", "segments", "softmax"

_SEGMENT_OPS = {"math.reduce_sum": tf.math.segment_sum,
                "math.reduce_mean": tf.math.segment_mean,
                "math.reduce_max": tf.math.segment_max,
                "math.reduce_min": tf.math.segment_min}
_MATMUL_ROWS = ("linalg.matmul", "operator.matmul")
_MATMUL_FLAGS = ("transpose_a", "adjoint_a", "a_is_sparse", "b_is_sparse")
_ROW_WISE_LOSSES = ("nn.sparse_softmax_cross_entropy_with_logits",
                    "nn.sigmoid_cross_entropy_with_logits",
                    "nn.softmax_cross_entropy_with_logits")


def merge_types(graph):
    """Join the graph's types that differ only in the first axis of their
    per-instance operands and whose op batches over it (module docstring).
    Sets ``graph.varying``: joined type -> kind (empty if nothing joined)."""
    graph.varying = {}
    signatures = graph.signatures
    groups = {}
    for node_type, signature in enumerate(signatures):
        key = _length_free_key(signature)
        if key is not None:
            groups.setdefault(key, []).append(node_type)
    groups = [types for types in groups.values() if len(types) > 1]
    if not groups:
        return
    # Only now are nodes looked at: one example per candidate type.
    merged_into, kinds = {}, {}
    for types in groups:
        joined = []
        for node_type in types:
            example = graph.type_of.index(node_type)
            kind = _kind(graph.nodes[example], graph.operands[example],
                         graph.shared_operand[node_type], signatures[node_type])
            if kind is not None:
                joined.append((node_type, kind))
        if len(joined) < 2:
            continue
        for node_type, _ in joined:
            merged_into[node_type] = joined[0][0]
        kinds[joined[0][0]] = joined[0][1]
    if not merged_into:
        return
    # Renumber the types densely (schedulers count per type).
    number_of = {}
    kept_signatures, kept_shared = [], []
    for node_type, signature in enumerate(signatures):
        if merged_into.get(node_type, node_type) == node_type:
            number_of[node_type] = len(kept_signatures)
            kept_signatures.append(signature)
            kept_shared.append(graph.shared_operand[node_type])
    renumber = [number_of[merged_into.get(t, t)] for t in range(len(signatures))]
    renumber.append(-1)   # type_of's -1 (not scheduled) indexes this
    graph.type_of = [renumber[t] for t in graph.type_of]
    graph.signatures, graph.shared_operand = kept_signatures, kept_shared
    graph.varying = {number_of[t]: kind for t, kind in kinds.items()}
    graph._type_names = None


def _length_free_key(signature):
    """The signature with each per-instance operand's first axis left out,
    or None when no operand has one to leave out.  (A signature is (row,
    attrs, attr types, a part per operand): a Spec per per-instance operand,
    a tuple for a shared one; see graph.py.)"""
    row = signature[0]
    if row.multi_output or row.family not in (
            "elementwise", "broadcasting", "matmul", "reduction", "gather", "loss"):
        return None
    parts = []
    varies = False
    for part in signature[3:]:
        if type(part) is tuple:   # shared: by identity or value, as it is
            parts.append(part)
        elif not part.shape:
            return None
        else:
            varies = True
            parts.append((part.dtype, part.python_type, part.shape[1:]))
    if not varies:
        return None
    return (row, signature[1], signature[2], tuple(parts))


def _kind(node, operands, shared, signature):
    """How nodes of this type batch over their first axis (ROWS, SEGMENTS,
    SOFTMAX), or None if they cannot.  A type's specs and shared operands
    are its nodes', so one node decides for all."""
    row, output = node.row, node.spec
    if isinstance(output, tuple) or output.dtype is None:
        return None
    specs = [None if is_shared else part for part, is_shared in zip(signature[3:], shared)]
    rows = [spec.shape[0] for spec in specs if spec is not None]
    if min(rows) < 1:
        return None   # an empty instance: segment ops differ from reductions there
    options = dict(zip(row.attr_params, node.attrs))
    output_rows = output.shape[0] if output.shape else None
    family = row.family

    def rows_match():
        return all(spec is None or spec.shape[0] == output_rows for spec in specs)

    if family == "elementwise":
        return ROWS if rows_match() else None
    if family == "broadcasting":
        if row.name == "nn.bias_add" and options.get("data_format") not in (None, "NHWC"):
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
        if (row.name not in _MATMUL_ROWS or tuple(shared) != (False, True)
                or any(options.get(flag) for flag in _MATMUL_FLAGS)
                or len(specs[0].shape) != 2 or len(tuple(operands[1].shape)) != 2):
            return None
        return ROWS
    if family == "gather":
        if (row.name not in ("gather", "nn.embedding_lookup")
                or tuple(shared) != (True, False)
                or options.get("axis") not in (None, 0)
                or options.get("batch_dims") not in (None, 0)
                or options.get("max_norm") is not None):
            return None
        return ROWS if rows_match() else None
    if family == "loss":
        if row.name not in _ROW_WISE_LOSSES or any(shared) or not rows_match():
            return None
        axis = options.get("axis", -1)
        if axis is not None and int(axis) % len(specs[1].shape) == 0:
            return None
        return ROWS
    if family == "reduction":
        return _reduction_kind(row, options, specs[0], output, rows_match())
    return None


def _reduction_kind(row, options, spec, output, rows_match):
    rank = len(spec.shape)
    axis = options.get("axis")
    if row.name in ("nn.softmax", "nn.log_softmax"):
        axis = -1 if axis is None else axis
        if not isinstance(axis, (int, np.integer)) or not spec.dtype.is_floating:
            return None
        return SOFTMAX if int(axis) % rank == 0 else (ROWS if rows_match else None)
    if axis is None:
        if row.name in ("math.argmax", "math.argmin"):
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
    if axes == {0} and row.name in _SEGMENT_OPS and (
            spec.dtype.is_floating or row.name != "math.reduce_mean"):
        return SEGMENTS
    return None


# -- running a batch -------------------------------------------------------------

def run(executor, indices, kind):
    """Run the nodes ``indices`` of one joined type as one op over their
    concatenated rows; record each node's value as rows of the result."""
    graph = executor.graph
    first = graph.nodes[indices[0]]
    node_type = graph.type_of[indices[0]]
    shared = graph.shared_operand[node_type]
    specs = graph.signatures[node_type][3:]
    varying_position = shared.index(False)
    lengths = [_rows_of(graph.operands[i][varying_position]) for i in indices]
    # Instances in order of length (stable): then the rows of each length are
    # one run of the result, which the ops batched per length (score
    # matrices) read as a slice, and the next batch over varying lengths,
    # in the same order, reads as a whole.
    order = sorted(range(len(indices)), key=lengths.__getitem__)
    indices = [indices[k] for k in order]
    lengths = [lengths[k] for k in order]
    values = []
    for position, is_shared in enumerate(shared):
        if is_shared:
            values.append(graph.operands[indices[0]][position])
            continue
        operands = [graph.operands[i][position] for i in indices]
        values.append(_concatenated(executor, operands, specs[position]))
    statistics = executor.statistics
    statistics["varying_batches"][first.row.name] += 1
    statistics["varying_instances"][first.row.name] += len(indices)
    if kind == ROWS:
        batched = first.row.call(values, first.attrs)
        places = _row_slices(lengths)
    else:
        segment_ids = tf.constant(np.repeat(np.arange(len(indices), dtype=np.int32),
                                            lengths))
        if kind == SEGMENTS:
            batched = _SEGMENT_OPS[first.row.name](values[0], segment_ids)
            if dict(zip(first.row.attr_params, first.attrs)).get("keepdims"):
                batched = tf.expand_dims(batched, 1)
            places = range(len(indices))
        else:
            batched = segment_softmax(values[0], segment_ids, len(indices),
                                      log=first.row.name == "nn.log_softmax")
            places = _row_slices(lengths)
    for index, place in zip(indices, places):
        executor.batch_of[index] = batched
        executor.row_of[index] = place


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


def _rows_of(operand):
    """The first axis of a per-instance operand (its instance's length)."""
    if isinstance(operand, NodeOperand):
        spec = operand.node.spec if operand.pick is None else operand.node.spec[operand.pick]
        return spec.shape[0]
    return len(operand)


def _concatenated(executor, operands, spec):
    """The operands' rows one after another (``rows_of_locations``); Python
    lists of each instance concatenated."""
    if not isinstance(operands[0], NodeOperand):
        kind = NUMPY_OF_PYTHON.get(getattr(spec, "python_type", None))
        return np.concatenate([np.asarray(operand, dtype=kind) for operand in operands])
    return rows_of_locations(executor.statistics,
                             [executor._location(operand) for operand in operands],
                             [_rows_of(operand) for operand in operands])


def rows_of_locations(statistics, locations, lengths):
    """The rows of values at ``locations`` ((source, row) as the executor
    keeps them: row None for the source itself, an int for row ``row`` of a
    stacked batch, a slice for rows of a batch over varying lengths), of
    ``lengths`` rows each, one after another: one source itself, a slice of
    it, a concat of whole sources, or one gather from their rows (whose
    gradient is one segment sum, where slices would each give a dense
    gradient of the whole source)."""
    tables, offsets, pieces, total = [], {}, [], 0
    for (source, row), length in zip(locations, lengths):
        offset = offsets.get(id(source))
        if offset is None:
            table = source
            if row is not None and type(row) is not slice:   # [count, n, ...]: rows
                table = tf.reshape(source, (-1, *source.shape[2:]))
            offset = offsets[id(source)] = total
            total += table.shape[0]
            tables.append(table)
        if row is None:
            start = 0
        elif type(row) is slice:
            start = row.start
        else:
            start = row * length
        pieces.append((offset + start, length))
    first, expected, contiguous = pieces[0][0], pieces[0][0], True
    for start, length in pieces:
        if start != expected:
            contiguous = False
            break
        expected += length
    table = tables[0] if len(tables) == 1 else tf.concat(tables, 0)
    if len(tables) > 1:
        statistics["stacks"] += 1
    if contiguous:
        if first == 0 and expected == total:
            return table
        statistics["slices"] += 1
        return table[first:expected]
    rows = np.concatenate([np.arange(start, start + length, dtype=np.int32)
                           for start, length in pieces])
    statistics["gathers"] += 1
    statistics["bytes_gathered"] += len(rows) * int(
        np.prod(table.shape[1:])) * table.dtype.size
    return gather_rows(table, tf.constant(rows))
