"""Keras layers called with VirtualNodes record one node (issue 16, part 3).

A Keras layer is the framework's own unit of work, so a call of a layer
with nodes records *one* node whose op entry stands for that layer
instance, and calls of the same layer across a minibatch's instances run
as one launch (``layer_rule``):

* a layer known to be row-wise (``_row_wise_rank``: Dense, Embedding,
  Keras's activation layers, the RNN cells, whose activations are Keras's)
  runs once on the instances' rows concatenated along axis 0, each
  instance's own first axis;
* any other layer -- a user's own ``keras.layers.Layer`` subclass, other
  built-in layers -- is marked per instance (``entry.min_rank`` None):
  its calls run as one ``tf.vectorized_map`` over the instances' operands
  stacked on a new leading axis, so each call sees exactly the operand it
  would see eagerly (no row-wise assumption); where vectorized_map cannot
  take the layer (pfor has no converter for an op, the layer reads a value
  in Python), the layer runs once per instance from then on, counted with
  the reason in ``stats()["unbatched"]``.

The hook is a wrapper around ``keras.layers.Layer.__call__`` (``install``).
Keras has no extension point for foreign tensor types: its ``__call__``
converts its arguments, and the TensorFlow functions its layers call are
Keras's own calls, which TensorFlow's dispatch must leave alone (dispatch.py:
Keras sets attributes on the tensors it gets back).  The wrapper does
nothing but call Keras unless subgraphjit is lazy, TensorFlow is executing
eagerly (not tracing a tf.function), an argument holds a node, and the
caller is not Keras's own code (a Sequential model's layers get tensors, as
before).  A layer whose call has effects besides its outputs is refused
(``_refusal``, and ``_side_effects`` for a layer not known to be row-wise):
it runs Keras's own ``__call__``, which evaluates the nodes as before (a
counted forced evaluation), and the reason is counted per call in
``stats()["layers_not_recorded"]``.

The op entry is per layer instance, not per class and config: two Dense
layers of one config hold different weights, so only one layer's calls can
run as one call.  The node's spec comes from calling Keras's own ``__call__``
once per operand specs on stand-in zeros with every tape paused: the first
such call builds the layer exactly as eager's first call would (same shapes,
same initializer draws in the same order, Keras's own ``weights``,
``trainable_variables``, ``summary()``), and a layer that leaves a Keras mask
on its output is refused.  Evaluation calls ``__call__`` again, under the
user's tape, so the layer's variables get eager's gradients.  A layer's call
never records (``_running``): a user's layer written with
``import subgraphjit as tf`` calls our functions on real tensors there.

Two places cannot take a layer node, and the node keeps out of them:

* patterns (``granularity="subgraph"``): a pattern is generated source of
  TensorFlow calls, and a layer call is none.  A node with a NumPy operand
  is never part of a pattern (``patterns.signature.has_value_operand``), so each
  layer node carries ``_MARKER``, a NumPy scalar the layer never sees;
* compiled programs (program.py): they pass the variables they read as
  explicit arguments and return gradients only for those, while a layer
  reads its own variables inside the trace, which would silently get no
  gradient.  A program with a layer kind refuses to compile and runs step
  by step (``programs_not_compiled`` names the reason).
"""

import contextlib
import functools
import itertools
import re
import weakref

import keras
import numpy as np
import tensorflow as tf
try:   # where Keras keeps the layer call in progress (no public API)
    from keras.src.backend.common import global_state
except ImportError:   # then a recorded call inherits nothing from it
    global_state = None
from tensorflow.python.eager import record as tape_record

from ..batcher.rules import NoRule, register_family_rule
from ..context import context
from ..ir.node import VirtualNode
from ..ir.record import record as _record
from ..ir.record import user_site
from ..ir.spec import NODE, TENSOR, VARIABLE, NotLazy, classify_operand, spec
from ..ir.table import OpEntry

FAMILY = "layer"
# The extra operand that keeps a layer node out of patterns (see above).
_MARKER = np.zeros((), np.int8)
_PLAIN = (type(None), bool, int, float, str)
_serials = itertools.count(1)
_entries = weakref.WeakKeyDictionary()   # layer -> its op entry


def _row_wise_classes():
    """Layer classes whose call maps each row of axis 0 to the same row of
    the output, by exact type (a subclass may override ``call``), with the
    least rank their inputs need for that: a Keras activation reduces over
    the last axis at most (softmax), which must not be the first axis."""
    from keras import layers
    return {layers.Dense: 2, layers.Embedding: 1, layers.Activation: 2,
            layers.ReLU: 2, layers.LeakyReLU: 2, layers.ELU: 2,
            layers.GRUCell: 2, layers.LSTMCell: 2, layers.SimpleRNNCell: 2}


def _keras_function(function):
    return function is None or (getattr(function, "__module__", "") or "").startswith(
        "keras.")


def _row_wise_rank(layer):
    """The least rank of inputs for which ``layer``'s call is row-wise, or
    None: a layer of those classes whose activation is not Keras's may not
    be, and runs per instance."""
    min_rank = _row_wise_classes().get(type(layer))
    if min_rank is None or not all(
            _keras_function(getattr(layer, name, None))
            for name in ("activation", "recurrent_activation")):
        return None
    return min_rank


def _refusal(layer):
    """Why calls of ``layer`` are not recorded, or None: what its attributes
    say (``_traced`` finds what they cannot)."""
    if getattr(layer, "activity_regularizer", None) is not None:
        return "an activity regularizer adds a loss when called"
    if getattr(layer, "quantization_mode", None) is not None:
        return "a quantized layer"
    if getattr(layer, "dropout", 0) or getattr(layer, "recurrent_dropout", 0):
        return "dropout draws random masks when called"
    if getattr(layer, "mask_zero", False):
        return "the output carries a Keras mask"
    if getattr(layer, "stateful", False) is True:
        return "a stateful layer keeps its state across calls"
    return None


def _not_recorded(layer, reason):
    """Count a call that runs Keras's own ``__call__``, for ``stats()``."""
    context.layers_not_recorded[f"keras.layers.{type(layer).__name__}: {reason}"] += 1
    return NotImplemented


@contextlib.contextmanager
def _running(outside_calls):
    """A layer's own call: it runs TensorFlow's ops rather than recording
    them (a user's layer written with ``import subgraphjit as tf`` calls
    our functions), and, ``outside_calls``, outside any enclosing layer's
    call in progress: a recorded call runs at evaluation as it would have
    run alone, with the call-context arguments it inherited when recorded
    passed explicitly (``_inherited``)."""
    lazy, context.lazy = context.lazy, False
    outside_calls = outside_calls and global_state is not None
    enclosing = outside_calls and global_state.get_global_attribute("current_call_ctx")
    if outside_calls:
        global_state.set_global_attribute("current_call_ctx", None)
    try:
        yield
    finally:
        context.lazy = lazy
        if outside_calls:
            global_state.set_global_attribute("current_call_ctx", enclosing)


def _inherited(layer, kwargs):
    """``kwargs`` and the call-context arguments (``training``) ``layer``
    inherits from an enclosing layer's call in progress, as Keras would
    pass them: the recorded call runs later, outside that call."""
    enclosing = global_state and global_state.get_global_attribute("current_call_ctx")
    if not enclosing:
        return kwargs
    inherited = {name: enclosing.get_value(name)
                 for name in getattr(layer, "_call_context_args", ())
                 if name not in kwargs and enclosing.get_value(name) is not None}
    return {**kwargs, **inherited}


# -- the hook -------------------------------------------------------------------

def install():
    """Wrap ``keras.layers.Layer.__call__`` (once per process)."""
    from keras.layers import Layer
    original = Layer.__call__
    if getattr(original, "_subgraphjit_original", None) is not None:
        return

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        if context.lazy and _holds_node(args) and tf.executing_eagerly():
            result = _record_call(self, original, args, kwargs)
            if result is not NotImplemented:
                return result
        try:
            return original(self, *args, **kwargs)
        except Exception as error:
            _keep_notes(error)
            raise

    __call__._subgraphjit_original = original
    Layer.__call__ = __call__


def _keep_notes(error):
    """Keras re-raises an error from a layer's ``call`` as a new exception
    with the call's arguments in its message, and without the notes of the
    one it caught (its ``__context__``): among them ours, naming the user's
    line of a recorded op (``ir.record.annotate``).  Give them back."""
    caught = error.__context__
    if not getattr(error, "_keras_call_info_injected", False) or caught is None:
        return
    kept = getattr(error, "__notes__", [])
    for note in getattr(caught, "__notes__", []):
        if note not in kept:
            error.add_note(note)


def _holds_node(args):
    for arg in args:
        if type(arg) is VirtualNode:
            return True
        if type(arg) in (list, tuple) and any(type(item) is VirtualNode for item in arg):
            return True
    return False


def _leaf(value):
    operand_class = classify_operand(value)
    return operand_class in (NODE, VARIABLE) or (
        operand_class == TENSOR and hasattr(value, "_numpy"))   # an eager tensor


def _layout(args):
    """(operands, structure) of positional arguments that are tensors,
    nodes, variables, or lists or tuples of them (a cell's states); None
    for anything else."""
    operands, structure = [], []
    for arg in args:
        if _leaf(arg):
            operands.append(arg)
            structure.append(None)
        elif type(arg) in (list, tuple) and all(_leaf(item) for item in arg):
            operands.extend(arg)
            structure.append((type(arg), len(arg)))
        else:
            return None
    return operands, tuple(structure)


def _rebuild(values, structure):
    args, position = [], 0
    for part in structure:
        if part is None:
            args.append(values[position])
            position += 1
        else:
            kind, length = part
            args.append(kind(values[position:position + length]))
            position += length
    return args


def _record_call(layer, original, args, kwargs):
    """The call's node (or its outputs' nodes, in the output's structure),
    or NotImplemented: Keras's own ``__call__`` runs."""
    site = user_site()
    if site is None:   # Keras's own code: not a refusal
        return NotImplemented
    reason = _refusal(layer)
    if reason is not None:
        return _not_recorded(layer, reason)
    layout = _layout(args)
    if layout is None:
        return _not_recorded(
            layer, "a positional argument is not a tensor or a list of them")
    kwargs = _inherited(layer, kwargs)
    if not all(type(value) in _PLAIN for value in kwargs.values()):
        return _not_recorded(layer, "a keyword argument is not a plain Python value")
    operands, structure = layout
    entry = _entries.get(layer)
    if entry is None:
        entry = _entries[layer] = _make_entry(layer, original)
    attrs = (structure, tuple(sorted(kwargs.items())))
    try:
        result = _record(entry, (*operands, _MARKER), attrs, site)
    except NotLazy as error:
        return _not_recorded(layer, error.args[0] if error.args else
                             "an operand subgraphjit cannot record")
    if not entry.multi_output:
        _hold_while_alive(entry, layer, result)
        return result
    for node in result:   # (each output holds the call's node)
        _hold_while_alive(entry, layer, node)
    return tf.nest.pack_sequence_as(entry.output_structure, list(result))


def _hold_while_alive(entry, layer, node):
    """The entry holds its layer while ``node`` lives: a node evaluated
    after the user dropped the layer still runs it, as eager TensorFlow
    ran it already.  (The entry itself holds the layer weakly: op entries
    sit in caches, which would otherwise keep every layer ever called.)"""
    entry.held = layer

    def released(reference):
        entry.watched.discard(reference)
        if not entry.watched:
            entry.held = None
    entry.watched.add(weakref.ref(node, released))


def _make_entry(layer, original):
    name = f"keras.layers.{type(layer).__name__}({layer.name})#{next(_serials)}"
    entry = OpEntry(name, original, FAMILY)
    entry.layer = weakref.ref(layer)   # an entry must not keep its layer alive...
    entry.held, entry.watched = None, set()   # ... but its live nodes do
    entry.min_rank = _row_wise_rank(layer)   # None: per instance
    entry.vectorized = None        # per instance: the tf.function of _map_calls
    entry.not_vectorized = None    # ... or why vectorized_map failed, once it did
    entry.output_structure = None      # the first output decides, for every key
    entry.refused_keys = {}            # key -> why Keras's own call runs

    def call(values, attrs):
        structure, kwargs = attrs
        args = _rebuild(list(values)[:-1], structure)   # without _MARKER
        with _running(outside_calls=True):
            outputs = original(entry.layer(), *args, **dict(kwargs))
        flat = tf.nest.flatten(outputs)
        return flat if entry.multi_output else flat[0]

    entry.call = call
    entry.infer = _infer
    return entry


def _infer(entry, inputs, attrs, key, site):
    """The output spec for ``key``, from Keras's own ``__call__`` on the
    operand specs (the first call builds the layer); a refusal raises
    NotLazy with the reason, so Keras's own call with the nodes runs (and
    raises any error of the layer's, at the user's line).

    A row-wise layer is called on stand-in zeros, every tape paused.  Any
    other layer is traced on placeholders instead (``_traced``): its call
    may have effects an eager call would apply, which a trace only finds."""
    if key in entry.refused_keys:
        raise NotLazy(entry.refused_keys[key])
    operand_specs = key[2:-1]
    try:
        if entry.min_rank is not None:
            outputs, reason = _called(entry, attrs, operand_specs), None
        else:
            outputs, reason = _traced(entry, attrs, operand_specs)
        reason = reason or _output_refusal(entry, outputs)
    except Exception as error:
        reason = f"its call on stand-ins raised {type(error).__name__}"
    if reason is not None:
        entry.refused_keys[key] = reason
        raise NotLazy(reason)
    flat = tf.nest.flatten(outputs)
    specs = tuple(spec(output.dtype, tuple(output.shape)) for output in flat)
    output_spec = specs if entry.multi_output else specs[0]
    entry.cache[key] = output_spec
    return output_spec


def _called(entry, attrs, operand_specs):
    """Keras's own ``__call__`` of the entry's layer on stand-in zeros,
    every tape paused."""
    structure, kwargs = attrs
    stand_ins = [tf.zeros(operand_spec.shape, operand_spec.dtype)
                 for operand_spec in operand_specs]
    with tape_record.stop_recording(), _running(outside_calls=False):
        return entry.fn(entry.layer(), *_rebuild(stand_ins, structure), **dict(kwargs))


# Stateful ops that only read a variable.
_READS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd",
                    "VariableShape"})


def _traced(entry, attrs, operand_specs):
    """(outputs, why the call may not be recorded or None) of a layer not
    known to be row-wise: a recorded call runs later, all instances at
    once, where an effect of the call would differ from eager's.

    The call is traced on placeholders (as dispatch.py checks a generic
    API), so none of its ops runs, inside a Keras ``StatelessScope``,
    which collects the Keras variables the call would assign (a random
    seed: Dropout; moving statistics: BatchNormalization in training; the
    states of a stateful RNN) and the losses it would add, instead of
    applying them; a first call builds the layer there, its variables
    initialized as eager's first call initializes them.  A call that
    cannot be traced (it reads a value in Python) is called on stand-in
    zeros in the scope instead, unchecked, and runs per instance
    (``_vectorized_rule``)."""
    structure, kwargs = attrs
    layer = entry.layer()

    def traced(*placeholders):
        return entry.fn(layer, *_rebuild(list(placeholders), structure), **dict(kwargs))

    with keras.StatelessScope(collect_losses=True) as scope:
        try:
            with _running(outside_calls=False):
                graph = tf.function(traced).get_concrete_function(*[
                    tf.TensorSpec(operand_spec.shape, operand_spec.dtype)
                    for operand_spec in operand_specs]).graph
        except Exception:
            return _called(entry, attrs, operand_specs), None
    if scope.state_mapping:
        assigned = [variable.path for variable in layer.variables
                    if scope.get_current_value(variable) is not None]
        seeds = [generator.state for sublayer in layer._flatten_layers()
                 for generator in sublayer._seed_generators]
        if any(scope.get_current_value(seed) is not None for seed in seeds):
            return None, ("it draws random numbers when called "
                          f"(assigns {', '.join(assigned)})")
        return None, f"its call assigns {', '.join(assigned) or 'a Keras variable'}"
    if scope.losses:
        return None, "its call adds a loss"
    stateful = sorted({op.type for op in graph.get_operations()
                       if op.op_def is not None and op.op_def.is_stateful} - _READS)
    if stateful:
        return None, f"its call has stateful ops {stateful}"
    outputs = graph.structured_outputs
    if not all(output.shape.is_fully_defined() for output in tf.nest.flatten(outputs)):
        return None, "its output's shape depends on values"
    return outputs, None


def _output_refusal(entry, outputs):
    """Why a layer's outputs cannot be a node's, or None; the first
    outputs decide the entry's output structure."""
    flat = tf.nest.flatten(outputs)
    if not flat or not all(isinstance(output, tf.Tensor) for output in flat):
        return "its output is not tensors"
    if any(getattr(output, "_keras_mask", None) is not None for output in flat):
        return "the output carries a Keras mask"
    output_structure = tf.nest.map_structure(lambda _: 0, outputs)
    if entry.output_structure is None:
        entry.output_structure = output_structure
        entry.multi_output = not isinstance(outputs, tf.Tensor)
    elif output_structure != entry.output_structure:
        return "its output's structure changed between calls"
    return None


# -- batching -----------------------------------------------------------------------

def layer_rule(entry, attrs, values, shared, ranks, output_spec, count):
    """All instances' calls of one layer as one launch; ``values``,
    ``shared`` and ``ranks`` end with ``_MARKER``'s place."""
    if entry.min_rank is not None:
        return _row_wise_rule(entry, attrs, values[:-1], shared[:-1], ranks[:-1], count)
    return _vectorized_rule(entry, attrs, values[:-1], tuple(shared[:-1]))


def _row_wise_rule(entry, attrs, values, shared, ranks, count):
    """One call on each operand's rows concatenated along axis 0 (a shared
    operand repeated once per instance), the outputs split back.  Every
    operand and output must share the instance's first axis."""
    if min(ranks) < entry.min_rank:
        raise NoRule(f"an operand of rank below {entry.min_rank}")
    rows = None
    concatenated = []
    for value, is_shared in zip(values, shared):
        instance_shape = value.shape if is_shared else value.shape[1:]
        if rows is None:
            rows = instance_shape[0]
        if instance_shape[0] != rows or rows is None:
            raise NoRule("operands of different first axes")
        if is_shared:
            value = tf.convert_to_tensor(value)
            concatenated.append(tf.tile(value, [count] + [1] * (len(value.shape) - 1)))
        else:
            concatenated.append(tf.reshape(value, [-1, *instance_shape[1:]]))
    outputs = entry.call([*concatenated, None], attrs)   # None: _MARKER's place
    flat = outputs if entry.multi_output else [outputs]
    if not isinstance(count, int) or any(
            output.shape.rank == 0 or output.shape[0] != count * rows for output in flat):
        raise NoRule("an output of another first axis")
    result = [tf.reshape(output, [count, rows, *output.shape[1:]]) for output in flat]
    return result if entry.multi_output else result[0]


def _vectorized_rule(entry, attrs, values, shared):
    """The calls as one ``tf.vectorized_map`` over the operands stacked on
    their new leading axis (a shared operand passed whole to each call),
    in a ``tf.function`` of the entry's, traced once per operand specs:
    tf.vectorized_map called eagerly traces anew at every call (60 ms for
    a small layer, against 1 ms for the traced function's call).

    Where pfor cannot vectorize the call, this raises NoRule, and the
    executor calls the layer once per instance and counts the reason;
    the entry remembers it, and is not traced again.  Not pfor's own
    ``fallback_to_while_loop``, though faster where it works: measured on
    a layer of a matmul and tf.linalg.svd (no pfor converter), forward and
    gradient of 16 instances, its while loop took 2.6 ms where calls per
    instance took 19 ms (64: 5 ms, 87 ms).  But inside a while loop the
    gradient fails for ops whose eager gradient works (tf.py_function: a
    KeyError; tf.unique: no gradient defined), and it fails in the user's
    ``tape.gradient``, too late to run per instance instead."""
    if entry.not_vectorized is not None:
        raise NoRule(entry.not_vectorized)
    stacked = [value for value, is_shared in zip(values, shared) if not is_shared]
    whole = [value for value, is_shared in zip(values, shared) if is_shared]
    if entry.vectorized is None:
        entry.vectorized = tf.function(functools.partial(_map_calls, entry))
    try:   # (traced once per specs: each count of instances runs the same)
        traced = entry.vectorized.get_concrete_function(
            [tf.TensorSpec([None, *value.shape[1:]], value.dtype) for value in stacked],
            whole, shared, attrs)
    except Exception as error:
        entry.not_vectorized = f"vectorized_map failed: {_cause(error)}"
        raise NoRule(entry.not_vectorized) from None
    return traced(stacked, whole, shared, attrs)


def _map_calls(entry, stacked, whole, shared, attrs):
    def call(rows):
        rows, whole_values = iter(rows), iter(whole)
        values = [next(whole_values) if is_shared else next(rows) for is_shared in shared]
        return entry.call([*values, None], attrs)   # None: _MARKER's place
    return tf.vectorized_map(call, stacked, fallback_to_while_loop=False)


# The cause in a trace's error message, which TensorFlow (autograph) and
# Keras wrap in lines of their own: pfor's, Keras's (in bold), autograph's.
_CAUSES = (re.compile(r"(No pfor vectorization defined for \w+)"),
           re.compile(r"\x1b\[1m(.+?)\x1b\[0m"),
           re.compile(r"^\s*(\w+(?:Error|Exception): .+)$", re.MULTILINE))


def _cause(error):
    text = str(error)
    for pattern in _CAUSES:
        found = pattern.search(text)
        if found:
            return found.group(1).strip()[:160]
    lines = text.strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:160]}" if lines else type(error).__name__


register_family_rule(FAMILY, layer_rule)
