"""VirtualNode: one recorded op, standing in for the tf.Tensor it will become.

A VirtualNode behaves like an eager tf.Tensor: it has a dtype and shape from
the moment it is recorded, the operator overloads a tf.Tensor has (recorded
lazily), and it turns into its value whenever a value is needed: ``.numpy()``,
``float()``, ``bool()``, printing, NumPy conversion, or TensorFlow and Keras
converting it to a tensor.
"""

import sys

import numpy as np
import tensorflow as tf

from .. import _native, overlap
from ..forced import forced_site

# What reading an unevaluated node calls: ``evaluate(targets, forced_by=)``
# of subgraphjit/evaluate.py, which imports this module and so installs
# itself here (``use_evaluator``) instead of being imported from here.
_evaluate = None


def use_evaluator(evaluate):
    """Make ``evaluate`` what a node whose value is read before its
    evaluation calls (evaluate.py installs its own when imported)."""
    global _evaluate
    _evaluate = evaluate


def _methods_for(native_type):
    """Attach a class body's methods and attributes to ``native_type`` and
    return that type.  VirtualNode's storage is a C type (``_native.c``):
    its instances are not tracked by the cyclic garbage collector, which
    the instances of any class statement would be, even a slotted subclass
    (so the type is completed here rather than subclassed)."""
    def attach(body):
        for name, value in vars(body).items():
            if name not in ("__module__", "__qualname__", "__dict__",
                            "__weakref__"):
                setattr(native_type, name, value)
        return native_type
    return attach


@_methods_for(_native.VirtualNode)
class VirtualNode:
    """One recorded op (or one output of a multi-output op).

    Fields (C members, see ``_native.c``): ``id`` (global, increasing, so a
    topological order), ``entry`` (the op entry), ``inputs``
    (VirtualNodes, tensors, variables or Python values), ``attrs`` (the op's
    other arguments, hashable), ``spec`` (dtype and shape), ``result`` (the
    tf.Tensor once evaluated, else None), ``site`` (code object and line of
    the user's call, for error messages) and ``consumers`` (nodes recorded
    with this one as an operand).  The batching layer leaves a node's value
    as row ``row`` of a batched tensor ``batched`` and takes the row out
    (``result``) only when someone asks for it.  Nodes are made by
    ``record`` (``_native.record``), or as ``VirtualNode(id, entry, inputs,
    attrs, spec, site)``.
    """

    # tf.is_tensor() and Keras treat tensor-like objects as tensors.
    is_tensor_like = True
    # NumPy defers binary operators to us (np.float32(2) * node records).
    __array_priority__ = 100

    # -- static facts, no evaluation --------------------------------------
    @property
    def dtype(self):
        return self.spec.dtype

    @property
    def shape(self):
        return tf.TensorShape(self.spec.shape)

    def get_shape(self):
        return self.shape

    @property
    def ndim(self):
        return len(self.spec.shape)

    def __len__(self):
        if not self.spec.shape:
            raise TypeError("Scalar tensor has no `len()`")
        return self.spec.shape[0]

    def __iter__(self):
        if not self.spec.shape:
            raise TypeError("Cannot iterate over a scalar tensor.")
        return (self[i] for i in range(self.spec.shape[0]))

    # Nodes are hashed by identity, so passes can key dicts by node (a
    # tf.Tensor refuses hashing because ``==`` is elementwise; here too).
    __hash__ = object.__hash__

    # -- evaluation ----------------------------------------------------------
    def value(self):
        """The tf.Tensor this node stands for, evaluating it if needed."""
        if self.result is None:
            if self.batched is None and not self._output_taken():
                # Read before a scope or tf.build evaluated it: an evaluation
                # of its own, counted under the user's line that read it
                # (the stack is looked at only here, never while recording).
                _evaluate([self], forced_by=forced_site(sys._getframe(1)))
            if self.result is None:
                self.result = _row_of(self.batched, self.row)
                self.batched = None
        return self.result

    def _host(self):
        """The value as NumPy (``.numpy()``, ``np.asarray``, ``float()``,
        ``int()``, ``bool()``): evaluated like ``value()``, but a row of a
        batched value is copied out of its host buffer rather than taken out
        as a tensor of its own.  The node stays a row of its batched value,
        so a later batch gathers it with its neighbours instead of stacking
        a slice per read, the backward differentiates no slice per read
        (``tf.batching.map`` reads every instance's ``float(gate)`` of a
        round from one batched value), and reading a minibatch's outputs
        costs no op per instance."""
        if self.result is None:
            if self.batched is None and not self._output_taken():
                _evaluate([self], forced_by=forced_site(sys._getframe(1)))
            if overlap.holding():   # its batched value may still be computing
                overlap.end()
            if self.result is None and type(self.batched) is EAGER_TENSOR:
                try:   # a view of TensorFlow's host buffer (private; no copy)
                    host = self.batched._numpy()
                except AttributeError:
                    host = self.batched.numpy()
                return host[self.row].copy()   # as .numpy(): a copy
        return self.value().numpy()

    def location(self):
        """(batched value, row) when the value is a plain row of a batched
        value (read with others by one gather, never asking the tensor
        anything); else (the value, None).  Not plain: rows of a result over
        varying lengths or a padded corner (slice, tuple rows: varying.py),
        and a multi-output op's outputs (a list)."""
        if self.result is None and self.batched is None:
            self._output_taken()
        if (self.result is None and self.batched is not None
                and type(self.batched) is not list
                and type(self.row) not in (slice, tuple)):
            return self.batched, self.row
        return self.value(), None

    @property
    def evaluated(self):
        return self.result is not None or self.batched is not None

    def _output_taken(self):
        """Whether this is an access node (one output of a multi-output
        op) whose op has its value, and has now taken its output from it.
        The pattern search leaves the access nodes that other nodes read
        out of their evaluation (native/match.c, ``enqueue``): those nodes
        read the output from the op itself, and the access node takes it
        here, when asked for, with no evaluation of its own."""
        if getattr(self.entry, "node_kind", None) != "access" or not self.inputs:
            return False
        source = self.inputs[0]
        if type(source) is not VirtualNode or not source.evaluated:
            return False
        take_output(self, source)
        return True

    def numpy(self):
        return self._host()

    def __array__(self, dtype=None, copy=None):
        # np.asarray: a scalar's .numpy() is a NumPy scalar, not an array.
        return np.asarray(self._host(), dtype=dtype)

    def __tf_tensor__(self, dtype=None, name=None):
        # TensorFlow or Keras converting a node: an op outside the table, so
        # it runs eagerly on the value (forced_site names the op).
        return tf.convert_to_tensor(self.value(), dtype=dtype, name=name)

    def __bool__(self):
        return bool(self._host())

    def __float__(self):
        return float(self._host())

    def __int__(self):
        return int(self._host())

    def __index__(self):
        return self.value().__index__()

    def __round__(self, ndigits=None):
        return round(self.value(), ndigits)

    # Printing shows the value, as eager TensorFlow does, except where
    # TensorFlow or Keras format an unevaluated node into a message (an
    # error's "Arguments received by ...", a structure mismatch): there it
    # is described by its shape and dtype, so that building the message
    # neither forces an evaluation nor dumps the values.
    def __format__(self, format_spec):
        if _described(self, sys._getframe(1)):
            return format(self._description(), format_spec)
        return format(self.value(), format_spec)

    def __repr__(self):
        if _described(self, sys._getframe(1)):
            return self._description()
        return repr(self.value())

    def __str__(self):
        if _described(self, sys._getframe(1)):
            return self._description()
        return str(self.value())

    def _description(self):
        return (f"<subgraphjit.VirtualNode: shape={self.shape}, "
                f"dtype={self.dtype.name}, not evaluated>")


# Packages whose code formats values into messages rather than for the user.
_MESSAGE_BUILDERS = frozenset({"tensorflow", "keras", "tf_keras"})


def _described(node, caller):
    """Whether ``caller``, printing ``node``, gets its description rather
    than its value: the node is unevaluated and the caller is TensorFlow's
    or Keras's code (the user's own ``print``, f-string or ``repr`` shows
    the value, as do IPython, logging and the like)."""
    return (not node.evaluated and caller is not None and caller.f_globals.get(
        "__name__", "").partition(".")[0] in _MESSAGE_BUILDERS)


EAGER_TENSOR = type(tf.constant(0))


def take_output(access_node, source):
    """Give an access node its output of ``source``, its evaluated
    multi-output node, in place: a row of one of its batched values, or
    the output of its value."""
    index = access_node.attrs[0]
    if source.result is None and source.batched is not None:
        access_node.batched = source.batched[index]
        access_node.row = source.row
        if isinstance(access_node.row, tuple):   # a row per output
            access_node.row = access_node.row[index]
    else:
        access_node.result = source.value()[index]


def _row_of(batched, row):
    if isinstance(batched, list):  # a multi-output op's batched outputs
        if isinstance(row, tuple):   # ... each at its own row (batcher/program.py)
            return [output[r] for output, r in zip(batched, row)]
        return [output[row] for output in batched]
    return batched[row]
