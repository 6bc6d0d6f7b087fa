"""TensorFlow's own functions and operators, given a VirtualNode, record it.

TensorFlow calls a registered *dispatch target* instead of its own code when
an API that supports dispatch (the ops, most of ``tf.math``, ``tf.nn``,
``tf.linalg``, and the functions behind ``tf.Tensor``'s operators) gets an
argument of a registered type.  With VirtualNode registered, a node given to
TensorFlow's own functions -- called by the user through the real
``tensorflow`` module, by a library, or by TensorFlow itself -- is recorded:

* an op-table API records its entry through the entry's generated dispatch
  target (``record.build_entry_functions``): the very ``record`` call of the
  subgraphjit wrapper, so the op batches as if called through subgraphjit;
* the operators of a ``tf.Tensor`` with a node on the right
  (``tf.zeros(shape) + node``) record the VirtualNode operator entries, as
  ``node + tensor`` does (the comparisons, ``-`` and ``/`` reach table ops);
* any other API records a *generic entry* (family ``generic``: no batch rule,
  so it runs once per instance), if it passes the checks of ``GenericApi``.

A target returns NotImplemented, and TensorFlow runs its own implementation
(which converts the node to its value: a counted forced evaluation), in
eager mode, inside a ``tf.function`` trace (nodes there behave as before: a
graph is being built), when Keras's own code is the caller (it sets
attributes on the tensors it gets back, which a node cannot hold), and for
operands the recorder cannot describe.  No target calls TensorFlow with a
node, so none can reach itself.
"""

import inspect
import types
import typing

import numpy as np
import tensorflow as tf
from tensorflow.python.util import dispatch as tf_dispatch

from ..context import context
from ..ir.node import VirtualNode
from ..ir.record import build_entry_functions, record, user_site
from ..ir.spec import NUMBER, TENSOR_LIKE, NotLazy, classify_operand, spec
from ..ir.table import ENTRIES_BY_NAME, OPERATOR_ENTRIES, TF_ENTRIES, OpEntry, thaw

# Dispatch signatures name the types the recorder takes for every other
# argument, so a call that also holds a RaggedTensor or SparseTensor matches
# only TensorFlow's own target for those (two matching targets are an
# error): it evaluates the node, as before.
_ITEM = typing.Union[VirtualNode, tf.Tensor, tf.Variable, int, float, bool,
                     list, np.ndarray, np.generic]
_OPERAND = typing.Union[_ITEM, tuple]
_NODE_LIST = typing.List[_ITEM]   # tf.concat's values: any item a node
# ... and for an API outside the table, whose attributes can be anything
# plain (another type there only leaves TensorFlow's code to run).
_PLAIN = typing.Union[_OPERAND, None, str, bytes, complex, dict, slice,
                      tf.DType, tf.TensorShape, types.FunctionType,
                      types.BuiltinFunctionType, types.MethodType]


def install(special_wrappers):
    """Register VirtualNode and every dispatch target (once per process:
    TensorFlow's registry is global).  ``special_wrappers``: TensorFlow
    functions that need more than an op entry (tf.shape, tf.nn.dropout) mapped
    to subgraphjit's versions."""
    if getattr(install, "done", False):
        return
    install.done = True
    tf_dispatch.register_dispatchable_type(VirtualNode)
    handled = set()
    entries_by_path = {}
    for entry in TF_ENTRIES:
        _register(entry.fn, _entry_dispatch_signatures(entry), entry.dispatch_target)
        handled.add(entry.fn)
        for path in _api_names(entry.fn) or (entry.name,):
            entries_by_path[path] = entry
    for function, target in _operator_targets().items():
        _register(function, _node_dispatch_signatures(function), target)
        handled.add(function)
    for original, wrapper in special_wrappers.items():
        _register(original, _node_dispatch_signatures(original, first_only=True),
                  _special_target(wrapper))
        handled.add(original)
    paths = _public_paths()
    for api in tf_dispatch.apis_with_type_based_dispatch():
        if api in handled:
            continue
        # TensorFlow keeps some ops twice under one name (tf.Tensor.__lt__
        # is an older copy of tf.math.less): the entry records both.
        entry = next((entries_by_path[name] for name in _api_names(api)
                      if name in entries_by_path), None)
        if entry is not None:
            try:
                _register(api, _entry_dispatch_signatures(entry), entry.dispatch_target)
                continue
            except ValueError:   # another Python signature after all
                pass
        generic = GenericApi.for_api(api, paths.get(id(api)))
        if generic is not None:
            _register(api, _node_dispatch_signatures(api), generic)


def _api_names(api):
    return getattr(api, "_tf_api_names", ())


def _public_paths():
    """id(function) -> a path under ``tensorflow`` that names it (for
    ``tf.<path>`` in a pattern's source): a walk of the public modules."""
    paths, seen, queue = {}, set(), [("", tf)]
    while queue:
        prefix, module = queue.pop(0)
        for name in dir(module):
            if name.startswith("_") or name in ("compat", "keras", "estimator"):
                continue
            try:
                value = getattr(module, name)
            except Exception:   # lazily loaded modules may fail to load
                continue
            if isinstance(value, types.ModuleType):
                if value.__name__.startswith("tensorflow._api.") \
                        and id(value) not in seen:
                    seen.add(id(value))
                    queue.append((f"{prefix}{name}.", value))
            elif callable(value):
                paths.setdefault(id(value), prefix + name)
    return paths


def _register(api, dispatch_signatures, target):
    if dispatch_signatures:
        tf.experimental.dispatch_for_api(api, *dispatch_signatures)(target)


def _entry_dispatch_signatures(entry):
    """One dispatch signature per tensor parameter: a node there, and the
    others operands the recorder takes."""
    if entry.list_input:
        return [{entry.tensor_params[0]: _NODE_LIST}]
    return [{name: VirtualNode if name == node else _OPERAND
             for name in entry.tensor_params} for node in entry.tensor_params]


def _node_dispatch_signatures(api, first_only=False):
    """One dispatch signature per parameter but ``name``: a node (or a list
    holding one) there, and plain values in the others."""
    names = [parameter.name for parameter in _parameters(api)
             if parameter.name != "name"]
    nodes = names[:1] if first_only else names
    return [{name: typing.Union[VirtualNode, _NODE_LIST] if name == node else _PLAIN
             for name in names} for node in nodes]


def _parameters(api):
    return list(inspect.signature(api).parameters.values())


def _recording_site():
    """The user's (code, line) if a call given a node should record now, else
    None: not in eager mode, not while a tf.function traces (a graph is being
    built: nodes behave there as before), and not for TensorFlow functions
    Keras calls (see record.user_site)."""
    if not (context.lazy and tf.executing_eagerly()):
        return None
    return user_site()


# -- tf.Tensor's operators ----------------------------------------------------
# ``tensor + node`` calls tf.Tensor.__add__, which calls a math_ops function
# with the node.  Where that function is a table op (subtract, truediv, pow,
# the comparisons, negative, abs), the entry's target records it.  The others
# are registered here: they record the VirtualNode operator entry, whose
# evaluation applies Python's operator to the values, so the result is the
# tf.Tensor operator's own.  (``*``, ``&``, ``|``, ``^``, ``~``, ``@`` and
# ``%`` go through functions without dispatch support and reach
# tf.math.multiply, logical_and, matmul, floormod..., which are entries.)

def _operator_targets():
    from tensorflow.python.ops import math_ops

    def recorded(dunder, operands):
        site = _recording_site()
        if site is None:
            return NotImplemented
        try:
            return record(OPERATOR_ENTRIES[dunder], operands, (), site)
        except NotLazy:
            return NotImplemented

    def add(x, y, name=None):   # (the operands in their order)
        return recorded("__add__", (x, y))

    def comparison(dunder):
        # == and != are symmetric; the operator entries take the node first.
        def target(self, other):
            if other is None:   # comparing with None is no op, as eagerly
                return NotImplemented
            operands = (self, other) if type(self) is VirtualNode else (other, self)
            return recorded(dunder, operands)
        return target

    targets = {math_ops._add_dispatch: add,
               math_ops.tensor_equals: comparison("__eq__"),
               math_ops.tensor_not_equals: comparison("__ne__")}
    return {function: target for function, target in targets.items()
            if hasattr(function, tf_dispatch.TYPE_BASED_DISPATCH_ATTR)}


def _special_target(wrapper):
    # (The wrapper records at the user's line itself: api.dropout.)
    def target(*args, **kwargs):
        if _recording_site() is None:
            return NotImplemented
        return wrapper(*args, **kwargs)
    return target


# -- APIs outside the op table ----------------------------------------------------

# APIs never recorded: they draw random numbers from a stateful generator,
# whose draws must happen in program order (as tf.nn.dropout's mask is drawn
# when recorded); stateless variants are fine.  Other side effects (asserts,
# prints, variable updates) are found when tracing: any stateful op refuses.
_RANDOM_WORDS = ("random", "dropout", "sampl", "multinomial", "categorical",
                 "truncated_normal", "fractional_", "shuffle")
# Callers of these expect a tf.Tensor back, never a stand-in.
_NEVER = {"convert_to_tensor", "tuple", "identity_n"}


class GenericApi:
    """A TensorFlow API outside the op table, recorded per instance.

    Its op entry is made on the first call with a node: the operands are
    the leading parameters up to the last one holding a tensor, node or
    variable (or, for a list in the first parameter, its items), the other
    parameters its attributes, as for a table entry -- and the entry is
    built by the same code.  A later call with another layout runs
    TensorFlow's own code.

    The output spec is inferred by tracing the API on placeholders of the
    operand specs (TensorFlow's shape functions, no values), and a call is
    recorded only if:

    * the outputs are tensors (or a flat tuple of them) of fully known shape:
      a shape that needs values (tf.range, tf.unique, tf.boolean_mask) is
      not known from specs, which are all a recorded node's key holds;
    * no traced op is stateful (random draws, asserts, prints, assignments
      must happen when called, and a dropped node is never run);
    * Python numbers among the operands give the same spec when traced as
      placeholders (their values are not in the key either);
    * no operand is a Python list or NumPy array (values again), and no
      attribute is a function (it would run at inference and evaluation).

    Otherwise TensorFlow's own code runs, as before.
    """

    by_api = {}

    @classmethod
    def for_api(cls, api, path):
        """A dispatch target for ``api`` (public name ``tf.<path>``), or None
        if it is never recorded."""
        if path is None or path in _NEVER or any(
                word in path for word in _RANDOM_WORDS) and "stateless" not in path:
            return None
        try:
            parameters = _parameters(api)
        except (TypeError, ValueError):
            return None
        if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD
               for p in parameters):
            return None
        generic = cls.by_api[api] = cls(api, path, parameters)
        return generic

    def __init__(self, api, path, parameters):
        self.api = api
        self.path = path
        self.names = [p.name for p in parameters]
        self.defaults = {p.name: p.default for p in parameters
                         if p.default is not inspect.Parameter.empty}
        self.entry = None
        self.refused = None   # why this API is never recorded, once known
        self.__name__ = f"record_{path.replace('.', '_')}"
        self.__signature__ = inspect.Signature(
            [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
             inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])

    def __call__(self, *args, **kwargs):
        if self.refused is not None or not (context.lazy and tf.executing_eagerly()):
            return NotImplemented
        layout = self._layout(args, kwargs)
        if layout is None:
            return NotImplemented
        entry = self.entry
        if entry is None:
            entry = self.entry = self._make_entry(*layout)
        elif (entry.tensors, entry.list_input) != layout:
            return NotImplemented
        result = entry.dispatch_target(*args, **kwargs)
        if type(result) is list and entry.output_type is not list:
            # record gives a multi-output op's outputs as a list; TensorFlow
            # gave a tuple or a namedtuple (tf.math.top_k).
            output_type = entry.output_type
            result = tuple(result) if output_type is tuple else output_type(*result)
        return result

    def _layout(self, args, kwargs):
        """(number of operand parameters, is the first a list), or None."""
        values = [args[i] if i < len(args) else kwargs.get(
            name, self.defaults.get(name)) for i, name in enumerate(self.names)]
        last = -1
        for index, value in enumerate(values):
            if _tensor_like(value) or isinstance(value, (list, tuple)) and any(
                    type(item) is VirtualNode for item in value):
                last = index
        if last < 0:
            return None
        first = values[0]
        if isinstance(first, (list, tuple)) and last == 0:
            if not all(classify_operand(item) in _OPERANDS for item in first):
                return None
            return 1, True
        for value in values[:last + 1]:
            if classify_operand(value) not in _OPERANDS:
                return None   # lists, arrays, None, strings among operands
        for value in values[last + 1:]:
            if callable(value) and not isinstance(value, tf.DType):
                return None
        return last + 1, False

    def _make_entry(self, tensors, list_input):
        entry = OpEntry(self.path, self.api, "generic", tensors=tensors,
                        list_input=list_input, thaw=thaw)
        entry.infer = self._infer
        entry.output_type = None
        entry.refused_keys = set()
        build_entry_functions(entry, self.path.rsplit(".", 1)[-1])
        entry.call = self._call_for(entry)
        # Patterns name their ops' entries by name (patterns/codegen.py); a generic
        # entry renders as tf.<path>(operands, attributes), as a table entry does.
        ENTRIES_BY_NAME.setdefault(entry.name, entry)
        return entry

    def _call_for(self, entry):
        """``entry.call`` passing only the attributes given a value other than
        their default: TensorFlow warns about a deprecated argument passed
        at all (tf.nn.l2_normalize's ``dim``), even as its default."""
        api, defaults, names = self.api, self.defaults, entry.attr_params
        absent = object()

        def call(values, attrs):
            given = {name: value for name, value in zip(names, thaw(attrs))
                     if value is not defaults.get(name, absent)}
            if entry.list_input:
                return api(list(values), **given)
            return api(*values, **given)
        return call

    def _infer(self, entry, inputs, attrs, key, site):
        """The output spec for ``key`` (record's cache miss), or NotLazy."""
        if key in entry.refused_keys:
            raise NotLazy
        try:
            output_spec, output_type = _traced_spec(entry, inputs, attrs, key,
                                                      numbers_by_value=True)
            if any(classify_operand(operand) == NUMBER for operand in inputs):
                if _traced_spec(entry, inputs, attrs, key,
                                numbers_by_value=False)[0] is not output_spec:
                    raise NotLazy
        except _Refused as reason:
            self.refused = str(reason)
            raise NotLazy from None
        except Exception:   # includes NotLazy; TensorFlow's own run decides
            entry.refused_keys.add(key)
            raise NotLazy from None
        if entry.output_type is None:   # the first spec decides, for every key
            entry.output_type = output_type
            entry.multi_output = output_type is not _SINGLE
        if output_type is not entry.output_type:
            entry.refused_keys.add(key)
            raise NotLazy
        entry.cache[key] = output_spec
        return output_spec


class _Refused(Exception):
    """The API is never recorded (its outputs or its ops say why)."""


_SINGLE = object()   # output_type of an API returning one tensor


def _tensor_like(value):
    return classify_operand(value) in TENSOR_LIKE


# What a generic entry takes as an operand: tensors (or nodes), and Python numbers.
_OPERANDS = TENSOR_LIKE | {NUMBER}


def _placeholder_dtype(number, specs):
    """The dtype TensorFlow would likely give a Python number among these
    operand specs; a wrong guess only refuses (the specs then differ)."""
    kind = {bool: "bool", int: "integer", float: "floating"}[type(number)]
    for operand_spec in specs:
        dtype = operand_spec.dtype
        if dtype is not None and (dtype.is_bool if kind == "bool" else
                                  getattr(dtype, f"is_{kind}")):
            return dtype
    return {bool: tf.bool, int: tf.int32, float: tf.float32}[type(number)]


def _traced_spec(entry, inputs, attrs, key, numbers_by_value):
    """(output spec, output type) of ``entry`` traced on placeholders of the
    operand specs in ``key``; raises _Refused for an API that must not be
    recorded at all, another exception for these operands."""
    operand_specs = key[2:]
    tensor_specs, positions, constants = [], [], {}
    for position, (operand, operand_spec) in enumerate(zip(inputs, operand_specs)):
        if classify_operand(operand) == NUMBER:
            if numbers_by_value:
                constants[position] = operand
                continue
            dtype = _placeholder_dtype(operand, operand_specs)
            tensor_specs.append(tf.TensorSpec((), dtype))
        else:
            tensor_specs.append(tf.TensorSpec(operand_spec.shape, operand_spec.dtype))
        positions.append(position)

    def traced(*placeholders):
        values = [None] * len(inputs)
        for position, placeholder in zip(positions, placeholders):
            values[position] = placeholder
        for position, value in constants.items():
            values[position] = value
        return entry.call(values, attrs)

    concrete = tf.function(traced, autograph=False).get_concrete_function(*tensor_specs)
    stateful = sorted({op.type for op in concrete.graph.get_operations()
                       if op.op_def is not None and op.op_def.is_stateful})
    if stateful:
        raise _Refused(f"stateful ops {stateful}")
    outputs = concrete.structured_outputs
    if isinstance(outputs, tf.Tensor):
        return _fully_known(outputs), _SINGLE
    if isinstance(outputs, (list, tuple)) and outputs and all(
            isinstance(output, tf.Tensor) for output in outputs):
        output_type = type(outputs)
        return tuple(_fully_known(output) for output in outputs), output_type
    raise _Refused(f"returns {type(outputs).__name__}, not tensors")


def _fully_known(tensor):
    shape = tensor.shape
    if shape.rank is None or None in shape.as_list():
        raise NotLazy   # the shape needs the operands' values
    if tensor.dtype in (tf.resource, tf.variant):
        raise _Refused(f"returns a {tensor.dtype.name} tensor")
    return spec(tensor.dtype, tuple(shape.as_list()))

