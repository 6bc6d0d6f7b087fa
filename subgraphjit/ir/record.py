"""Recording: the record hot path, and generated wrappers.

Every patched function is generated from its op entry with the exact
signature of the TensorFlow function it replaces (read with ``inspect``), so
positional and keyword calls, defaults and ``name=`` all behave as in
TensorFlow.  A wrapper does one of three things:

* eager mode: calls the real TensorFlow function with the user's arguments;
* lazy mode: records a VirtualNode (``record``), whose spec comes from a cache
  keyed by the op's attributes and operand specs;
* an operand the recorder cannot describe (a symbolic tensor inside a
  tf.function, a ragged tensor, ...): calls the real function, as eager mode.

Most patched functions are a ``_native.Recorder`` in front of the generated
wrapper: it records the common lazy call (the parameters bound by position
or name, the operands given) in C, with no Python frame, and passes every
other call to the wrapper.

Each entry also gets a *dispatch target* with the same signature: what
TensorFlow's own function calls when given a VirtualNode (dropin/dispatch.py).
It records exactly as the wrapper does, but where the wrapper would call the
real function it returns NotImplemented, which tells TensorFlow to run its
own implementation: calling the real function with a node would reach the
dispatch target again.
"""

import inspect
import linecache
import sys
import time

import tensorflow as tf

from .. import _native, overlap
from ..context import context
from ..forced import user_frame
from . import spec as specs
from .spec import TENSOR_LIKE, NotLazy, classify_operand, spec_of_foreign
from .table import ACCESS, freeze


# The hot path, in C (``native/_native.c``): ``record(entry, inputs, attrs)``
# (the generated wrappers call its form ``record_operands(entry, attrs,
# *inputs)``, which takes no tuple of the operands) builds the cache key
# (attrs, their types, one spec per operand), counts
# consumers, looks the output spec up in ``entry.cache`` (``_infer`` on a
# miss), takes the user's call site, and returns a VirtualNode (a list of
# accesses for a multi-output entry), appended to ``context.pending`` in a
# scope.
record = _native.record
# A function of more parameters keeps its generated wrapper (``_native.Recorder``
# binds at most this many).
RECORDER_PARAMETERS = 16
# So does a function Keras may be given as a layer's activation (one tensor
# in, the same shape out: the elementwise family, and these): Keras names
# an activation by its Python function, and saved a native callable as an
# object it could not load (tests/test_layers.py).
KERAS_ACTIVATIONS = {"nn.softmax", "nn.log_softmax"}


def _infer(entry, inputs, attrs, key, site):
    """Run the real op once to learn its output spec (cached): on stand-ins
    for tensors (a node has no value yet; reading a variable here would be
    seen by the user's tape), on the values themselves for Python and NumPy
    operands, which TensorFlow converts by their value.  In place, even
    while a backward is queued (overlap.py): an op that fails here (an id
    out of range) raises now, and leaves the queue unharmed."""
    with overlap.in_place():
        return _infer_in_place(entry, inputs, attrs, key, site)


def _infer_in_place(entry, inputs, attrs, key, site):
    if entry.infer is not None:   # an entry of its own kind (dispatch.GenericApi)
        context.shape_inferences += 1
        return entry.infer(entry, inputs, attrs, key, site)
    stand_ins = [
        specs.stand_in(key[position + 2], position in entry.index_positions)
        if isinstance(operand, specs.Spec) or classify_operand(operand) in TENSOR_LIKE
        else operand
        for position, operand in enumerate(inputs)]
    context.shape_inferences += 1
    started = time.perf_counter()
    try:
        result = entry.call(stand_ins, attrs)
    except Exception as error:
        raise annotate(error, entry, site) from None
    finally:
        context.inference_seconds += time.perf_counter() - started
    output_spec = specs.spec_of_result(result)
    entry.cache[key] = output_spec
    return output_spec


def infer_spec(entry, attrs, operands):
    """The output spec of ``entry`` on operands given as Specs (values to come)
    or as the values themselves (variables, tensors, Python numbers)."""
    key = (attrs, tuple(map(type, attrs)), *(
        operand if isinstance(operand, specs.Spec) else spec_of_foreign(operand)
        for operand in operands))
    return entry.cache.get(key) or _infer(entry, operands, attrs, key, None)


def annotate(error, entry, site):
    """Add the user's line to a TensorFlow error raised for a recorded op."""
    if site is None:
        return error
    code, line = site
    error.add_note(f"subgraphjit: raised by {entry.name}, recorded at "
                   f"{code.co_filename}:{line} in {code.co_name}")
    return error


def user_site():
    """The user's (code, line) for a call that reached subgraphjit through
    frames of its own or of a library (TensorFlow's dispatch, the Keras
    layer hook, a special wrapper), to give ``record`` as its site; or None
    when Keras's own code made the call: it sets attributes on the tensors
    it gets back (``output._keras_logits``), which a VirtualNode cannot
    hold, so such calls do not record."""
    frame = user_frame(sys._getframe(1))
    return None if frame is None else (frame.f_code, frame.f_lineno)


# -- code generation of wrappers and callers ---------------------------------

def _parameters(fn):
    return list(inspect.signature(fn).parameters.values())


def _arguments(parameters, expression, skip=None):
    """The call's argument list: positional while the order allows (up to a
    keyword-only or a ``skip``ped parameter), then keywords.  TensorFlow's
    decorators take keywords on a slower path: a matmul called with all
    twelve by keyword costs 6 us more than called positionally."""
    arguments, by_keyword = [], False
    for parameter in parameters:
        if parameter.name == skip:
            by_keyword = True
            continue
        by_keyword = by_keyword or parameter.kind != parameter.POSITIONAL_OR_KEYWORD
        value = expression(parameter.name)
        arguments.append(f"{parameter.name}={value}" if by_keyword else value)
    return ", ".join(arguments)


def _passing_on(parameters):
    """The wrapper's eager call of TensorFlow's function, as lines of code:
    the arguments up to the last one that is not its parameter's default,
    which is what the user's call passed on eager TensorFlow.  Every default
    passed explicitly costs TensorFlow's decorators time (ten of matmul's
    cost it 1.2 us)."""
    lines = []
    for count in range(len(parameters), 0, -1):
        last = parameters[count - 1]
        call = f"return _fn({_arguments(parameters[:count], lambda n: n)})"
        if last.default is inspect.Parameter.empty:
            return lines + [f"    {call}"]
        lines.append(f"    if {last.name} is not _default_{last.name}:\n        {call}")
    return lines + ["    return _fn()"]


def _fast_call(fast, parameters, arguments=None, by_name=True):
    """Lines that try ``fast`` (dropin/fast.py) first: it takes every
    parameter but ``name``, in order (``arguments``: their expressions,
    the parameters by default); a ``fast`` written for another
    TensorFlow's signature is not tried.  ``by_name``: only when ``name``
    is its default (the wrapper's user call; ``call`` passes none)."""
    if fast is None:
        return []
    names = [p.name for p in parameters if p.name != "name"]
    if [p.name for p in _parameters(fast)] != names:
        return []
    lines = [f"    _result = _fast({', '.join(arguments or names)})",
             "    if _result is not NotImplemented:",
             "        return _result"]
    if not by_name or len(names) == len(parameters):
        return lines
    return ["    if name is _default_name:"] + ["    " + line for line in lines]


def build_entry_functions(entry, public_name, fast=None):
    """Generate ``entry.call`` and the patched wrapper for ``entry.fn``
    (which tries ``fast`` first when nothing records)."""
    parameters = _parameters(entry.fn)
    names = [p.name for p in parameters]
    entry.tensor_params = tuple(names[:1 if entry.list_input else entry.tensors])
    entry.attr_params = tuple(n for n in names
                              if n not in entry.tensor_params and n != "name")
    defaults = {p.name: p.default for p in parameters
                if p.default is not inspect.Parameter.empty}

    attrs_expr = "(" + "".join(f"{p}, " for p in entry.attr_params) + ")"
    if entry.list_input:
        listed = entry.tensor_params[0]
        inputs_expr = f"tuple({listed})"
        if entry.lone_is_list:
            inputs_expr = (f"({inputs_expr} if isinstance({listed}, (list, tuple)) "
                           f"else ({listed},))")
        recorded = f"_record(_entry, {inputs_expr}, {attrs_expr})"
        call_tensors = {entry.tensor_params[0]: "list(values)"}
    else:
        inputs_expr = "(" + "".join(f"{p}, " for p in entry.tensor_params) + ")"
        # (The operands as arguments: no tuple made per op.)
        recorded = ("_record_operands(_entry, " + attrs_expr
                    + "".join(f", {p}" for p in entry.tensor_params) + ")")
        call_tensors = {p: f"values[{i}]" for i, p in enumerate(entry.tensor_params)}
    thawed = "_thaw(attrs)" if entry.thaw else "attrs"
    call_attrs = {p: f"{thawed}[{i}]" for i, p in enumerate(entry.attr_params)}
    call_args = _arguments(parameters, lambda n: call_tensors.get(n) or call_attrs[n],
                           skip="name")

    signature = ", ".join(
        n if n not in defaults else f"{n}=_default_{n}" for n in names)
    # ``record_operands`` asks the mode itself (raising NotLazy in eager
    # mode): a Python check of ``context.lazy`` in front of it is a
    # property read.  An op of no tensors (tf.zeros) has no operand that
    # would tell a tf.function trace from eager code (a symbolic tensor
    # refuses to be recorded): it asks.
    recording = ["try:", f"    return {recorded}", "except _NotLazy:", "    pass"]
    if not entry.tensor_params or entry.list_input:
        lazy = "_context.lazy" + ("" if entry.tensor_params else " and _executing_eagerly()")
        recording = [f"if {lazy}:"] + ["    " + line for line in recording]
    source = (
        f"def wrapper({signature}):\n"
        + "".join(f"    {line}\n" for line in recording)
        + "\n".join(_fast_call(fast, parameters) + _passing_on(parameters)) + "\n"
        "\n"
        "def call(values, attrs):\n"
        + "".join(line + "\n" for line in _fast_call(
            fast if entry.thaw is None else None, parameters,
            [call_tensors.get(n) or call_attrs[n] for n in names if n != "name"],
            by_name=False)) +
        f"    return _fn({call_args})\n"
        f"\n"
        f"def dispatch_target({signature}):\n"
        f"    if _context.lazy and _executing_eagerly():\n"
        f"        site = _user_site()\n"
        f"        if site is not None:\n"
        f"            try:\n"
        f"                return _record(_entry, {inputs_expr}, {attrs_expr}, site)\n"
        f"            except _NotLazy:\n"
        f"                pass\n"
        f"    return NotImplemented\n")
    namespace = {"_context": context, "_record": record,
                 "_record_operands": _native.record_operands, "_entry": entry,
                 "_NotLazy": NotLazy, "_fn": entry.fn, "_fast": fast,
                 "_thaw": entry.thaw, "_user_site": user_site,
                 "_executing_eagerly": tf.executing_eagerly,
                 # TensorFlow's defaults: the signature's, and what
                 # _passing_on compares arguments with (by identity).
                 **{f"_default_{n}": value for n, value in defaults.items()}}
    filename = f"<subgraphjit wrapper {entry.name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True),
                                 filename)
    exec(compile(source, filename, "exec"), namespace)
    entry.call = namespace["call"]
    entry.dispatch_target = namespace["dispatch_target"]
    wrapper = namespace["wrapper"]
    if (entry.tensor_params and len(names) <= RECORDER_PARAMETERS
            and entry.family != "elementwise" and entry.name not in KERAS_ACTIVATIONS):
        # Lazy calls record in C, with no frame of this wrapper's
        # (``_native.Recorder``); the wrapper takes every other call.
        wrapper = _native.Recorder(
            entry, wrapper, tuple(names),
            tuple(defaults.get(n, inspect.Parameter.empty) for n in names),
            inspect.Parameter.empty, len(entry.tensor_params),
            names.index("name") if "name" in names else -1, entry.list_input)
    wrapper.__name__ = wrapper.__qualname__ = public_name
    wrapper.__doc__ = (f"Lazily recorded version of tf.{entry.name} "
                       f"(subgraphjit).\n\n{entry.fn.__doc__ or ''}")
    wrapper.__wrapped__ = entry.fn
    wrapper.__module__ = "subgraphjit"
    return wrapper


_native.setup(context=context, spec_of_foreign=spec_of_foreign, infer=_infer,
              freeze=freeze, access_entry=ACCESS, scalar_specs=specs.SCALAR_SPECS,
              variable_types=specs.VARIABLE_TYPES,
              eager_tensor_type=type(tf.constant(0)))
