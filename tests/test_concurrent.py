"""tf.batching.map: instances run concurrently, their value reads served by
batched rounds.  Differential against eager TensorFlow (values, gradients
and their types) for the value-dependent example models under every
scheduler and granularity; rounds against reads; errors, nested and empty
maps."""

import gc
import traceback

import greenlet
import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit import concurrent
from subgraphjit.context import context
from experiments.example_models import CONTROL_FLOW_MODELS, minibatch_losses
from gradients import assert_loss_and_gradients_equal


@pytest.fixture
def settings(request):
    """Set (scheduler, granularity) for one test, with fresh patterns and
    programs (a new model), and put everything back afterwards."""
    keys = ("scheduler", "granularity")
    previous = [tf.get_parameter(key) for key in keys]
    for key, value in zip(keys, request.param):
        tf.set_parameter(key, value)
    tf.reset_patterns()
    yield request.param
    for key, value in zip(keys, previous):
        tf.set_parameter(key, value)
    tf.reset_patterns()


def loss_and_gradients(module, model, examples):
    with module.GradientTape() as tape:
        loss = module.add_n(minibatch_losses(module, model, examples))
        if hasattr(module, "build"):
            loss = module.build(loss)
    return loss, tape.gradient(loss, model.variables)


SETTINGS = [(scheduler, granularity)
            for scheduler in ("agenda", "depth", "fsm", "none")
            for granularity in ("op", "subgraph", "auto")]


@pytest.mark.parametrize("model_name", sorted(CONTROL_FLOW_MODELS))
@pytest.mark.parametrize("settings", SETTINGS, indirect=True,
                         ids=lambda pair: "-".join(pair))
def test_map_equals_eager(model_name, settings):
    rng = np.random.default_rng(sum(map(ord, model_name)))
    model = CONTROL_FLOW_MODELS[model_name](rng, 4, 3)
    # Two minibatches: the second runs on what the first collected/compiled.
    for _ in range(2):
        examples = model.random_examples(rng, 5)
        expected_loss, expected_gradients = loss_and_gradients(tensorflow, model, examples)
        tf.reset_stats()
        loss, gradients = loss_and_gradients(tf, model, examples)
        assert_loss_and_gradients_equal((loss, gradients), (expected_loss, expected_gradients))
        stats = tf.stats()
        assert stats["forced_evaluations"] == {}
        # One evaluation per round, and the tape's build.
        assert stats["evaluations"] == stats["concurrent_rounds"] + 1
        assert stats["concurrent_reads"] == sum(stats["concurrent_read_sites"].values())


@pytest.mark.parametrize("model_name", sorted(CONTROL_FLOW_MODELS))
def test_rounds_are_far_fewer_than_reads(model_name):
    rng = np.random.default_rng(7)
    model = CONTROL_FLOW_MODELS[model_name](rng, 4, 3)
    examples = model.random_examples(rng, 16)
    tf.reset_stats()
    loss_and_gradients(tf, model, examples)
    stats = tf.stats()
    assert stats["concurrent_reads"] >= 3 * stats["concurrent_rounds"] > 0
    assert stats["evaluations"] == stats["concurrent_rounds"] + 1
    # The sequential loop: a forced evaluation per read, as before.
    tf.reset_stats()
    with tf.GradientTape():
        tf.build(tf.add_n([model.loss(tf, example) for example in examples]))
    sequential = tf.stats()
    assert sequential["concurrent_rounds"] == sequential["concurrent_reads"] == 0
    assert sum(sequential["forced_evaluations"].values()) == stats["concurrent_reads"]
    assert set(sequential["forced_evaluations"]) == set(stats["concurrent_read_sites"])


def chain(x, reads):
    """``reads`` value reads, each of a node depending on the last."""
    h = tf.constant(x)
    for _ in range(reads):
        h = tf.tanh(h) + 1.0
        if float(h) < -5:   # never: a read
            raise AssertionError
    return h


def test_each_round_serves_every_suspended_instance():
    tf.reset_stats()
    results = tf.batching.map(lambda reads: chain(0.5, reads), [3, 1, 0, 5, 2])
    stats = tf.stats()
    assert stats["concurrent_rounds"] == 5   # the longest instance's reads
    assert stats["concurrent_reads"] == 11
    assert stats["evaluations"] == 5
    for reads, result in zip([3, 1, 0, 5, 2], results):
        expected = tensorflow.constant(0.5)
        for _ in range(reads):
            expected = tensorflow.tanh(expected) + 1.0
        np.testing.assert_allclose(tf.build(result).numpy(), expected.numpy(), rtol=1e-6)


def test_empty_map():
    tf.reset_stats()
    assert tf.batching.map(lambda item: 1 / 0, []) == []
    assert tf.stats()["evaluations"] == 0


def test_reads_outside_map_force_as_before():
    tf.reset_stats()
    chain(0.1, 2)
    stats = tf.stats()
    assert sum(stats["forced_evaluations"].values()) == 2
    assert stats["concurrent_rounds"] == 0


def test_nested_map_joins_the_outer_rounds():
    def outer(x):
        return tf.batching.map(lambda reads: chain(x, reads), [1, 2])

    tf.reset_stats()
    results = tf.batching.map(outer, [0.1, 0.2, 0.3])
    stats = tf.stats()
    # Every inner instance's first read is in one round, the second reads
    # in another: the inner coordinators' evaluations are the outer's reads.
    assert stats["concurrent_rounds"] == stats["evaluations"] == 2
    assert stats["concurrent_reads"] == 3 * 3
    for x, pair in zip([0.1, 0.2, 0.3], results):
        expected = tensorflow.tanh(tensorflow.constant(x)) + 1.0
        np.testing.assert_allclose(tf.build(pair[0]).numpy(), expected.numpy(), rtol=1e-6)


def test_scopes_inside_instances_are_each_instances_own():
    def scoped(x):
        with tf.batching():
            h = chain(x, 2)
            inner = tf.tanh(h)
        return float(inner)

    scopes_before = list(context.scopes)
    with tf.batching():
        results = tf.batching.map(scoped, [0.1, 0.2, 0.3])
    assert context.scopes == scopes_before
    expected = [float(tensorflow.tanh(chain_eager(x, 2))) for x in (0.1, 0.2, 0.3)]
    np.testing.assert_allclose(results, expected, rtol=1e-6)


def chain_eager(x, reads):
    h = tensorflow.constant(x)
    for _ in range(reads):
        h = tensorflow.tanh(h) + 1.0
    return h


def live_instances():
    return [g for g in gc.get_objects() if type(g) is concurrent._Instance and g]


def test_an_error_in_one_instance_propagates_and_abandons_the_rest():
    finished, unwound = [], []

    def instance(item):
        try:
            chain(0.1, item)
            if item == 2:
                raise ValueError("instance 2 failed")   # the user's line
            chain(0.1, 3)
            finished.append(item)
        finally:
            unwound.append(item)
        return item

    scopes_before = list(context.scopes)
    with pytest.raises(ValueError, match="instance 2 failed") as caught:
        with tf.GradientTape():
            tf.batching.map(instance, [1, 3, 2, 0, 4])
    # The traceback names the user's line inside the instance.
    frames = traceback.extract_tb(caught.value.__traceback__)
    assert any(frame.line == 'raise ValueError("instance 2 failed")   # the user\'s line'
               for frame in frames)
    assert sorted(finished) == [1, 3]            # before the failing one: finished
    assert sorted(unwound) == [0, 1, 2, 3, 4]    # after it: started, then unwound
    assert context.scopes == scopes_before and not live_instances()
    assert gc.isenabled()


def test_the_lowest_failing_instance_wins():
    def instance(item):
        chain(0.1, item)
        raise KeyError(item)

    with pytest.raises(KeyError) as caught:
        tf.batching.map(instance, [3, 2, 1, 0])
    # Index 3 fails first (no reads), index 0 last: the sequential loop's error.
    assert caught.value.args == (3,)
    assert not live_instances()


def test_a_shape_error_recorded_in_one_instance():
    def instance(item):
        h = chain(0.1, 1)
        if item == 1:
            h = tf.matmul(tf.reshape(h, (1, 1)), tf.ones((3, 3)))   # shape error
        return float(h)

    with pytest.raises(tensorflow.errors.InvalidArgumentError) as caught:
        tf.batching.map(instance, [0, 1, 2])
    assert "test_concurrent.py" in "".join(getattr(caught.value, "__notes__", [])) \
        or any(frame.filename.endswith("test_concurrent.py")
               for frame in traceback.extract_tb(caught.value.__traceback__))
    assert not live_instances()


def bad_lookup(item):
    table = tf.constant([[1.0], [2.0]])
    row = tf.gather(table, [item])   # an index out of range fails when evaluated
    return float(tf.reduce_sum(row))


def test_an_evaluation_error_is_raised_at_the_failing_instances_read():
    completed = []

    def instance(item):
        value = bad_lookup(item)
        completed.append(item)
        return value

    with pytest.raises(tensorflow.errors.InvalidArgumentError) as caught:
        tf.batching.map(instance, [0, 1, 7, 0])
    frames = traceback.extract_tb(caught.value.__traceback__)
    assert any(frame.name == "bad_lookup" for frame in frames)
    assert completed == [0, 1]
    assert not live_instances()


def test_an_evaluation_error_caught_in_its_instance():
    def instance(item):
        try:
            return bad_lookup(item)
        except tensorflow.errors.InvalidArgumentError:
            return "caught"

    assert tf.batching.map(instance, [0, 5, 1]) == [1.0, "caught", 2.0]


def test_eager_mode_runs_the_plain_loop():
    tf.set_parameter("mode", "eager")
    try:
        assert tf.batching.map(lambda x: float(chain(x, 2)), [0.1]) == \
            [pytest.approx(float(chain_eager(0.1, 2)))]
    finally:
        tf.set_parameter("mode", "lazy")


def test_instances_share_the_callers_tape_and_thread():
    variable = tensorflow.Variable([[0.3]])

    def instance(x):
        h = tf.tanh(tf.matmul(tf.constant([[x]]), variable))
        if float(tf.reduce_sum(h)) > 0.0:
            h = h * 2.0
        return h

    with tf.GradientTape() as tape:
        loss = tf.build(tf.add_n(tf.batching.map(instance, [1.0, -1.0, 2.0])))
    with tensorflow.GradientTape() as eager_tape:
        expected = tensorflow.add_n([
            (lambda h: h * 2.0 if float(tensorflow.reduce_sum(h)) > 0.0 else h)(
                tensorflow.tanh(tensorflow.matmul(tensorflow.constant([[x]]), variable)))
            for x in (1.0, -1.0, 2.0)])
    np.testing.assert_allclose(loss.numpy(), expected.numpy(), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(loss, variable).numpy(),
                               eager_tape.gradient(expected, variable).numpy(), rtol=1e-5)
    assert isinstance(greenlet.getcurrent(), greenlet.greenlet)


def test_a_tape_inside_each_instance():
    """Per-instance gradients: each instance's tape, entered in its greenlet,
    is on TensorFlow's per-thread tape stack while the rounds evaluate."""
    variable = tensorflow.Variable([[0.5, -0.2], [0.1, 0.3]])

    def per_instance_gradient(module, x):
        with module.GradientTape() as tape:
            h = module.tanh(module.matmul(module.constant([x]), variable))
            if float(module.reduce_sum(h)) > 0.0:
                h = h * h
            loss = module.reduce_sum(h)
        return tape.gradient(loss, variable)

    items = [[1.0, 2.0], [-1.0, 0.5], [0.3, -2.0]]
    got = tf.batching.map(lambda x: per_instance_gradient(tf, x), items)
    for x, gradient in zip(items, got):
        np.testing.assert_allclose(
            gradient.numpy(), per_instance_gradient(tensorflow, x).numpy(), rtol=1e-5)


def test_rows_taken_out_after_the_tape_keep_their_gradient():
    """Losses left as rows of a batched result when the tape's block ends
    (no build inside) still have gradients, each eager's."""
    variable = tensorflow.Variable([[0.5, -0.2], [0.1, 0.3]])
    items = [[1.0, 2.0], [-1.0, 0.5], [0.3, -2.0]]

    def losses(module):
        return [module.reduce_sum(module.tanh(module.matmul(module.constant([x]), variable)))
                for x in items]

    with tf.GradientTape(persistent=True) as tape:
        got = losses(tf)
    with tensorflow.GradientTape(persistent=True) as eager_tape:
        expected = losses(tensorflow)
    for loss, eager_loss in zip(got, expected):
        np.testing.assert_allclose(tape.gradient(loss, variable).numpy(),
                                   eager_tape.gradient(eager_loss, variable).numpy(),
                                   rtol=1e-5)
    # Recorded after the block: off the tape, as eagerly.
    assert tape.gradient(tf.reduce_sum(variable * 2.0), variable) is None

