"""Compiled programs (batcher/plan.py, batcher/program.py): an evaluation run as
one compiled TensorFlow call gives eager TensorFlow's values, gradients and
gradient types; a program compiled for one minibatch and reused on another
gives that minibatch's results; errors still name the user's line.

Programs are tested with patterns as units (the setting they are for): a
first minibatch collects the patterns, later ones run compiled."""

import collections
import gc
import sys
import weakref

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit import _native
from subgraphjit.batcher import execute, plan as plans, program
from subgraphjit.batcher.graph import BatchGraph
from subgraphjit.batcher.schedulers import SCHEDULERS
from subgraphjit.context import context
from subgraphjit.evaluate import unevaluated_ancestors
from experiments.example_models import MODELS
from gradients import assert_gradient_equal
from test_batching import minibatch_loss_and_gradients
from test_patterns import assert_matches_eager


@pytest.fixture
def compiled(monkeypatch):
    """Patterns from the first minibatch on; every program compiled at its
    first sighting, however many node kinds it has and however little
    its minibatch batches, every scope recorded (so that every model's
    programs are checked, not only those compiled by default)."""
    monkeypatch.setattr(program, "MAX_KINDS", 10**6)
    monkeypatch.setattr(execute, "LITTLE_SHARED", 1.0)
    keys = ("compile", "granularity", "collect", "eager_scopes")
    previous = [tf.get_parameter(key) for key in keys]
    for key, value in zip(keys, (1, "subgraph", 1, False)):
        tf.set_parameter(key, value)
    tf.reset_patterns()
    program.PROGRAMS.clear()
    program.SPECULATING.__init__()
    yield
    for key, value in zip(keys, previous):
        tf.set_parameter(key, value)
    tf.reset_patterns()


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_compiled_minibatches_equal_eager(model_name, compiled):
    rng = np.random.default_rng(len(model_name))
    model = MODELS[model_name](rng)
    assert_matches_eager(model, model.random_examples(rng, 3))   # collect
    tf.reset_stats()
    for _ in range(2):
        assert_matches_eager(model, model.random_examples(rng, 3))
    if model_name == "keras_tree_gru":   # a layer reads its variables inside: step by step
        assert any("Keras layer" in reason
                   for reason in tf.stats()["programs_not_compiled"]), tf.stats()
    else:
        assert tf.stats()["program_runs"] >= 2, tf.stats()
    # The gradients of every backward speculated were taken (test_speculation.py):
    # most models' programs read only variables (mv_rnn's do not).
    stats = tf.stats()
    assert stats["speculations_used"] == stats["backwards_speculated"], stats
    assert (stats["speculations_used"] == 2) == (model_name not in ("keras_tree_gru", "mv_rnn"))


def test_a_program_reading_keras_variables_equals_eager(compiled):
    """A Keras 3 variable (whose dtype is a string) as a shared operand of
    a compiled program: it compiled with an AttributeError from deep inside
    program.py."""
    import keras
    rng = np.random.default_rng(7)
    model = MODELS["tree_lstm"](rng)
    for name, value in list(vars(model).items()):
        if isinstance(value, tensorflow.Variable) and name != "embedding":
            setattr(model, name, keras.Variable(value.numpy()))
    model.variables = [model.embedding] + [
        value for value in vars(model).values() if isinstance(value, keras.Variable)]
    tf.reset_stats()
    for _ in range(3):   # collect, then compiled
        assert_matches_eager(model, model.random_examples(rng, 3))
    assert tf.stats()["program_runs"] >= 1, tf.stats()


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_compiled_inference_equals_eager(model_name, compiled):
    """No tape: the same programs, values only.  (Statistics reset first:
    the programs an earlier test ran once counted here, and the Keras
    model, whose programs never compile, passed only after another.)"""
    rng = np.random.default_rng(len(model_name))
    model = MODELS[model_name](rng)
    tf.reset_stats()
    for _ in range(2):   # collect, then compiled
        examples = model.random_examples(rng, 3)
        expected = [model.loss(tensorflow, e).numpy() for e in examples]
        with tf.batching():
            losses = [model.loss(tf, e) for e in examples]
        np.testing.assert_allclose([float(loss) for loss in losses], expected,
                                   rtol=1e-5)
    if model_name == "keras_tree_gru":   # a layer reads its variables inside: step by step
        assert any("Keras layer" in reason
                   for reason in tf.stats()["programs_not_compiled"]), tf.stats()
    else:
        assert tf.stats()["program_runs"] >= 1, tf.stats()


def test_compiled_inference_reads_its_variables_when_it_runs(compiled):
    """Inference reads the variables inside the call: a program run again
    after the variables changed gives the new values' results, as eager
    does."""
    rng = np.random.default_rng(9)
    model = MODELS["tree_lstm"](rng)
    examples = model.random_examples(rng, 3)
    variables = [v for v in vars(model).values() if isinstance(v, tensorflow.Variable)]
    assert variables
    for round in range(3):   # collect, compiled, compiled after an update
        if round == 2:
            tf.reset_stats()
            for variable in variables:
                variable.assign_add(tensorflow.constant(
                    rng.standard_normal(variable.shape), variable.dtype) * 0.1)
        expected = [model.loss(tensorflow, e).numpy() for e in examples]
        with tf.batching():
            losses = [model.loss(tf, e) for e in examples]
        np.testing.assert_allclose([float(loss) for loss in losses], expected, rtol=1e-5)
    assert tf.stats()["program_runs"] >= 1 and tf.stats()["program_cache_hits"] >= 1


def test_inference_results_are_read_from_their_buffer(compiled):
    """With no tape, a compiled program leaves its results as rows of their
    buffers; .numpy() and np.asarray copy the row out (the shape
    and type eager gives, a copy the caller may change) and the node stays
    a row of its buffer."""
    rng = np.random.default_rng(5)
    model = MODELS["tree_lstm"](rng)
    for _ in range(2):   # collect, then compiled
        examples = model.random_examples(rng, 3)
        with tf.batching():
            logits = [tf.matmul(model.encode(tf, tree)[0], model.output)
                      for tree, _ in examples]
    assert tf.stats()["program_runs"] >= 1
    for node, (tree, _) in zip(logits, examples):
        expected = tensorflow.matmul(model.encode(tensorflow, tree)[0],
                                     model.output).numpy()
        assert node.result is None and node.batched is not None
        got = node.numpy()
        assert type(got) is type(expected) and got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5)
        got[...] = 0   # a copy: the buffer keeps the value
        np.testing.assert_allclose(np.asarray(node), expected, rtol=1e-5)
        assert node.result is None


def relabelled(examples, rng, model):
    """The same structures with other words and labels: the same program."""
    def relabel(tree):
        if isinstance(tree, int):
            return int(rng.integers(model.vocabulary))
        return (*tree[:-2], relabel(tree[-2]), relabel(tree[-1]))
    return [(relabel(tree), int(rng.integers(model.classes)))
            for tree, _ in examples]


def test_a_program_reused_on_another_minibatch_gives_its_results(compiled):
    rng = np.random.default_rng(11)
    model = MODELS["tree_lstm"](rng)
    minibatch_loss_and_gradients(tf, model, model.random_examples(rng, 5))  # collect
    first = model.random_examples(rng, 5)
    tf.reset_stats()
    minibatch_loss_and_gradients(tf, model, first)
    assert tf.stats()["programs_compiled"] == 1
    tf.reset_stats()
    assert_matches_eager(model, relabelled(first, rng, model))
    stats = tf.stats()
    assert stats["program_cache_hits"] == 1 and stats["programs_compiled"] == 0


@pytest.mark.parametrize("in_tape,aside", [(2, 0), (1, 1), (2, 1)])
def test_other_forwards_of_a_program_before_a_backward(compiled, in_tape, aside):
    """Minibatches of one structure run one compiled program: ``in_tape``
    of them under one tape, then ``aside`` more with the tape paused
    (inference), before the gradient.  Each backward reads its own
    forward's rows, whichever forward ran last, so the gradient of the
    tape's weighted sum is eager's."""
    rng = np.random.default_rng(12)
    model = MODELS["tree_lstm"](rng)
    minibatch_loss_and_gradients(tf, model, model.random_examples(rng, 5))  # collect
    first = model.random_examples(rng, 5)
    minibatch_loss_and_gradients(tf, model, first)   # compiles
    minibatches = [first] + [relabelled(first, rng, model)
                             for _ in range(in_tape + aside - 1)]

    def total_and_gradients(module):
        def loss_of(examples):
            loss = module.add_n([model.loss(module, e) for e in examples])
            return module.build(loss) if hasattr(module, "build") else loss
        with module.GradientTape() as tape:
            total = sum((k + 1.0) * loss_of(examples)
                        for k, examples in enumerate(minibatches[:in_tape]))
            with tape.stop_recording():
                for examples in minibatches[in_tape:]:
                    float(loss_of(examples))
        return total, tape.gradient(total, model.variables)

    tf.reset_stats()
    total, gradients = total_and_gradients(tf)
    assert tf.stats()["program_runs"] == in_tape + aside
    expected_total, expected_gradients = total_and_gradients(tensorflow)
    np.testing.assert_allclose(float(total), float(expected_total), rtol=1e-5)
    for got, want in zip(gradients, expected_gradients):
        assert_gradient_equal(got, want, atol=1e-5)


def with_cells_of_kind(examples, cell):
    """TreeLSTM-2Type examples whose internal nodes are all cell ``cell``."""
    def assign(tree):
        if isinstance(tree, int):
            return tree
        return (cell, assign(tree[1]), assign(tree[2]))
    return [(assign(tree), label) for tree, label in examples]


def test_a_program_of_more_kinds_runs_a_minibatch_of_fewer(compiled):
    """A minibatch whose kinds are a subset of a compiled program's runs
    that program (its other kinds take no steps): no compile, and the
    minibatch's own eager results; then a minibatch of the other kinds."""
    rng = np.random.default_rng(12)
    model = MODELS["tree_lstm_2type"](rng)
    minibatch_loss_and_gradients(tf, model, model.random_examples(rng, 6))  # collect
    tf.reset_stats()
    minibatch_loss_and_gradients(tf, model, model.random_examples(rng, 6))
    assert tf.stats()["programs_compiled"] == 1
    for cell in (0, 1):
        tf.reset_stats()
        assert_matches_eager(model, with_cells_of_kind(model.random_examples(rng, 6), cell))
        stats = tf.stats()
        assert stats["programs_compiled"] == 0 and stats["program_runs"] == 1, stats


def test_a_program_with_two_kinds_of_one_key_adopts_no_other(compiled):
    """Two kinds that differ only in which tensor of one shape they read
    have one kind key; a program holding both is never run by a program
    of other kinds (which could not tell them apart)."""
    rng = np.random.default_rng(13)
    first, second, third = (tensorflow.constant(rng.normal(size=(3, 3)).astype(np.float32))
                            for _ in range(3))
    rows = [rng.normal(size=(1, 3)).astype(np.float32) for _ in range(2)]
    with tf.batching():   # compiles a program of kinds (matmul, add t1, add t2, tanh)
        values = [tf.tanh(tf.matmul(tf.identity(row), third) + first) for row in rows] + [
            tf.matmul(tf.identity(row), third) + second for row in rows]
    tf.reset_stats()
    with tf.batching():   # the add kinds' key twice: run step by step or compiled alone
        values = [tf.matmul(tf.identity(row), third) + first for row in rows] + [
            tf.matmul(tf.identity(row), third) + second for row in rows]
    for value, (row, shared) in zip(values, [(rows[0], first), (rows[1], first),
                                             (rows[0], second), (rows[1], second)]):
        np.testing.assert_allclose(value.numpy(), row @ third.numpy() + shared.numpy(),
                                   rtol=1e-5, atol=1e-5)
    assert tf.stats()["program_cache_hits"] == 0


def test_a_key_seen_before_its_superset_compiled_is_run_by_it_after(monkeypatch):
    """A key not compiled itself is run by a compiled program of more
    kinds (its superset), also when it was first seen before that
    program compiled, and by the one of fewest kinds once a smaller
    superset compiles (the superset an entry keeps is looked for again)."""
    from types import SimpleNamespace

    def fake_program(name, kind_keys):
        fake = SimpleNamespace(key=(name,), kind_keys=kind_keys, buffers=[("float32", ())],
                               relatives=(name,), adopted=None)
        fake.adopt = lambda other: setattr(fake, "adopted", other)
        return fake

    def fake_compiled(fake):
        return SimpleNamespace(kinds=list(fake.kind_keys), kind_set=set(fake.kind_keys),
                               buffer_set=set(fake.buffers), modes={True: True})

    monkeypatch.setattr(program, "_Compiled", fake_compiled)
    statistics = {"program_cache_hits": 0, "programs_compiled": 0, "compile_seconds": 0.0,
                  "programs_not_compiled": collections.Counter()}
    programs = program.Programs()
    small, large = fake_program("small", ("a",)), fake_program("large", ("a", "b", "c"))
    assert programs.compiled_for(small, 4, statistics) is None   # seen once: step by step
    compiled = programs.compiled_for(large, 1, statistics)       # compiles
    assert compiled is not None and statistics["programs_compiled"] == 1
    assert programs.compiled_for(small, 4, statistics) is compiled
    assert small.adopted is compiled
    assert programs.compiled_for(small, 4, statistics) is compiled   # (again)
    smaller = programs.compiled_for(fake_program("middle", ("a", "d")), 1, statistics)
    assert smaller is not None and smaller is not compiled
    assert programs.compiled_for(small, 4, statistics) is smaller


def test_a_program_run_by_its_superset_reads_its_own_shared_tensors(compiled):
    """A minibatch whose key is not compiled runs on a compiled program of
    more kinds (``Program.adopt``) with its own kinds' shared values: a
    tensor given to every instance, which the key names only by dtype and
    shape, is this minibatch's, not the one the superset compiled with."""
    tf.set_parameter("granularity", "op")   # (the fixture restores it)
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal((1, 3)).astype(np.float32) for _ in range(4)]

    def scope(shared, squashed):
        with tf.batching():
            products = [tf.multiply(tf.identity(row), shared) for row in rows]
            outputs = [tf.tanh(product) for product in products] if squashed else products
        return [np.asarray(output) for output in outputs]

    first = tensorflow.constant(rng.standard_normal((1, 3)).astype(np.float32))
    for output, row in zip(scope(first, squashed=True), rows):
        np.testing.assert_allclose(output, np.tanh(row * first.numpy()), rtol=1e-6)
    assert tf.stats()["programs_compiled"] >= 1
    compiles, hits = tf.stats()["programs_compiled"], tf.stats()["program_cache_hits"]
    second = tensorflow.constant(rng.standard_normal((1, 3)).astype(np.float32))
    for output, row in zip(scope(second, squashed=False), rows):
        np.testing.assert_allclose(output, row * second.numpy(), rtol=1e-6)
    assert tf.stats()["programs_compiled"] == compiles   # run by the first's program
    assert tf.stats()["program_cache_hits"] > hits


def test_a_graph_of_a_structure_seen_before_takes_its_program_again(compiled, monkeypatch):
    """A scope whose graph has the batching types and read outputs of one
    compiled before runs its program again without ``outline``
    (``Programs.again``), with this scope's values; a shared tensor of
    another id is another structure, and after a compile the program is
    looked for anew: outlined.  Values equal eager's."""
    tf.set_parameter("granularity", "op")   # (the fixture restores it)
    outlined = []
    outline = plans.outline
    monkeypatch.setattr(plans, "outline", lambda *a, **k: outlined.append(1) or outline(*a, **k))
    rng = np.random.default_rng(8)

    def scope(shared):
        rows = [rng.standard_normal((1, 3)).astype(np.float32) for _ in range(3)]
        with tf.batching():
            products = [tf.multiply(tf.identity(row), shared) for row in rows]
            outputs = [tf.tanh(product) for product in products]
        for row, output in zip(rows, outputs):
            np.testing.assert_allclose(np.asarray(output), np.tanh(row * shared.numpy()),
                                       rtol=1e-6)
        return len(outlined)

    first = tensorflow.constant(rng.standard_normal((1, 3)).astype(np.float32))
    assert scope(first) == 1
    hits = tf.stats()["program_cache_hits"]
    assert scope(first) == 1 and scope(first) == 1   # taken again
    assert tf.stats()["program_cache_hits"] == hits + 2
    second = tensorflow.constant(rng.standard_normal((1, 3)).astype(np.float32))
    assert scope(second) == 2   # another id: another structure
    assert scope(second) == 2
    program.PROGRAMS._generation += 1   # (as a compile or an eviction does)
    assert scope(second) == 3
    assert scope(second) == 3


@pytest.mark.parametrize("shape", [(), (1,), (3,), (0,), (2, 2)])
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.bool_])
def test_stacked_python_values_equal_numpys_array(shape, dtype):
    """A buffer's Python inputs (numbers, or lists of one shape) stacked by
    ``_stacked_values`` equal ``np.array`` of them, in dtype and shape."""
    rng = np.random.default_rng(len(shape))
    python = {np.int32: int, np.float32: float, np.bool_: bool}[dtype]
    for count in (0, 1, 7):
        values = [rng.integers(-3, 3, shape).astype(python).tolist() for _ in range(count)]
        assert all(type(value) is (list if shape else python) for value in values)
        stacked = program._stacked_values(values, dtype, shape)
        expected = np.array(values, dtype).reshape(count, *shape)
        assert stacked.dtype == expected.dtype and stacked.shape == expected.shape
        np.testing.assert_array_equal(stacked, expected)


def planned(graph):
    return plans.plan(graph, SCHEDULERS["agenda"]().schedule(graph))


def test_programs_of_other_trees_share_a_key():
    """The steps' order, counts and rows are arguments, not part of the key:
    minibatches of different trees run one compiled program."""
    rng = np.random.default_rng(3)
    model = MODELS["tree_lstm"](rng)
    keys = set()
    for _ in range(6):
        examples = model.random_examples(rng, 8)
        with tf.GradientTape():
            loss = tf.add_n([model.loss(tf, e) for e in examples])
            keys.add(planned(BatchGraph(unevaluated_ancestors([loss]))).key)
    assert len(keys) == 1
    # (A key computes its hash once, as a plain tuple of its items would.)
    key, = keys
    assert hash(key) == hash(tuple(key)) and key == tuple(key)


def test_every_node_is_located_and_steps_read_only_earlier_rows():
    rng = np.random.default_rng(4)
    model = MODELS["lattice_lstm"](rng)
    with tf.GradientTape():
        loss = tf.add_n([model.loss(tf, e) for e in model.random_examples(rng, 4)])
        graph = BatchGraph(unevaluated_ancestors([loss]))
        program = planned(graph)
    written = [0] * len(program.buffers)
    inputs = [len(values) + len(nodes) for values, nodes in
              zip(program.input_values, program.input_nodes)]
    for kind_number, count, start, end, _, *output_ranges in program.steps:
        kind = program.kinds[kind_number]
        for operand_kind, buffer in kind.operands:
            if operand_kind == plans.ROWS:
                start += count
                for row in program.rows[start - count:start]:
                    computed = program.computed[buffer]
                    assert row < written[buffer] or \
                        computed <= row < computed + inputs[buffer]
        assert start == end
        for number, buffer in enumerate(kind.outputs):
            if buffer is None:
                continue
            assert output_ranges[2 * number:2 * number + 2] == [
                written[buffer], written[buffer] + count]
            written[buffer] += count
    assert written == program.computed
    for index in range(len(graph)):
        assert program.location(index) is not None


def test_errors_in_a_compiled_program_name_the_users_line(compiled):
    table = tensorflow.constant(np.ones((3, 2), np.float32))
    for attempt in range(2):   # compiled at the first, failing at the second
        indices = [tf.identity([index]) for index in (0, 1, 7 if attempt else 2)]
        lookups = [tf.gather(table, i) for i in indices]
        line = sys._getframe().f_lineno - 1
        if not attempt:
            tf.build(lookups)
            continue
        with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
            tf.build(lookups)
        assert any(f"{__file__}:{line}" in note for note in raised.value.__notes__)


def test_an_output_no_node_reads_is_computed_when_asked():
    """A program keeps only the outputs some node reads; another, held by
    the user, is computed when asked, with eager's value and gradient."""
    previous = tf.get_parameter("compile")
    tf.set_parameter("compile", 1)
    try:
        rng = np.random.default_rng(5)
        weight = tensorflow.Variable(rng.normal(size=(4, 6)).astype(np.float32))
        rows = [rng.normal(size=(1, 4)).astype(np.float32) for _ in range(3)]

        def run(module):
            with module.GradientTape(persistent=True) as tape:
                halves = [module.split(module.matmul(row, weight), 2, axis=1)
                          for row in rows]
                later = [second * 3.0 for _, second in halves]   # not evaluated yet
                loss = module.add_n([module.reduce_sum(module.tanh(first))
                                     for first, _ in halves])
                if module is tf:
                    loss = tf.build(loss)
                held = module.add_n([module.reduce_sum(value) for value in later])
                held = held.numpy()
            return float(loss), float(held), tape.gradient(loss, weight)

        expected, actual = run(tensorflow), run(tf)
        np.testing.assert_allclose(actual[:2], expected[:2], rtol=1e-5)
        np.testing.assert_allclose(actual[2], expected[2], rtol=1e-5, atol=1e-6)
    finally:
        tf.set_parameter("compile", previous)


def test_compiles_stop_when_the_budget_is_spent(compiled, monkeypatch):
    """A model whose keys keep changing stops compiling; its evaluations
    run step by step, with eager's results."""
    monkeypatch.setattr(program, "BUDGET", 1)
    tf.reset_stats()
    rng = np.random.default_rng(12)
    weight = tensorflow.Variable(rng.normal(size=(3, 3)).astype(np.float32))
    for width in (1, 2, 1, 2):   # two keys, each seen twice
        rows = [rng.normal(size=(width, 3)).astype(np.float32) for _ in range(2)]
        with tf.batching():
            values = [tf.tanh(tf.matmul(row, weight)) for row in rows]
        for value, row in zip(values, rows):
            np.testing.assert_allclose(value.numpy(), np.tanh(row @ weight.numpy()),
                                       rtol=1e-5, atol=1e-6)
    stats = tf.stats()
    assert program.PROGRAMS.compiles == 1   # the first key, at once
    # The second key, at each of its sightings.
    assert stats["programs_not_compiled"] == {"compile budget of 1 spent": 2}


def test_without_tensorflows_tape_api_programs_run_step_by_step(compiled, monkeypatch):
    """Where TensorFlow's private tape module is missing, nothing compiles
    and training still gives eager's losses and gradients."""
    monkeypatch.setattr(program, "_tape", None)
    tf.reset_stats()
    rng = np.random.default_rng(13)
    model = MODELS["tree_lstm"](rng)
    for _ in range(2):
        assert_matches_eager(model, model.random_examples(rng, 3))
    stats = tf.stats()
    assert stats["program_runs"] == 0 and stats["programs_compiled"] == 0
    assert any("tensorflow.python.eager.record" in reason
               for reason in stats["programs_not_compiled"]), stats["programs_not_compiled"]


def test_a_reused_program_reads_this_minibatchs_shared_tensors():
    """A shared tensor is in the key by dtype and shape only: a program
    compiled for one minibatch's tensor reads the next minibatch's own."""
    previous = tf.get_parameter("compile")
    tf.set_parameter("compile", 1)
    try:
        rng = np.random.default_rng(13)
        for _ in range(3):
            shared = tensorflow.constant(rng.normal(size=(3, 3)).astype(np.float32))
            rows = [rng.normal(size=(1, 3)).astype(np.float32) for _ in range(2)]
            with tf.batching():
                values = [tf.matmul(tf.identity(row), shared) for row in rows]
            for value, row in zip(values, rows):
                np.testing.assert_allclose(value.numpy(), row @ shared.numpy(),
                                           rtol=1e-5, atol=1e-6)
        assert tf.stats()["program_runs"] >= 2
    finally:
        tf.set_parameter("compile", previous)


def stubbed_policy(monkeypatch):
    """A Programs object whose compiling is stubbed, and its statistics."""
    monkeypatch.setattr(program, "_Compiled", lambda planned: ("compiled", planned))
    monkeypatch.setattr(program, "_traced", lambda compiled, *_, **__: compiled)
    monkeypatch.setattr(program.Programs, "_find_superset", lambda self, planned: None)
    statistics = {"program_cache_hits": 0, "programs_compiled": 0,
                  "programs_not_compiled": collections.Counter(),
                  "compile_seconds": 0.0}
    return program.Programs(), statistics


def test_a_key_compiles_once_it_is_compile_of_the_last_16(monkeypatch):
    """The policy alone (compiling stubbed): a steady key compiles at its
    fourth sighting; keys that keep changing, each seen now and then,
    never do (and no program of more kinds runs them)."""
    class Planned:
        def __init__(self, key):
            self.key = self.relatives = key

    programs, statistics = stubbed_policy(monkeypatch)

    steady = [programs.compiled_for(Planned("tree"), 4, statistics) for _ in range(6)]
    assert steady[:3] == [None] * 3
    assert [compiled[1].key for compiled in steady[3:]] == ["tree"] * 3
    changing = [programs.compiled_for(Planned(f"length {n % 6}"), 4, statistics)
                for n in range(60)]   # each key 2 or 3 of any 16
    assert changing == [None] * 60
    assert statistics["programs_compiled"] == 1
    assert statistics["program_cache_hits"] == 2


def test_an_epochs_last_smaller_minibatch_compiles_at_first_sight(compiled):
    """Its loss sums fewer losses and divides by another count: another
    key, seen once per epoch, so never ``compile`` of the last 16; a
    relative of the compiled program (the same kinds but for operand counts
    and numbers), it compiles at once and gives eager's results."""
    tf.set_parameter("compile", 3)
    rng = np.random.default_rng(15)
    model = MODELS["tree_lstm"](rng)
    assert_matches_eager(model, model.random_examples(rng, 4))   # collect
    for _ in range(6):
        assert_matches_eager(model, model.random_examples(rng, 4))
    compiles = program.PROGRAMS.compiles
    assert compiles >= 1
    tf.reset_stats()
    assert_matches_eager(model, model.random_examples(rng, 3))
    stats = tf.stats()
    assert program.PROGRAMS.compiles == compiles + 1 and stats["program_runs"] == 1, stats


def test_relatives_compile_at_first_sight_a_bounded_number_of_times(monkeypatch):
    """The policy alone (compiling stubbed): a relative of a compiled key
    compiles at its first sighting, RELATIVES times per process; other
    keys wait for ``compile`` sightings."""
    class Planned:
        def __init__(self, key, relatives):
            self.key, self.relatives = key, relatives

    programs, statistics = stubbed_policy(monkeypatch)
    for _ in range(4):
        programs.compiled_for(Planned("tree of 256", "tree"), 4, statistics)
    assert statistics["programs_compiled"] == 1
    assert programs.compiled_for(Planned("other", "other"), 4, statistics) is None
    for n in range(program.RELATIVES):
        assert programs.compiled_for(Planned(f"tree of {n}", "tree"), 4, statistics)
    assert programs.compiled_for(Planned("tree of 9", "tree"), 4, statistics) is None


def test_a_program_of_many_kinds_runs_step_by_step():
    """The BiLSTM's single ops make a program of more than MAX_KINDS kinds
    (slower compiled than step by step): never compiled, eager's results."""
    previous = tf.get_parameter("compile")
    tf.set_parameter("compile", 1)
    try:
        rng = np.random.default_rng(14)
        model = MODELS["bilstm_tagger"](rng)
        tf.reset_stats()
        assert_matches_eager(model, model.random_examples(rng, 4))
        stats = tf.stats()
        assert stats["programs_not_compiled"] == {
            f"more than {program.MAX_KINDS} node kinds": 1}
        assert stats["program_runs"] == 0
    finally:
        tf.set_parameter("compile", previous)


def test_a_tensor_shared_by_two_kinds_in_one_minibatch_and_not_the_next():
    """The key holds a shared tensor's dtype and shape, not which other
    operands are the same tensor: each is its own argument."""
    previous = tf.get_parameter("compile")
    tf.set_parameter("compile", 1)
    try:
        rng = np.random.default_rng(15)
        for same in (True, False, True):
            first = tensorflow.constant(rng.normal(size=(3, 3)).astype(np.float32))
            second = first if same else tensorflow.constant(
                rng.normal(size=(3, 3)).astype(np.float32))
            rows = [rng.normal(size=(3, 3)).astype(np.float32) for _ in range(2)]
            with tf.batching():
                values = [tf.matmul(tf.identity(row), first) + second for row in rows]
            for value, row in zip(values, rows):
                np.testing.assert_allclose(
                    value.numpy(), row @ first.numpy() + second.numpy(),
                    rtol=1e-5, atol=1e-5)
        assert tf.stats()["program_runs"] >= 2
    finally:
        tf.set_parameter("compile", previous)


def test_outputs_not_kept_are_not_computed_when_the_tape_closes(compiled):
    """A training step whose program keeps only the outputs nodes read is
    one evaluation: the tape's exit leaves the rest (like nodes inside a
    pattern) to be computed only if asked for."""
    rng = np.random.default_rng(16)
    model = MODELS["tree_lstm"](rng)
    minibatch_loss_and_gradients(tf, model, model.random_examples(rng, 5))  # collect
    tf.reset_stats()
    minibatch_loss_and_gradients(tf, model, model.random_examples(rng, 5))
    stats = tf.stats()
    assert stats["program_runs"] == 1 and stats["evaluations"] == 1, stats


def test_a_compiled_step_frees_its_graph_without_the_cyclic_collector(compiled):
    """Reference counting alone frees a minibatch's nodes once the user
    lets go of the loss: nothing the planner or the program keeps forms a
    cycle with the graph (one did, and left every minibatch's graph,
    hundreds of thousands of objects at a minibatch of 256 trees, to the
    collector)."""
    rng = np.random.default_rng(17)
    model = MODELS["tree_lstm"](rng)
    minibatch_loss_and_gradients(tf, model, model.random_examples(rng, 4))  # collect
    collector_was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        tf.reset_stats()
        with tf.GradientTape() as tape:
            loss = tf.add_n([model.loss(tf, example)
                             for example in model.random_examples(rng, 4)])
            probes = [weakref.ref(node) for node in context.pending]
            loss = tf.build(loss)
        tape.gradient(loss, model.variables)
        assert tf.stats()["program_runs"] == 1
        del loss, tape
        alive = [probe() for probe in probes if probe() is not None]
        assert not alive, f"{len(alive)} of {len(probes)} nodes alive"
    finally:
        if collector_was_on:
            gc.enable()


def test_a_pattern_looking_up_a_variables_rows_keeps_an_entry_each(compiled):
    """A pattern line gathering constant rows of a captured variable (the
    MV-RNN's idiom): compiled, the variable's gradient is an IndexedSlices
    with an entry per instance, as eagerly."""
    rng = np.random.default_rng(17)
    table = tensorflow.Variable(rng.normal(size=(4, 3)).astype(np.float32))
    weight = tensorflow.Variable(rng.normal(size=(3, 3)).astype(np.float32))

    def loss(module, rows):
        terms = []
        for row in rows:
            value = module.tanh(module.matmul(module.gather(table, 2) * row, weight))
            # Deeper than a signature (depth 8) from the sum of losses,
            # whose subgraph the collection skips: the gather's pattern is
            # found under it.
            for _ in range(7):
                value = module.tanh(value)
            terms.append(module.reduce_sum(value))
        return module.add_n(terms)

    assert_compiled_pattern_matches_eager(loss, [table, weight], rng, np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_kept_by_the_forward_give_eager_gradients(compiled, dtype):
    """The backward replays the products the forward kept (rules.hooks):
    a pattern's products with a transposed weight, an adjoint one and a
    constant matrix, in float32 and float64, give eager's values and
    gradients; and a chain of products reads each its own kept value."""
    rng = np.random.default_rng(23)
    first = tensorflow.Variable(rng.normal(size=(3, 4)).astype(dtype))
    second = tensorflow.Variable(rng.normal(size=(4, 3)).astype(dtype))
    constant = tensorflow.constant(rng.normal(size=(3, 3)).astype(dtype))

    def loss(module, rows):
        terms = []
        for row in rows:
            hidden = module.tanh(module.matmul(row, second, transpose_b=True))
            hidden = module.sigmoid(module.matmul(hidden, first, adjoint_b=True))
            hidden = module.tanh(module.matmul(hidden, constant)) * hidden
            terms.append(module.reduce_sum(hidden * hidden))
        return module.add_n(terms)

    assert_compiled_pattern_matches_eager(loss, [first, second], rng, dtype)


def test_weight_gradients_summed_after_the_loop_give_eager_gradients(compiled):
    """The backward leaves a shared weight's gradient to one product of all
    steps' rows after its loop, and multiplies rows by the weight
    transposed once: a weight in two products of a pattern and also read
    elementwise, with rows added, subtracted and multiplied (the
    backward's own gradients for operands of the same rows), gives
    eager's values and gradients."""
    rng = np.random.default_rng(29)
    weight = tensorflow.Variable(rng.normal(size=(3, 3)).astype(np.float32))
    bias = tensorflow.Variable(rng.normal(size=(1, 3)).astype(np.float32))

    def loss(module, rows):
        terms = []
        for row in rows:
            first = module.tanh(module.matmul(row, weight) + bias)
            second = module.sigmoid(module.matmul(first - row, weight))
            terms.append(module.reduce_sum(first * second + second * weight[0:1]))
        return module.add_n(terms)

    assert_compiled_pattern_matches_eager(loss, [weight, bias], rng, np.float32)


def test_a_concats_gradient_in_a_backward_is_eagers(compiled):
    """The backward takes a concat's gradient as one split
    (``rules.concat_rule``): parts of unequal sizes, along an axis given
    as positive and as negative, parts read from variables, and a concat
    whose result is concatenated again, give eager's values and
    gradients.  (A concat along an instance's first axis makes rows of
    another length, which run step by step.)"""
    rng = np.random.default_rng(31)
    weight = tensorflow.Variable(rng.normal(size=(8, 3)).astype(np.float32))
    extra = tensorflow.Variable(rng.normal(size=(1, 2)).astype(np.float32))

    def loss(module, rows):
        terms = []
        for row in rows:
            wide = module.concat([module.tanh(row), row * extra[:, :1], row[:, :2] * extra],
                                 axis=1)
            hidden = module.sigmoid(module.matmul(wide, weight))
            both = module.concat([module.concat([hidden, row[:, :1]], axis=-1), wide], 1)
            terms.append(module.reduce_sum(both * both))
        return module.add_n(terms)

    assert_compiled_pattern_matches_eager(loss, [weight, extra], rng, np.float32)


@pytest.mark.parametrize("granularity", ["op", "subgraph"])
def test_a_backward_adds_every_gradient_of_a_row_read_twice_in_a_step(
        compiled, monkeypatch, granularity):
    """The backward adds a step's operand gradients into their rows by
    reading, adding and writing back only where the plan says every
    step's rows are distinct; a node every instance reads (here
    ``shared``) is one row read several times by one step, whose
    gradients must all be added.  Both kinds of step occur, and the values
    and gradients are eager TensorFlow's."""
    tf.set_parameter("granularity", granularity)
    rng = np.random.default_rng(31)
    weight = tensorflow.Variable(rng.normal(size=(3, 3)).astype(np.float32))
    flags = []
    run = program.run

    def recorded_run(the_program, *arguments, **keywords):
        flags.extend(the_program.steps[:, _native.STEP_DISTINCT].tolist())
        return run(the_program, *arguments, **keywords)
    monkeypatch.setattr(program, "run", recorded_run)

    def loss(module, rows):
        rows = [module.identity(row) for row in rows]
        shared = module.tanh(module.matmul(rows[0], weight))
        return module.add_n([module.reduce_sum(
            module.sigmoid(module.matmul(row, weight)) * shared) for row in rows])

    for _ in range(2):
        rows = [rng.normal(size=(1, 3)).astype(np.float32) for _ in range(4)]
        _assert_as_eager(loss, rows, [weight])
    assert tf.stats()["program_runs"] >= 1
    assert 0 in flags and 1 in flags, flags
    # A call with a step whose rows repeat ran the backward traced for
    # them (scatter_add throughout); the other, traced with its forward.
    assert any(set(compiled_program.backwards) == {True, False}
               for compiled_program in _compiled_programs())


def _assert_as_eager(function, instances, variables):
    """``function(module, instances)`` (a value, or a list of them) and its
    gradients for ``variables``: subgraphjit's are eager TensorFlow's."""
    with tensorflow.GradientTape() as tape:
        expected = function(tensorflow, instances)
    expected_gradients = tape.gradient(expected, variables)
    with tf.GradientTape() as tape:
        actual = function(tf, instances)
    actual_gradients = tape.gradient(actual, variables)
    pairs = zip(actual, expected) if isinstance(actual, list) else [(actual, expected)]
    for got, want in pairs:
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5)
    for got, want in zip(actual_gradients, expected_gradients):
        assert_gradient_equal(got, want, atol=1e-5)


def assert_compiled_pattern_matches_eager(loss, variables, rng, dtype):
    """``loss(module, rows)`` over four random (1, 3) rows, three times
    (collect, then compiled): values and the variables' gradients as
    eager TensorFlow's, through a compiled program running a pattern."""
    def on_nodes(module, rows):   # (rows recorded, under subgraphjit)
        return loss(module, [module.identity(row) for row in rows])

    tf.reset_stats()
    for _ in range(3):
        rows = [rng.normal(size=(1, 3)).astype(dtype) for _ in range(4)]
        _assert_as_eager(on_nodes, rows, variables)
    stats = tf.stats()
    assert stats["program_runs"] >= 1 and stats["pattern_matches"] >= 1, stats


# -- tables: variables a program only looks rows up in ------------------------

def _lookups_loss(table, weight):
    """Per instance: two lookups of ``table`` (a list of ids, and one id)
    whose rows go through products with a row of the instance's own and
    with ``weight``, in one pattern."""
    def loss(module, instances):
        terms = []
        for ids, other, row in instances:
            rows = module.nn.embedding_lookup(table, ids) * module.identity(row)
            hidden = module.tanh(module.matmul(rows, weight)) * module.gather(table, other)
            terms.append(module.reduce_sum(hidden * hidden))
        return module.add_n(terms)
    return loss


def _random_ids(rng, count):
    return [([int(i) for i in rng.integers(0, 6, size=2)], int(rng.integers(0, 6)),
             rng.normal(size=(1, 3)).astype(np.float32)) for _ in range(count)]


def _compiled_programs():
    return [entry.compiled for entry in program.PROGRAMS._entries.values()
            if entry.compiled is not None]


def test_a_table_is_captured_and_its_gradient_is_eagers_entries(compiled):
    """A variable read only by lookups is no argument of the program (a
    whole read copies a variable that a sparse update has put in
    copy-on-read mode): the traces gather its rows, and its gradient is
    eager's IndexedSlices, two lookups in one step included."""
    rng = np.random.default_rng(31)
    table = tensorflow.Variable(rng.normal(size=(6, 3)).astype(np.float32))
    weight = tensorflow.Variable(rng.normal(size=(3, 3)).astype(np.float32))
    loss = _lookups_loss(table, weight)
    for _ in range(3):
        _assert_as_eager(loss, _random_ids(rng, 4), [table, weight])
    assert tf.stats()["program_runs"] >= 1
    programs = _compiled_programs()
    assert programs
    for compiled_program in programs:
        tables = [compiled_program.shared.values[number] for number in compiled_program.tables]
        assert any(value is table for value in tables)
        assert all(compiled_program.shared.values[number] is not table
                   for number in compiled_program.given)


def test_a_table_changed_before_the_gradient_gives_eagers_gradient(compiled):
    """The backward replays the rows the forward looked up, as eager's
    tape keeps them: a table assigned between the loss and
    ``tape.gradient`` gives the gradient of the loss computed."""
    rng = np.random.default_rng(37)
    start = rng.normal(size=(6, 3)).astype(np.float32)
    table = tensorflow.Variable(start)
    weight = tensorflow.Variable(rng.normal(size=(3, 3)).astype(np.float32))
    loss = _lookups_loss(table, weight)

    def gradients(module, instances):
        table.assign(start)
        with module.GradientTape() as tape:
            value = loss(module, instances)
            if module is tf:
                value = tf.build(value)
        table.assign(start * 2 + 1)
        return tape.gradient(value, [table, weight])

    for _ in range(3):
        instances = _random_ids(rng, 4)
        for got, want in zip(gradients(tf, instances), gradients(tensorflow, instances)):
            assert_gradient_equal(got, want, atol=1e-5)
    assert tf.stats()["program_runs"] >= 1


@pytest.mark.parametrize("results", ["one loss", "two losses", "watched by hand"])
def test_a_variable_changed_before_the_gradient_gives_eagers_gradient(compiled, results):
    """A training forward reads its variables inside the call, and the
    tapes see their handles: a weight assigned between the loss and
    ``tape.gradient`` gives the gradients of the loss computed (the
    backward is given the forward's reads), whether the backward was
    speculated behind the forward (one loss) or runs when asked (two);
    and a tape that watches only what it is told gets the weight's
    gradient through its handle."""
    rng = np.random.default_rng(43)
    start = rng.normal(size=(3, 3)).astype(np.float32)
    table = tensorflow.Variable(rng.normal(size=(6, 3)).astype(np.float32))
    weight = tensorflow.Variable(start)
    loss = _lookups_loss(table, weight)

    def gradients(module, instances):
        weight.assign(start)
        with module.GradientTape(
                watch_accessed_variables=results != "watched by hand") as tape:
            if results == "watched by hand":
                tape.watch(weight)
            half = len(instances) // 2
            values = [loss(module, instances[:half]), loss(module, instances[half:])]
            if results != "two losses":
                values = module.add_n(values)
            if module is tf:
                values = tf.build(values)
        weight.assign(start * 2 + 1)
        return tape.gradient(values, [table, weight])

    for _ in range(3):
        instances = _random_ids(rng, 4)
        got, want = gradients(tf, instances), gradients(tensorflow, instances)
        if results == "watched by hand":
            assert got[0] is None and want[0] is None
            got, want = got[1:], want[1:]
        for got_one, want_one in zip(got, want):
            assert_gradient_equal(got_one, want_one, atol=1e-5)
    assert tf.stats()["program_runs"] >= 1


def _looked_up_products(seed, rows=list):
    """A generator, a table, a weight, and ``outputs(module, instances)``:
    tanh of each instance's rows of the table times the weight.  The rows
    are given as ``rows`` makes them: a list joins the lookup to the
    pattern that reads it (a program of one kind: signature.looked_up_rows);
    a NumPy array keeps the lookup a kind of its own (a program of two)."""
    rng = np.random.default_rng(seed)
    table = tensorflow.Variable(rng.normal(size=(6, 3)).astype(np.float32))
    weight = tensorflow.Variable(rng.normal(size=(3, 3)).astype(np.float32))

    def outputs(module, instances):
        return [module.tanh(module.matmul(module.nn.embedding_lookup(table, rows(ids)),
                                          weight))
                for ids, _, _ in instances]
    return rng, table, weight, outputs


def _infer_as_eager(outputs, instances):
    """``outputs`` of ``instances`` in a batching scope equal eager's."""
    with tf.batching():
        actual = outputs(tf, instances)
    for got, want in zip(actual, outputs(tensorflow, instances)):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_cached_program_shares_repeated_lookups_in_inference(compiled, seed):
    """Inference shares a lookup of rows looked up before in the scope, and
    the work on them (graph.py): a program cached on one minibatch, run on
    others whose repeats fall elsewhere, gives each minibatch's eager
    values."""
    rng, _, _, outputs = _looked_up_products(seed)
    tf.reset_stats()
    for _ in range(4):
        instances = _random_ids(rng, 5)
        instances += instances[:2]   # (two instances again: repeats for sure)
        _infer_as_eager(outputs, instances)
    stats = tf.stats()
    # Each repeated instance: at least its pattern (its lookup inside) skipped.
    assert stats["program_runs"] >= 3 and stats["duplicates_skipped"] >= 4 * 2, stats


def test_a_lookup_by_a_list_of_rows_runs_inside_its_pattern(compiled):
    """A lookup whose rows are a Python list (``embedding_lookup(table,
    [i, j])``, a tree's leaf) is part of the pattern that reads it, the
    list one of the pattern's arguments: a compiled program of one kind,
    whose values and gradients (the table's an IndexedSlices) are eager
    TensorFlow's, in inference and in training, on new minibatches."""
    rng, table, weight, outputs = _looked_up_products(53)
    for _ in range(3):
        _infer_as_eager(outputs, _random_ids(rng, 4))
        _assert_as_eager(outputs, _random_ids(rng, 4), [table, weight])
    # (The first minibatch, which collects the patterns, runs ops.)
    patterned = [compiled_program for compiled_program in _compiled_programs()
                 if any(kind.entry.node_kind == "pattern" for kind in compiled_program.kinds)]
    assert patterned
    for compiled_program in patterned:
        assert len(compiled_program.kinds) == 1
        assert "tf.nn.embedding_lookup" in compiled_program.kinds[0].entry.pattern.source


def test_a_program_traces_the_modes_it_runs(compiled):
    """A program run for inference traces its inference forward alone (no
    backward); run by a tape later, the same key traces its training
    functions and gives eager's values and gradients."""
    rng, table, weight, outputs = _looked_up_products(41)
    for _ in range(3):
        _infer_as_eager(outputs, _random_ids(rng, 4))
    programs = _compiled_programs()
    assert programs and all(compiled_program.modes == {False: True}
                            and not getattr(compiled_program, "backwards", None)
                            for compiled_program in programs)
    tf.reset_stats()
    for _ in range(2):
        _assert_as_eager(outputs, _random_ids(rng, 4), [table, weight])
    stats = tf.stats()
    assert stats["programs_compiled"] == 0 and stats["program_runs"] == 2, stats
    assert stats["compile_seconds"] > 0
    assert any(compiled_program.modes == {False: True, True: True}
               for compiled_program in programs)
    # Every step's rows distinct: one backward, traced with the forward.
    trained = [compiled_program for compiled_program in programs
               if compiled_program.modes.get(True) is True]
    assert trained and all(set(compiled_program.backwards) == {True}
                           for compiled_program in trained)


def test_a_programs_loops_and_switches_run_as_function_calls(compiled):
    """Every loop over a program's steps (forward, inference, backward) and
    every switch among its kinds is marked not to be lowered to frames:
    lowered, each step paid a merge, a switch and a next-iteration per
    loop variable (BENCHMARKS.md).  Results stay eager's."""
    traced = _traced_program_nodes(43)
    marked = collections.Counter()
    for node in (node for _, nodes in traced for node in nodes):
        if node.op in ("While", "StatelessWhile", "Case", "StatelessCase"):
            assert "_lower_using_switch_merge" in node.attr, node.name
            assert not node.attr["_lower_using_switch_merge"].b, node.name
            marked[node.op.replace("Stateless", "")] += 1
    assert marked["While"] >= len(traced) and marked["Case"] >= len(traced), marked


def test_a_programs_step_functions_run_on_the_single_threaded_executor(compiled):
    """Each switch's branches and each loop's condition (forward, inference,
    backward) run on TensorFlow's single-threaded executor where their ops
    allow it: here every one, the backward's too, which add gradient rows
    with no ``tf.cond``.  A loop's body, which calls the switch, never
    does.  Results stay eager's."""
    executors = collections.Counter()
    for mode, nodes in _traced_program_nodes(47):
        for node in nodes:
            for key in ("branches", "cond", "body"):
                if key not in node.attr:
                    continue
                value = node.attr[key]
                for function in (value.list.func if value.HasField("list") else [value.func]):
                    executor = function.attr["_executor"].s if "_executor" in function.attr \
                        else b"default"
                    executors[mode, key, executor] += 1
    assert not any(executor == b"SINGLE_THREADED_EXECUTOR"
                   for (_, key, executor) in executors if key == "body"), executors
    if not program.overlap.cpu_only():   # (where a GPU could run them, none moves)
        assert not any(executor != b"default" for *_, executor in executors), executors
        return
    for mode in ("inference", "forward", "backward"):
        for key in ("branches", "cond"):
            assert executors[mode, key, b"SINGLE_THREADED_EXECUTOR"] >= 1, executors
            assert executors[mode, key, b"default"] == 0, executors


def _traced_program_nodes(seed):
    """Lookups and products (two kinds) run compiled in each mode (results
    checked against eager's): per function each mode traced, (mode, every node of
    its graph and of the functions it calls)."""
    rng, table, weight, outputs = _looked_up_products(seed, rows=np.asarray)
    for _ in range(2):
        _infer_as_eager(outputs, _random_ids(rng, 4))
        _assert_as_eager(outputs, _random_ids(rng, 4), [table, weight])
    traced = [(mode, function) for compiled_program in _compiled_programs()
              for mode, function in _traced_functions(compiled_program)]
    assert {mode for mode, _ in traced} == {"inference", "forward", "backward"}, traced
    nodes = []
    for mode, function in traced:
        graph = function.graph.as_graph_def()
        nodes.append((mode, list(graph.node) + [node for library_function in graph.library.function
                                                for node in library_function.node_def]))
    return nodes


def _traced_functions(compiled_program):
    """(mode, concrete function) of each function a compiled program traced."""
    for mode in ("inference", "forward"):
        if hasattr(compiled_program, mode):
            yield mode, getattr(compiled_program, mode)
    for function in getattr(compiled_program, "backwards", {}).values():
        yield "backward", function


def test_a_function_that_could_wait_keeps_the_default_executor():
    """The single-threaded executor waits in place for an asynchronous
    kernel, which with one inter-op thread never runs: a branch that calls
    a function (a nested ``tf.function``, a ``tf.cond``) or holds a
    stateful op not known to be synchronous keeps the default executor;
    the others move.  Every branch still computes its value."""
    switch, marks = _switch_of_four_branches()
    x = tensorflow.constant([2.0, 5.0])
    expected = [[4.0, 10.0], [3.0, 6.0], [1.0, 4.0], [6.0, 15.0]]
    for index, values in enumerate(expected):
        np.testing.assert_allclose(switch(tensorflow.constant(index), x).numpy(), values)
    moved = b"SINGLE_THREADED_EXECUTOR" if program.overlap.cpu_only() else None
    assert marks["executors"] == [moved, None, None, None], marks


def _switch_of_four_branches():
    """A traced ``tf.switch_case`` made by ``program._unlowered`` (a plain
    branch, one calling a ``tf.function``, one holding a ``tf.cond``, one
    a stateful op not on the synchronous list), and what executor each
    branch was given (``marks``, filled when traced)."""
    @tensorflow.function(autograph=False)
    def inner(x):
        return x + 1.0

    branches = [lambda x: x * 2.0,
                lambda x: inner(x),
                lambda x: tensorflow.cond(x[0] > 0, lambda: x - 1.0, lambda: x + 1.0),
                lambda x: tensorflow.random.shuffle(x) * 0.0 + x * 3.0]
    marks = {}

    @tensorflow.function(autograph=False)
    def switch(index, x):
        graph = tensorflow.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        result = program._unlowered(("Case", "StatelessCase"), tensorflow.switch_case, index,
                                    [lambda f=f: f(x) for f in branches])
        for op in graph.get_operations()[before:]:
            if op.type in ("Case", "StatelessCase"):
                marks["executors"] = [
                    function.attr["_executor"].s if "_executor" in function.attr else None
                    for function in op.node_def.attr["branches"].list.func]
        return result

    return switch, marks


def test_where_a_gpu_could_run_them_no_function_moves(monkeypatch):
    """Where TensorFlow has a GPU, every branch keeps the default executor
    (the single-threaded one is used and tested on the CPU only)."""
    monkeypatch.setattr(program.overlap, "cpu_only", lambda: False)
    switch, marks = _switch_of_four_branches()
    np.testing.assert_allclose(switch(tensorflow.constant(0), tensorflow.constant([1.0])).numpy(),
                               [2.0])
    assert marks["executors"] == [None, None, None, None], marks


def test_a_gather_along_a_later_axis_reads_its_variable_whole(compiled):
    """A gather from a shared variable along its second axis is no lookup
    of rows: the rule refuses it, the step repeats the variable per
    instance, and its gradient is eager's (the variable is no table)."""
    tf.set_parameter("granularity", "op")
    rng = np.random.default_rng(43)
    table = tensorflow.Variable(rng.normal(size=(3, 6)).astype(np.float32))

    def loss(module, instances):
        return module.add_n([
            module.reduce_sum(module.tanh(module.gather(table, ids, axis=1) * row[:, :2]))
            for ids, _, row in instances])

    for _ in range(3):
        _assert_as_eager(loss, _random_ids(rng, 4), [table])
    assert tf.stats()["program_runs"] >= 1
    assert all(not compiled_program.tables for compiled_program in _compiled_programs())
