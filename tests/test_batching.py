"""Batched evaluation equals eager TensorFlow for every example model,
every scheduler and both row layouts: losses and gradients, over minibatches
of varied structure."""

import contextlib

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit.batcher.schedulers import SCHEDULERS
from experiments.example_models import MODELS
from gradients import assert_gradient_equal, assert_loss_and_gradients_equal

SCHEDULER_NAMES = ["none", *SCHEDULERS]


@pytest.fixture(params=[(name, "none") for name in SCHEDULER_NAMES]
                + [(name, "pq") for name in SCHEDULER_NAMES if name != "none"],
                ids=lambda pair: "-".join(pair))
def scheduler(request):
    """The scheduler's name, with a row layout set too; every batch runs as
    its own op (compiled programs: test_programs.py)."""
    previous = tf.get_parameter("scheduler"), tf.get_parameter("layout")
    name, layout = request.param
    tf.set_parameter("scheduler", name)
    tf.set_parameter("layout", layout)
    yield name
    tf.set_parameter("scheduler", previous[0])
    tf.set_parameter("layout", previous[1])


@pytest.fixture
def step_by_step():
    """The step-by-step executor, whose operand statistics (slices, gathers)
    a test checks: a compiled program gathers every operand inside."""
    previous = tf.get_parameter("compile")
    tf.set_parameter("compile", 0)
    yield
    tf.set_parameter("compile", previous)


def minibatch_loss_and_gradients(module, model, examples):
    with module.GradientTape() as tape:
        loss = module.add_n([model.loss(module, e) for e in examples]) / len(examples)
        if hasattr(module, "build"):
            loss = module.build(loss)
    return loss, tape.gradient(loss, model.variables)


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_batched_minibatch_equals_eager(model_name, scheduler):
    rng = np.random.default_rng(sum(map(ord, model_name)))
    model = MODELS[model_name](rng)
    examples = model.random_examples(rng, 6)
    expected_loss, expected_gradients = minibatch_loss_and_gradients(
        tensorflow, model, examples)
    tf.reset_stats()
    loss, gradients = minibatch_loss_and_gradients(tf, model, examples)
    assert_loss_and_gradients_equal((loss, gradients), (expected_loss, expected_gradients))
    stats = tf.stats()
    if scheduler != "none":
        # Batching really happened: fewer launches than nodes (far fewer but
        # for attention, whose sequences of unequal length rarely share shapes).
        share = 1.0 if model_name == "attention" else 0.5
        assert stats["batches"] < stats["nodes_evaluated"] * share, stats
        assert not stats["unbatched"], stats["unbatched"]


def test_schedulers_report_batches_and_the_lower_bound():
    rng = np.random.default_rng(3)
    model = MODELS["tree_lstm"](rng)
    examples = model.random_examples(rng, 8)
    tf.set_parameter("lower_bound", True)
    previous = tf.get_parameter("scheduler")
    try:
        counts = {}
        for name in SCHEDULERS:
            tf.set_parameter("scheduler", name)
            tf.reset_stats()
            tf.build([model.loss(tf, e) for e in examples])
            stats = tf.stats()
            counts[name] = stats["batches"]
            assert 0 < stats["lower_bound"] <= stats["batches"]
            assert sum(stats["batch_sizes"].values()) == stats["batches"]
    finally:
        tf.set_parameter("lower_bound", False)
        tf.set_parameter("scheduler", previous)
    assert all(count > 0 for count in counts.values())


def test_identical_work_is_done_once():
    table = tensorflow.constant(np.eye(4, dtype=np.float32))
    tf.reset_stats()
    # The same word looked up in three "sentences": one lookup.
    nodes = [tf.tanh(tf.nn.embedding_lookup(table, [2])) for _ in range(3)]
    values = tf.build(nodes)
    assert tf.stats()["duplicates_skipped"] == 4  # 2 lookups + 2 tanh
    for value in values:
        np.testing.assert_allclose(value.numpy(), np.tanh(np.eye(4)[[2]]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lookups_of_a_variable_are_shared_where_no_tape_records(seed):
    """Without a tape, the same row of a variable looked up twice is one
    lookup, and the work that reads it is done once (a Tree-LSTM's leaves
    of one word); under a tape each lookup keeps its own row (the test
    below).  Either way, every value is eager TensorFlow's."""
    rng = np.random.default_rng(seed)
    table = tensorflow.Variable(rng.normal(size=(6, 3)).astype(np.float32))
    weight = tensorflow.Variable(rng.normal(size=(3, 4)).astype(np.float32))
    ids = [int(i) for i in rng.integers(0, 6, size=12)]   # (repeats: 12 of 6)

    def leaves(module):
        return [module.tanh(module.matmul(module.nn.embedding_lookup(table, [i]), weight))
                for i in ids]
    expected = [value.numpy() for value in leaves(tensorflow)]
    repeats = len(ids) - len(set(ids))
    tf.reset_patterns()   # (op by op: patterns other tests left would fold ops)
    for under_tape in (False, True):
        tf.reset_stats()
        with tf.GradientTape() if under_tape else contextlib.nullcontext():
            values = tf.build(leaves(tf))
        # The lookup, its product and the tanh of a repeated word: skipped
        # in inference; under the tape nothing repeats.
        assert tf.stats()["duplicates_skipped"] == (0 if under_tape else 3 * repeats)
        for value, eager in zip(values, expected):
            np.testing.assert_allclose(value.numpy(), eager, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("lookup", ["nn.embedding_lookup", "gather"])
def test_lookups_of_a_variable_keep_one_gradient_entry_each(lookup):
    """The same row of a variable looked up three times: three entries in
    the IndexedSlices gradient, as eager gives (Adam squares each entry)."""
    table = tensorflow.Variable(np.eye(4, dtype=np.float32))
    gradients = []
    for module in (tensorflow, tf):
        function = getattr(module.nn, "embedding_lookup") if "nn" in lookup \
            else module.gather
        with module.GradientTape() as tape:
            rows = [module.tanh(function(table, [2])) * float(k + 1)
                    for k in range(3)]
            total = module.reduce_sum(module.add_n(rows))
        gradients.append(tape.gradient(total, table))
    assert len(gradients[1].indices) == 3
    assert_gradient_equal(gradients[1], gradients[0])


def test_nodes_nothing_references_are_not_evaluated():
    """A result dropped in a scope (MV-RNN's matrix of a one-word tree) is
    never computed: batched with the live lookup, the dropped lookup would
    add an entry to the variable's gradient that eager TensorFlow has not."""
    table = tensorflow.Variable(np.eye(4, dtype=np.float32))
    gradients = []
    for module in (tensorflow, tf):
        tf.reset_stats()
        with module.GradientTape() as tape:
            kept = module.gather(table, [1]) * 2.0
            module.gather(table, [3]) * 5.0   # dropped at once
            total = module.reduce_sum(kept)
        gradients.append(tape.gradient(total, table))
    assert tf.stats()["nodes_evaluated"] == 3
    assert_gradient_equal(gradients[1], gradients[0])


def test_in_order_rows_are_sliced_and_others_gathered(step_by_step):
    x = tensorflow.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
    tf.reset_stats()
    rows = [tf.gather(x, [i]) * 2.0 for i in range(6)]
    # Pairing row i with row 5 - i: no order of the batch suits both operands.
    mirrored = [tf.exp((rows[i] - rows[5 - i]) * 0.1) for i in range(6)]
    in_order = [tf.sigmoid(rows[i]) for i in range(6)]
    results = tf.build(mirrored + in_order)
    stats = tf.stats()
    assert stats["gathers"] >= 1 and stats["bytes_gathered"] > 0
    for value, i in zip(results[:6], range(6)):
        np.testing.assert_allclose(
            value.numpy(), np.exp((x.numpy()[[i]] - x.numpy()[[5 - i]]) * 0.2),
            rtol=1e-6)
    for value, i in zip(results[6:], range(6)):
        np.testing.assert_allclose(
            value.numpy(), 1 / (1 + np.exp(-2 * x.numpy()[[i]])), rtol=1e-6)


def test_per_instance_python_lists_of_lower_rank_broadcast(step_by_step):
    """``tanh(x_i) + [i, 1.0]``: the lists stack into a NumPy array whose
    rows get a size-1 axis to broadcast as each instance's list did (the
    rank alignment reads a NumPy array's shape too)."""
    rng = np.random.default_rng(0)
    xs = [tensorflow.Variable(rng.standard_normal((2, 2)).astype(np.float32))
          for _ in range(3)]
    results = []
    for module in (tensorflow, tf):
        tf.reset_stats()
        with module.GradientTape() as tape:
            outputs = [module.math.tanh(x) + [float(i), 1.0] for i, x in enumerate(xs)]
            total = module.add_n([module.reduce_sum(y * y) for y in outputs])
        results.append(([np.asarray(y) for y in outputs], tape.gradient(total, xs)))
    assert tf.stats()["batch_sizes"].get(3), "the additions ran as one batch"
    (expected, expected_gradients), (values, gradients) = results
    for value, want in zip(values, expected):
        np.testing.assert_allclose(value, want, rtol=1e-6)
    for gradient, want in zip(gradients, expected_gradients):
        assert_gradient_equal(gradient, want)


def test_the_row_layout_turns_gathers_into_slices(step_by_step):
    """z_i = a_i + b_(5-i), with a and b computed from different variables:
    as scheduled, b (or a) is ordered like its own source and one of z's
    operands is gathered; the planner orders b's chain backwards instead."""
    x = tensorflow.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
    y = tensorflow.Variable(np.arange(12, dtype=np.float32).reshape(6, 2) / 7)

    def evaluate(layout):
        tf.set_parameter("layout", layout)
        tf.reset_stats()
        a = [tf.sigmoid(tf.gather(x, [i]) * 2.0) for i in range(6)]
        b = [tf.tanh(tf.gather(y, [i]) * 3.0) for i in range(6)]
        values = tf.build([a[i] + b[5 - i] for i in range(6)])
        return [value.numpy() for value in values], tf.stats()

    try:
        planned, planned_stats = evaluate("pq")
        scheduled, scheduled_stats = evaluate("none")
    finally:
        tf.set_parameter("layout", "none")
    assert scheduled_stats["gathers"] == 1
    assert planned_stats["gathers"] == 0 and planned_stats["bytes_gathered"] == 0
    assert planned_stats["layout_seconds"] > 0
    for got, expected, i in zip(planned, scheduled, range(6)):
        np.testing.assert_allclose(got, expected)
        want = (1 / (1 + np.exp(-2 * x.numpy()[[i]]))
                + np.tanh(3 * y.numpy()[[5 - i]]))
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_ops_without_a_rule_run_per_instance_and_are_counted():
    a = [tensorflow.constant(np.random.rand(2, 3).astype(np.float32)) for _ in range(3)]
    tf.reset_stats()
    # tf.math.cumsum is outside the op table: recorded through dispatch.
    nodes = [tensorflow.math.cumsum(tf.identity(x), axis=1) for x in a]
    for node, x in zip(tf.build(nodes), a):
        np.testing.assert_allclose(node.numpy(), np.cumsum(x.numpy(), axis=1), rtol=1e-6)
    assert tf.stats()["unbatched"] == {"cumsum: no batch rule": 3}


def test_debug_prints_a_summary_per_evaluation(capsys):
    rng = np.random.default_rng(5)
    model = MODELS["tree_lstm"](rng)
    tf.set_parameter("debug", True)
    try:
        tf.build([model.loss(tf, e) for e in model.random_examples(rng, 3)])
    finally:
        tf.set_parameter("debug", False)
    summary = capsys.readouterr().err
    assert f"launches (scheduler {tf.get_parameter('scheduler')})" in summary
    assert "batch sizes: mean" in summary and "gathers" in summary


def test_a_minibatch_of_one_with_nothing_to_batch_runs_op_by_op(scheduler):
    """One attention instance: no two of its nodes have one batching type,
    so its nodes run one by one in recording order (no schedule, no
    program), and the loss, gradients and their types are eager's."""
    rng = np.random.default_rng(12)
    model = MODELS["attention"](rng)
    examples = model.random_examples(rng, 1)
    expected = minibatch_loss_and_gradients(tensorflow, model, examples)
    tf.reset_stats()
    got = minibatch_loss_and_gradients(tf, model, examples)
    assert_loss_and_gradients_equal(got, expected)
    stats = tf.stats()
    if scheduler != "none":
        assert stats["unshared_evaluations"] == stats["evaluations"] == 1
        assert stats["batch_sizes"] == {1: stats["nodes_evaluated"]}


@pytest.mark.parametrize("shared", [False, True], ids=["little", "much"])
def test_an_evaluation_batches_only_where_batching_saves_launches(shared, scheduler):
    """Eight ops of which two could share a launch (7 launches for 8 nodes)
    run op by op; twelve instances of one op and one sum (2 launches for 13
    nodes) batch.  Both give eager's values, gradients and their types."""
    weight = tensorflow.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    table = tensorflow.Variable(np.linspace(0, 1, 15, dtype=np.float32).reshape(5, 3))

    def loss(module):
        if shared:
            rows = [module.matmul(module.nn.embedding_lookup(table, [k % 5]), weight)
                    for k in range(6)]
            return module.reduce_sum(module.add_n(rows))
        h = module.tanh(module.nn.embedding_lookup(table, [1, 3]))
        left = module.matmul(h * 2.0, weight)
        right = module.matmul(module.sigmoid(h), weight)
        return module.reduce_sum(module.exp(left + right))

    results = []
    for module in (tensorflow, tf):
        tf.reset_stats()
        with module.GradientTape() as tape:
            total = loss(module)
            if module is tf:
                total = tf.build(total)
        results.append((total, tape.gradient(total, [weight, table])))
    assert_loss_and_gradients_equal(results[1], results[0])
    stats = tf.stats()
    if scheduler != "none":
        assert (stats["unshared_evaluations"] == 1) is not shared
        assert (max(stats["batch_sizes"]) > 1) is shared
