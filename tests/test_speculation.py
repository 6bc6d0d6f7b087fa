"""A training program's backward, queued right behind its forward
(batcher/program.py, ``Speculation``): ``tape.gradient(loss, variables)``
takes the gradients it computed only where they are what TensorFlow's tape
gives; everywhere else TensorFlow's tape differentiates, and every case
gives eager TensorFlow's values and gradient types."""

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from experiments.example_models import MODELS
from gradients import assert_gradient_equal
from test_patterns import assert_matches_eager
from test_programs import compiled  # noqa: F401 (a fixture)


def _loss(module, model, examples):
    loss = module.add_n([model.loss(module, e) for e in examples]) / len(examples)
    return module.build(loss) if hasattr(module, "build") else loss


def _model(rng):
    """The Tree-LSTM, its patterns collected and its program compiled."""
    model = MODELS["tree_lstm"](rng)
    assert_matches_eager(model, model.random_examples(rng, 3))
    tf.reset_stats()
    return model


def _assert_all_equal(got, expected):
    for lazy, eager in zip(got, expected, strict=True):
        assert_gradient_equal(lazy, eager)


def _eager_and_lazy(model, examples, differentiate, **tape_options):
    """``differentiate(module, tape, loss)`` after each module's tape
    recorded the minibatch's loss: (eager's result, subgraphjit's)."""
    results = []
    for module in (tensorflow, tf):
        with module.GradientTape(**tape_options) as tape:
            loss = _loss(module, model, examples)
        results.append(differentiate(module, tape, loss))
    return results


@pytest.mark.parametrize("case", ["persistent, twice", "a subset", "output gradients",
                                  "unconnected zero", "a variable not read",
                                  "a tensor source"])
def test_other_gradient_calls_equal_eager(case, compiled):  # noqa: F811
    rng = np.random.default_rng(3)
    model = _model(rng)
    examples = model.random_examples(rng, 3)
    spare = tensorflow.Variable(np.ones(2, np.float32))
    variables = model.variables

    def differentiate(module, tape, loss):
        if case == "persistent, twice":
            return (tape.gradient(loss, variables) + tape.gradient(loss, variables[::-1]))
        if case == "a subset":
            return tape.gradient(loss, variables[1:3])
        if case == "output gradients":
            return tape.gradient(loss, variables, output_gradients=tensorflow.constant(3.0))
        if case == "unconnected zero":
            return tape.gradient(loss, variables + [spare],
                                 unconnected_gradients=tensorflow.UnconnectedGradients.ZERO)
        if case == "a variable not read":
            return tape.gradient(loss, variables + [spare])
        return tape.gradient(loss, variables + [loss])

    expected, got = _eager_and_lazy(model, examples, differentiate,
                                    persistent=case == "persistent, twice")
    _assert_all_equal(got, expected)
    if case != "persistent, twice":   # (a persistent tape's program may run step by step)
        taken = case in ("a subset", "a variable not read")
        assert tf.stats()["speculations_used"] == taken


@pytest.mark.parametrize("where", ["a function of the loss", "inside the block"])
def test_a_gradient_the_speculation_does_not_answer_comes_from_the_tape(
        compiled, where):  # noqa: F811
    """The loss used by TensorFlow's own ops inside the tape (the target is
    no longer the result the backward ran for), or the gradient asked
    inside the tape's block (a tape that records could record the
    backward): TensorFlow's tape gives eager's."""
    rng = np.random.default_rng(4)
    model = _model(rng)
    examples = model.random_examples(rng, 3)
    results = []
    for module in (tensorflow, tf):
        with module.GradientTape() as tape:
            loss = _loss(module, model, examples)
            if where == "inside the block":
                results.append(tape.gradient(loss, model.variables))
            else:
                scaled = tensorflow.square(loss) * 2.0
        if where != "inside the block":
            results.append(tape.gradient(scaled, model.variables))
    _assert_all_equal(results[1], results[0])
    assert tf.stats()["speculations_used"] == 0


def test_watched_variables_only(compiled):  # noqa: F811
    """A tape that watches only what it is told: the rest get None."""
    rng = np.random.default_rng(5)
    model = _model(rng)
    examples = model.random_examples(rng, 3)

    def differentiate(module, tape, loss):
        return tape.gradient(loss, model.variables)

    results = []
    for module in (tensorflow, tf):
        with module.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(model.variables[1])
            loss = _loss(module, model, examples)
        results.append(differentiate(module, tape, loss))
    _assert_all_equal(results[1], results[0])
    assert sum(gradient is not None for gradient in results[1]) == 1
    assert tf.stats()["speculations_used"] == 1


def test_a_non_persistent_tape_gives_one_set_of_gradients(compiled):  # noqa: F811
    rng = np.random.default_rng(6)
    model = _model(rng)
    with tf.GradientTape() as tape:
        loss = _loss(tf, model, model.random_examples(rng, 3))
    tape.gradient(loss, model.variables)
    assert tf.stats()["speculations_used"] == 1
    with pytest.raises(RuntimeError, match="non-persistent"):
        tape.gradient(loss, model.variables)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_gradient_while_another_tape_records_is_refused_clearly(compiled,  # noqa: F811
                                                                 persistent):
    """Under an outer tape (or inside a persistent tape's block) the tapes
    would record the compiled backward to differentiate it again, which
    TensorFlow cannot: a clear error, not one from deep in TensorFlow."""
    rng = np.random.default_rng(10)
    model = _model(rng)
    examples = model.random_examples(rng, 3)
    assert_matches_eager(model, examples)   # (its program compiled, traced)
    with pytest.raises(RuntimeError, match="while a tape records"):
        with tensorflow.GradientTape():
            with tf.GradientTape(persistent=persistent) as tape:
                loss = _loss(tf, model, examples)
            tape.gradient(loss, model.variables)


def test_speculation_pauses_after_a_backward_nobody_took(compiled):  # noqa: F811
    rng = np.random.default_rng(9)
    model = _model(rng)

    def step(take):
        with tf.GradientTape() as tape:
            loss = _loss(tf, model, model.random_examples(rng, 3))
        if take:
            tape.gradient(loss, model.variables)
        return tf.stats()["backwards_speculated"]

    assert step(take=False) == 1   # not taken:
    assert step(take=True) == 1    # the next evaluation does not speculate;
    assert step(take=False) == 2   # the one after does, not taken again:
    assert step(take=True) == 2    # two do not,
    assert step(take=True) == 2
    assert step(take=True) == 3    # the next does, taken,
    assert step(take=True) == 4    # and so does the one after


def test_a_failing_training_program_names_the_users_line(compiled):  # noqa: F811
    """The forward and its backward are queued; a bad index fails there,
    the evaluation runs anew step by step and its error names the line,
    and the thread's later ops run as usual."""
    table = tensorflow.Variable(np.ones((3, 2), np.float32))

    def step(last):
        with tf.GradientTape() as tape:
            indices = [tf.identity([index]) for index in (0, 1, last)]
            lookups = [tf.reduce_sum(tf.gather(table, i)) for i in indices]
            loss = tf.build(tf.add_n(lookups))
        return tape.gradient(loss, [table])[0]

    step(2)   # compiled
    line = step.__code__.co_firstlineno + 3
    with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
        step(7)
    assert any(f"{__file__}:{line}" in note for note in raised.value.__notes__)
    assert_gradient_equal(step(1), tensorflow.IndexedSlices(
        tensorflow.ones((3, 2)), tensorflow.constant([0, 1, 1]), tensorflow.constant([3, 2])))
