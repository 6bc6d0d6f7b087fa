"""Code generation: a frequent subgraph becomes a compiled TensorFlow function
(thesis section 5.4).

The pattern's structural key (see ``signature.py``) is turned back into
Python source, one TensorFlow call per line, in the thesis's naming: the root
is ``v``, its operands ``v_0``, ``v_1``, theirs ``v_0_0``... and a node reached
twice keeps the name it got first (figure 5.2, ``dag_func_2``).  The source is
registered with ``linecache``, so it shows in tracebacks and in
``subgraphjit.patterns()``.

Per-instance inputs (recorded nodes) become the function's arguments.  Shared parameters (tf.Variables and tensors, whose
identity is part of the signature) are captured by name, and Python numbers
(whose value is) are written as literals.

Each pattern runs two ways, each compiled once per input shapes with
tf.function (a new batch size never retraces) and called as the concrete
function, which skips tf.function's per-call signature matching:

* ``call``: on one instance, the generated function itself;
* ``batched``: on a whole group at once, every per-instance argument stacked
  along a new leading axis; each line runs through the batching layer's rule
  for its op (``batcher/rules.py``), the same rules single ops batch with.
  Every argument arrives as a table and the rows to take from it, gathered
  inside the function: a gather costs no launch of its own, and an argument
  that is a slice one time and a gather the next does not retrace.

A ``FusedPattern`` runs two patterns, one reading the other's outputs, as
one compiled function (see ``search.py`` for when they are joined).
"""

import dataclasses
import inspect
import itertools
import linecache
import operator

import numpy as np
import tensorflow as tf

from .. import overlap
from ..batcher.eager_ops import gather_rows
from ..batcher.rules import NoRule, register_family_rule, rule_for
from ..context import context
from ..ir import spec as specs
from ..ir.node import EAGER_TENSOR
from ..ir.record import infer_spec
from ..ir.spec import VARIABLE, classify_operand, dtype_of, is_variable
from ..ir.table import ACCESS, ENTRIES_BY_NAME, GETITEM, LOOKUP, WHOLE, OpEntry

_pattern_numbers = itertools.count(1)


@dataclasses.dataclass
class Step:
    """One line of a pattern: ``name = entry(operands, attrs)``."""
    name: str
    entry: OpEntry
    attrs: tuple
    operands: list   # ("name", variable name) or ("literal", Python number)


class _Compiled:
    """How a pattern runs: ``call`` on one instance, ``batched`` on many.

    A subclass provides ``function`` (the per-instance Python function) and
    ``stacked_body(argument_specs)`` (the pattern as a function of its
    stacked arguments; raises NoRule if some op has no batch rule)."""

    def call(self, values, attrs=()):
        """The pattern on one instance's arguments.  (A lookup's row numbers
        may come as a list: ``signature.looked_up_rows``.)"""
        values = [value if hasattr(value, "dtype") else tf.convert_to_tensor(value)
                  for value in values]
        key = tuple(_spec_key(value) for value in values)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = tf.function(
                self._counting(self.function), autograph=False,
                input_signature=[tf.TensorSpec(shape, dtype) for dtype, shape in key]
            ).get_concrete_function()
        return compiled(*values)

    def batched(self, arguments):
        """The pattern on every instance at once.  ``arguments[i]`` is a pair
        (table, rows): argument i of all instances, stacked along axis 0, is
        the table's ``rows``, gathered inside the compiled function (so a
        gather costs no launch, and no gradient op, of its own).  Raises
        NoRule when an op of the pattern has no batch rule for these
        operands."""
        key = tuple((table.dtype, tuple(table.shape[1:])) for table, _ in arguments)
        compiled = self._batched.get(key)
        if compiled is None:
            compiled = self._batched[key] = self._compile_batched(key)
        if isinstance(compiled, NoRule):
            raise compiled
        flat = [tensor for pair in arguments for tensor in pair]
        if all(type(tensor) is EAGER_TENSOR for tensor in flat):
            # Tensors of the key's specs: called flat, without matching
            # them to the signature again (235-274 us a call, against
            # 99-124 flat).
            return overlap.call(compiled, flat)
        return compiled(*flat)

    def traced(self, arguments):
        """``batched``, its ops traced into the caller's graph rather than
        called as a function of their own (inside a compiled program a
        nested call costs far more than the ops it runs)."""
        key = tuple((table.dtype, tuple(table.shape[1:])) for table, _ in arguments)
        body = self._bodies.get(key)
        if body is None:
            body = self._bodies[key] = self.stacked_body(
                [specs.spec(dtype, shape) for dtype, shape in key])
        return body([gather_rows(table, rows) for table, rows in arguments])

    def _compile_batched(self, key):
        """The concrete function for these argument specs (see ``batched``),
        or the NoRule that prevents one.  Called directly, a concrete
        function skips tf.function's per-call signature matching."""
        try:
            def run_batched(*flat):
                # ``flat``: each argument's table, then the rows to take from it.
                return self.traced(list(zip(flat[::2], flat[1::2])))

            input_signature = []
            for dtype, shape in key:
                input_signature += [tf.TensorSpec((None,) + shape, dtype),
                                    tf.TensorSpec((None,), tf.int32)]
            return tf.function(
                self._counting(run_batched), autograph=False,
                input_signature=input_signature).get_concrete_function()
        except NoRule as reason:  # also when raised while tracing
            return reason

    def _load(self, namespace, entry_name, multi_output, node_kind):
        """Run the source (registered, so it shows in tracebacks); set
        ``function``, the caches of compiled calls and the op entry (of
        ``node_kind``) that recorded nodes running the pattern get."""
        filename = f"<subgraphjit {self.function_name}>"
        linecache.cache[filename] = (len(self.source), None,
                                     self.source.splitlines(True), filename)
        exec(compile(self.source, filename, "exec"), namespace)
        self.function = namespace[self.function_name]
        self._compiled = {}      # per-instance argument specs -> concrete function
        self._batched = {}       # stacked argument specs -> concrete function or NoRule
        self._bodies = {}        # stacked argument specs -> stacked_body, for ``traced``
        self.entry = OpEntry(entry_name, None, "pattern", tensors=len(self.arguments),
                             multi_output=multi_output, node_kind=node_kind)
        self.entry.call = self.call
        self.entry.pattern = self

    def __repr__(self):
        return f"<{self.function_name}: {self.op_count} ops, {self.matches} matches>"

    def _counting(self, function):
        def traced(*arguments):
            context.pattern_traces += 1  # runs once per trace, not per call
            return function(*arguments)
        return traced


def batch_rule(entry, attrs, values, shared, ranks, output_spec, count):
    """The batch rule of the entries compiled patterns record (family
    "pattern"): every instance at once.  Unlike other rules it takes each
    operand as a (table, rows) pair, and the compiled function gathers the
    rows itself."""
    if any(shared):
        raise NoRule("a pattern argument is shared")
    return entry.pattern.batched(values)


register_family_rule("pattern", batch_rule)


class Pattern(_Compiled):
    """A frequent subgraph, with its source and its compiled functions."""

    def __init__(self, signature, example_inputs, occurrences=0):
        self.number = next(_pattern_numbers)
        self.signature = signature
        self.occurrences = occurrences   # in the collection stage
        self.matches = 0                 # nodes replaced since
        self.function_name = f"pattern_{self.number}"
        (self.steps, self.arguments, self.argument_positions,
         self.captured) = _steps(signature.key, example_inputs)
        self.op_count = sum(step.entry.node_kind != "access" for step in self.steps)
        # Lines looking up rows of a captured variable.  Run batched, each
        # instance looks up its own rows even where the index is a constant,
        # so that the gradient has an entry per instance, as eager's has.
        self.variable_lookups = {
            step.name for step in self.steps
            if step.entry.looks_up_rows(step.attrs) and is_variable(
                self.captured.get(step.operands[step.entry.gathers_from][1]))}
        self.gathers_variable_rows = bool(self.variable_lookups)
        self.source, unrenderable = _source(self)
        self._load({"tf": tf, "operator": operator, **self.captured,
                    **{f"attr_{index}": value for index, value in
                       enumerate(unrenderable)}},
                   f"pattern.{self.number}", self.steps[-1].entry.multi_output,
                   "pattern")

    def _propagate_specs(self, argument_specs):
        """Each line's per-instance output spec for these argument specs, and
        the specs of lines computed from shared values alone."""
        per_instance = dict(zip(self.arguments, argument_specs))
        shared = {}
        for step in self.steps:
            operands = [self._operand_spec(operand, per_instance, shared)
                        for operand in step.operands]
            instance = step.name in self.variable_lookups or any(
                kind == "name" and name in per_instance
                for kind, name in step.operands)
            if step.entry.node_kind == "access":
                target = per_instance if instance else shared
                target[step.name] = operands[0][step.attrs[0]]
                continue
            try:
                output_spec = infer_spec(step.entry, step.attrs, operands)
            except Exception as error:
                raise NoRule(f"{step.entry.name} in {self.function_name}: {error}") from None
            (per_instance if instance else shared)[step.name] = output_spec
        return per_instance

    def _operand_spec(self, operand, per_instance, shared):
        kind, value = operand
        if kind == "literal":
            return value
        if value in per_instance:
            return per_instance[value]
        if value in shared:
            return shared[value]
        return self.captured[value]

    def output_spec(self, argument_specs):
        """The per-instance output spec for these argument specs."""
        return self._propagate_specs(argument_specs)["v"]

    @property
    def captured_values(self):
        """The shared parameters the source reads by name, in one order: a
        compiled program passes them to ``stacked_body``'s function."""
        return list(self.captured.values())

    @property
    def captured_reads(self):
        """Per captured value, in that order, how the lines read it: a set
        of LOOKUP (its rows looked up: a variable whose gradient keeps an
        entry per lookup) and WHOLE (any other read)."""
        reads = {name: set() for name in self.captured}
        for step in self.steps:
            for position, (kind, name) in enumerate(step.operands):
                if kind == "name" and name in reads:
                    reads[name].add(LOOKUP if step.name in self.variable_lookups
                                    and position == step.entry.gathers_from else WHOLE)
        return [frozenset(reads[name]) for name in self.captured]

    def stacked_body(self, argument_specs):
        """The pattern as a function of its stacked arguments (a list), each
        line through its op's batch rule; optionally given the values to use
        for ``captured_values`` (a program's own stand-ins for them)."""
        steps, arguments, captured = self.steps, self.arguments, self.captured
        instance_specs = self._propagate_specs(argument_specs)
        variable_lookups = self.variable_lookups

        def run_stacked(stacked, captured_values=None):
            count = tf.shape(stacked[0])[0]
            values = dict(zip(arguments, stacked))   # stacked per-instance values
            # One value for all instances.
            shared_values = (dict(captured) if captured_values is None
                             else dict(zip(captured, captured_values)))
            for step in steps:
                operands, shared, ranks = [], [], []
                for kind, name in step.operands:
                    if kind == "name" and name in values:
                        operands.append(values[name])
                        shared.append(False)
                        operand_spec = instance_specs[name]
                        ranks.append(None if isinstance(operand_spec, tuple)
                                     else len(operand_spec.shape))
                    else:
                        value = name if kind == "literal" else shared_values[name]
                        operands.append(value)
                        shared.append(True)
                        ranks.append(len(getattr(value, "shape", ())))
                if step.name in variable_lookups:
                    for position in step.entry.index_positions:
                        if shared[position]:   # the same rows for every instance
                            operands[position] = tf.repeat(
                                tf.expand_dims(operands[position], 0), count, 0)
                            shared[position] = False
                if all(shared):
                    shared_values[step.name] = (
                        operands[0][step.attrs[0]] if step.entry.node_kind == "access"
                        else step.entry.call(operands, step.attrs))
                    continue
                if step.entry.node_kind == "access":
                    values[step.name] = operands[0][step.attrs[0]]
                    continue
                rule = rule_for(step.entry)
                if rule is None:
                    raise NoRule(f"{step.entry.name} has no batch rule")
                output_spec = instance_specs[step.name]
                values[step.name] = rule(
                    step.entry, step.attrs, operands, shared, ranks,
                    output_spec[0] if step.entry.multi_output else output_spec, count)
            return values["v"]

        return run_stacked

    def __str__(self):
        """A few lines for ``subgraphjit.patterns()``."""
        return (f"{self.function_name}: signature {self.signature.digest:032x}, "
                f"{self.occurrences} occurrences while collecting, "
                f"{self.matches} matched since, {self.op_count} ops\n{self.source}")


class FusedPattern(_Compiled):
    """Two patterns run as one: ``producer``, a pattern with several outputs
    (a ``tf.split``), and ``consumer``, a pattern that reads some of them.
    Its outputs are the producer's, then the consumer's.

    ``wiring`` says where each consumer argument comes from: ("output", k),
    the producer's output k; ("argument", i), argument i of the fused
    pattern (the producer's come first, then the consumer's own).  One
    launch for both halves of a cell that the multi-consumer rule (thesis
    5.5) cut in two: the Tree-LSTM's gates and its memory cell."""

    def __init__(self, producer, consumer, wiring, extra_count):
        self.number = next(_pattern_numbers)
        self.producer, self.consumer, self.wiring = producer, consumer, wiring
        self.matches = 0
        self.op_count = producer.op_count + consumer.op_count
        self.gathers_variable_rows = (producer.gathers_variable_rows
                                      or consumer.gathers_variable_rows)
        self.function_name = (f"{producer.function_name}_then_"
                              f"{consumer.function_name.removeprefix('pattern_')}")
        self.arguments = [f"x_{index}" for index in
                          range(len(producer.arguments) + extra_count)]
        self.source = self._render_source()
        self._load({producer.function_name: producer.function,
                    consumer.function_name: consumer.function},
                   f"pattern.{producer.number}+{consumer.number}", True, "fused")

    def _render_source(self):
        producer_count = len(self.producer.arguments)
        consumer_operands = [
            f"v[{place}]" if kind == "output" else self.arguments[place]
            for kind, place in self.wiring]
        return "\n".join([
            f"def {self.function_name}({', '.join(self.arguments)}):",
            f'    """{self.producer.function_name}, then '
            f'{self.consumer.function_name} on its outputs, in one call."""',
            f"    v = {self.producer.function_name}"
            f"({', '.join(self.arguments[:producer_count])})",
            f"    w = {self.consumer.function_name}({', '.join(consumer_operands)})",
            "    return (*v, w)"]) + "\n"

    def __str__(self):
        return (f"{self.function_name}: {self.producer.function_name} and "
                f"{self.consumer.function_name} in one call, {self.matches} "
                f"matched, {self.op_count} ops\n{self.source}")

    def _consumer_arguments(self, arguments, producer_outputs):
        return [producer_outputs[place] if kind == "output" else arguments[place]
                for kind, place in self.wiring]

    def stacked_body(self, argument_specs):
        producer_count = len(self.producer.arguments)
        producer_specs = argument_specs[:producer_count]
        produce = self.producer.stacked_body(producer_specs)
        consume = self.consumer.stacked_body(self._consumer_arguments(
            argument_specs, self.producer.output_spec(producer_specs)))

        def run_stacked(stacked, captured_values=None):
            split = len(self.producer.captured)
            mine, theirs = ((None, None) if captured_values is None else
                            (captured_values[:split], captured_values[split:]))
            outputs = produce(stacked[:producer_count], mine)
            return (*outputs, consume(self._consumer_arguments(stacked, outputs),
                                      theirs))

        return run_stacked

    @property
    def captured_values(self):
        return self.producer.captured_values + self.consumer.captured_values

    @property
    def captured_reads(self):
        return self.producer.captured_reads + self.consumer.captured_reads


def _spec_key(value):
    return dtype_of(value), tuple(value.shape)


# -- from a structural key to steps -------------------------------------------

def _steps(key, example_inputs):
    """Walk the key as the signer walked the subgraph (operands first, in
    order) and name every value by its path from the root."""
    steps, arguments, positions, captured = [], [], [], {}
    trail = []       # names of nodes in visiting order (for shared markers)
    inputs = iter(enumerate(example_inputs))

    def emit(key, name):
        label, children = key
        kind = label[0]
        if kind == "shared":
            return ("name", trail[label[1]])
        if kind == "op":
            operands = [emit(child, f"{name}_{index}")
                        for index, child in enumerate(children)]
            steps.append(Step(name, ENTRIES_BY_NAME[label[1]], label[2], operands))
            trail.append(name)
            return ("name", name)
        if kind == "output":
            source = emit(children[0], f"{name}_0")
            steps.append(Step(name, ACCESS, (label[1],), [source]))
            return ("name", name)
        position, value = next(inputs)
        if kind == "input":
            trail.append(name)
            arguments.append(name)
            positions.append(position)
        elif kind == "value":
            arguments.append(name)
            positions.append(position)
        elif kind in ("parameter", "tensor"):
            captured[name] = value
        elif kind == "constant":
            return ("literal", value)
        else:
            raise ValueError(f"unknown signature label {label!r}")
        return ("name", name)

    emit(key, "v")
    leftover = next(inputs, None)
    if leftover is not None:
        raise ValueError("the example's inputs do not fit its signature")
    return steps, arguments, positions, captured


# -- source text ----------------------------------------------------------------

def _source(pattern):
    """The pattern's source, and the attribute values it names ``attr_<i>``
    because they have no literal form."""
    unrenderable = []
    lines = [f"def {pattern.function_name}({', '.join(pattern.arguments)}):",
             f'    """Signature {pattern.signature.digest:032x} '
             f'({pattern.op_count} ops)."""']
    for name, value in pattern.captured.items():
        lines.append(f"    # {name}: {_describe_captured(value)}")
    for step in pattern.steps:
        lines.append(f"    {step.name} = {_render_call(step, unrenderable)}")
    lines.append("    return v")
    return "\n".join(lines) + "\n", unrenderable


def _describe_captured(value):
    kind = "tf.Variable" if classify_operand(value) == VARIABLE else "tensor"
    name = getattr(value, "name", None) if kind == "tf.Variable" else None
    return f"{kind} {name or ''} {tuple(value.shape)} {dtype_of(value).name}".replace("  ", " ")


def _render_call(step, unrenderable):
    operands = [name if kind == "name" else repr(name)
                for kind, name in step.operands]
    entry = step.entry
    attrs = entry.thaw(step.attrs) if entry.thaw else step.attrs
    if entry.node_kind == "access":
        return f"{operands[0]}[{step.attrs[0]}]"
    if entry is GETITEM:
        return f"{operands[0]}[{_render_value(attrs[0], unrenderable)}]"
    if entry.name.startswith("operator."):
        return f"{entry.name}({', '.join(operands)})"
    if entry.list_input:
        operands = [f"[{', '.join(operands)}]"]
    defaults = _defaults(entry)
    keywords = [
        f"{name}={_render_value(value, unrenderable)}"
        for name, value in zip(entry.attr_params, attrs)
        if not (name in defaults and _same(defaults[name], value))]
    return f"tf.{entry.name}({', '.join(operands + keywords)})"


def _defaults(entry):
    defaults = getattr(entry, "_defaults", None)
    if defaults is None:
        defaults = entry._defaults = {
            p.name: p.default for p in inspect.signature(entry.fn).parameters.values()
            if p.default is not inspect.Parameter.empty}
    return defaults


def _same(default, value):
    return type(default) is type(value) and default == value


def _render_value(value, unrenderable):
    """Python source for an attribute: a literal when one reads back exactly,
    else a named constant of the generated module."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float) and np.isfinite(value):
        return repr(value)
    if isinstance(value, tf.DType):
        return f"tf.{value.name}"
    if isinstance(value, tuple):
        inner = ", ".join(_render_value(item, unrenderable) for item in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, slice):
        return (f"slice({_render_value(value.start, unrenderable)}, "
                f"{_render_value(value.stop, unrenderable)}, "
                f"{_render_value(value.step, unrenderable)})")
    unrenderable.append(value)
    return f"attr_{len(unrenderable) - 1}"
