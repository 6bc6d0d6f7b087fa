"""Keras layers called with VirtualNodes record one node (issue 16, part 3).

A Keras layer is the framework's own unit of work, so a call of a known
layer with nodes records *one* node whose op entry stands for that layer
instance: calls of the same layer across a minibatch's instances run as one
call on their rows concatenated along axis 0, each instance's own first
axis (``row_wise_rule``).

The hook is a wrapper around ``keras.layers.Layer.__call__`` (``install``).
Keras has no extension point for foreign tensor types: its ``__call__``
converts its arguments, and the TensorFlow functions its layers call are
Keras's own calls, which TensorFlow's dispatch must leave alone (dispatch.py:
Keras sets attributes on the tensors it gets back).  The wrapper does
nothing but call Keras unless subgraphjit is lazy, TensorFlow is executing
eagerly (not tracing a tf.function), an argument holds a node, the caller is
not Keras's own code (a Sequential model's layers get tensors, as before),
and the layer is one whose call is known to be row-wise and free of side
effects (``_refusal``).  Anything else runs Keras's own ``__call__``, which
evaluates the nodes as before (a counted forced evaluation).

The op entry is per layer instance, not per class and config: two Dense
layers of one config hold different weights, so only one layer's calls can
run as one call.  The node's spec comes from calling Keras's own ``__call__``
once per operand specs on stand-in zeros with every tape paused: the first
such call builds the layer exactly as eager's first call would (same shapes,
same initializer draws in the same order, Keras's own ``weights``,
``trainable_variables``, ``summary()``), and a layer that leaves a Keras mask
on its output is refused.  Evaluation calls ``__call__`` again, under the
user's tape, so the layer's variables get eager's gradients.

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

import functools
import itertools
import weakref

import numpy as np
import tensorflow as tf
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


def _refusal(layer):
    """Why calls of ``layer`` are not recorded, or None."""
    min_rank = _row_wise_classes().get(type(layer))
    if min_rank is None:
        return "not a layer known to be row-wise"
    if getattr(layer, "activity_regularizer", None) is not None:
        return "an activity regularizer adds a loss when called"
    if getattr(layer, "quantization_mode", None) is not None:
        return "a quantized layer"
    if getattr(layer, "dropout", 0) or getattr(layer, "recurrent_dropout", 0):
        return "dropout draws random masks when called"
    if getattr(layer, "mask_zero", False):
        return "the output carries a Keras mask"
    for name in ("activation", "recurrent_activation"):
        if not _keras_function(getattr(layer, name, None)):
            return f"its {name} is not one of Keras's (it may not be row-wise)"
    return None


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
    if site is None or _refusal(layer) is not None:
        return NotImplemented
    layout = _layout(args)
    if layout is None or not all(type(value) in _PLAIN for value in kwargs.values()):
        return NotImplemented
    operands, structure = layout
    entry = _entries.get(layer)
    if entry is None:
        entry = _entries[layer] = _make_entry(layer, original)
    attrs = (structure, tuple(sorted(kwargs.items())))
    try:
        result = _record(entry, (*operands, _MARKER), attrs, site)
    except NotLazy:
        return NotImplemented
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
    entry.min_rank = _row_wise_classes()[type(layer)]
    entry.output_structure = None      # the first output decides, for every key
    entry.refused_keys = set()

    def call(values, attrs):
        structure, kwargs = attrs
        args = _rebuild(list(values)[:-1], structure)   # without _MARKER
        outputs = original(entry.layer(), *args, **dict(kwargs))
        flat = tf.nest.flatten(outputs)
        return flat if entry.multi_output else flat[0]

    entry.call = call
    entry.infer = _infer
    return entry


def _infer(entry, inputs, attrs, key, site):
    """The output spec for ``key``: Keras's own ``__call__`` on stand-in
    zeros, every tape paused (the first call builds the layer).  Any error
    raises NotLazy, so Keras's own call with the nodes raises it, at the
    user's line."""
    if key in entry.refused_keys:
        raise NotLazy
    structure, kwargs = attrs
    stand_ins = [tf.zeros(operand_spec.shape, operand_spec.dtype)
                 for operand_spec in key[2:-1]]
    try:
        with tape_record.stop_recording():
            outputs = entry.fn(entry.layer(), *_rebuild(stand_ins, structure),
                               **dict(kwargs))
        flat = tf.nest.flatten(outputs)
        if not flat or not all(isinstance(output, tf.Tensor) for output in flat):
            raise NotLazy
        if any(getattr(output, "_keras_mask", None) is not None for output in flat):
            raise NotLazy
        output_structure = tf.nest.map_structure(lambda _: 0, outputs)
        if entry.output_structure is None:
            entry.output_structure = output_structure
            entry.multi_output = not isinstance(outputs, tf.Tensor)
        elif output_structure != entry.output_structure:
            raise NotLazy
    except Exception:
        entry.refused_keys.add(key)
        raise NotLazy from None
    specs = tuple(spec(output.dtype, tuple(output.shape)) for output in flat)
    output_spec = specs if entry.multi_output else specs[0]
    entry.cache[key] = output_spec
    return output_spec


# -- batching -----------------------------------------------------------------------

def row_wise_rule(entry, attrs, values, shared, ranks, output_spec, count):
    """All instances' calls of one row-wise layer as one call: each operand's
    rows concatenated along axis 0 (a shared operand repeated once per
    instance), the outputs split back.  Every operand and output must share
    the instance's first axis."""
    layer_values, layer_shared, layer_ranks = values[:-1], shared[:-1], ranks[:-1]
    if min(layer_ranks) < entry.min_rank:
        raise NoRule(f"an operand of rank below {entry.min_rank}")
    rows = None
    concatenated = []
    for value, is_shared in zip(layer_values, layer_shared):
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


register_family_rule(FAMILY, row_wise_rule)
