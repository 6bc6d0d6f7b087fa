"""Running a program as one compiled TensorFlow call, and its backward as one.

The forward is a ``tf.while_loop`` over the program's steps: each iteration
picks the step's kind (``tf.switch_case``), gathers its operands' rows from
the buffers, runs the kind's batch rule or pattern on them, and writes its
results' rows.  Shapes are dynamic, so one trace serves every minibatch
whose program has the same key (``plan.py``): the table of steps and the
rows are arguments.

TensorFlow would differentiate the loop by saving every iteration's
intermediates and scattering every gradient into a dense copy of a whole
buffer, iteration by iteration; that costs more than the forward.  So the
program brings its own backward, also one call: a loop over the steps in
reverse that recomputes each step from the saved buffers (every row is
written once, so the final buffers hold every step's operands), takes the
step's local gradient with a GradientTape inside the trace, and adds the
operands' gradients into adjoint buffers.  The recomputation skips the
steps' matrix products, the bulk of the work: the forward keeps each product
in a list, and the backward replays it (``rules.hooks``).  Gradients of
shared operands are summed over the steps, except rows of a variable looked up (``tf.gather``,
embedding lookups), which are kept as entries, so the variable's gradient is
the IndexedSlices eager TensorFlow gives, with an entry per lookup.

The call joins the two to the user's tape as one recorded op whose
gradient is the backward call (what ``tf.custom_gradient`` does, without
its extra op per output and second read of each variable): the forward
runs with the tapes paused, reads the variables inside the call (the
op's inputs for the tapes are their handles, as a read's are, and the
backward is given the values the forward read) and takes the shared
tensors as plain inputs.  A variable the program
only looks rows up in (an embedding: a *table*) is never read whole: the
traces capture it and gather rows, the forward keeps the rows for the
backward as it keeps products, and the table's gradient reaches its
handle as eager's lookups' does.

In training the forward is queued (overlap.py), and where the evaluation
has one result (the loss) and the program reads only variables, the
backward for that result is queued right behind it (``Speculation``):
``tape.gradient(loss, variables)`` takes its gradients (api.GradientTape)
where they are what the tape would give.

Inference (no tape) runs a forward of its own that keeps nothing.  Each
mode's functions are traced when first asked for.
"""

import collections
import itertools
import time

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from .. import _native, overlap
from ..context import context
from ..ir import spec as specs
from ..ir.spec import dtype_of, is_variable
from ..ir.table import ACCESS, LOOKUP, PATTERN_KINDS, WHOLE
from . import rules
from .plan import ROWS, SHARED
from .rules import NoRule, rule_for

try:   # TensorFlow's tape, as tf.custom_gradient uses it (no public API)
    from tensorflow.python.eager import record as _tape
except ImportError:   # programs then run step by step (_Compiled refuses)
    _tape = None
try:   # what a variable's sparse_read tells the tapes (no public API)
    from tensorflow.python.ops.resource_variable_ops import variable_accessed
except ImportError:   # then a program reads its tables whole
    variable_accessed = None

# Compiled programs are kept for this many distinct keys (least recently
# used first out), so a run of ever-new shapes holds a bounded number.
CAPACITY = 64
# A key is compiled once it is ``compile`` of the last WINDOW evaluations'
# keys: a model whose keys keep changing (kinds that hold a sentence's
# length) runs step by step rather than compiling programs it rarely reuses.
WINDOW = 16
# And at most this many compiles per process (each traces a forward and a
# backward: about a second), whatever the keys do.
BUDGET = 24
# A key whose program is a relative of a compiled one (``Kind.relative_key``:
# the same kinds but for operand counts and numbers) compiles at first
# sight, this many times per process.  An epoch's last, smaller minibatch
# is one: seen once per epoch, it never made ``compile`` of WINDOW, and ran
# step by step at every epoch (the Tree-LSTM at batch 256: 486 ms for 208
# trees against 190 for each 256-tree minibatch compiled).
RELATIVES = 4
# Programs of more node kinds run step by step: tracing costs about half a
# second a kind, and a compiled step of a program with many kinds (single
# ops of a BiLSTM: 122 kinds for 214 steps) ran slower than its eager
# launch (benchmarks/models.py).
MAX_KINDS = 16
# Products (``rules.hooks``) a step keeps for the backward, at most: the
# forward's list of them holds this many places per step.
KEPT_PRODUCTS = 8


class _Entry:
    __slots__ = ("compiled", "tried", "superset", "superset_generation")

    def __init__(self):
        # The _Compiled, once compiled; it holds the kinds' variables, whose
        # ids are part of the key, so that no other variable takes an id.
        self.compiled = None
        self.tried = False
        # The compiled program that runs this key's (_compiled_superset),
        # as found when the compiled programs were ``superset_generation``.
        self.superset = None
        self.superset_generation = -1


class _Reusable(collections.namedtuple("_Reusable", "program key compiled generation")):
    """A graph structure's program (holding no graph: ``Program.again``),
    its own key (before a superset adopted it), its compiled form, and
    the generation of compiled programs it was found among."""


class Programs:
    """The compiled programs of this process, by key."""

    def __init__(self):
        self._entries = collections.OrderedDict()
        self._recent = collections.deque(maxlen=WINDOW)   # the last keys seen
        self._counts = collections.Counter()              # ... how often each
        self._compiled_relatives = set()   # ``relatives`` of compiled programs
        self.compiles = self.relatives_compiled = 0
        # Counts the changes to the set of compiled programs (a compile, an
        # eviction), after which an entry's superset is looked for again.
        self._generation = 0
        # Graph structure (plan.structure) -> _Reusable: its program and
        # compiled form, as found while the compiled programs were those
        # of one generation.
        self._reusable = {}

    def clear(self):
        self.__init__()

    def _compiled_superset(self, program, entry):
        """The compiled program of fewest kinds among those whose kinds
        include all of ``program``'s, or None; kept in ``entry`` (the
        program's) until the compiled programs change.  (A pipelined
        part's key is usually run by a superset: looking it up anew cost
        a 256-tree minibatch about a millisecond.)"""
        if entry.superset_generation != self._generation:
            entry.superset = self._find_superset(program)
            entry.superset_generation = self._generation
        return entry.superset

    def _find_superset(self, program):
        kinds, buffers = set(program.kind_keys), set(program.buffers)
        if len(kinds) < len(program.kind_keys):
            # Two kinds of one key (the same op on two tensors of one
            # shape): only their positions tell them apart.
            return None
        best = None
        for entry in self._entries.values():
            compiled = entry.compiled
            if compiled is not None and len(compiled.kind_set) == len(compiled.kinds) \
                    and kinds <= compiled.kind_set \
                    and buffers <= compiled.buffer_set \
                    and (best is None or len(compiled.kinds) < len(best.kinds)):
                best = compiled
        return best

    def again(self, structure, graph, batches, statistics, training=True):
        """(program, compiled form) of ``batches`` of a graph of a
        ``structure`` whose program was found compiled before, while the
        compiled programs are still those it was found among; else (None,
        None): ``outline`` and ``compiled_for``.  Counted as a look-up of
        its key."""
        reusable = self._reusable.get(structure)
        if (reusable is None or reusable.generation != self._generation
                or reusable.key not in self._entries):
            return None, None
        compiled = _traced(reusable.compiled, training, statistics)
        if compiled is None:
            return None, None
        self._seen(reusable.key)
        statistics["program_cache_hits"] += 1
        return reusable.program.again(graph, batches), compiled

    def compiled_for(self, program, compile_after, statistics, training=True,
                     structure=None):
        """The compiled form of ``program``, compiling it if its key is now
        ``compile_after`` of the last WINDOW keys, or a relative of a
        compiled program (RELATIVES); None: run it step by step.  Its
        functions for ``training`` (a tape could record) or inference are
        traced once asked for (``_Compiled.trace``).  Found, it is kept
        for the graph ``structure`` the program is of (``again``)."""
        key = program.key
        compiled = self._compiled_for(program, compile_after, statistics, training)
        if compiled is not None and structure is not None:
            if len(self._reusable) >= CAPACITY:
                self._reusable.clear()
            self._reusable[structure] = _Reusable(
                program.again(None, ()), key, compiled, self._generation)
        return compiled

    def _seen(self, key):
        """Count ``key`` among the last WINDOW keys seen; its entry, made if
        new (the least recently used one out, past CAPACITY), else moved
        last."""
        if len(self._recent) == WINDOW:
            oldest = self._recent[0]
            self._counts[oldest] -= 1
            if not self._counts[oldest]:
                del self._counts[oldest]
        self._recent.append(key)
        self._counts[key] += 1
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
            if len(self._entries) > CAPACITY:
                _, evicted = self._entries.popitem(last=False)
                self._generation += evicted.compiled is not None
        else:
            self._entries.move_to_end(key)
        return entry

    def _compiled_for(self, program, compile_after, statistics, training):
        if not compile_after:
            return None
        key = program.key
        entry = self._seen(key)
        if entry.compiled is not None:
            statistics["program_cache_hits"] += 1
            return _traced(entry.compiled, training, statistics)
        larger = self._compiled_superset(program, entry)
        if larger is not None:
            # A program of more kinds runs this one (its other kinds take
            # no steps): no compile for minibatches that lack a rare kind.
            program.adopt(larger)
            statistics["program_cache_hits"] += 1
            return _traced(larger, training, statistics)
        relative = (program.relatives in self._compiled_relatives
                    and self.relatives_compiled < RELATIVES)
        if (self._counts[key] >= compile_after or relative) and not entry.tried:
            if self.compiles >= BUDGET:
                statistics["programs_not_compiled"][
                    f"compile budget of {BUDGET} spent"] += 1
                return None
            self.compiles += 1
            self.relatives_compiled += self._counts[key] < compile_after
            entry.tried = True
            started = time.perf_counter()
            try:
                compiled = _Compiled(program)
            except (NoRule, ValueError, TypeError) as reason:
                statistics["programs_not_compiled"][str(reason)] += 1
            else:
                if _traced(compiled, training, statistics, started) is not None:
                    entry.compiled = compiled
                    self._generation += 1
                    self._compiled_relatives.add(program.relatives)
                    statistics["programs_compiled"] += 1
        return entry.compiled


def _traced(compiled, training, statistics, started=None):
    """``compiled`` with its functions for the mode traced, or None if
    they cannot be: operands an op refuses in a graph (a dtype TensorFlow
    converts only eagerly) run step by step, in that mode, from then on."""
    state = compiled.modes.get(training)
    if state is None:
        started = time.perf_counter() if started is None else started
        try:
            compiled.trace(training)
            state = True
        except (NoRule, ValueError, TypeError) as reason:
            state = str(reason)
            statistics["programs_not_compiled"][state] += 1
        compiled.modes[training] = state
        statistics["compile_seconds"] += time.perf_counter() - started
    return compiled if state is True else None


PROGRAMS = Programs()


class _Kept(collections.namedtuple(
        "_Kept", "place shape shared inner transpose_b")):
    """A product the forward keeps: its list and static shape; the number
    of its shared operand (None: not one); the width of its rows operand;
    and whether the shared operand is transposed."""


class _Trace(collections.namedtuple("_Trace", "rows buffers shared lists transposed sites")):
    """What every step of the backward's trace reads: the operand rows, the
    forward's buffers, the shared values, the forward's lists of products, each shared weight
    transposed, by number, and the weight sites: the kept products, by
    (kind number, product number), whose shared operand's gradient is a
    sum over the steps, made one product of all steps' rows after the loop
    rather than a weight-sized product and sum per step."""


class _Shared:
    """The shared values a program reads, as its arguments: each distinct
    variable (read once per call) and tensor, then each pattern's captured
    parameters.  ``places[kind]``: per shared operand position (or per
    captured parameter of a pattern), the argument number."""

    def __init__(self, program):
        self.values, self._number = [], {}
        self.places = []
        for kind in program.kinds:
            places = {}
            for position, (operand_kind, value) in enumerate(kind.operands):
                if operand_kind == SHARED and _is_tensor(value):
                    places[position] = self._add(value)
            if kind.entry.node_kind in PATTERN_KINDS:
                places["captured"] = [self._add(value)
                                      for value in kind.entry.pattern.captured_values]
            self.places.append(places)

    def _add(self, value):
        """Its argument number.  A variable given twice is one argument (its
        id is in the key); a tensor is its own argument each time, since
        the key says only its dtype and shape, and another minibatch may
        give two tensors where this one gives one."""
        if not is_variable(value):
            self.values.append(value)
            return len(self.values) - 1
        number = self._number.get(id(value))
        if number is None:
            number = self._number[id(value)] = len(self.values)
            self.values.append(value)
        return number


def _scratch(shape, dtype):
    """A program's own variable: rows written in place."""
    return tf.Variable(tf.zeros([0 if size is None else size for size in shape], dtype),
                       shape=tf.TensorShape(shape), trainable=False)


def _numbers(places):
    """Every shared-argument number in a kind's ``places``."""
    for key, number in places.items():
        yield from (number if key == "captured" else (number,))


def _is_tensor(value):
    return is_variable(value) or isinstance(value, tf.Tensor)


def _trainable(dtype):
    return dtype.is_floating or dtype.is_complex


class _Compiled:
    """The forward and backward concrete functions of one program key.

    Buffers live in variables of the program's own (not trainable, so no
    tape watches them): a step writes its rows in place
    (``scatter_update``), where a tensor's update would copy the whole
    buffer at every step.  The loops run one step at a time
    (``parallel_iterations=1``), so every read sees the writes before it.
    A program runs one call at a time."""

    def __init__(self, program):
        if _tape is None:
            raise TypeError("this TensorFlow has no tensorflow.python.eager.record, "
                            "which joins a program to the user's tape")
        for kind in program.kinds:
            if kind.entry.family == "layer":
                # A Keras layer reads its variables inside the trace, not as
                # _Shared arguments: the custom backward would give them no
                # gradient.  Such programs run step by step.
                raise NoRule(f"{kind.entry.name}: a Keras layer's variables "
                             "are not arguments of a compiled program")
        self.kinds, self.buffers = program.kinds, program.buffers
        self.kind_keys, self.key = program.kind_keys, program.key
        self.kind_set, self.buffer_set = set(self.kind_keys), set(self.buffers)
        # Where a program this one runs puts each kind and buffer (Program.adopt).
        self.kind_place = {key: place for place, key in enumerate(self.kind_keys)}
        self.buffer_place = {spec: place for place, spec in enumerate(self.buffers)}
        self.shared = _Shared(program)
        looked_up, whole = set(), set()
        for kind, places in zip(self.kinds, self.shared.places):
            looked, other = _reads(kind, places)
            looked_up |= looked
            whole |= other
        # Rows of a variable each kind looks up: their gradients stay entries.
        self.sparse = sorted(
            number for number in looked_up if is_variable(self.shared.values[number])
            and _trainable(dtype_of(self.shared.values[number])))
        # Variables read only as tables of lookups (an embedding): the
        # traces capture them and gather their rows, never reading one
        # whole, which copies it once a sparse update (an optimizer's) has
        # put it in copy-on-read mode: the Tree-LSTM's 7687x300 embedding
        # took 1.4 ms of a 25-tree inference's 18.  The other shared
        # values are arguments (``given``).  (A Keras variable, which wraps
        # one, is read as before.)
        self.tables = [number for number in self.sparse if number not in whole
                       and variable_accessed is not None
                       and isinstance(self.shared.values[number], tf.Variable)
                       and self.shared.values[number].shape.is_fully_defined()]
        self.given = [number for number in range(len(self.shared.values))
                      if number not in self.tables]
        # The forward reads the variables inside the call, not as eager
        # reads before it: 0.3 ms of a 25-tree inference, and in training
        # 0.5-0.7 ms (50-300 us a read, on the tape) in which the other
        # core idled between the last update and this forward.
        # A training forward returns its reads for the backward, and the
        # tapes see each variable's handle as the op's input.  (A Keras
        # variable, and a tensor, stays an argument: ``forward_given``.)
        self.read_inside = [number for number in self.given
                            if isinstance(self.shared.values[number], tf.Variable)]
        self.forward_given = [number for number in self.given
                              if number not in self.read_inside]
        self.trainable = [number for number, (dtype, _) in enumerate(self.buffers)
                          if _trainable(dtype)]
        self.values = [_scratch((None, *shape), dtype) for dtype, shape in self.buffers]
        self.no_rows = [tf.zeros((0, *shape), dtype) for dtype, shape in self.buffers]
        self.adjoints = {b: _scratch((None, *self.buffers[b][1]), self.buffers[b][0])
                         for b in self.trainable}
        # The other trainable shared values' gradients: summed in place.
        self.sums = {number: _scratch(value.shape, dtype_of(value))
                     for number, value in enumerate(self.shared.values)
                     if _trainable(dtype_of(value)) and number not in self.sparse}
        # A step's row of the table: kind, count, start and end of its
        # operand rows, whether they are distinct, its outputs' starts and
        # ends (native/plan.c).
        self.width = _native.STEP_OUTPUTS + 2 * max(len(kind.outputs) for kind in self.kinds)
        # The forward keeps each step's products in a list per dtype, at
        # place step * KEPT_PRODUCTS + j for its j-th product; ``kept``:
        # (kind number, j) -> (list number, static shape), as traced.
        # (And the rows looked up in a table, at the same places.)
        self.product_dtypes = sorted(
            {dtype for dtype, _ in self.buffers if dtype.is_floating}
            | {self.shared.values[number].dtype for number in self.tables},
            key=lambda dtype: dtype.name)
        self.kept = {}
        self.kept_lookups = {}   # (kind number, j) -> (list number, static shape)
        # Per mode (training: bool), its functions traced (True) or why
        # they could not be: ``trace``.
        self.modes = {}

    def trace(self, training):
        """Trace the functions of a mode: for training, a forward that
        keeps its products and lookups, and the backward; for inference,
        a forward that keeps nothing.  A mode is traced once it is needed:
        the inference program of a model rarely runs a backward."""
        packed = [tf.TensorSpec((None,), tf.int32)]   # the steps and rows: _packed
        rows = [tf.TensorSpec((None, *shape), dtype) for dtype, shape in self.buffers]
        given = [tf.TensorSpec(self.shared.values[number].shape,
                               dtype_of(self.shared.values[number])) for number in self.given]
        forward_given = [spec for number, spec in zip(self.given, given)
                         if number not in self.read_inside]
        if not training:
            self.inference = tf.function(
                lambda *arguments: self._forward(arguments, keep=False), autograph=False,
                input_signature=packed + rows + forward_given).get_concrete_function()
            return
        adjoints = [rows[b] for b in self.trainable]
        lists = [tf.TensorSpec((), tf.variant)] * len(self.product_dtypes)
        self.forward = tf.function(
            lambda *arguments: self._forward(arguments, keep=True), autograph=False,
            input_signature=packed + rows + forward_given).get_concrete_function()
        self.backward_signature = packed + rows + given + adjoints + lists
        self.backwards = {}
        self.backward_for(True)   # (the other when a call first needs it)

    def backward_for(self, distinct):
        """The backward's concrete function for a call whose steps' operand
        rows are all ``distinct`` (the plan's flag, per step; every step of
        the Tree-LSTM's), or for one where some are not.  The way a step adds
        its gradient rows is fixed in each trace (``_add_rows``), not chosen
        by a ``tf.cond`` per step: a cond's functions kept every branch
        holding one off the single-threaded executor (``_single_threaded``),
        3.5% of a 25-tree training minibatch (BENCHMARKS.md).  Each traced
        once, the second when first needed (its seconds counted then)."""
        function = self.backwards.get(distinct)
        if function is None:
            started = time.perf_counter()
            function = self.backwards[distinct] = tf.function(
                lambda *arguments: self._backward(arguments, distinct), autograph=False,
                input_signature=self.backward_signature).get_concrete_function()
            if len(self.backwards) > 1:   # (the first is timed with its mode's trace)
                context.batching["compile_seconds"] += time.perf_counter() - started
        return function

    def _with_tables(self, given, forward=False):
        """The shared values inside a trace: those ``given`` as arguments,
        and the tables, captured; in a ``forward``, the variables read
        here (``read_inside``)."""
        shared = list(self.shared.values)
        for number, value in zip(self.forward_given if forward else self.given, given):
            shared[number] = value
        if forward:
            for number in self.read_inside:
                shared[number] = tf.convert_to_tensor(shared[number])
        return shared

    # -- the forward -----------------------------------------------------------
    def _forward(self, arguments, keep):
        """Every buffer, computed: room for the steps' rows (uninitialized:
        each is written by its step before anything reads it; zeros cost
        a pass over the buffer), then the inputs' rows, written step by
        step; then, with ``keep``, the lists of the steps' products and
        lookups (``_keep``) and the values read of ``read_inside``, which
        the backward is given."""
        steps, table, rows, sizes, ends = self._unpacked(arguments[0])
        count = len(self.buffers)
        inputs = arguments[1:1 + count]
        shared = self._with_tables(arguments[1 + count:], forward=True)
        for b, (dtype, shape) in enumerate(self.buffers):
            # The last call's scatters left the variable in copy-on-read
            # mode, where this assign would copy the new buffer and the
            # read at the end copy it again (3 of a 256-tree forward's 48
            # ms); out of it, the assign adopts the buffer and the read
            # shares it.  (The buffer the last read shares stays its own.)
            tf.raw_ops.DisableCopyOnRead(resource=self.values[b].handle)
            self.values[b].assign(tf.raw_ops.Empty(
                shape=tf.stack([ends[b], *shape]), dtype=dtype, init=False))
            self.values[b].scatter_update(tf.IndexedSlices(
                inputs[b], tf.range(sizes[b], ends[b])))

        def step(s, *lists):
            info = tf.unstack(tf.gather(table, s), num=self.width)

            def branch(kind_number):
                def run():
                    kind = self.kinds[kind_number]
                    operand_rows, places = self._indices(kind_number, info, rows)
                    gathered = [tf.gather(self.values[buffer], flat)
                                for buffer, _, flat in operand_rows]
                    values = self._operands(kind_number, operand_rows, gathered, shared)
                    kept = list(lists)
                    with rules.hooks(**(self._keep(kind_number, s, kept, shared)
                                        if keep else {})):
                        results = self._run(kind_number, values, shared, info[1])
                    for number, buffer in enumerate(kind.outputs):
                        if buffer is not None:
                            self.values[buffer].scatter_update(
                                tf.IndexedSlices(results[number], places[number]))
                    return [s + 1, *kept]
                return run
            return self._switch(info[0], branch)

        lists = [tf.raw_ops.TensorListReserve(element_shape=-1,
                                              num_elements=steps * KEPT_PRODUCTS,
                                              element_dtype=dtype)
                 for dtype in self.product_dtypes] if keep else []
        done = _loop(lambda s, *_: s < steps, step, (0, *lists))
        with tf.control_dependencies(tf.nest.flatten(done)):
            for value in self.values:
                tf.raw_ops.DisableCopyOnRead(resource=value.handle)
            reads = [shared[number] for number in self.read_inside] if keep else []
            return [value.read_value() for value in self.values] + list(done[1:]) + reads

    def _keep(self, kind_number, s, lists, shared):
        """The forward's products and lookups hooks (``rules.hooks``) for
        step ``s``: each product computed and put in its dtype's list
        (``lists``, replaced in place), where the backward's ``_replay``
        finds it; so are the rows looked up in a table."""
        number = itertools.count()   # the step's products and lookups, in turn
        numbers = {id(value): n for n, value in enumerate(shared)}

        def keep(a, b, transpose_b, compute):
            product, j = compute(), next(number)
            if product.dtype in self.product_dtypes and j < KEPT_PRODUCTS:
                place = self.product_dtypes.index(product.dtype)
                lists[place] = tf.raw_ops.TensorListSetItem(
                    input_handle=lists[place], index=s * KEPT_PRODUCTS + j, item=product)
                self.kept[kind_number, j] = _Kept(
                    place, product.shape, numbers.get(id(b)), a.shape[-1], transpose_b)
            return product

        def look_up(table, indices, compute):
            rows, j = compute(), next(number)
            if numbers.get(id(table)) not in self.tables:
                return rows
            if j >= KEPT_PRODUCTS:
                raise NoRule(f"more than {KEPT_PRODUCTS} products and lookups in a step")
            place = self.product_dtypes.index(rows.dtype)
            lists[place] = tf.raw_ops.TensorListSetItem(
                input_handle=lists[place], index=s * KEPT_PRODUCTS + j, item=rows)
            self.kept_lookups[kind_number, j] = (place, rows.shape)
            return rows
        return {"products": keep, "lookups": look_up}

    def _replay(self, kind_number, s, trace, local_shared, deferred, tape, looked):
        """The backward's products and lookups hooks (``rules.hooks``) for
        step ``s``.  A product: the one the forward kept, with the
        product's gradient (which reads its operands only, so that the
        recomputed product is never run).  Rows of a table: those the
        forward looked up, watched by the step's ``tape`` and put in
        ``looked`` as (table number, rows, indices), whose gradient
        becomes the table's entries.

        Two things make that gradient cheaper than TensorFlow's own for a
        shared weight: the rows' gradient multiplies by the weight
        transposed once for the whole backward (``trace.transposed``; a
        product with ``transpose_b`` repacks the weight at every step: the
        Tree-LSTM's row products took 2.9 ms of a 25-tree backward, 1.75
        ms by the transposed weight), and the weight's own
        gradient, when a sum over the steps (``trace.sites``), is left to
        one product after the loop: the step puts its operand rows and the
        product's upstream rows in ``deferred`` instead of computing and
        adding a weight-sized product."""
        number = itertools.count()
        numbers = {id(value): n for n, value in enumerate(local_shared)}

        def replay(a, b, transpose_b, compute):
            j = next(number)
            kept = self.kept.get((kind_number, j))
            if kept is None:
                return compute()
            product = tf.raw_ops.TensorListGetItem(
                input_handle=trace.lists[kept.place], index=s * KEPT_PRODUCTS + j,
                element_shape=-1, element_dtype=self.product_dtypes[kept.place])
            product.set_shape(kept.shape)
            b = tf.convert_to_tensor(b, a.dtype)
            site = (kind_number, j)
            # The shared value itself (not, say, a slice of it)?
            whole = kept.shared is not None and b is local_shared[kept.shared]
            deferring = whole and site in trace.sites

            def gradient(upstream):
                if transpose_b:
                    of_a = tf.matmul(upstream, b)
                elif whole:
                    of_a = tf.matmul(upstream, trace.transposed[kept.shared])
                else:
                    of_a = tf.matmul(upstream, b, transpose_b=True)
                if deferring:
                    deferred[site] = (a, upstream)
                    return of_a, None
                return of_a, (tf.matmul(upstream, a, transpose_a=True) if transpose_b
                              else tf.matmul(a, upstream, transpose_a=True))

            _tape.record_operation("MatMul", [product], [a, b], gradient)
            return product

        def look_up(table, indices, compute):
            j, table_number = next(number), numbers.get(id(table))
            if table_number not in self.tables:
                return compute()
            place, shape = self.kept_lookups[kind_number, j]
            rows = tf.raw_ops.TensorListGetItem(
                input_handle=trace.lists[place], index=s * KEPT_PRODUCTS + j,
                element_shape=-1, element_dtype=self.product_dtypes[place])
            rows.set_shape(shape)
            tape.watch(rows)
            looked.append((table_number, rows, indices))
            return rows
        return {"products": replay, "lookups": look_up}

    def _switch(self, kind_number, branch):
        if len(self.kinds) == 1:
            return branch(0)()
        # Run only the step's branch, as a function call.  Lowered to
        # switches and merges (TensorFlow's default), every op of every
        # other branch would pass a dead tensor on, at each step: the
        # Tree-LSTM's programs ran 5-7% slower at minibatches of 256.
        return _unlowered(("Case", "StatelessCase"), tf.switch_case, kind_number,
                          [branch(k) for k in range(len(self.kinds))])

    def _indices(self, kind_number, info, rows):
        """A step's operand rows and output rows, from its part of the step
        table (``info``): a few ops, not a few per operand (every op in
        the loop costs microseconds per step).  Operand rows: per buffer
        the kind reads, (the buffer, its positions, their rows, each
        position's in turn), so that one gather reads them all: the loss's
        ``add_n`` of a 256-tree minibatch has 256 positions of one buffer,
        whose gathers and gradients were a third of its program's trace."""
        start, end = info[2], info[_native.STEP_END]
        kind = self.kinds[kind_number]
        positions = [position for position, (operand_kind, _) in enumerate(kind.operands)
                     if operand_kind == ROWS]
        groups = {}   # buffer -> [(place among the positions, position)]
        for place, position in enumerate(positions):
            groups.setdefault(kind.operands[position][1], []).append((place, position))
        operand_rows = []
        if positions:
            block = tf.gather(rows, tf.range(start, end))
            if len(groups) > 1:
                matrix = tf.reshape(block, [len(positions), -1])
                single = tf.unstack(matrix, num=len(positions))
            for buffer, members in groups.items():
                if len(groups) == 1:
                    flat = block
                elif len(members) == 1:
                    flat = single[members[0][0]]
                else:
                    flat = tf.reshape(tf.gather(matrix, [place for place, _ in members]), [-1])
                operand_rows.append((buffer, [position for _, position in members], flat))
        first = _native.STEP_OUTPUTS
        places = [None if buffer is None else tf.range(info[first + 2 * number],
                                                       info[first + 2 * number + 1])
                  for number, buffer in enumerate(kind.outputs)]
        return operand_rows, places

    def _operands(self, kind_number, operand_rows, gathered, shared):
        """Each operand of a step: its rows, from those ``gathered`` per
        group of ``operand_rows`` (``_indices``), or the shared value."""
        kind = self.kinds[kind_number]
        values = [None] * len(kind.operands)
        for (buffer, members, _), rows_read in zip(operand_rows, gathered):
            if len(members) == 1:
                values[members[0]] = rows_read
                continue
            shape = self.buffers[buffer][1]
            parts = tf.unstack(tf.reshape(rows_read, [len(members), -1, *shape]),
                               num=len(members))
            for position, part in zip(members, parts):
                values[position] = part
        places = self.shared.places[kind_number]
        for position, (operand_kind, value) in enumerate(kind.operands):
            if operand_kind == ROWS:
                continue
            values[position] = (shared[places[position]] if position in places
                                else value)   # else a Python number
        return values

    def _run(self, kind_number, values, shared, count):
        """The kind's results for stacked ``values``: a list, one per output."""
        kind = self.kinds[kind_number]
        op_entry = kind.entry
        flags = [operand_kind == SHARED for operand_kind, _ in kind.operands]
        if all(flags):   # the same value for every instance
            one = op_entry.call(values, kind.attrs)
            outputs = list(one) if op_entry.multi_output else [one]
            return [tf.repeat(tf.expand_dims(output, 0), count, 0) for output in outputs]
        if op_entry.node_kind in PATTERN_KINDS:
            captured = [shared[n] for n in self.shared.places[kind_number]["captured"]]
            body = op_entry.pattern.stacked_body(
                [specs.spec(*self.buffers[buffer])
                 for (_, buffer), is_shared in zip(kind.operands, flags) if not is_shared])
            results = body([v for v, is_shared in zip(values, flags) if not is_shared],
                           captured)
        else:
            results = _batched(kind, values, flags, count)
        return list(results) if op_entry.multi_output else [results]

    # -- the backward ----------------------------------------------------------
    def _backward(self, arguments, distinct):
        """Gradients of the inputs' rows and of the shared values, given the
        forward's final buffers (whose rows the steps read: another forward
        may have run since), each trainable buffer's upstream gradient and
        the forward's lists of products; ``distinct``: as ``backward_for``."""
        steps, table, rows, sizes, ends = self._unpacked(arguments[0])
        count, given_count = len(self.buffers), len(self.given)
        buffers = arguments[1:1 + count]
        shared = self._with_tables(arguments[1 + count:1 + count + given_count])
        upstreams = arguments[1 + count + given_count:][:len(self.trainable)]
        lists = arguments[1 + count + given_count + len(self.trainable):]
        trace = _Trace(rows, buffers, shared, lists, {
            kept.shared: tf.transpose(shared[kept.shared])
            for kept in self.kept.values()
            if kept.shared is not None and not kept.transpose_b}, {
            site: kept for site, kept in sorted(self.kept.items())
            if kept.shared in self.sums})
        for b, upstream in zip(self.trainable, upstreams):
            # A buffer no gradient reaches comes as no rows (``no_rows``):
            # padded here to zeros, which the assign adopts (out of
            # copy-on-read mode, as in _forward); zeros made before the
            # call were written once and then copied (0.4 ms of a 25-tree
            # backward).
            missing = tf.shape(buffers[b])[0] - tf.shape(upstream)[0]
            tf.raw_ops.DisableCopyOnRead(resource=self.adjoints[b].handle)
            self.adjoints[b].assign(tf.pad(
                upstream, [[0, missing]] + [[0, 0]] * (upstream.shape.rank - 1)))
        for number, total in self.sums.items():
            total.assign(tf.zeros_like(shared[number]))
        # Per looked-up variable: a list of its entries' values and one of
        # their indices, to which each step that has entries appends them
        # (a step that looks nothing up adds no ops: every op in the loop
        # costs at each step).
        entries = []
        for number in self.sparse:
            entries += [_empty_list(shared[number].dtype, shared[number].shape[1:]),
                        _empty_list(tf.int32, ())]
        # Per weight site (``trace.sites``): its steps' operand rows and
        # their products' upstream rows, multiplied once after the loop.
        sites = trace.sites
        weights = [_empty_list(shared[kept.shared].dtype, (size,))
                   for kept in sites.values() for size in (kept.inner, kept.shape[-1])]

        def step(k, entries, weights):
            s = steps - 1 - k   # (once here, not again in each branch)
            info = tf.unstack(tf.gather(table, s), num=self.width)

            def branch(kind_number):
                def run():
                    return self._step_gradient(kind_number, info, k, s,
                                               trace, entries, weights, distinct)
                return run
            flat = self._switch(info[0], branch)
            if not entries and not weights:
                return k + 1, [], []
            return k + 1, list(flat[:len(entries)]), list(flat[len(entries):])

        done = _loop(lambda k, *_: k < steps, step, (0, entries, weights))
        entries, weights = done[1], done[2]
        with tf.control_dependencies(tf.nest.flatten(done)):
            gradients = [tf.zeros([0], tf.float32)] * len(shared)   # (none)
            for number, total in self.sums.items():
                gradients[number] = total.read_value()
            for place, kept in enumerate(sites.values()):
                dtype = shared[kept.shared].dtype
                operand_rows, upstream = (
                    _concatenated(weights[2 * place + half], dtype, (size,))
                    for half, size in enumerate((kept.inner, kept.shape[-1])))
                gradients[kept.shared] += (
                    tf.matmul(upstream, operand_rows, transpose_a=True) if kept.transpose_b
                    else tf.matmul(operand_rows, upstream, transpose_a=True))
            for place, number in enumerate(self.sparse):
                gradients[number] = (
                    _concatenated(entries[2 * place], shared[number].dtype,
                                  shared[number].shape[1:]),
                    _concatenated(entries[2 * place + 1], tf.int32, ()))
            # (The input rows alone: a read of the whole buffer copies it.)
            inputs = [self.adjoints[b].sparse_read(tf.range(sizes[b], ends[b]))
                      for b in self.trainable]
        return inputs, gradients

    def _step_gradient(self, kind_number, info, k, s, trace, entries, weights, distinct):
        """One step of the backward: its local gradient, given the upstream
        rows of its outputs, added into the operands' adjoint rows, the
        shared values' sums, the looked-up variables' entries, or the weight
        sites' lists of rows."""
        kind, shared = self.kinds[kind_number], trace.shared
        operand_rows, places = self._indices(kind_number, info, trace.rows)
        used = sorted({number for number in _numbers(self.shared.places[kind_number])
                       if _trainable(shared[number].dtype) and number not in self.tables})
        looked = []
        with tf.GradientTape() as tape:
            local_shared = list(shared)
            for number in used:   # fresh tensors: a gradient of this step only
                local_shared[number] = tf.identity(shared[number])
                tape.watch(local_shared[number])
            gathered = [tf.gather(trace.buffers[buffer], flat)
                        for buffer, _, flat in operand_rows]
            watched = [number for number, (buffer, _, _) in enumerate(operand_rows)
                       if buffer in self.adjoints]
            for number in watched:
                tape.watch(gathered[number])
            values = self._operands(kind_number, operand_rows, gathered, local_shared)
            deferred = {}
            with rules.hooks(**self._replay(kind_number, s, trace, local_shared,
                                            deferred, tape, looked),
                             rows=_rows_op):
                results = self._run(kind_number, values, local_shared, info[1])
        outputs, upstream = [], []
        for number, buffer in enumerate(kind.outputs):
            if buffer in self.adjoints:
                outputs.append(results[number])
                upstream.append(self.adjoints[buffer].sparse_read(places[number]))
        sources = [gathered[number] for number in watched] + [
            local_shared[number] for number in used] + [rows for _, rows, _ in looked]
        gradients = (tape.gradient(outputs, sources, output_gradients=upstream)
                     if outputs and sources else [None] * len(sources))
        # (A weight whose gradient is left to after the loop has none here.)
        deferred_weights = {len(watched) + used.index(self.kept[site].shared)
                            for site in deferred}
        if outputs and any(gradient is None and place not in deferred_weights
                           for place, gradient in enumerate(gradients)):
            # An op with no gradient (tf.stop_gradient, floordiv), or an
            # operand only a dropped output reads: eagerly, a variable
            # reached only through it has no gradient (None), where this
            # backward would give zeros.  Step by step gives eager's.
            raise NoRule(f"{kind.entry.name}: no gradient for an operand")
        of_rows = gradients[len(watched) + len(used):]
        for number, gradient in zip(watched, gradients):
            if gradient is not None:
                buffer, _, flat = operand_rows[number]
                _add_rows(self.adjoints[buffer], tf.convert_to_tensor(gradient), flat,
                          distinct)
        of_shared = dict(zip(used, gradients[len(watched):len(watched) + len(used)]))
        for number, total in self.sums.items():
            if of_shared.get(number) is not None:
                total.assign_add(tf.convert_to_tensor(of_shared[number]))
        entries = list(entries)
        for place, number in enumerate(self.sparse):
            gradient = of_shared.get(number)
            if number in self.tables:
                gradient = _entries(shared[number], [
                    (indices, rows_gradient) for (table_number, _, indices), rows_gradient
                    in zip(looked, of_rows)
                    if table_number == number and rows_gradient is not None])
            if gradient is None:   # nothing looked up: no entries
                continue
            if isinstance(gradient, tf.IndexedSlices):
                values_part = gradient.values
                indices_part = tf.cast(gradient.indices, tf.int32)
            else:   # the variable used whole too: every row an entry
                values_part = gradient
                indices_part = tf.range(tf.shape(gradient)[0])
            for half, part in enumerate((values_part, indices_part)):
                entries[2 * place + half] = tf.raw_ops.TensorListPushBack(
                    input_handle=entries[2 * place + half], tensor=part)
        weights = list(weights)
        for place, site in enumerate(trace.sites):
            if site in deferred:
                for half, rows_of_site in enumerate(deferred[site]):
                    weights[2 * place + half] = tf.raw_ops.TensorListPushBack(
                        input_handle=weights[2 * place + half], tensor=rows_of_site)
        # (A branch must return something.)
        return entries + weights if entries or weights else [k]

    def _unpacked(self, packed):
        """From the one vector a call is given (``_packed``): the number of
        steps, the step table, the rows, and per buffer the number of its
        computed rows (where its inputs' rows start) and of all its rows,
        each a scalar.  A handful of ops per call, and none per buffer: an
        op outside the loop costs a microsecond or two at each call."""
        count = len(self.buffers)
        head = tf.unstack(packed[:_HEAD + 2 * count], num=_HEAD + 2 * count)
        table, rows = tf.split(packed[_HEAD + 2 * count:], packed[1:_HEAD], num=2)
        return (head[0], tf.reshape(table, [-1, self.width]), rows,
                head[_HEAD:_HEAD + count], head[_HEAD + count:])

    # -- one call --------------------------------------------------------------
    def arguments(self, program):
        """The call's arguments but the variables' values: the step table
        and rows, each buffer's input rows, and this program's shared
        values, in the compiled order (variables are the compiled ones,
        whose ids are in the key; tensors this minibatch's own, of which
        the key says only dtype and shape).  Made before the queue is
        waited for, in training (execute.py)."""
        arrays = [overlap.host_tensor(_packed(program))]
        inputs = [self._inputs(program, b) for b in range(len(self.buffers))]
        shared = program.derived.get(_Shared)
        if shared is None:
            shared = program.derived[_Shared] = _Shared(program).values
        return arrays, inputs, shared

    def __call__(self, program, recording, arguments=None):
        """The program's buffers, computed; while a tape could record
        (``recording``), a ``_Forward``: the buffers, and the one op whose
        gradient is the backward call, for the tapes.  Only what can carry
        a gradient to the user passes through that op: rows of nodes
        evaluated earlier (in trainable buffers), shared tensors and the
        variables.  ``arguments``: as ``arguments(program)`` gives them,
        if made before."""
        arrays, inputs, values = arguments or self.arguments(program)
        if not recording:   # inference: no gradient to join to a tape
            given = _read(values, self.forward_given)
            return overlap.call(self.inference, [*arrays, *inputs, *given], rewrite=False)
        carried = [b for b in self.trainable if program.input_nodes[b]]
        backward_function = self.backward_for(
            bool(program.steps[:, _native.STEP_DISTINCT].all()))
        # Values of kinds with steps: a program of more kinds than this
        # minibatch has (Programs.compiled_for) gives the others no
        # gradient, as eagerly, not zeros.  (Places are the compiled ones.)
        used = {number for kind_number in set(program.steps[:, 0].tolist())
                for number in _numbers(self.shared.places[kind_number])}
        # A Keras variable's read is an op the tapes record (and a
        # tf.custom_gradient's VariableWatcher sees): the gradient given
        # for the value read reaches the variable, an IndexedSlices as is.
        # Read where called, not queued: the queue is empty (execute.py),
        # and the tapes, which ask for each read's shape, do not wait for it.
        with overlap.in_place():
            given = _read(values, self.forward_given)
        # A variable the forward reads (``read_inside``), and a table it
        # looks up, as a read or a sparse_read tells the tapes: its
        # gradient, for its handle, reaches the variable.
        # (Only those this minibatch's steps use, as eager reads only those.)
        read_now = [number for number in self.read_inside if number in used]
        tables = [number for number in self.tables if number in used]
        for number in read_now + tables:
            variable_accessed(values[number])
        with _tape.stop_recording():
            outputs = overlap.call(self.forward, [*arrays, *inputs, *given], rewrite=False)
        count, listed = len(self.buffers), len(self.product_dtypes)
        buffers, lists = outputs[:count], outputs[count:count + listed]
        # Every shared value given to the backward, in ``given`` order: an
        # argument of the forward, or its read inside it.
        read = dict(zip(self.read_inside, outputs[count + listed:]))
        argument = dict(zip(self.forward_given, given))
        given = [read[number] if number in read else argument[number]
                 for number in self.given]

        def gradient(*upstream):
            if could_record():
                # A tape would record the backward's call, to differentiate
                # it in turn: its trace cannot be (TensorFlow fails deep in
                # its function machinery).
                raise RuntimeError(
                    "subgraphjit: the gradient of a compiled program was asked "
                    "while a tape records (under another tape, or inside a "
                    "persistent tape's block); its backward cannot be "
                    "differentiated again.  Take the gradient after the tapes' "
                    "blocks, or set_parameter('compile', 0) to run such "
                    "evaluations op by op.")
            return backward(upstream)

        def backward(upstream):
            adjoints = [self.no_rows[b] if upstream[b] is None
                        else tf.convert_to_tensor(upstream[b])
                        for b in self.trainable]
            # (Queued since GradientTape.gradient: overlap.py.)
            input_gradients, shared_gradients = overlap.call(
                backward_function, [*arrays, *buffers, *given, *adjoints, *lists],
                rewrite=False)
            by_buffer = dict(zip(self.trainable, input_gradients))
            return [by_buffer[b] for b in carried] + [
                _gradient(values[number] if number in read else value,
                          shared_gradients[number]) if number in used else None
                for number, value in zip(self.given, given)] + [
                _gradient(values[number], shared_gradients[number]) for number in tables]

        tape_inputs = ([inputs[b] for b in carried]
                       + [values[number].handle if number in read else value
                          for number, value in zip(self.given, given)]
                       + [values[number].handle for number in tables])
        # The variable each input reads, by position (None: not a variable).
        # Where every input that can carry a gradient is a variable's, the
        # gradient of a result with respect to the variables is the
        # backward's alone (``_Forward.speculate``).
        variables = ([None] * len(carried)
                     + [values[number] if isinstance(values[number], tf.Variable) else None
                        for number in self.given]
                     + [values[number] for number in tables])
        direct = not carried and all(
            variables[len(carried) + k] is not None or number not in used
            or not _trainable(dtype_of(value))
            for k, (number, value) in enumerate(zip(self.given, given)))
        return _Forward(self, buffers, tape_inputs, variables, gradient, backward, direct)

    def _inputs(self, program, buffer):
        """The rows that follow a buffer's computed ones: stacked Python
        values, then the values of nodes evaluated earlier."""
        parts = []
        dtype, shape = self.buffers[buffer]
        if program.input_values[buffer]:
            parts.append(overlap.host_tensor(
                _stacked_values(program.input_values[buffer], dtype.as_numpy_dtype, shape)))
        if program.input_nodes[buffer]:
            parts.append(_stacked(program.input_nodes[buffer]))
        if not parts:
            return self.no_rows[buffer]
        return parts[0] if len(parts) == 1 else tf.concat(parts, 0)


# The ints a call's vector (``_packed``) starts with: the step count and the
# lengths of the table and of the rows.
_HEAD = 3


def _packed(program):
    """A program's step table and rows, and per buffer the number of its
    computed rows and of all its rows (with its inputs'), as one int32
    vector: one tensor made per call, not three (each took 20-40 us in a
    25-tree inference, where TensorFlow's code runs cold: BENCHMARKS.md).
    It starts with the step count and the table's and rows' lengths."""
    ends = [computed + len(values) + len(nodes) for computed, values, nodes
            in zip(program.computed, program.input_values, program.input_nodes)]
    table = program.steps.reshape(-1)
    return np.concatenate([
        np.array([len(program.steps), len(table), len(program.rows),
                  *program.computed, *ends], np.int32),
        table, program.rows])


def _loop(condition, body, loop_vars):
    """A loop over the steps, one at a time (every read sees the writes
    before it), run as a loop of function calls.  Lowered to frames
    (TensorFlow's default), every loop variable not passed through as is
    (the buffers' handles, the weights read: a dozen for the Tree-LSTM)
    went through a merge, a switch and a next-iteration at every step:
    the 25-tree inference program ran 4-7% slower (6-16 us a step)."""
    return _unlowered(("While", "StatelessWhile"), tf.while_loop, condition, body,
                      loop_vars, parallel_iterations=1)


def _unlowered(types, make, *args, **kwargs):
    """``make(*args, **kwargs)``, its new ops of ``types`` (control flow)
    marked to run as function calls, not lowered to switches and merges,
    and their step-sized functions (a ``Case``'s branches, a loop's
    condition) on the single-threaded executor where they can be
    (``_single_threaded``).  (No public API says either; where these
    private ones fail, the defaults stay.)"""
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    outputs = make(*args, **kwargs)
    for op in graph.get_operations()[before:]:
        if op.type in types:
            try:
                op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))
            except (AttributeError, TypeError, ValueError):
                pass
            _single_threaded(op)
    return outputs


# Stateful ops whose kernels surely run synchronously: variables read,
# written, gathered from and scattered into, and the random, assert and
# print ops.  Any other stateful op keeps its function on the default
# executor (``_synchronous``).
_SYNCHRONOUS_STATEFUL = frozenset({
    "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp",
    "AssignSubVariableOp", "ResourceGather", "ResourceGatherNd",
    "ResourceScatterUpdate", "ResourceScatterAdd", "ResourceScatterSub",
    "ResourceScatterMul", "ResourceScatterDiv", "ResourceScatterMin",
    "ResourceScatterMax", "ResourceScatterNdUpdate", "ResourceScatterNdAdd",
    "DisableCopyOnRead", "VarIsInitializedOp", "RandomUniform",
    "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal", "Assert",
    "PrintV2"})


def _single_threaded(op):
    """Run the functions a step calls (a ``Case``'s branches, a loop's
    condition) on TensorFlow's single-threaded executor: their kernels
    one after another on the calling thread, without the default
    executor's ready queues and pass through the thread pool, about 8 us
    of a narrow step's 45 (the Tree-LSTM's programs, BENCHMARKS.md).
    That executor blocks its thread until an asynchronous kernel (a
    function call, a loop, a queue) completes; when the kernel's work
    needs that thread (the only inter-op thread, here), it never does.
    So a function moves only if none of its ops calls a function and
    each is stateless or a known synchronous stateful op.  A
    loop's body, which holds the ``Case``, keeps the default executor,
    and so does every function where a GPU could run it (the executor
    is measured and tested here on the CPU only)."""
    if not overlap.cpu_only():
        return
    try:
        if op.type in ("Case", "StatelessCase"):
            key = "branches"
            graphs = [getattr(op, f"_branch_graph_{k}", None)
                      for k in range(len(op.get_attr(key)))]
        elif op.type in ("While", "StatelessWhile"):
            key, graphs = "cond", [getattr(op, "_cond_graph", None)]
        else:
            return
        value = attr_value_pb2.AttrValue()
        value.CopyFrom(op.node_def.attr[key])
        functions = list(value.list.func) if value.HasField("list") else [value.func]
        marked = False
        for function, graph in zip(functions, graphs):
            if graph is not None and all(_synchronous(inner) for inner in graph.get_operations()):
                function.attr["_executor"].s = b"SINGLE_THREADED_EXECUTOR"
                marked = True
        if marked:
            op._set_attr(key, value)
    except (AttributeError, TypeError, ValueError):
        pass


def _synchronous(op):
    """Whether ``op``'s kernel surely runs synchronously (``_single_threaded``)."""
    if any(value.HasField("func") or len(value.list.func)
           for value in op.node_def.attr.values()):
        return False
    return not op.op_def.is_stateful or op.type in _SYNCHRONOUS_STATEFUL


def _block_shape(row_shape):
    """A block of rows of ``row_shape`` as a tensor list's element shape."""
    return tf.constant([-1, *(-1 if size is None else size for size in row_shape)],
                       tf.int32)


def _empty_list(dtype, row_shape):
    """An empty tensor list of blocks of rows of ``row_shape``, to which a
    loop's steps append (``TensorListPushBack``)."""
    return tf.raw_ops.EmptyTensorList(element_shape=_block_shape(row_shape),
                                      max_num_elements=-1, element_dtype=dtype)


def _concatenated(blocks, dtype, row_shape):
    """The rows of a list made by ``_empty_list``, in the order appended."""
    return tf.raw_ops.TensorListConcatV2(
        input_handle=blocks, element_shape=_block_shape(row_shape),
        leading_dims=tf.zeros([0], tf.int64), element_dtype=dtype)[0]


def _stacked_values(values, dtype, shape):
    """Python values of one spec (numbers, or lists of ``shape``) as one
    array.  Numbers and flat lists go through ``fromiter``: ``np.array``
    looks at every element for nesting, 250 us for 2,000 one-word lists
    (a lookup's ``[word_id]``) against 112."""
    if not shape:
        return np.fromiter(values, dtype, len(values))
    if len(shape) == 1:
        flat = itertools.chain.from_iterable(values)
        return np.fromiter(flat, dtype, len(values) * shape[0]).reshape(len(values), shape[0])
    return np.array(values, dtype).reshape(len(values), *shape)


def _add_rows(adjoint, gradient, rows, distinct):
    """``adjoint[rows] += gradient``.  Where no row is there twice
    (``distinct``, a trace's: ``_Compiled.backward_for``), by reading the
    rows, adding and writing them back: TensorFlow's scatter_add on the CPU
    adds row by row, and took 8.5 ms of a 256-tree backward (500 rows of
    150 floats: 107 us, against 39 for this; BENCHMARKS.md).  Rows repeated
    (an operand read twice, two instances reading one node) need
    scatter_add, which sums them; on distinct rows it adds the same
    values."""
    if distinct:
        adjoint.scatter_update(tf.IndexedSlices(adjoint.sparse_read(rows) + gradient, rows))
    else:
        adjoint.scatter_add(tf.IndexedSlices(gradient, rows))


def _stacked(nodes):
    """The nodes' values stacked on a new first axis, as rows of their
    batched values where they are plain rows (``VirtualNode.location``): a
    gather per run of rows of one batched value rather than a slice per
    node, and no tensor asked for its shape (``tf.stack`` asks; a queued
    tensor's shape waits for the tensor: overlap.py)."""
    parts, run = [], None   # run: (batched value, [rows])
    for node in nodes:
        source, row = node.location()
        if row is not None and run is not None and run[0] is source:
            run[1].append(row)
            continue
        if run is not None:
            parts.append(tf.gather(*run))
            run = None
        if row is not None:
            run = (source, [row])
        else:
            parts.append(tf.expand_dims(source, 0))
    if run is not None:
        parts.append(tf.gather(*run))
    return parts[0] if len(parts) == 1 else tf.concat(parts, 0)


def _rows_op(name, operands, compute, gradient):
    """An op on stacked rows recorded with ``gradient``, its gradient for
    that case (``rules.hooks``' ``rows``): no ops finding at run time what
    the trace knows (that nothing broadcasts, where a concat's parts are)."""
    with _tape.stop_recording():
        result = compute()
    _tape.record_operation(name, [result], list(operands), gradient)
    return result


def _gradient(value, gradient):
    if not _trainable(dtype_of(value)):
        return None
    if isinstance(gradient, tuple):   # entries of looked-up rows
        values, indices = gradient
        if is_variable(value):   # a table: its shape is static
            dense_shape = overlap.host_tensor(np.array(value.shape.as_list(), np.int32))
        else:
            dense_shape = tf.shape(value, out_type=tf.int32)
        # (A tensor made while ops are queued, even a constant, waits for
        # them when asked for its shape.)
        overlap.promise(dense_shape, [len(value.shape)])
        return tf.IndexedSlices(values, indices, dense_shape)
    return gradient


def _entries(table, parts):
    """A table's entries from the rows of its lookups in a step: per
    lookup, (indices, the gradient of its rows); None for none."""
    if not parts:
        return None
    values = [tf.reshape(tf.convert_to_tensor(gradient), (-1, *table.shape[1:]))
              for _, gradient in parts]
    indices = [tf.reshape(tf.cast(indices, tf.int32), (-1,)) for indices, _ in parts]
    if len(parts) == 1:
        return tf.IndexedSlices(values[0], indices[0])
    return tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0))


def _reads(kind, places):
    """The shared-argument numbers a kind reads: (those whose rows it looks
    up, those it reads otherwise).  A kind whose operands are all shared
    runs once for every instance, not through the lookup rule: it reads
    its table otherwise too."""
    op_entry = kind.entry
    looked, other = set(), set()
    for key, place in places.items():
        if key == "captured":
            for number, reads in zip(place, op_entry.pattern.captured_reads):
                if LOOKUP in reads:
                    looked.add(number)
                if WHOLE in reads:
                    other.add(number)
        elif key == op_entry.gathers_from and op_entry.looks_up_rows(kind.attrs):
            looked.add(place)
        else:
            other.add(place)
    if all(operand_kind == SHARED for operand_kind, _ in kind.operands):
        other |= looked
    return looked, other


def _batched(kind, values, flags, count):
    """A single op on stacked operands: its batch rule, else per instance."""
    op_entry, attrs = kind.entry, kind.attrs
    ranks = [len(getattr(value, "shape", ())) if is_shared else len(value.shape) - 1
             for value, is_shared in zip(values, flags)]
    output_spec = kind.spec[0] if op_entry.multi_output else kind.spec
    rule = rule_for(op_entry)
    if rule is not None:
        try:
            return rule(op_entry, attrs, values, flags, ranks, output_spec, count)
        except NoRule:
            pass
        if any(flags):
            # The rule refuses a shared operand (a concat of each instance's
            # row with the same zeros): give every instance the value as a row.
            rows = [tf.repeat(tf.expand_dims(tf.convert_to_tensor(value), 0), count, 0)
                    if is_shared else value for value, is_shared in zip(values, flags)]
            try:
                return rule(op_entry, attrs, rows, [False] * len(rows), ranks,
                            output_spec, count)
            except NoRule:
                pass
    return _each_instance(kind, values, flags, count)


def _each_instance(kind, values, flags, count):
    """The op run once per instance, in a loop over the step's rows."""
    op_entry, attrs = kind.entry, kind.attrs
    specs = kind.spec if op_entry.multi_output else [kind.spec]
    output_signature = [tf.TensorSpec(spec.shape, spec.dtype) for spec in specs]

    def one(instance):
        result = op_entry.call([value if is_shared else value[instance]
                                for value, is_shared in zip(values, flags)], attrs)
        return list(result) if op_entry.multi_output else [result]

    results = tf.map_fn(one, tf.range(count), fn_output_signature=output_signature)
    return results if op_entry.multi_output else results[0]


def _read(values, numbers):
    """The shared values ``numbers``, each variable read (a Keras
    variable too): the call's arguments."""
    return [tf.convert_to_tensor(values[number]) if is_variable(values[number])
            else values[number] for number in numbers]


class _Forward:
    """A training program's forward call: its buffers, and its op for the
    tapes (``record``), whose gradient is the backward call.  ``direct``:
    every input that can carry a gradient is a variable's (a read of it,
    or its handle), named in ``variables``."""

    def __init__(self, compiled, buffers, tape_inputs, variables, gradient, backward,
                 direct):
        self.compiled, self.buffers = compiled, buffers
        self.tape_inputs, self.variables = tape_inputs, variables
        # gradient(*upstream), for the tapes; backward(upstream), the call.
        self.gradient, self.backward, self.direct = gradient, backward, direct

    def record(self):
        """The op, on the tapes.  (They ask for the buffers' shapes, which
        waits for a queued forward; asked here first, a failure of the
        forward raises as TensorFlow's error for it, an OpError.)"""
        for buffer in self.buffers:
            buffer.shape   # noqa: B018 (waits)
        _tape.record_operation("subgraphjit_program", self.buffers, self.tape_inputs,
                               self.gradient)

    def speculate(self, buffer, row):
        """The backward of one row of a buffer, queued now, as
        ``tape.gradient`` of that row would run it: its upstream gradient
        ones at the row and zeros elsewhere (what TensorFlow's tape gives
        the op for a slice's ones).  Returns a Speculation."""
        dtype, shape = self.compiled.buffers[buffer]
        # (Made from NumPy values: tf.ones asks its tensor's shape, which
        # waits for the queue.)
        seed = tf.raw_ops.TensorScatterUpdate(
            tensor=tf.raw_ops.ZerosLike(x=self.buffers[buffer]),
            indices=overlap.host_tensor(np.array([[row]], np.int32)),
            updates=overlap.host_tensor(np.ones((1, *shape), dtype.as_numpy_dtype)))
        upstream = [None] * len(self.buffers)
        upstream[buffer] = seed
        # (Taken only where no tape records: api.GradientTape.)
        with _tape.stop_recording():
            gradients = self.backward(upstream)
        return Speculation({id(variable.handle): gradient
                            for variable, gradient in zip(self.variables, gradients)
                            if variable is not None and gradient is not None})


class Speculation:
    """The gradients of a training evaluation's one result with respect to
    the variables its program read (by the id of each one's handle),
    computed by a backward queued right behind the forward, before the
    user asks: ``tape.gradient(loss, variables)`` takes them
    (api.GradientTape) instead of waiting for the forward, running
    TensorFlow's tape and only then queueing the backward, while the
    other core idled (2.5 ms of a 25-tree training step)."""

    def __init__(self, gradients):
        self.gradients, self.used = gradients, False


class _Speculating:
    """Whether to speculate: a backward nobody took cost as much as the
    forward, so after one, the next 1, 2, 4, ... (at most 64) training
    evaluations do not speculate."""

    LONGEST_PAUSE = 64

    def __init__(self):
        self.last, self.pause, self.waiting = None, 0, 0

    def allowed(self):
        if self.last is not None and not self.last.used:
            self.pause = min(max(1, 2 * self.pause), self.LONGEST_PAUSE)
            self.waiting = self.pause
        elif self.last is not None:
            self.pause = 0
        self.last = None
        if self.waiting:
            self.waiting -= 1
            return False
        return True


SPECULATING = _Speculating()


def _speculate(forward, results, statistics):
    """The Speculation for the one result of a training evaluation, if the
    program's inputs let its backward alone give its gradients
    (``_Forward.direct``) and the result is a plain row of a buffer of
    floats; else None."""
    if not forward.direct or len(results) != 1 or not SPECULATING.allowed():
        return None
    source, row = results[0].location()
    buffer = next((b for b, tensor in enumerate(forward.buffers) if tensor is source), None)
    if buffer is None or row is None or not forward.compiled.buffers[buffer][0].is_floating:
        return None
    speculation = SPECULATING.last = forward.speculate(buffer, int(row))
    statistics["backwards_speculated"] += 1
    return speculation


def run(program, compiled, graph, statistics, recording, queued=False, arguments=None):
    """Run ``program`` with its compiled form and leave each node's value as
    its row of a buffer (``_native.write_back``: a loop over every node).
    A node with an output not kept is marked swallowed (like a node inside
    a pattern: left unevaluated, with its inputs, and computed only if
    someone asks; a multi-output node's kept outputs' access nodes have
    rows of their own).  ``queued``: the call is queued (overlap.py), so
    the operands the nodes drop are held until it has run
    (``overlap.hold``).  ``recording``: a tape could record (``could_record``):
    the forward is queued (execute.py), its backward speculated behind it
    (``_speculate``), and the op joins the tapes once it has run.
    ``arguments``: the call's, made before (``_Compiled.arguments``)."""
    outputs = forward = compiled(program, recording, arguments)
    if recording:
        outputs = forward.buffers
    statistics["program_runs"] += 1
    statistics["program_steps"] += len(program.steps)
    statistics["batches"] += len(program.steps)
    kinds, counts = program.steps[:, 0], program.steps[:, 1]
    statistics["batch_sizes"].update(counts.tolist())
    for kind_number, kind in enumerate(program.kinds):
        if kind.entry.node_kind not in PATTERN_KINDS and rule_for(kind.entry) is None \
                and not all(operand_kind == SHARED for operand_kind, _ in kind.operands):
            unbatched = int(counts[(kinds == kind_number) & (counts > 1)].sum())
            if unbatched:
                statistics["unbatched"][f"{kind.entry.name}: no batch rule"] += unbatched
    # (A training forward may be queued too: the operands are kept until
    # the tapes have seen it run.)
    keep = queued or recording
    results = _native.write_back(graph.nodes, graph.operands, *program.places,
                                 list(outputs), ACCESS, keep)
    results, operands = results if keep else (results, None)
    if queued:
        overlap.hold(graph.nodes, operands)
    if not recording:
        # With no tape (inference) rows stay rows of their buffer until
        # read: a slice each, at once, cost 6 ms of a 256-tree minibatch's
        # 144.
        return
    try:
        # Behind a queued forward, its backward for the one result (the
        # loss), before the tapes wait for the forward.
        speculation = _speculate(forward, results, statistics)
        forward.record()
    except tf.errors.OpError:
        _native.restore(operands)   # (the nodes run anew: execute.py)
        raise
    del operands   # (the forward ran: the operands it kept go)
    # A node nothing reads, such as the loss, is what the user
    # differentiates, often after the tape has stopped recording: its row
    # is taken now, while the tapes see the op, where it is called (not
    # queued behind the backward).  (TensorFlow says whether a tape could
    # record only privately; without it, rows are taken.)
    with overlap.in_place():
        for node in results:
            node.value()
    if speculation is not None:
        for tape in context.tapes:
            tape.speculated(results[0].value(), speculation)


def could_record():
    """Whether a tape (or forward accumulator) could record an op now."""
    return _tape is None or _tape.could_possibly_record()
