"""Scopes with nothing to batch run eagerly (eager_scopes.py): results,
gradients and their types stay eager TensorFlow's through the whole life of
a line's judgement, and a line whose scopes batch is never run eagerly."""

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit import eager_scopes
from subgraphjit.context import context
from subgraphjit.ir.node import VirtualNode
from experiments.example_models import MODELS
from gradients import assert_loss_and_gradients_equal

# Scopes before a line runs eagerly: watched, then the timed turns.
JUDGED = eager_scopes.WATCHED + 2 * eager_scopes.TIMED


@pytest.fixture
def eager_wins(monkeypatch):
    """The timed turns find eager faster (timings are not the test's); the
    unit is ops (with ``auto``, a line is judged once the unit is chosen:
    test_a_line_is_judged_once_the_granularity_trial_has_chosen)."""
    monkeypatch.setattr(eager_scopes, "faster", lambda eager, lazy: True)
    tf.set_parameter("granularity", "op")
    tf.reset_patterns()
    yield
    tf.set_parameter("granularity", "auto")
    tf.reset_patterns()


def test_a_line_is_judged_once_the_granularity_trial_has_chosen(monkeypatch):
    monkeypatch.setattr(eager_scopes, "faster", lambda eager, lazy: True)
    tf.reset_patterns()
    rng = np.random.default_rng(3)
    model = MODELS["attention"](rng)
    tf.reset_stats()
    eager = []
    # (How long the trial and the programs take to settle depends on what
    # earlier tests compiled: at most the compile budget's worth.)
    while len(eager) < 200 and eager[-4:] != [1] * 4:
        before = tf.stats()["scopes_run_eagerly"]
        inference(tf, model, model.random_examples(rng, 1))
        eager.append(tf.stats()["scopes_run_eagerly"] - before)
        if "inference" not in tf.stats()["granularity_chosen"]:
            assert not any(eager)
    assert eager[-4:] == [1] * 4
    tf.reset_patterns()


def inference(module, model, examples):
    with (tf.batching() if module is tf else tensorflow.GradientTape()):
        losses = [model.loss(module, example) for example in examples]
    return [float(np.asarray(loss)) for loss in losses]


def training(module, model, examples):
    with module.GradientTape() as tape:
        loss = module.add_n([model.loss(module, example) for example in examples])
    return loss, tape.gradient(loss, model.variables)


@pytest.mark.parametrize("run", [inference, training])
def test_a_line_with_nothing_to_batch_runs_eagerly_with_eagers_results(run, eager_wins):
    rng = np.random.default_rng(4)
    model = MODELS["attention"](rng)
    eager = []
    # (Lazy turns that traced or compiled are taken again: a few more.)
    for scope in range(JUDGED + 12):
        examples = model.random_examples(rng, 1)
        before = tf.stats()["scopes_run_eagerly"]
        expected, got = run(tensorflow, model, examples), run(tf, model, examples)
        eager.append(tf.stats()["scopes_run_eagerly"] - before)
        if run is inference:
            np.testing.assert_allclose(got, expected, rtol=1e-5)
        else:
            assert_loss_and_gradients_equal(got, expected)
    assert eager[:eager_scopes.WATCHED] == [0] * eager_scopes.WATCHED
    assert eager[-4:] == [1] * 4   # judged: every scope eagerly
    assert context.lazy


def test_a_probe_that_batches_records_the_line_again(eager_wins, monkeypatch):
    monkeypatch.setattr(eager_scopes, "PROBE", 2)
    rng = np.random.default_rng(5)
    weight = tensorflow.Variable(rng.standard_normal((3, 4)).astype(np.float32))

    def scope(count):
        rows = rng.standard_normal((count, 1, 3)).astype(np.float32)
        with tf.batching():
            results = [tf.tanh(tf.matmul(row, weight)) for row in rows]
        np.testing.assert_allclose([np.asarray(result) for result in results],
                                   np.tanh(rows @ weight.numpy()), rtol=1e-5)

    for _ in range(JUDGED):       # one instance: nothing to batch
        scope(1)
    tf.reset_stats()
    for _ in range(2):            # eight: eagerly, then the probe batches,
        scope(8)
    stats = tf.stats()
    assert stats["scopes_run_eagerly"] == 1 and stats["batches"] == 2
    # ... op by op, searching and compiling nothing.
    assert stats["search_seconds"] == stats["programs_compiled"] == 0
    for _ in range(2):            # then each scope batches
        scope(8)
    assert tf.stats()["scopes_run_eagerly"] == 1 and tf.stats()["batches"] == 2 * 3


def test_a_line_whose_scopes_batch_is_never_run_eagerly(eager_wins):
    rng = np.random.default_rng(6)
    model = MODELS["tree_lstm"](rng)
    tf.reset_stats()
    for _ in range(JUDGED + 2):
        inference(tf, model, model.random_examples(rng, 6))
    assert tf.stats()["scopes_run_eagerly"] == 0


def test_the_parameter_off_records_every_scope(eager_wins):
    rng = np.random.default_rng(7)
    model = MODELS["attention"](rng)
    tf.set_parameter("eager_scopes", False)
    try:
        tf.reset_stats()
        for _ in range(JUDGED + 2):
            inference(tf, model, model.random_examples(rng, 1))
        assert tf.stats()["scopes_run_eagerly"] == 0
    finally:
        tf.set_parameter("eager_scopes", True)


def test_an_error_in_an_eager_scope_leaves_recording_on(eager_wins):
    rng = np.random.default_rng(8)
    model = MODELS["attention"](rng)

    def scope(fail):
        with tf.batching():
            loss = model.loss(tf, model.random_examples(rng, 1)[0])
            if fail:
                raise KeyError("the user's")
        return float(np.asarray(loss))

    for _ in range(JUDGED):
        scope(fail=False)
    tf.reset_stats()
    with pytest.raises(KeyError, match="the user's"):
        scope(fail=True)
    assert tf.stats()["scopes_run_eagerly"] == 1
    assert context.lazy
    assert type(tf.tanh(tf.constant(1.0))) is VirtualNode


def test_turns_too_close_to_call_are_taken_again_up_to_a_limit():
    many = eager_scopes.MOST_TIMED
    assert eager_scopes.faster([1.0, 9.0, 1.0], [2.0, 2.0, 0.1]) is True
    assert eager_scopes.faster([2.0, 2.0, 2.0], [1.0, 1.0, 1.0]) is False
    assert eager_scopes.faster([1.0, 1.0, 1.0], [1.2, 1.2, 1.2]) is None
    assert eager_scopes.faster([1.0] * many, [1.2] * many) is True
    assert eager_scopes.faster([1.2] * many, [1.0] * (many + 1)) is False
