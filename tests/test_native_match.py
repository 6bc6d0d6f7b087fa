"""Pattern matching and joining in C (native/match.c, native/fuse.c)
against the generated-Python matchers and the Python joining they replaced,
kept here as the reference (the package has one implementation, the native
one): every match, replacement and join on graphs recorded from the example
models, and bad input, which must raise clean exceptions."""

import itertools

import numpy as np
import pytest

import subgraphjit as tf
from subgraphjit import VirtualNode, _native
from subgraphjit.patterns import signature as signatures
from subgraphjit.patterns.codegen import FusedPattern, Pattern
from subgraphjit.context import context
from subgraphjit.evaluate import unevaluated_ancestors
from subgraphjit.ir.spec import spec
from subgraphjit.ir.table import ACCESS, ENTRIES_BY_NAME
from subgraphjit.patterns.search import SEARCH
from subgraphjit.patterns.signature import Signer, Template, has_value_operand
from experiments.example_models import MODELS
from test_patterns import assert_matches_eager


# -- the reference: generated Python (signature.py before issue 17) -------------

_OPERAND_KINDS = ("parameter", "constant", "tensor", "value")


def _compile_matcher(template, depth):
    """A Python function that matches ``template`` at ``depth`` from a root
    node: the recursive comparison ``walk`` implies, unrolled into straight
    code with every depth, label and visiting position decided here, once.
    Matching runs for every node of every minibatch, so this is the search's
    hot loop.  The function returns (inputs, nodes) as ``walk`` lists them,
    or None; it is made per Signer (its required nodes and label caches)
    by the factory returned here."""
    lines = ["def make(required, spec_labels, spec_label, input_labels,"
             " input_label, operand_label):",
             "  def match(n0):",
             "    seen = set()", "    inputs = []", "    nodes = []"]
    constants = {"VirtualNode": VirtualNode, "ACCESS": ACCESS,
                 "has_value_operand": has_value_operand}
    trail = []           # variable holding the node at each visiting position
    names = itertools.count(1)

    def constant(value):
        name = f"c{len(constants)}"
        constants[name] = value
        return name

    def emit(line):
        lines.append("    " + line)

    def node(t, var, depth, is_root):
        if t.kind == "shared":  # the very node visited at that position
            emit(f"if {var} is not {trail[t.detail]}: return None")
            return
        if not is_root and t.kind != "op":  # (an op has one consumer: reached once)
            emit(f"if {var}.id in seen: return None")
        if t.kind == "input":  # the walk must stop here (Signer._stops_at)
            source = f"n{next(names)}"
            emit(f"if {var}.entry is ACCESS:")
            emit(f"    if {var}.inputs:")
            emit(f"        {source} = {var}.inputs[0]")
            emit(f"        if {source}.id in seen: return None")
            if depth > 0:  # else depth alone stops it
                emit(f"        if {source}.inputs and {source}.consumers < 2 and "
                     f"{source}.id not in required: return None")
                emit(f"elif {var}.inputs and {var}.consumers < 2 and {var}.id not "
                     f"in required and not has_value_operand({var}): return None")
            emit(f"if (input_labels.get({var}.spec) or input_label({var})) "
                 f"!= {constant(t.label)}: return None")
            emit(f"seen.add({var}.id); inputs.append({var})")
            trail.append(var)
        elif t.kind == "output":
            source = f"n{next(names)}"
            emit(f"if {var}.entry is not ACCESS or not {var}.inputs or "
                 f"{var}.attrs[0] != {t.detail}: return None")
            emit(f"{source} = {var}.inputs[0]")
            stops = ("True" if depth == 0 else
                     f"(not {source}.inputs or {source}.consumers > 1 "
                     f"or {source}.id in required)")
            emit(f"if {stops} and {source}.id not in seen: return None")
            node(t.children[0], source, depth, False)
        elif t.kind == "op" and depth > 0:
            checks = [f"{var}.entry is not {constant(t.detail)}",
                      f"len({var}.inputs) != {t.arity}",
                      f"{var}.attrs != {constant(t.attrs)}"]
            if t.attrs:
                checks.append(f"tuple(map(type, {var}.attrs)) != {constant(t.attr_types)}")
            if not is_root:
                checks.append(f"{var}.consumers > 1 or {var}.id in required")
            checks.append(f"(spec_labels.get({var}.spec) or spec_label({var}.spec)) "
                          f"!= {constant(t.spec_label)}")
            emit(f"if {' or '.join(checks)}: return None")
            for position, child in enumerate(t.children):
                operand = f"n{next(names)}"
                emit(f"{operand} = {var}.inputs[{position}]")
                if child.kind in _OPERAND_KINDS:  # not a recorded node
                    emit(f"if type({operand}) is VirtualNode or operand_label("
                         f"{operand}) != {constant(child.label)}: return None")
                    emit(f"inputs.append({operand})")
                else:
                    emit(f"if type({operand}) is not VirtualNode: return None")
                    node(child, operand, depth - 1, False)
            emit(f"nodes.append({var})")
            trail.append(var)
        else:  # an op at depth 0, or a leaf kind where a node must be
            emit("return None")

    node(template, "n0", depth, True)
    emit("return inputs, nodes")
    lines.append("  return match")
    namespace = dict(constants)
    exec(compile("\n".join(lines) + "\n", "<subgraphjit matcher>", "exec"), namespace)
    return namespace["make"]


def reference_matcher(signer, template, depth):
    return _compile_matcher(template, depth)(
        signer.required, signer._spec_labels, signer._spec_label,
        signer._input_labels, signer._boundary_label, signer._operand_label)


def reference_replace(roots, templates, signer, depth, swallowed):
    """search.PatternSearch._replace_in_place's loop before issue 17: (reached nodes
    in id order, replaced nodes in id order); access nodes left out since."""
    candidates_by_root = {
        root: [(reference_matcher(signer, template, depth), pattern)
               for template, pattern in candidates]
        for root, candidates in templates.items()}
    replaced = []
    queue = list(roots)
    reached = {node.id: node for node in roots}
    while queue:
        node = queue.pop(0)
        candidates = candidates_by_root.get((node.entry, node.attrs))
        found = None
        for matcher, pattern in candidates or ():
            found = matcher(node)
            if found is not None:
                break
        if found is None:
            operands = node.inputs
        else:
            inputs, inner_nodes = found
            operands = tuple(inputs[position] for position in pattern.argument_positions)
            node.entry, node.attrs, node.inputs = pattern.entry, (), operands
            inner_nodes.pop()
            swallowed.update([inner.id for inner in inner_nodes])
            replaced.append(node)
        for operand in operands:
            if type(operand) is not VirtualNode or operand.evaluated:
                continue
            # (Since: an access node nodes read, that no one asked for and
            # that is no root, is left out, to take its output when asked.)
            if (operand.entry is ACCESS and operand.consumers > 0 and operand.inputs
                    and type(operand.inputs[0]) is VirtualNode
                    and operand.id not in signer.required and operand.id not in reached):
                swallowed.add(operand.id)
                operand = operand.inputs[0]
                if operand.evaluated:
                    continue
            if operand.id not in reached:
                reached[operand.id] = operand
                queue.append(operand)
    return ([reached[node_id] for node_id in sorted(reached)],
            sorted(replaced, key=lambda node: node.id))


# -- recorded graphs -------------------------------------------------------------

def record(model, examples, copies=0):
    """The loss nodes of ``examples`` and every node they need, unevaluated,
    and ``copies`` copies of that graph made before the scope evaluates it
    on exit (which replaces patterns in it)."""
    with tf.batching():
        roots = [model.loss(tf, example) for example in examples]
        nodes = unevaluated_ancestors(roots)
        graphs = [copy_graph(roots, nodes) for _ in range(copies)]
    return (roots, nodes, *graphs)


def record_graphs(make_graph, copies=1):
    """As ``record``, for a function returning the roots."""
    with tf.batching():
        roots = make_graph()
        nodes = unevaluated_ancestors(roots)
        graphs = [copy_graph(roots, nodes) for _ in range(copies)]
    return (roots, nodes, *graphs)


def copy_graph(roots, nodes):
    """Fresh copies of ``nodes`` (same ids, entries, consumers) wired to each
    other: replacement rewrites nodes in place, so each side gets its own."""
    copies = {}
    for node in nodes:  # in id order: operands first
        inputs = tuple(copies.get(id(operand), operand) for operand in node.inputs)
        copy = VirtualNode(node.id, node.entry, inputs, node.attrs, node.spec, node.site)
        copy.consumers = node.consumers
        copies[id(node)] = copy
    return [copies[id(root)] for root in roots], list(copies.values())


def described(nodes):
    """Each node as the replacement left it: entry, attributes and operands
    (nodes by id, other values by identity)."""
    return [(node.id, node.entry, node.attrs, node.spec,
             tuple(("node", operand.id) if type(operand) is VirtualNode else id(operand)
                   for operand in node.inputs))
            for node in nodes]


def reference_fuse(search, pattern_nodes, required, reached, swallowed):
    """PatternSearch._fuse_in_place as Python before issue 17 moved its loop
    to C; since, the joined consumers that nodes read and no one asked for
    leave ``reached`` (their ids added to ``swallowed``): returns the rest."""
    passed = set()
    for node in pattern_nodes:
        if node.entry.multi_output:
            continue
        producer = reference_latest_producer(node)
        if producer is None:
            continue
        wiring, extras = reference_wiring(node, producer)
        if wiring is None:
            continue
        key = (producer.entry.pattern, node.entry.pattern, wiring)
        fused = search.fused.get(key)
        if fused is None:
            fused = search.fused[key] = FusedPattern(*key, len(extras))
        output = len(producer.spec)
        producer.entry = fused.entry
        producer.inputs = tuple(producer.inputs) + tuple(extras)
        producer.spec = tuple(producer.spec) + (node.spec,)
        node.entry, node.attrs, node.inputs = ACCESS, (output,), (producer,)
        if node.consumers and node.id not in required:
            passed.add(node.id)
    swallowed |= passed
    return [node for node in reached if node.id not in passed]


def reference_latest_producer(node):
    latest = None
    for operand in node.inputs:   # (a lookup's row numbers may be a list)
        if type(operand) is VirtualNode and operand.entry is ACCESS and operand.inputs:
            source = operand.inputs[0]
            entry = source.entry
            if entry.family == "pattern" and entry.multi_output \
                    and type(entry.pattern) is Pattern \
                    and (latest is None or source.id > latest.id):
                latest = source
    return latest


def reference_wiring(consumer, producer):
    arguments = producer.inputs
    wiring, extras = [], []
    for operand in consumer.inputs:
        if type(operand) is VirtualNode and operand.entry is ACCESS and operand.inputs \
                and operand.inputs[0] is producer:
            wiring.append(("output", operand.attrs[0]))
            continue
        for place, argument in enumerate(arguments):
            if argument is operand:
                wiring.append(("argument", place))
                break
        else:
            if type(operand) is VirtualNode and not (
                    operand.evaluated or reference_feeds(operand, producer)):
                return None, None
            wiring.append(("argument", len(arguments) + len(extras)))
            extras.append(operand)
    return tuple(wiring), extras


def reference_feeds(node, producer, budget=64):
    stack = [operand for operand in producer.inputs
             if type(operand) is VirtualNode and operand.id > node.id]
    seen = set()
    while stack and budget:
        budget -= 1
        current = stack.pop()
        for operand in current.inputs:
            if operand is node:
                return True
            if type(operand) is VirtualNode and operand.id > node.id \
                    and operand.id not in seen and not operand.evaluated:
                seen.add(operand.id)
                stack.append(operand)
    return False


def required_ids(roots, nodes):
    """The roots, and some inner nodes, as a caller might require them."""
    return {node.id for node in roots} | {node.id for node in nodes[::7]}


# -- differential tests ------------------------------------------------------------

@pytest.mark.parametrize("level", signatures.LEVELS)
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_every_match_equals_the_generated_matchers(model_name, level):
    """Each node of a recorded graph against templates of every kind (ops,
    outputs, shared nodes, inputs, every operand label) at several depths:
    the C matcher finds exactly the generated matcher's walks."""
    rng = np.random.default_rng(3)
    model = MODELS[model_name](rng)
    roots, nodes, (roots, nodes) = record(model, model.random_examples(rng, 2), 1)
    required = required_ids(roots, nodes)
    matched = 0
    for depth in (1, 2, 3, 5, 8):
        signer = Signer(level, for_patterns=True, required=required)
        keys = {}
        for node in nodes:
            # (As the search: a node with a NumPy operand, such as a Keras
            # layer's, roots no pattern.)
            if node.entry is not ACCESS and not has_value_operand(node):
                signature = signer.walk(node, depth).signature
                keys.setdefault(signature.key, signature)
        templates = [Template(key, ENTRIES_BY_NAME, signature)
                     for key, signature in list(keys.items())[:40]]
        for template in templates:
            matcher = reference_matcher(signer, template, depth)
            for node in nodes:
                expected = matcher(node)
                found = signer.match(node, depth, template)
                assert (found is None) == (expected is None)
                if found is not None:
                    matched += 1
                    assert [id(x) for x in found.inputs] == [id(x) for x in expected[0]]
                    assert [id(x) for x in found.nodes] == [id(x) for x in expected[1]]
    assert matched > 0


def test_outputs_shared_nodes_and_other_depths_equal_the_generated_matchers():
    """What the models' graphs rarely hold: a multi-output op read through
    its only output (``output`` in a template), a node read twice, and
    templates run at depths other than their own (an op where the depth
    ends: no match)."""
    values = np.arange(6, dtype=np.float32).reshape(1, 2, 3)

    def graph():
        (single,) = tf.unstack(tf.identity(values), axis=0)
        shared = tf.tanh(single)
        return [tf.sigmoid(shared * shared) + 2.0, tf.split(tf.exp(single), 3, axis=1)[1]]

    _, _, (roots, nodes) = record_graphs(graph)
    for level in signatures.LEVELS:
        signer = Signer(level, for_patterns=True, required={roots[0].id})
        templates = [Template(signer.walk(node, depth).signature.key, ENTRIES_BY_NAME)
                     for node in nodes if node.entry is not ACCESS for depth in (1, 2, 4, 6)]
        kinds = set()
        for template, depth in itertools.product(templates, (1, 2, 3, 4, 6)):
            kinds.update(instruction[0] for instruction in _program_code(template, depth))
            matcher = reference_matcher(signer, template, depth)
            for node in nodes:
                expected = matcher(node)
                found = _native.match(template.program(depth), node, signer.match_labels())
                assert (found is None) == (expected is None)
                if found is not None:
                    assert [id(x) for x in found[0]] == [id(x) for x in expected[0]]
                    assert [id(x) for x in found[1]] == [id(x) for x in expected[1]]
        assert {"output", "same", "fail", "constant", "input"} <= kinds


def _program_code(template, depth):
    """The instructions of ``template.program(depth)``."""
    captured = []
    real = _native.MatchProgram
    try:
        signatures._native.MatchProgram = lambda code: captured.append(code) or real(code)
        signatures._match_program(template, depth)
    finally:
        signatures._native.MatchProgram = real
    return captured[0]


@pytest.mark.parametrize("depth", [2, 4, 8])
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_replacement_equals_the_python_search(model_name, depth, parameters):
    """Patterns collected on one minibatch, replaced in copies of another's
    graph by the native search and by the Python it replaced: the same
    nodes rewritten the same way, the same swallowed ids, the same reached
    nodes in the same order (joining included)."""
    parameters(granularity="subgraph", collect=1, depth=depth)
    rng = np.random.default_rng(depth)
    model = MODELS[model_name](rng)
    assert_matches_eager(model, model.random_examples(rng, 4))  # collects
    assert context.patterns is not None
    roots, nodes, (roots_a, nodes_a), (roots_b, nodes_b) = record(
        model, model.random_examples(rng, 4), 2)
    required = required_ids(roots, nodes)
    level = tf.get_parameter("equivalence")

    # The native search first, so that its joins make the joined patterns
    # (the reference's then find them: the same keys).
    reached_b = SEARCH._replace_in_place(roots_b, Signer(level, True, required), depth)
    swallowed_b = {node.id for node in nodes_b if node.swallowed}
    joined = dict(SEARCH.fused)

    swallowed_a = set()
    reached_a, replaced_a = reference_replace(
        roots_a, SEARCH.templates, Signer(level, True, required), depth, swallowed_a)
    reached_a = reference_fuse(SEARCH, replaced_a, required, reached_a, swallowed_a)

    assert replaced_a
    assert SEARCH.fused == joined
    assert [node.id for node in reached_b] == [node.id for node in reached_a]
    assert swallowed_b == swallowed_a
    assert described(nodes_b) == described(nodes_a)


def test_replaced_nodes_count_as_matches_of_their_pattern(parameters):
    parameters(granularity="subgraph", collect=1, depth=3)
    rng = np.random.default_rng(0)
    model = MODELS["tree_lstm"](rng)
    assert_matches_eager(model, model.random_examples(rng, 2))
    tf.reset_stats()
    assert_matches_eager(model, model.random_examples(rng, 2))
    patterns = [p for p in tf.patterns() if "_then_" not in p.function_name]
    assert sum(p.matches for p in patterns) == tf.stats()["pattern_matches"] > 0


# -- bad input ---------------------------------------------------------------------

def node(node_id=1, entry=ACCESS, inputs=(), attrs=(), spec=spec(tf.float32, (1,))):
    return VirtualNode(node_id, entry, inputs, attrs, spec, None)


def labels(**changes):
    signer = Signer("signature", for_patterns=True)
    given = list(signer.match_labels())
    for index, value in changes.items():
        given[int(index[1:])] = value
    return tuple(given)


@pytest.mark.parametrize("instructions,error", [
    ([("fail",)], TypeError),                         # not a tuple
    ((["fail"],), TypeError),                         # an instruction not a tuple
    (((),), TypeError),                               # no opcode
    (((1, 0),), TypeError),                           # opcode not a str
    ((("jump", 0),), ValueError),                     # unknown opcode
    ((("node",),), ValueError),                       # too few items
    ((("node", 0, 1),), ValueError),                  # too many items
    ((("node", 1),), ValueError),                     # a register never loaded
    ((("node", -1),), ValueError),
    ((("node", "0"),), ValueError),
    ((("node", 2 ** 80),), ValueError),
    ((("child", 0, 0, 2),), ValueError),              # loads no next register
    ((("child", 0, -1, 1),), ValueError),             # negative position
    ((("output", 0, ACCESS, 0, True, 5),), ValueError),
    ((("same", 0, 1),), ValueError),
    ((("op", 0, ACCESS, 1, (), [int], False, "x"),), TypeError),  # types
    ((("op", 0, ACCESS, -1, (), None, False, "x"),), ValueError),  # arity
    ((("identity", 0, 0, "parameter", "here"),), TypeError),
    ((("identity", 0, 0, 7, 1),), TypeError),
    ((("constant", 0, 0, 3, 3),), TypeError),         # no type
])
def test_malformed_programs_raise(instructions, error):
    with pytest.raises(error):
        _native.MatchProgram(instructions)


def test_a_program_is_checked_whole_and_frees_what_it_read():
    with pytest.raises(ValueError):
        _native.MatchProgram((("op", 0, ACCESS, 1, (1,), (int,), False, "x"),
                              ("child", 0, 0, 1), ("node", 9)))
    with pytest.raises(TypeError):
        _native.MatchProgram(("fail",), extra=1)
    program = _native.MatchProgram((("child", 0, 0, 1), ("node", 1), ("fail",)))
    assert "3 instructions, 2 registers" in repr(program)


def test_bad_roots_and_labels_raise():
    program = _native.MatchProgram((("node", 0),))
    root = node()
    inputs, nodes = _native.match(program, root, labels())
    assert inputs == [] and len(nodes) == 1 and nodes[0] is root
    for root in (None, 3, "node", ()):
        with pytest.raises(TypeError):
            _native.match(program, root, labels())
    for bad in ((), labels()[:6], labels() + (None,), labels(i1=[]), labels(i2=None),
                labels(i0=[1, 2]), labels(i0={"x"}), labels(i0={2 ** 80})):
        with pytest.raises(TypeError):
            _native.match(program, node(), bad)
    with pytest.raises(TypeError):
        _native.match("program", node(), labels())


def test_bad_replace_input_raises():
    program = _native.MatchProgram((("node", 0),))
    good = {ACCESS: ((program, ACCESS, (0,)),)}
    root = node()
    for roots in ([root, 3], [None], 7):
        with pytest.raises(TypeError):
            _native.replace(roots, {}, labels())
    for candidates in ({ACCESS: [(program, ACCESS, ())]}, {ACCESS: ((program,),)},
                       {ACCESS: (("program", ACCESS, ()),)},
                       {ACCESS: ((program, ACCESS, [0]),)}, []):
        with pytest.raises(TypeError):
            _native.replace([root], candidates, labels())
    with pytest.raises(TypeError):
        _native.replace([root], good, labels(), set())   # a fourth argument
    with pytest.raises(TypeError):
        _native.replace([root], good, labels(i3=None))
    # The match has no inputs: argument position 0 is none of them.
    with pytest.raises(IndexError):
        _native.replace([root], good, labels())
    assert root.entry is ACCESS  # not rewritten


def test_fuse_joins_and_bad_input_raises():
    """Joining on hand-made nodes: the rewrite, and items that are no
    nodes and errors in the callbacks, which raise and leave the nodes as
    they were."""
    class Entry:
        def __init__(self, pattern):
            self.pattern = pattern

    producer_entry, consumer_entry, joined_entry = Entry("p"), Entry("c"), Entry("p+c")
    argument = node(0, consumer_entry)
    first = spec(tf.float32, (1,))
    outputs = (first,)   # (one object: specs are interned when recorded)
    producer = node(1, producer_entry, (argument,), spec=outputs)
    output = node(2, ACCESS, (producer,), (0,))
    second = spec(tf.float32, (2,))
    consumer = node(3, consumer_entry, (output, argument), spec=second)

    def entry_kind(entry):
        return 3 if entry is producer_entry else 0

    def snapshot():
        return [(n.entry, n.inputs, n.attrs, n.spec) for n in (producer, consumer)]

    before = snapshot()
    for given in ([consumer, 3], [None], 7):
        with pytest.raises(TypeError):
            _native.fuse(given, {}, None, entry_kind, ACCESS, set(), [])
    with pytest.raises(TypeError):
        _native.fuse([consumer], [], None, entry_kind, ACCESS, set(), [])
    for required, reached in (([], []), ({"x"}, []), (set(), (consumer,))):
        with pytest.raises(TypeError):
            _native.fuse([consumer], {}, None, entry_kind, ACCESS, required, reached)
    with pytest.raises(TypeError, match=r"reached\[1\]"):   # (nothing joins)
        _native.fuse([consumer], {}, None, lambda entry: 0, ACCESS, set(), [consumer, 3])

    def refuse(_):
        raise KeyError("no kind")

    def no_pair(key, extra_count):
        raise RuntimeError("no pair")

    with pytest.raises(KeyError):
        _native.fuse([consumer], {}, None, refuse, ACCESS, set(), [consumer])
    with pytest.raises(RuntimeError):
        _native.fuse([consumer], {}, no_pair, entry_kind, ACCESS, set(), [consumer])
    assert snapshot() == before

    class Pair:
        entry = joined_entry

    made = []

    def make_pair(key, extra_count):
        made.append((key, extra_count))
        return Pair()

    # Two more pairs of the same wiring, one with a consumer of another
    # spec: joins of equal specs share the joined spec.
    third = spec(tf.float32, (3,))
    pairs = [(producer, consumer)]
    for number, consumer_spec in ((4, second), (8, third)):
        other_argument = node(number, consumer_entry)
        other_producer = node(number + 1, producer_entry, (other_argument,), spec=outputs)
        other_output = node(number + 2, ACCESS, (other_producer,), (0,))
        pairs.append((other_producer, node(number + 3, consumer_entry,
                                           (other_output, other_argument),
                                           spec=consumer_spec)))
    # The first consumer is read by a node, the second too but asked for,
    # the third by nothing: only the first leaves the evaluation.
    pairs[0][1].consumers = pairs[1][1].consumers = 1
    reached = [node for pair in pairs for node in pair]
    joined, left = _native.fuse([pair[1] for pair in pairs], {}, make_pair, entry_kind,
                                ACCESS, {pairs[1][1].id}, reached)
    assert left == [node for node in reached if node is not pairs[0][1]]
    assert [node.swallowed for pair in pairs for node in pair] == [
        False, True, False, False, False, False]
    assert made == [(("p", "c", (("output", 0), ("argument", 0))), 0)]
    [(pair, count)] = joined.items()
    assert type(pair) is Pair and count == 3
    assert producer.entry is joined_entry and producer.inputs == (argument,)
    assert [joined_producer.spec for joined_producer, _ in pairs] == [
        (first, second), (first, second), (first, third)]
    assert pairs[0][0].spec is pairs[1][0].spec
    for joined_producer, joined_consumer in pairs:
        assert joined_consumer.entry is ACCESS and joined_consumer.attrs == (1,)
        assert joined_consumer.inputs == (joined_producer,)

    # A node whose spec Python deleted raises, and nothing is joined.
    lone_argument = node(20, consumer_entry)
    lone_producer = node(21, producer_entry, (lone_argument,), spec=outputs)
    lone_consumer = node(23, consumer_entry,
                         (node(22, ACCESS, (lone_producer,), (0,)), lone_argument),
                         spec=second)
    del lone_consumer.spec
    with pytest.raises(TypeError, match="no spec"):
        _native.fuse([lone_consumer], {}, make_pair, entry_kind, ACCESS, set(), [])
    assert lone_producer.entry is producer_entry and lone_consumer.entry is consumer_entry


def test_odd_nodes_never_match_and_never_crash():
    """Nodes whose fields were replaced from Python with other values."""
    program = _native.MatchProgram((
        ("op", 0, ACCESS, 1, (0,), (int,), False, "float32"),
        ("child", 0, 0, 1), ("input", 1, ACCESS, True, None), ("node", 0)))
    leaf = node(1)
    for inputs, attrs in (([leaf], (0,)), ((leaf,), [0]), ((3,), (0,)),
                          ((leaf, leaf), (0,)), ((leaf,), (False,))):
        odd = node(2, ACCESS, (leaf,), (0,))
        odd.inputs, odd.attrs = inputs, attrs
        assert _native.match(program, odd, labels()) is None
    with pytest.raises(TypeError):   # inputs are a tuple or list, nothing else
        odd.inputs = 5
    del leaf.spec
    assert _native.match(program, node(2, ACCESS, (leaf,), (0,)), labels()) is None
    odd = node(2, ACCESS, ([], 5, leaf), (0,))
    reached, replaced, matches = _native.replace(
        [odd], {ACCESS: ((program, ACCESS, ()),)}, labels())
    assert len(reached) == 2 and reached[1] is odd and replaced == [] and matches == {}


def test_a_label_found_equal_for_one_spec_decides_nothing_for_another():
    """An instruction remembers the last spec whose label it found equal,
    for the rest of one replace call only: a node of another spec is still
    compared, and the next call (another Signer, other labels) starts
    afresh."""
    entry = ENTRIES_BY_NAME["math.sigmoid"]
    wide, narrow = spec(tf.float32, (1, 4)), spec(tf.float32, (1, 3))
    signer = Signer("shape", for_patterns=True)
    program = _native.MatchProgram((
        ("op", 0, entry, 0, (), None, False, signer._spec_label(wide)), ("node", 0)))
    candidates = {entry: ((program, ENTRIES_BY_NAME["math.tanh"], ()),)}

    def graph():
        first = _native.next_node_id()
        return [node(first + k, entry, (), (), given)
                for k, given in enumerate((wide, narrow, wide))]

    nodes = graph()
    reached, replaced, matches = _native.replace(nodes, candidates, signer.match_labels())
    assert [node.id for node in replaced] == [nodes[0].id, nodes[2].id]
    assert matches == {ENTRIES_BY_NAME["math.tanh"]: 2}
    assert nodes[1].entry is entry
    # Labels that no longer match the remembered spec's: nothing matches.
    relabelled = Signer("shape", for_patterns=True)
    relabelled._spec_labels[wide] = "other"
    nodes = graph()
    reached, replaced, matches = _native.replace(nodes, candidates,
                                                 relabelled.match_labels())
    assert replaced == [] and matches == {}


def test_errors_in_label_callbacks_propagate():
    program = _native.MatchProgram((("op", 0, ACCESS, 0, (), None, False, "x"),))

    def broken(spec):
        raise KeyError("no label")

    root = node(1, spec="a spec")
    with pytest.raises(KeyError):
        _native.match(program, root, labels(i2=broken))
    with pytest.raises(KeyError):
        _native.replace([root], {ACCESS: ((program, ACCESS, ()),)},
                        labels(i2=broken))
    unhashable = node(1, spec=["a", "list"])
    with pytest.raises(TypeError):
        _native.match(program, unhashable, labels())
