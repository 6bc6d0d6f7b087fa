"""Running a program as one compiled TensorFlow call.

The whole forward of an evaluation -- every step's operand gathers, batch
rules and patterns (their ops inline) -- is traced once into a tf.function per
program key (``plan.py``) and called with the program's row arrays as
tensors.  Under the user's GradientTape that is one recorded op, whose
gradient TensorFlow derives from the function: the backward is one call
too, and gradients keep their types (a variable's rows looked up inside
give an IndexedSlices, as eagerly).

Tracing, and TensorFlow deriving the gradient graph at the first run
under a tape, cost seconds for a program of a few thousand ops, so a key is
compiled only once it has been seen ``compile`` times; until then, and for
programs that cannot be traced (operands an op refuses in a graph), the
step-by-step executor runs it.
"""

import collections
import time

import numpy as np
import tensorflow as tf

from ..patch.spec import is_variable
from .plan import ROWS, SHARED, VALUES
from .rules import NoRule, gather_rows, rule_for

# A compiled program is kept for this many distinct keys (least recently
# used first out), so a run of ever-new shapes holds a bounded number.
CAPACITY = 64
# Programs of more steps run step by step: tracing costs about a millisecond
# a step, and a graph of many node types (single ops rather than patterns)
# has many empty steps in every round.
MAX_STEPS = 400


class _Entry:
    __slots__ = ("sightings", "function", "program")

    def __init__(self):
        self.sightings = 0
        self.function = None   # the concrete function, once compiled
        self.program = None    # the program traced (keeps its variables alive)


class Programs:
    """The compiled programs of this process, by key."""

    def __init__(self):
        self._entries = collections.OrderedDict()

    def clear(self):
        self._entries.clear()

    def function_for(self, program, compile_after, statistics):
        """The compiled function for ``program``, compiling it if its key has
        now been seen ``compile_after`` times; None: run it step by step."""
        if not compile_after or len(program.steps) > MAX_STEPS:
            return None
        entry = self._entries.get(program.key)
        if entry is None:
            entry = self._entries[program.key] = _Entry()
            if len(self._entries) > CAPACITY:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(program.key)
        entry.sightings += 1
        if entry.function is None and entry.sightings >= compile_after \
                and entry.program is None:
            started = time.perf_counter()
            entry.program = program
            try:
                entry.function = _compile(program)
                statistics["programs_compiled"] += 1
            except (NoRule, ValueError, TypeError) as reason:
                # Operands an op refuses in a graph (a dtype TensorFlow
                # converts only eagerly): this key runs step by step.
                statistics["programs_not_compiled"][str(reason)] += 1
            statistics["compile_seconds"] += time.perf_counter() - started
        elif entry.function is not None:
            statistics["program_cache_hits"] += 1
        return entry.function


PROGRAMS = Programs()


def arguments(program):
    """The compiled function's arguments for this program: every ROWS
    operand's rows packed into one array with their lengths, then the
    stacked Python values, shared tensors and earlier evaluations' values,
    in step order."""
    rows, extra = [], []
    for step in program.steps:
        for operand in step.operands:
            if operand.kind == ROWS:
                rows.append(operand.rows)
                if operand.externals:
                    extra.append(tf.stack([node.value() for node in operand.externals]))
            elif operand.kind == VALUES:
                extra.append(tf.constant(operand.value))
            elif isinstance(operand.value, tf.Tensor):
                extra.append(operand.value)
    packed = np.concatenate(rows) if rows else np.zeros(0, np.int32)
    lengths = np.array([len(r) for r in rows], np.int32)
    return [tf.constant(packed), tf.constant(lengths), *extra]


def _compile(program):
    """Trace ``program`` into a concrete function of ``arguments(program)``
    returning each buffer (every step's results of one spec, in order)."""
    signature = [tf.TensorSpec((None,), tf.int32), tf.TensorSpec((None,), tf.int32)]
    rows_operands = 0
    for step in program.steps:
        for operand in step.operands:
            if operand.kind == ROWS:
                rows_operands += 1
                if operand.externals:
                    spec = program.buffers[operand.buffer]
                    signature.append(tf.TensorSpec((None, *spec.shape), spec.dtype))
            elif operand.kind == VALUES:
                signature.append(tf.TensorSpec((None, *operand.value.shape[1:]),
                                               tf.as_dtype(operand.value.dtype)))
            elif isinstance(operand.value, tf.Tensor):
                signature.append(tf.TensorSpec(operand.value.shape, operand.value.dtype))

    def run_program(packed_rows, lengths, *extra):
        row_arrays = iter(tf.split(packed_rows, lengths, num=rows_operands)
                          if rows_operands else ())
        extra = iter(extra)
        buffers = [[] for _ in program.buffers]
        tables = {}   # (buffer, results in it) -> their concatenation
        for step in program.steps:
            values, shared, ranks, count = [], [], [], None
            pattern = step.row.family == "pattern" and not step.every_operand_shared
            for operand in step.operands:
                if operand.kind == SHARED:
                    value = operand.value
                    if isinstance(value, tf.Tensor) and not is_variable(value):
                        value = next(extra)
                    values.append(value)
                    shared.append(True)
                    ranks.append(len(getattr(value, "shape", ())))
                    continue
                if operand.kind == VALUES:
                    value = next(extra)
                    rank = len(operand.value.shape) - 1
                else:
                    rows = next(row_arrays)
                    table = _table(program, buffers, operand.buffer, tables)
                    if operand.externals:
                        table = tf.concat([table, next(extra)], 0)
                    value = (table, rows) if pattern else gather_rows(table, rows)
                    rank = len(program.buffers[operand.buffer].shape)
                if count is None:
                    count = tf.shape(value[1] if pattern else value)[0]
                values.append(value)
                shared.append(False)
                ranks.append(rank)
            results = _run_step(step, values, shared, ranks, count)
            if not step.row.multi_output:
                results = [results]
            for (buffer, _), result in zip(step.outputs, results):
                buffers[buffer].append(result)
        return [parts[0] if len(parts) == 1 else tf.concat(parts, 0)
                for parts in buffers]

    return tf.function(run_program, autograph=False,
                       input_signature=signature).get_concrete_function()


def _table(program, buffers, buffer, tables):
    """Every result in ``buffer`` so far, as one tensor; operands of later
    steps reading it again reuse the concatenation."""
    parts = buffers[buffer]
    key = (buffer, len(parts))
    table = tables.get(key)
    if table is None:
        if not parts:   # read by a step with no rows, or only from externals
            spec = program.buffers[buffer]
            table = tf.zeros((0, *spec.shape), spec.dtype)
        else:
            table = parts[0] if len(parts) == 1 else tf.concat(parts, 0)
        tables[key] = table
    return table


def _run_step(step, values, shared, ranks, count):
    """The step's results, stacked over its instances (a list of them for
    a multi-output op)."""
    row, attrs = step.row, step.attrs
    if step.every_operand_shared:   # count known: the key holds it
        results = [row.call(values, attrs) for _ in step.indices]
        if row.multi_output:
            return [tf.stack(outputs) for outputs in zip(*results)]
        return tf.stack(results)
    pattern = row.family == "pattern"
    rule = _traced_pattern if pattern else rule_for(row)
    if rule is not None:
        output_spec = step.spec[0] if row.multi_output else step.spec
        try:
            return rule(row, attrs, values, shared, ranks, output_spec, count)
        except NoRule:
            pass
        if any(shared):
            # The rule refuses a shared operand (a concat of each instance's
            # row with the same zeros): give every instance the value as a row.
            rows = [_as_rows(value, count, pattern) if is_shared else value
                    for value, is_shared in zip(values, shared)]
            try:
                return rule(row, attrs, rows, [False] * len(rows), ranks,
                            output_spec, count)
            except NoRule:
                pass
    return _each_instance(step, values, shared, count, pattern)


def _each_instance(step, values, shared, count, pattern):
    """The op run once per instance, in a loop over the step's rows (their
    number is known only when the program runs)."""
    row, attrs = step.row, step.attrs
    if pattern:   # (table, rows) pairs
        values = [value if is_shared else gather_rows(*value)
                  for value, is_shared in zip(values, shared)]
    specs = step.spec if row.multi_output else [step.spec]
    signature = [tf.TensorSpec(spec.shape, spec.dtype) for spec in specs]

    def one(instance):
        result = row.call([value if is_shared else value[instance]
                           for value, is_shared in zip(values, shared)], attrs)
        return list(result) if row.multi_output else [result]

    results = tf.map_fn(one, tf.range(count), fn_output_signature=signature)
    return results if row.multi_output else results[0]


def _traced_pattern(row, attrs, values, shared, ranks, output_spec, count):
    """The pattern batch rule, with the pattern's ops in the program's own
    graph."""
    if any(shared):
        raise NoRule("a pattern argument is shared")
    return row.pattern.traced(values)


def _as_rows(value, count, pattern):
    table = tf.expand_dims(tf.convert_to_tensor(value), 0)
    rows = tf.zeros([count], tf.int32)
    return (table, rows) if pattern else gather_rows(table, rows)


def run(program, function, graph, statistics):
    """Run the compiled ``function`` of ``program`` and leave each node's
    value as its row of a returned buffer."""
    outputs = function(*arguments(program))
    statistics["program_runs"] += 1
    statistics["program_steps"] += len(program.steps)
    for step in program.steps:
        if step.indices:
            statistics["batches"] += 1
            statistics["batch_sizes"][len(step.indices)] += 1
            if rule_for(step.row) is None and len(step.indices) > 1:
                statistics["unbatched"][f"{step.row.name}: no batch rule"] += \
                    len(step.indices)
    for index, node in enumerate(graph.nodes):
        location = program.location(index)
        if location is not None:
            if isinstance(location, list):   # a multi-output node
                node.batch = [outputs[buffer] for buffer, _ in location]
                node.batch_row = tuple(row for _, row in location)
            else:
                node.batch, node.batch_row = outputs[location[0]], location[1]
        node.inputs = ()
        node.site = None
        if node.consumers == 0 and node.batch is not None:
            # A node nothing reads, such as the loss, is what the user
            # differentiates, often after the tape has stopped recording:
            # its row is taken now, while the tape sees the op.
            node.value()
