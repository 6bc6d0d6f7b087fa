"""The op table: one entry per TensorFlow op that subgraphjit records lazily.

An entry names the public TensorFlow function, how the op batches (its
family), how many of its leading parameters take tensors, and which of those
hold indices.  Everything else -- the wrapper with TensorFlow's exact signature,
the evaluator, every public alias (``tf.add`` is ``tf.math.add``), the
VirtualNode operator overloads -- is generated from these entries.  Ops not
listed here still work: TensorFlow's own functions given a VirtualNode
record a generic entry that runs per instance (``dispatch.py``), or else
evaluate the node first, so adding an entry is a speed change, never a
correctness change.

``OpEntry`` is the entry type, of this table's entries and of every other
op entry a node can have (generic and Keras layer entries, patterns, the
access entry); an entry's ``node_kind`` says which kind of node it makes.
Attributes are held hashable (``freeze``), as the record cache keys them.

Families, for the batching layer:

=============  ==============================================================
elementwise    one tensor in, same shape out (sigmoid, tanh, exp, cast, ...)
broadcasting   tensors broadcast against each other (add, maximum, clip)
reduction      reduces the axes its attributes name (reduce_sum, softmax)
matmul         matrix products, with transpose flags
shape          moves data, never computes (reshape, transpose, slicing)
concat         joins a list of tensors (concat, stack, add_n)
split          multi-output: one tensor to a list (split, unstack)
gather         indexes a table with integer ids (gather, embedding_lookup)
loss           losses over logits and labels
source         no tensors in: a constant of a shape (zeros, ones), the same
               for every instance
=============  ==============================================================
"""

import operator

import tensorflow as tf

from .spec import NotLazy


# What a node is, named by its entry's ``node_kind``: the one place Python
# tells nodes apart (the C code compares with the access entry it is given).
# An entry's ``family`` says how an op batches; its node kind, what it does:
#   "op"       a TensorFlow op: an entry of the table, a generic entry
#              (dropin/dispatch.py) or a Keras layer's call (dropin/layers.py)
#   "access"   one output of a multi-output node (the one ACCESS entry)
#   "pattern"  a compiled frequent subgraph (patterns/codegen.py's Pattern)
#   "fused"    two patterns joined into one call (codegen's FusedPattern)
NODE_KINDS = ("op", "access", "pattern", "fused")
# The node kinds that run a pattern's compiled code (``entry.pattern``).
PATTERN_KINDS = frozenset({"pattern", "fused"})


# How a node reads a shared value (a compiled program asks, per kind):
# rows of it looked up (``OpEntry.looks_up_rows``), or otherwise, whole.
LOOKUP, WHOLE = "lookup", "whole"


class OpEntry:
    """One entry of the op table.

    The first ``tensors`` parameters of ``fn`` take tensors (with
    ``list_input``, the first parameter takes a list of tensors, and with
    ``lone_is_list`` a value that is no list or tuple is a list of it, as
    in ``tf.concat``, rather than iterated); every other
    parameter except ``name`` is an attribute.  ``index_positions`` are tensor
    operands holding indices (stand-ins there are zeros).  ``family`` says how
    the op batches; ``multi_output`` ops return a list of nodes.
    ``gathers_from`` is the operand whose rows the op gathers (None for
    other ops): a variable there gets its gradient from eager TensorFlow as
    an IndexedSlices with one slice per gathered row.  ``node_kind`` is one
    of ``NODE_KINDS``; an entry of a pattern kind has its ``pattern``.
    """

    def __init__(self, name, fn, family, tensors=1, list_input=False,
                 lone_is_list=False, index_positions=(), multi_output=False, thaw=None,
                 gathers_from=None, node_kind="op"):
        if node_kind not in NODE_KINDS:
            raise ValueError(f"unknown node kind {node_kind!r}")
        self.node_kind = node_kind
        self.pattern = None         # what an entry of a pattern kind runs
        self.name = name
        self.fn = fn
        self.family = family
        self.tensors = tensors
        self.list_input = list_input
        self.lone_is_list = lone_is_list
        self.index_positions = frozenset(index_positions)
        self.multi_output = multi_output
        self.thaw = thaw            # undoes ``freeze`` for ops with odd attrs
        self.gathers_from = gathers_from
        self.cache = {}             # (attrs, *operand specs) -> output spec
        self.infer = None           # its own inference (dispatch.py's generic entries)
        self.dispatch_target = None  # what TensorFlow's own function calls on a node
        self.call = None            # (operand values, attrs) -> result
        self.tensor_params = ()
        self.attr_params = ()

    def looks_up_rows(self, attrs):
        """Whether a node of this op with ``attrs`` looks rows of its
        ``gathers_from`` operand up: a ``tf.gather`` along another axis,
        or with ``batch_dims``, reads a variable whole, and eager
        TensorFlow gives it a dense gradient."""
        if self.gathers_from is None:
            return False
        options = dict(zip(self.attr_params, attrs))
        return not options.get("axis") and not options.get("batch_dims")

    def __repr__(self):
        return f"OpEntry({self.name})"


def _access_call(values, attrs):
    return values[0][attrs[0]]


# The entry of every access node: output ``attrs[0]`` of its multi-output input.
ACCESS = OpEntry("access", None, "access", node_kind="access")
ACCESS.call = _access_call


# -- attributes: held hashable ---------------------------------------------

class FrozenSlice(tuple):
    """A hashable stand-in for a ``slice`` in an attribute."""


def freeze(value):
    """Make an attribute hashable: lists become tuples, tensors tuples of
    numbers, slices FrozenSlice; ``thaw`` undoes the slices."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(item) for item in value)
    if isinstance(value, slice):
        return FrozenSlice(freeze((value.start, value.stop, value.step)))
    if hasattr(value, "numpy"):
        # A tensor (or node) used as an attribute, such as a shape or an axis:
        # its value is what counts.
        array = value.numpy()
        return array.item() if array.ndim == 0 else freeze(array.tolist())
    try:
        hash(value)
    except TypeError:
        raise NotLazy from None
    return value


def thaw(value):
    if isinstance(value, FrozenSlice):
        return slice(*value)
    if isinstance(value, tuple):
        return tuple(thaw(item) for item in value)
    return value


# -- the entries -------------------------------------------------------------

def _resolve(path):
    target = tf
    for part in path.split("."):
        target = getattr(target, part)
    return target


def _entries(family, paths, **options):
    return [OpEntry(path, _resolve(path), family, **options) for path in paths]


TF_ENTRIES = [
    *_entries("elementwise", [
        "math.sigmoid", "math.tanh", "nn.relu", "nn.relu6", "nn.elu",
        "nn.selu", "nn.softplus", "nn.softsign", "nn.silu", "nn.gelu",
        "nn.leaky_relu", "math.log_sigmoid", "math.exp", "math.log",
        "math.log1p", "math.expm1", "math.negative", "math.abs",
        "math.square", "math.sqrt", "math.rsqrt", "math.reciprocal",
        "math.sign", "math.floor", "math.ceil", "math.round", "math.sin",
        "math.cos", "math.erf", "math.logical_not", "cast", "identity",
        "zeros_like", "ones_like", "stop_gradient"]),
    *_entries("broadcasting", [
        "math.add", "math.subtract", "math.multiply", "math.divide",
        "math.truediv", "math.floordiv", "math.floormod", "math.pow",
        "math.maximum", "math.minimum", "math.squared_difference",
        "math.equal", "math.not_equal", "math.less", "math.less_equal",
        "math.greater", "math.greater_equal", "math.logical_and",
        "math.logical_or", "nn.bias_add"], tensors=2),
    *_entries("broadcasting", ["clip_by_value"], tensors=3),
    *_entries("reduction", [
        "math.reduce_sum", "math.reduce_mean", "math.reduce_max",
        "math.reduce_min", "math.reduce_prod", "math.reduce_logsumexp",
        "math.reduce_any", "math.reduce_all", "math.argmax", "math.argmin",
        "nn.softmax", "nn.log_softmax"]),
    *_entries("matmul", ["linalg.matmul", "tensordot"], tensors=2),
    *_entries("shape", ["reshape", "transpose", "expand_dims", "squeeze",
                        "tile", "reverse"]),
    # (tf.concat takes a lone tensor as a list of it, where the others
    # iterate it: its rows.)
    *_entries("concat", ["concat"], list_input=True, lone_is_list=True),
    *_entries("concat", ["stack", "math.add_n"], list_input=True),
    *_entries("split", ["split", "unstack"], multi_output=True),
    *_entries("gather", ["gather", "nn.embedding_lookup"], tensors=2,
              index_positions=(1,), gathers_from=0),
    *_entries("gather", ["one_hot"], index_positions=(0,)),
    *_entries("source", ["zeros", "ones"], tensors=0),
    *_entries("loss", ["nn.sparse_softmax_cross_entropy_with_logits"],
              tensors=2, index_positions=(0,)),
    *_entries("loss", ["nn.softmax_cross_entropy_with_logits",
                       "nn.sigmoid_cross_entropy_with_logits"], tensors=2),
]


# -- Python operators on VirtualNodes -----------------------------------------
# Each entry evaluates with Python's own operator on real tensors, so ``2 - x``
# and ``x[1:, ::2]`` mean exactly what they mean on a tf.Tensor.

def _operator_function(name, python_operator, arity):
    if arity == 1:
        def function(x):
            return python_operator(x)
    else:
        def function(x, y):
            return python_operator(x, y)
    function.__name__ = name
    function.__qualname__ = name
    return function


# dunder name -> (entry name, Python operator, arity); VirtualNode's C slots
# take either operand order (native/_native.c)
OPERATORS = {
    "__add__": ("add", operator.add, 2),
    "__sub__": ("sub", operator.sub, 2),
    "__mul__": ("mul", operator.mul, 2),
    "__truediv__": ("truediv", operator.truediv, 2),
    "__floordiv__": ("floordiv", operator.floordiv, 2),
    "__mod__": ("mod", operator.mod, 2),
    "__pow__": ("pow", operator.pow, 2),
    "__matmul__": ("matmul", operator.matmul, 2),
    "__and__": ("and", operator.and_, 2),
    "__or__": ("or", operator.or_, 2),
    "__xor__": ("xor", operator.xor, 2),
    "__lt__": ("lt", operator.lt, 2),
    "__le__": ("le", operator.le, 2),
    "__gt__": ("gt", operator.gt, 2),
    "__ge__": ("ge", operator.ge, 2),
    "__eq__": ("eq", operator.eq, 2),
    "__ne__": ("ne", operator.ne, 2),
    "__neg__": ("neg", operator.neg, 1),
    "__abs__": ("abs", operator.abs, 1),
    "__invert__": ("invert", operator.invert, 1),
}

_FAMILY_OF_OPERATOR = {"matmul": "matmul", "neg": "elementwise",
                       "abs": "elementwise", "invert": "elementwise"}

OPERATOR_ENTRIES = {
    dunder: OpEntry(f"operator.{name}",
                    _operator_function(name, python_operator, arity),
                    _FAMILY_OF_OPERATOR.get(name, "broadcasting"), tensors=arity)
    for dunder, (name, python_operator, arity) in OPERATORS.items()
}


def _getitem(tensor, slice_spec):
    return tensor[slice_spec]


GETITEM = OpEntry("operator.getitem", _getitem, "shape", thaw=thaw)

ALL_ENTRIES = TF_ENTRIES + list(OPERATOR_ENTRIES.values()) + [GETITEM]

# Every entry a pattern can name (a signature labels an op by its entry's
# name; patterns/codegen.py turns the name back into the entry): the
# entries above, and each generic entry as dropin/dispatch.py makes it.
ENTRIES_BY_NAME = {entry.name: entry for entry in ALL_ENTRIES}

