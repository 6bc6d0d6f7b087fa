"""The batched executor: runs the scheduler's batches, one op per batch.

For each batch it assembles every per-instance operand into one stacked
tensor -- the earlier batched result itself when the rows are all of it in
order, a slice when they are an in-order run of it, a gather otherwise --
runs the batch rule, and remembers each node's value as a row of the result.
Rows are taken out of batched results only when something asks for a node's
value, so intermediate nodes never cost an op of their own.  Everything runs
under the caller's GradientTape, so gradients are exact.
"""

import collections

import numpy as np
import tensorflow as tf

from ..ir.record import annotate
from ..ir.table import PATTERN_KINDS
from . import eager_ops, varying
from .graph import NodeOperand
from .plan import NUMPY_OF_PYTHON
from .rules import NoRule, rule_for


def _stacked(table, rows):
    """The operand itself: the table, a slice of it, or a gather."""
    if rows is None:
        return table
    if isinstance(rows, range):
        return eager_ops.rows(table, rows.start, rows.stop)
    return eager_ops.gather_rows(table, tf.constant(rows, tf.int32))


def _row_numbers(table, rows):
    """(table, rows as an int32 tensor), every row when ``rows`` is None:
    one form whatever the order, so a compiled pattern never retraces for
    a slice that is a gather next time."""
    if rows is None:
        return table, eager_ops.row_numbers(0, table.shape[0])
    if isinstance(rows, range):
        return table, eager_ops.row_numbers(rows.start, rows.stop)
    return table, tf.constant(rows, tf.int32)


class Executor:
    def __init__(self, graph, statistics):
        self.graph = graph
        self.statistics = statistics
        count = len(graph)
        self.batched_of = [None] * count  # batched result holding node i ...
        self.row_of = [None] * count      # ... as this row
        self.result_of = [None] * count   # or node i's own result

    # -- operands ------------------------------------------------------------
    def _location(self, operand):
        """(source tensor, row) of a node operand; row None: the value itself."""
        if operand.index < 0:
            return operand.node.location()
        index = operand.index
        batched = self.batched_of[index]
        if batched is not None:
            if operand.pick is not None:
                batched = batched[operand.pick]
            return batched, self.row_of[index]
        result = self.result_of[index]
        return (result if operand.pick is None else result[operand.pick]), None

    def _assembly(self, position, indices, operand_spec):
        """(table, rows): the operand at ``position`` of every node, stacked
        on axis 0, is the table's ``rows``.  ``rows`` is None when it is the
        whole table (an earlier result, a stack, Python values), a ``range``
        when it is an in-order run of it (a slice), else a list of row
        numbers (a gather from the concatenated sources)."""
        all_operands = self.graph.operands
        operands = [all_operands[i][position] for i in indices]
        count = len(operands)
        if not isinstance(operands[0], NodeOperand):  # Python lists, arrays
            kind = NUMPY_OF_PYTHON.get(getattr(operand_spec, "python_type", None))
            return np.array(operands, dtype=kind), None
        # The common case first, without a call per operand: rows of results
        # batched in this evaluation.
        batched_of, row_of = self.batched_of, self.row_of
        locations = []
        for operand in operands:
            source = batched_of[operand.index] if operand.index >= 0 else None
            if source is None:
                locations.append(self._location(operand))
            elif operand.pick is None:
                locations.append((source, row_of[operand.index]))
            else:
                locations.append((source[operand.pick], row_of[operand.index]))
        if self.graph.varying and any(type(row) in (slice, tuple) for _, row in locations):
            # Values that are rows of a result over varying lengths, or
            # corners of a padded result (varying.py): gathered, and stacked.
            rows = varying.rows_of_locations(
                self.statistics, locations, [operand_spec.shape] * count)
            return eager_ops.reshape(rows, (count, *operand_spec.shape)), None
        first_source, first_row = locations[0]
        if first_row is not None and all(
                source is first_source for source, _ in locations) and [
                row for _, row in locations] == list(
                range(first_row, first_row + count)):
            if first_row == 0 and count == first_source.shape[0]:
                return first_source, None
            self.statistics["slices"] += 1
            return first_source, range(first_row, first_row + count)
        if all(row is None for _, row in locations):
            self.statistics["stacks"] += 1
            return eager_ops.stack([source for source, _ in locations]), None
        # Rows of several results: one concat of the sources, one gather.
        sources, offsets, singles, rows = [], {}, [], []
        for source, row in locations:
            if row is None:
                rows.append(("single", len(singles)))
                singles.append(source)
                continue
            if id(source) not in offsets:
                offsets[id(source)] = sum(s.shape[0] for s in sources)
                sources.append(source)
            rows.append(("row", offsets[id(source)] + row))
        if singles:
            base = sum(s.shape[0] for s in sources)
            sources.append(eager_ops.stack(singles))
            rows = [r if kind == "row" else base + r for kind, r in rows]
        else:
            rows = [r for _, r in rows]
        table = sources[0] if len(sources) == 1 else eager_ops.concat(sources)
        self.statistics["gathers"] += 1
        self.statistics["bytes_gathered"] += (
            count * int(np.prod(table.shape[1:])) * table.dtype.size)
        return table, rows

    # -- running batches -----------------------------------------------------
    def run(self, indices):
        graph = self.graph
        first = graph.nodes[indices[0]]
        node_type = graph.type_of[indices[0]]
        shared = graph.shared_operand[node_type]
        statistics = self.statistics
        statistics["batches"] += 1
        statistics["batch_sizes"][len(indices)] += 1
        if len(indices) == 1 or all(shared):
            self._run_each(indices)
            return
        kind = graph.varying.get(node_type)
        if kind is not None:
            try:
                varying.run(self, indices, kind)
            except (tf.errors.OpError, ValueError, TypeError):
                self._run_each(indices)   # so the error names the instance's line
            return
        rule = rule_for(first.entry)
        if rule is None:
            statistics["unbatched"][f"{first.entry.name}: no batch rule"] += len(indices)
            self._run_each(indices)
            return
        operand_specs = graph.types[node_type].operands
        values, ranks = [], []
        # A compiled pattern takes every argument as (table, rows) and
        # gathers it itself (patterns/codegen.py); other ops take the stacked operand.
        take = _row_numbers if first.entry.node_kind in PATTERN_KINDS else _stacked
        for position, is_shared in enumerate(shared):
            operand_spec = operand_specs[position]
            if is_shared:
                value = graph.operands[indices[0]][position]
                values.append(value)
                ranks.append(len(getattr(value, "shape", ())))
            else:
                values.append(take(*self._assembly(position, indices, operand_spec)))
                ranks.append(len(operand_spec.shape))
        try:
            batched = rule(first.entry, first.attrs, values, shared, ranks,
                           first.spec if not first.entry.multi_output else first.spec[0],
                           len(indices))
        except NoRule as reason:
            statistics["unbatched"][f"{first.entry.name}: {reason}"] += len(indices)
            self._run_each(indices)
            return
        except (tf.errors.OpError, ValueError, TypeError):
            # A bad value in one instance (an index out of range...): run them
            # one by one so the error names the instance's own line.
            self._run_each(indices)
            return
        for row, index in enumerate(indices):
            self.batched_of[index] = batched
            self.row_of[index] = row

    def _values(self, operands):
        """Each operand's own value.  A node reading many rows of one batched
        result (``tf.add_n`` of a minibatch's losses) takes them from one
        unstack, whose gradient is one stack, rather than a slice per row,
        whose gradients are each a zero tensor of the whole result."""
        locations = [self._location(operand) if isinstance(operand, NodeOperand)
                     else (operand, None) for operand in operands]
        # (Fewer than 4 operands cannot read 4 rows: no count.)
        reads = collections.Counter(id(source) for source, row in locations
                                    if type(row) is int) if len(locations) >= 4 else {}
        unstacked = {}
        values = []
        for source, row in locations:
            if row is None:
                values.append(source)
            elif type(row) is int and reads.get(id(source), 0) >= 4 and (
                    2 * reads[id(source)] >= source.shape[0]):
                rows = unstacked.get(id(source))
                if rows is None:
                    rows = unstacked[id(source)] = tf.unstack(source)
                values.append(rows[row])
            elif type(row) is int:
                values.append(eager_ops.row(source, row))
            else:
                values.append(source[row])
        return values

    def _run_each(self, indices):
        graph = self.graph
        for index in indices:
            node = graph.nodes[index]
            values = self._values(graph.operands[index])
            try:
                self.result_of[index] = node.entry.call(values, node.attrs)
            except Exception as error:
                raise annotate(error, node.entry, node.site) from None

    # -- results -------------------------------------------------------------
    def write_back(self):
        """Give every node its value, in place: a row of a batched result
        (``batched``, ``row``) or its own ``result``; its inputs and site are
        dropped (its value is all anyone needs now)."""
        graph = self.graph
        for index, node in enumerate(graph.nodes):
            if node.entry.node_kind == "access":
                if node.result is None and node.batched is None:
                    source_index = graph.duplicate_of[graph.operands[index][0].index]
                    pick = node.attrs[0]
                    if self.batched_of[source_index] is not None:
                        node.batched = self.batched_of[source_index][pick]
                        node.row = self.row_of[source_index]
                    else:
                        node.result = self.result_of[source_index][pick]
            else:
                canonical = graph.duplicate_of[index]
                if self.batched_of[canonical] is not None:
                    node.batched = self.batched_of[canonical]
                    node.row = self.row_of[canonical]
                else:
                    node.result = self.result_of[canonical]
            node.inputs = ()
            node.site = None
