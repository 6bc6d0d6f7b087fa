"""Why an evaluation was forced: what read a node's value, and on which line.

A node whose value is read before its scope or ``tf.build`` evaluates it
(``if tf.reduce_max(h) > 0.5:``, ``float(loss)``, printing, a TensorFlow
function outside the op table) is evaluated on its own, so such a read
inside a per-instance function keeps the instances from batching.
``tf.stats()["forced_evaluations"]`` counts these evaluations by
``"<what> (<file>:<line>)"``: the user's line (the innermost frame that is
not subgraphjit, TensorFlow, Keras, NumPy or the standard library), and
what read the value in the user's terms: ``if``, ``float()``, ``+``,
``tf.nn.l2_normalize``.  The stack is walked only when a read forces an
evaluation, never while recording.  When such reads split most of the
work (their evaluations launched most of the batches), a
``ForcedEvaluationWarning`` says so once, at the commonest read's line.
"""

import ast
import bisect
import dis
import functools
import linecache
import os
import re
import sysconfig
import warnings

from .context import context

# Top-level packages whose frames are machinery the user calls, not the user's code.
_LIBRARIES = frozenset({"tensorflow", "keras", "tf_keras", "numpy", "absl", "optree",
                        "IPython", "ipykernel"})
# ... of which these name their public functions with attributes, not modules.
_NAMED_ELSEWHERE = frozenset({"tensorflow", "keras", "tf_keras", "subgraphjit"})
_STANDARD_LIBRARY = sysconfig.get_paths()["stdlib"] + os.sep
_SITE_PACKAGES = (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])
# Autograph rewrites the user's statements into calls of these operators.
_AUTOGRAPH = "tensorflow.python.autograph."
_AUTOGRAPH_STATEMENTS = {"if_stmt": "if", "if_exp": "if", "while_stmt": "while",
                         "for_stmt": "for", "and_": "and", "or_": "or",
                         "not_": "not", "assert_stmt": "assert"}
# A node method reached from C code (``float(node)``, ``print(node)``) is
# named by the call the user wrote; these are the names otherwise.
_READERS = {"__bool__": "bool()", "__float__": "float()", "__int__": "int()",
            "__index__": "index", "__round__": "round()", "__format__": "format()",
            "__repr__": "repr()", "__str__": "str()",
            "__array__": "NumPy conversion", "__tf_tensor__": "convert_to_tensor"}
# ... except methods the user calls in Python, whose CALL would show the
# user's variable name rather than the method.
_METHODS = {"numpy": ".numpy()", "value": ".value()"}
_OPERATORS = {"BINARY_SUBSCR": "[]", "STORE_SUBSCR": "[]=", "UNARY_NEGATIVE": "-",
              "UNARY_POSITIVE": "+", "UNARY_INVERT": "~"}
_NAME_LOADS = {"LOAD_NAME", "LOAD_GLOBAL", "LOAD_FAST", "LOAD_FAST_CHECK",
               "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_ATTR", "LOAD_METHOD"}
_CALL_PARTS = {"PUSH_NULL", "PRECALL", "KW_NAMES", "CACHE", "EXTENDED_ARG"}


def forced_site(frame):
    """``"<what> (<file>:<line>)"`` for a read that forces an evaluation;
    ``frame`` is the caller of ``VirtualNode.value``.  None when an
    evaluation itself asks for a node (a pattern's interior node): that is
    part of the evaluation, not the user's read."""
    try:
        return _site(frame)
    except Exception:   # naming a read must never break the user's program
        return "unknown read"


# A site by the frames its read came through (code and instruction each)
# and the working directory files are shown relative to: a plain loop
# reads at the same few places again and again, and naming one from its
# bytecode cost more than the eager ops of a small evaluation.
_SITES = {}
_SITES_KEPT = 4096


def _site(frame):
    reader = None   # the outermost of our frames the read came through
    library = []    # library frames between the read and the user, innermost first
    origin = None
    walked = [os.getcwd()]
    while frame is not None:
        walked.append((frame.f_code, frame.f_lasti))
        kind = frame_kind(frame)
        if kind == "user":
            break
        if kind == "autograph":
            # A function autograph converted runs from a temporary file:
            # shown at the user's line it came from, or else skipped.
            origin = _autograph_origin(frame)
            if origin is not None:
                break
        elif kind == "ours" and not library:
            if frame.f_code.co_name == "evaluate" and \
                    frame.f_globals.get("__name__") == "subgraphjit.evaluate":
                return None
            reader = frame
        else:
            library.append(frame)
        frame = frame.f_back
    key = tuple(walked)
    site = _SITES.get(key)
    if site is None:
        if len(_SITES) >= _SITES_KEPT:
            _SITES.clear()
        site = _SITES[key] = _described_site(frame, reader, library, origin)
    return site


def _described_site(frame, reader, library, origin):
    """The site of a read, from the frames ``_site`` found: the user's
    (None if none is on the stack), our outermost reader, the library
    frames in between, and autograph's origin of the user's line."""
    if frame is None:   # no user code on the stack
        return _library_name(library, None) or _reader_name(reader)
    instructions, index = _instructions(frame.f_code), _index(frame.f_code, frame.f_lasti)
    callee = _callee(instructions, index)
    if origin is not None and callee and callee.startswith("ag__."):
        callee = None   # autograph's own call, not the user's
    what = (_operator(instructions, index)
            or (None if library else _truth_test(frame.f_code, instructions, index))
            or _library_name(library, callee)
            or (reader and _METHODS.get(reader.f_code.co_name))
            or (callee and f"{callee}()")
            or _reader_name(reader))
    filename, line = origin or (frame.f_code.co_filename, frame.f_lineno)
    site = Site(f"{what} ({_shown(filename)}:{line})")
    site.filename, site.lineno = filename, line
    return site


class Site(str):
    """``"<what> (<file>:<line>)"``, the key ``stats()`` counts a forced
    read under, keeping the file's own name and the line for a warning
    that points at that line (and shows it)."""


# Code object -> its frames' kind: recording through TensorFlow's dispatch
# asks for every op, through several TensorFlow frames.
_KINDS = {}


def frame_kind(frame):
    """Whose code a frame runs: "ours" (subgraphjit, its generated wrappers
    and patterns), "autograph" (a function autograph converted), "keras",
    "library" (other machinery the user calls: TensorFlow, NumPy, the
    standard library) or "user"."""
    code = frame.f_code
    kind = _KINDS.get(code)
    if kind is None:
        filename = code.co_filename
        package = frame.f_globals.get("__name__", "").partition(".")[0]
        # Generated wrappers and patterns have no module name, but a filename.
        if package == "subgraphjit" or filename.startswith("<subgraphjit"):
            kind = "ours"
        elif os.path.basename(filename).startswith("__autograph_generated_file"):
            kind = "autograph"
        elif package in ("keras", "tf_keras"):
            kind = "keras"
        elif (package in _LIBRARIES or filename.startswith("<frozen")
                or (filename.startswith(_STANDARD_LIBRARY)
                    and not filename.startswith(_SITE_PACKAGES))):
            kind = "library"
        else:
            kind = "user"
        if len(_KINDS) > 100_000:   # code made at run time, over and over
            _KINDS.clear()
        _KINDS[code] = kind
    return kind


def user_frame(frame):
    """The innermost frame from ``frame`` out that runs the user's code (a
    function autograph converted included), or None if Keras's own code
    comes first, or none does.  (The cache inlined: this runs for every op
    recorded through TensorFlow's dispatch, over several of its frames.)"""
    while frame is not None:
        kind = _KINDS.get(frame.f_code) or frame_kind(frame)
        if kind == "user" or kind == "autograph":
            return frame
        if kind == "keras":
            return None
        frame = frame.f_back
    return None


def _autograph_origin(frame):
    """The user's (file, line) that a converted function's frame runs, from
    the source map autograph keeps on the converted function (which the
    frame that called it holds)."""
    caller = frame.f_back
    for value in (caller.f_locals.values() if caller is not None else ()):
        if getattr(value, "__code__", None) is frame.f_code:
            origin = getattr(value, "ag_source_map", {}).get(
                (frame.f_code.co_filename, frame.f_lineno))
            return origin and (origin.loc.filename, origin.loc.lineno)
    return None


def _shown(filename):
    relative = os.path.relpath(filename) if os.path.isabs(filename) else filename
    return filename if relative.startswith(os.pardir) else relative


# -- the user's instruction ---------------------------------------------------

@functools.lru_cache(maxsize=256)
def _instructions(code):
    return list(dis.get_instructions(code))


@functools.lru_cache(maxsize=256)
def _offsets(code):
    return [instruction.offset for instruction in _instructions(code)]


def _index(code, lasti):
    """The instruction running at ``lasti``, which may point into its inline
    cache (Python 3.11 calling a Python function)."""
    return bisect.bisect_right(_offsets(code), lasti) - 1 if lasti >= 0 else None


def _operator(instructions, index):
    """``+``, ``*=``, ``<``, ``[]``: an operator the user applied (or an
    f-string formatting a value)."""
    if index is None:
        return None
    instruction = instructions[index]
    if instruction.opname.startswith("FORMAT_"):
        return "f-string"
    if instruction.opname in ("BINARY_OP", "COMPARE_OP"):
        return instruction.argrepr
    if instruction.opname == "CONTAINS_OP":
        return "not in" if instruction.arg else "in"
    return _OPERATORS.get(instruction.opname)


def _truth_test(code, instructions, index):
    """The statement or operator whose test called ``bool()``, from the
    instruction running it (Python 3.11 and 3.12): None if it is not a test."""
    if index is None:
        return None
    if instructions[index].opname == "TO_BOOL":   # 3.13: converts, then tests
        index += 1
    instruction = instructions[index]
    name = instruction.opname
    previous = instructions[index - 1] if index else None
    if name == "UNARY_NOT":
        return "not"
    if name in ("JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP"):   # 3.11
        if previous.opname == "COMPARE_OP" and previous.positions == instruction.positions:
            return previous.argrepr   # a chain such as a < b < c
        return "and" if "FALSE" in name else "or"
    if not re.fullmatch(r"POP_JUMP_(FORWARD_|BACKWARD_)?IF_(FALSE|TRUE)", name):
        return None
    if previous is not None and previous.opname == "COPY" and previous.arg == 1:
        return "and" if "FALSE" in name else "or"   # 3.12: a and b as a value
    # The jump is placed at the statement, its test, or a part of the test.
    position = instruction.positions
    return _truth_tests(code.co_filename).get(
        (position.lineno, position.col_offset, position.end_lineno,
         position.end_col_offset), "bool()")


@functools.lru_cache(maxsize=32)
def _truth_tests(filename):
    """Source positions of a file's tests -> ``if``, ``while`` or ``assert``:
    each statement (or conditional expression, or comprehension with ``if``)
    and its test, down through ``and``, ``or`` and ``not``."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return {}
    tests = {}

    def mark(node, keyword):
        tests.setdefault((node.lineno, node.col_offset, node.end_lineno,
                          node.end_col_offset), keyword)
        parts = (node.values if isinstance(node, ast.BoolOp) else
                 [node.operand] if isinstance(node, ast.UnaryOp) else [])
        for part in parts:
            mark(part, keyword)

    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.Assert, ast.IfExp)):
            keyword = {ast.While: "while", ast.Assert: "assert"}.get(type(node), "if")
            mark(node, keyword)
            mark(node.test, keyword)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            if any(generator.ifs for generator in node.generators):
                mark(node, "if")
    return tests


def _callee(instructions, index):
    """The dotted name (``np.asarray``) a CALL instruction calls, as the user
    wrote it: the loads that start where the call starts and end before it
    does.  None for any other instruction or callee."""
    if index is None or not instructions[index].opname.startswith("CALL"):
        return None
    call = instructions[index].positions
    start, end = (call.lineno, call.col_offset), (call.end_lineno, call.end_col_offset)
    names = []
    for instruction in reversed(instructions[:index]):
        where = instruction.positions
        if instruction.opname in _CALL_PARTS or where.lineno is None:
            continue
        if (where.lineno, where.col_offset) != start:
            if (where.lineno, where.col_offset) < start:
                break
            continue   # an argument
        if (where.end_lineno, where.end_col_offset) >= end or \
                instruction.opname not in _NAME_LOADS:
            break      # an earlier copy of this call, or a callee not a name
        names.append(instruction.argval)
    return ".".join(reversed(names)) or None


# -- library functions ------------------------------------------------------

def _library_name(frames, callee):
    """The public name of the outermost library function in ``frames``
    (innermost first) that has one; the user's ``callee`` picks among a
    TensorFlow function's names."""
    for frame in reversed(frames):
        module = frame.f_globals.get("__name__", "")
        if module.startswith(_AUTOGRAPH):
            statement = (_AUTOGRAPH_STATEMENTS.get(frame.f_code.co_name)
                         if module.startswith(_AUTOGRAPH + "operators") else None)
            if statement:
                return statement
            continue   # converted_call and the like
        name = _public_name(frame, callee)
        if name:
            return name
    return None


def _public_name(frame, callee):
    code = frame.f_code
    if "<" in code.co_qualname:   # decorators' wrappers, lambdas, comprehensions
        return None
    if "." in code.co_qualname:
        # A method: named after the public class of its object (Dense, not
        # the Layer that defines __call__), or the nearest public base.
        defining = code.co_qualname.split(".")[-2]
        owner = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
        classes = (owner if isinstance(owner, type) else type(owner)).__mro__
        if not any(cls.__name__ == defining for cls in classes):
            return None   # not a method of its first argument's class
        for cls in classes:
            name = _exported(cls, vars(cls), None)
            if name:
                return f"{name}.{code.co_name}"
        return None
    # A function: the module's binding is the decorated function; its
    # innermost wrapped function (the running code) carries TensorFlow's names.
    function = outer = frame.f_globals.get(code.co_name)
    while function is not None and getattr(function, "__code__", None) is not code:
        function = getattr(function, "__wrapped__", None)
    if function is None:
        return None
    # TensorFlow's names are on the innermost function: the running code,
    # or the TensorFlow function a subgraphjit wrapper stands for.
    while function is not None:
        name = _exported(function, getattr(function, "__dict__", {}), callee)
        if name:
            return name
        function = getattr(function, "__wrapped__", None)
    return _exported(outer, {"__module__": getattr(outer, "__module__", None)}, None)


def _exported(symbol, own, callee):
    """``symbol``'s public name from the attributes it has itself (``own``):
    TensorFlow's ``tf_export`` names, Keras' export path, or a public
    module outside TensorFlow and Keras (``numpy.mean``, ``logging.info``)."""
    names = own.get("_tf_api_names")
    if names:
        chosen = next((name for name in names if callee and (
            callee == name or callee.endswith("." + name))), names[0])
        return f"tf.{chosen}"
    path = own.get("_api_export_path")
    if path:
        return "tf." + (path if isinstance(path, str) else path[0])
    module = own.get("__module__")
    qualname = getattr(symbol, "__qualname__", "")
    if isinstance(module, str) and module != "builtins" \
            and module.partition(".")[0] not in _NAMED_ELSEWHERE \
            and not any(part.startswith("_") for part in module.split(".")) \
            and qualname and not qualname.startswith("_"):
        return f"{module}.{qualname}"
    return None


def _reader_name(reader):
    if reader is None:
        return "evaluation"
    return _READERS.get(reader.f_code.co_name, reader.f_code.co_name)


# -- saying so ------------------------------------------------------------

class ForcedEvaluationWarning(UserWarning):
    """Most of the work evaluated so far ran in evaluations that reads
    forced one at a time (README: Forced evaluations).  Silence it with
    ``warnings.simplefilter("ignore", tf.ForcedEvaluationWarning)``."""


# Evaluations forced by a read that had already forced one since the
# program last asked for an evaluation (a scope's end, tf.build,
# tape.gradient): such reads split work that one evaluation would have
# batched (a read in per-instance code forces one per instance).  A read
# once per scope (``float(loss)`` inside the tape, a Keras loss outside
# the table) evaluates the whole minibatch at once: batched, not split.
# Twenty: a minibatch of 25 instances with a read in each is judged from
# the next minibatch on, and a few reads in a debugging loop never are.
SPLITS_TO_JUDGE = 20


def judge(site, launches):
    """After an evaluation the read ``site`` forced, which launched
    ``launches`` batches: warn once (per ``reset_stats()``, which starts
    the counts again) when reads have split the work and their
    evaluations launched most of the batches so far.  Batches, not nodes,
    are the work: in the gated tree's per-instance loop (the example
    models), half the nodes come after their instance's last read and run
    batched at the end in a few launches, while the forced evaluations
    launch 90 to 97% of the batches."""
    if context.parameters["scheduler"] == "none":
        return   # (no batches counted: nothing batches anyway)
    context.forced_batches += launches
    since_asked = context.forced_since_asked
    context.forced_splits += site in since_asked
    since_asked[site] += launches
    if context.forced_warned or context.forced_splits < SPLITS_TO_JUDGE:
        return
    # Only work whose share is settled counts: an open scope may hold work
    # recorded after its reads, to be evaluated batched when it ends, so
    # inside one, the work up to the last evaluation the program asked
    # for; outside every scope, all of it.
    unsettled = sum(since_asked.values()) if context.scopes else 0
    forced = context.forced_batches - unsettled
    total = context.batching["batches"] - unsettled
    if 2 * forced <= total:
        return
    # At the commonest read that has a line of the user's to point at.
    read, count = next(((read, count) for read, count
                        in context.forced_evaluations.most_common()
                        if isinstance(read, Site)), (None, 0))
    if read is None:
        return
    context.forced_warned = True
    message = (
        f"subgraphjit: {forced / total:.0%} of the batches run so far ({forced:,} "
        f"of {total:,} launches) ran in evaluations forced one at a time, "
        f"{count:,} of them by {read}: a value read before its scope or "
        f"tf.build evaluates it keeps the instances from batching; move the "
        f"read out of the per-instance code, or run the minibatch with "
        f"tf.batching.map (README: Forced evaluations)")
    warnings.warn_explicit(message, ForcedEvaluationWarning, read.filename, read.lineno)
