"""Frequent-subgraph patterns: found, compiled and substituted, they give
eager TensorFlow's losses and gradients, never merge different subgraphs and
never compute a node twice."""

import gc
import itertools
import linecache

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit.patterns import search, signature as signatures
from subgraphjit.ir.table import ENTRIES_BY_NAME
from subgraphjit.evaluate import unevaluated_ancestors
from experiments.example_models import CONTROL_FLOW_MODELS, MODELS
from gradients import assert_loss_and_gradients_equal
from test_batching import minibatch_loss_and_gradients


def assert_matches_eager(model, examples):
    expected_loss, expected_gradients = minibatch_loss_and_gradients(
        tensorflow, model, examples)
    loss, gradients = minibatch_loss_and_gradients(tf, model, examples)
    assert_loss_and_gradients_equal((loss, gradients), (expected_loss, expected_gradients))


@pytest.mark.parametrize("level", signatures.LEVELS)
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_patterns_give_eager_results_at_every_depth(model_name, level, parameters):
    """Acceptance: every example model, every equivalence level, depth 1-10
    (collect on one minibatch, then replace in another)."""
    replaced_somewhere = False
    for depth in range(1, 11):
        parameters(granularity="subgraph", collect=1, equivalence=level,
                   depth=depth, scheduler="agenda")
        rng = np.random.default_rng(depth)
        model = MODELS[model_name](rng)
        assert_matches_eager(model, model.random_examples(rng, 4))   # collect
        tf.reset_stats()
        assert_matches_eager(model, model.random_examples(rng, 4))   # replace
        replaced_somewhere |= tf.stats()["pattern_matches"] > 0
    assert replaced_somewhere


@pytest.mark.parametrize("scheduler,layout", [
    ("none", "none"), ("depth", "none"), ("fsm", "none"), ("agenda", "pq"),
    ("fsm", "pq")])
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_patterns_under_every_scheduler(model_name, scheduler, layout, parameters):
    """Patterns as batched units under the other schedulers ('none': each
    replaced node runs its compiled pattern on its own) and row layouts."""
    parameters(granularity="subgraph", collect=1, scheduler=scheduler,
               layout=layout)
    rng = np.random.default_rng(1)
    model = MODELS[model_name](rng)
    assert_matches_eager(model, model.random_examples(rng, 4))
    tf.reset_stats()
    assert_matches_eager(model, model.random_examples(rng, 4))
    assert tf.stats()["pattern_matches"] > 0


def test_colliding_hashes_never_share_code(parameters, monkeypatch):
    """Every digest equal: the structural keys alone keep patterns apart."""
    monkeypatch.setattr(signatures, "digest_of", lambda text: 7)
    parameters(granularity="subgraph", collect=1)
    for model_name in ("tree_lstm", "mv_rnn"):
        tf.reset_patterns()
        rng = np.random.default_rng(2)
        model = MODELS[model_name](rng)
        assert_matches_eager(model, model.random_examples(rng, 4))
        tf.reset_stats()
        assert_matches_eager(model, model.random_examples(rng, 4))
        assert len(tf.patterns()) > 1
        assert tf.stats()["pattern_matches"] > 0


def leaf(*shape):
    return tf.identity(np.ones(shape, np.float32))


def test_a_shared_edge_names_which_node_it_shares():
    """add(mul(tanh a, tanh b), tanh a) and add(mul(tanh a, tanh b), tanh b):
    the shared node is equal in structure, not the same node."""
    signer = signatures.Signer()

    def graph(second):
        a, b = tf.tanh(leaf(1, 3)), tf.tanh(leaf(1, 3))
        return tf.add(a * b, a if not second else b)

    assert signer.walk(graph(False), 4).signature != signer.walk(graph(True), 4).signature
    assert signer.walk(graph(False), 4).signature == signer.walk(graph(False), 4).signature


def collect_and_replace(parameters, make_graph, **settings):
    """Collect on one evaluation of ``make_graph()``, replace in a second;
    returns the second graph's outputs (evaluated) and the patterns."""
    parameters(granularity="subgraph", collect=1, **settings)
    tf.build(make_graph())
    outputs = make_graph()
    tf.build(outputs)
    return outputs, tf.patterns()


def test_generated_code_names_a_node_reached_twice_once(parameters):
    """Thesis figure 5.2: the tanh read by both products is one argument.
    (It has two consumers, so by section 5.5 it is an input, not inside.)"""
    rng = np.random.default_rng(0)
    x_value, c_value = rng.standard_normal((2, 1, 3)).astype(np.float32)

    def diamond():
        x, c = tf.identity(x_value), tf.identity(c_value)
        shared = tf.tanh(x)
        return [(c * shared) + (shared * c)]

    (root,), patterns = collect_and_replace(parameters, diamond, depth=3)
    expected = (c_value * np.tanh(x_value)) * 2
    np.testing.assert_allclose(root.numpy(), expected, rtol=1e-6)
    (pattern,) = patterns
    assert pattern.arguments == ["v_0_0", "v_0_1"]  # c and the tanh, once each
    assert "v_1 = operator.mul(v_0_1, v_0_0)" in pattern.source
    assert pattern.op_count == 3 and pattern.matches == 1
    assert "def pattern_" in str(pattern) and "3 ops" in str(pattern)
    # The source is registered, so tracebacks show its lines.
    filename = f"<subgraphjit {pattern.function_name}>"
    assert linecache.getline(filename, 1).startswith(f"def {pattern.function_name}(")


def test_a_node_used_outside_is_never_inside_a_pattern(parameters):
    """Thesis section 5.5: ``inner`` has two consumers, so it is an input of
    the pattern (once), computed outside it, never inside."""
    rng = np.random.default_rng(0)
    value = rng.standard_normal((1, 3)).astype(np.float32)

    def graph():
        inner = tf.exp(tf.identity(value))
        return [tf.sigmoid(tf.tanh(inner)) + inner * 2.0]

    (top,), patterns = collect_and_replace(parameters, graph, depth=4)
    (pattern,) = patterns
    assert pattern.op_count == 4 and pattern.arguments == ["v_0_0_0"]
    assert "exp" not in pattern.source
    np.testing.assert_allclose(
        top.numpy(), 1 / (1 + np.exp(-np.tanh(np.exp(value)))) + np.exp(value) * 2,
        rtol=1e-6)


def test_a_swallowed_node_is_computed_when_asked_for(parameters):
    """Inside a batching scope only the roots are needed; a node inside a
    replaced pattern keeps its inputs and is computed if the user asks."""
    rng = np.random.default_rng(0)
    value = rng.standard_normal((1, 3)).astype(np.float32)
    parameters(granularity="subgraph", collect=1, depth=3)
    for _ in range(2):
        with tf.batching():
            inner = tf.tanh(tf.identity(value))
            top = tf.sigmoid(inner * 3.0)
    assert tf.stats()["pattern_matches"] >= 1 and not inner.evaluated
    np.testing.assert_allclose(inner.numpy(), np.tanh(value), rtol=1e-6)
    np.testing.assert_allclose(top.numpy(), 1 / (1 + np.exp(-3 * np.tanh(value))),
                               rtol=1e-6)


def test_an_access_node_read_by_others_takes_its_output_when_asked_for(parameters):
    """The search leaves an access node that other nodes read out of their
    evaluation (they read the output from the multi-output op); asked for
    later, in the tape, it takes that output: eager's values and
    gradients."""
    rng = np.random.default_rng(0)
    weight_value = rng.standard_normal((3, 4)).astype(np.float32)
    inputs = rng.standard_normal((3, 1, 3)).astype(np.float32)

    def loss_of(module, weight, kept):
        losses = []
        for x in inputs:
            a, b = module.split(module.matmul(x, weight), 2, axis=1)
            # (``a`` read twice: never inside a pattern, only its input.)
            h = module.sigmoid(a) * module.tanh(b) + a
            kept.append(a)
            losses.append(module.reduce_sum(module.exp(h)))
        return module.add_n(losses)

    eager_weight = tensorflow.Variable(weight_value)
    with tensorflow.GradientTape() as tape:
        eager_kept = []
        expected = loss_of(tensorflow, eager_weight, eager_kept) + \
            tensorflow.reduce_sum(eager_kept[1] * 2.0)
    expected_gradient = tape.gradient(expected, eager_weight)

    parameters(granularity="subgraph", collect=1, depth=3)
    weight = tf.Variable(weight_value)
    for collecting in (True, False):
        kept = []
        with tf.GradientTape() as tape:
            loss = loss_of(tf, weight, kept)
            tf.build(loss)
            if not collecting:   # left out: not computed, its op was
                assert kept[1].swallowed and not kept[1].evaluated
                assert kept[1].inputs[0].evaluated
            total = loss + tf.reduce_sum(kept[1] * 2.0)
        gradient = tape.gradient(total, weight)
    assert tf.stats()["pattern_matches"] > 0
    np.testing.assert_allclose(kept[1].numpy(), eager_kept[1].numpy(), rtol=1e-6)
    np.testing.assert_allclose(float(total), float(expected), rtol=1e-6)
    assert_loss_and_gradients_equal((total, [gradient]), (expected, [expected_gradient]))


def test_new_batch_sizes_do_not_retrace(parameters):
    parameters(granularity="subgraph", collect=1, depth=3)
    weight = tensorflow.Variable(np.eye(3, dtype=np.float32))

    def instances(count):
        return [tf.sigmoid(tf.matmul(tf.identity(np.full((1, 3), i, np.float32)),
                                     weight)) * 2.0 for i in range(count)]

    tf.build(instances(2))
    tf.reset_stats()
    for count in (3, 5, 8, 13):
        results = tf.build(instances(count))
        np.testing.assert_allclose(
            results[-1].numpy(), 2 / (1 + np.exp(-np.full((1, 3), count - 1.0))),
            rtol=1e-6)
    stats = tf.stats()
    assert stats["pattern_matches"] == 3 + 5 + 8 + 13
    assert stats["pattern_traces"] == 1  # the batched function, traced once


def test_statistics_collect_then_replace(parameters):
    parameters(granularity="subgraph", collect=2, freq=1)
    rng = np.random.default_rng(0)
    model = MODELS["tree_gru"](rng)
    for _ in range(2):
        assert_matches_eager(model, model.random_examples(rng, 3))
        assert tf.patterns() == [] or _ == 1
    assert tf.patterns()
    tf.reset_stats()
    assert_matches_eager(model, model.random_examples(rng, 3))
    stats = tf.stats()
    assert stats["pattern_matches"] > 0 and stats["search_seconds"] > 0
    frequent = [p for p in tf.patterns() if "_then_" not in p.function_name]
    assert stats["patterns"] == len(frequent)


def test_replacement_keeps_its_labels_and_candidates_between_evaluations(parameters):
    """Each evaluation's search reads the label caches and match candidates
    the last one filled (and still gives eager's results); a reset, which
    forgets the patterns, forgets them too."""
    parameters(granularity="subgraph", collect=1, freq=1)
    rng = np.random.default_rng(0)
    model = MODELS["tree_lstm"](rng)
    assert_matches_eager(model, model.random_examples(rng, 3))   # collects
    assert_matches_eager(model, model.random_examples(rng, 3))   # replaces
    labels, candidates = search.SEARCH.label_caches, search.SEARCH.candidates
    assert all(labels) and candidates is not None
    tf.reset_stats()
    assert_matches_eager(model, model.random_examples(rng, 3))
    assert tf.stats()["pattern_matches"] > 0
    assert search.SEARCH.label_caches is labels
    assert search.SEARCH.candidates is candidates
    tf.reset_patterns()
    assert not any(search.SEARCH.label_caches) and search.SEARCH.candidates is None


def test_a_subgraph_seen_once_per_evaluation_is_no_pattern(parameters):
    """The minibatch's sum of losses, a training evaluation's one root, occurs
    once per evaluation: nothing to batch it with, so no pattern, while the
    cells, seen many times, are."""
    parameters(granularity="subgraph", collect=2, freq=1)
    rng = np.random.default_rng(2)
    model = MODELS["tree_gru"](rng)
    for _ in range(3):
        assert_matches_eager(model, model.random_examples(rng, 3))
    assert tf.patterns()
    for pattern in tf.patterns():
        assert "add_n" not in pattern.source, pattern.source


def test_collection_ends_early_once_it_has_seen_enough_nodes(parameters, monkeypatch):
    """``collect`` minibatches, or fewer once they hold
    ``search.COLLECT_NODES`` nodes: a large first minibatch alone."""
    parameters(granularity="subgraph", collect=3, freq=1)
    rng = np.random.default_rng(1)
    model = MODELS["tree_gru"](rng)
    monkeypatch.setattr(search, "COLLECT_NODES", 10 ** 9)
    assert_matches_eager(model, model.random_examples(rng, 3))
    assert tf.patterns() == []   # one of three minibatches
    tf.reset_patterns()
    monkeypatch.setattr(search, "COLLECT_NODES", 20)
    assert_matches_eager(model, model.random_examples(rng, 3))
    assert tf.patterns()         # its nodes were enough
    assert_matches_eager(model, model.random_examples(rng, 3))
    assert tf.stats()["pattern_matches"] > 0


@pytest.mark.parametrize("training", [False, True])
def test_collection_walks_part_of_a_large_minibatch(parameters, monkeypatch, training):
    """Past ``search.COLLECT_NODES`` nodes walked, collection stops within
    the minibatch, between two instances' subgraphs, and counts as inputs
    only the roots it walked (in training, the minibatch is one input, as
    its loss is one root).  The counts are those of a walk of the same
    instances alone, and the patterns found give eager's results."""
    parameters(granularity="subgraph", collect=3, freq=1)
    rng = np.random.default_rng(2)
    model = MODELS["tree_lstm"](rng)
    examples = model.random_examples(rng, 12)

    def collect(examples, budget):
        tf.reset_patterns()
        monkeypatch.setattr(search, "COLLECT_NODES", budget)
        if training:
            with tf.GradientTape():
                tf.build(tf.add_n([model.loss(tf, example) for example in examples]))
        else:
            with tf.batching():   # (a scope evaluates what is still referenced)
                losses = [model.loss(tf, example) for example in examples]
            assert all(loss.evaluated for loss in losses)
        return search.SEARCH

    whole = collect(examples, 10 ** 9)
    assert whole.inputs == (1 if training else 12) and tf.patterns() == []
    total = whole.nodes
    part = collect(examples, total // 3)
    assert tf.patterns()   # collection ended: enough nodes
    assert total // 3 <= part.nodes < total
    if training:
        assert part.inputs == 1
    else:
        assert 1 <= part.inputs < 12
        # The same counts as a walk of the instances it walked, alone.
        counts, inputs = part.counts.copy(), part.inputs
        alone = collect(examples[:inputs], 10 ** 9)
        assert alone.counts == counts
        collect(examples, total // 3)
    assert_matches_eager(model, model.random_examples(rng, 4))
    assert tf.stats()["pattern_matches"] > 0


@pytest.mark.parametrize("level", signatures.LEVELS)
def test_matching_agrees_with_signatures(level):
    """``Signer.match`` (fast, top-down) finds a template exactly where the
    signer's walk (the specification) gives the template's key."""
    rng = np.random.default_rng(5)
    for model_name in sorted(MODELS):
        model = MODELS[model_name](rng)
        with tf.batching():
            roots = [model.loss(tf, example) for example in model.random_examples(rng, 2)]
            # (As the search: a node with a NumPy operand, such as a Keras
            # layer's, roots no pattern.)
            nodes = [node for node in unevaluated_ancestors(roots)
                     if node.entry.name != "access"
                     and not signatures.has_value_operand(node)]
            for depth in (1, 2, 4, 8):
                signer = signatures.Signer(level, for_patterns=True)
                walks = [signer.walk(node, depth) for node in nodes]
                # (A node of no inputs, such as tf.zeros, is an input of any
                # walk; collection keeps walks of two ops or more.)
                keys = list({walk.signature.key: walk.signature
                             for node, walk in zip(nodes, walks) if node.inputs}.items())
                for key, signature in keys[:6]:
                    template = signatures.Template(key, ENTRIES_BY_NAME, signature)
                    for node, walk in zip(nodes, walks):
                        found = signer.match(node, depth, template)
                        assert (found is not None) == (walk.signature.key == key)
                        if found is not None:
                            assert [id(x) for x in found.inputs] == [id(x) for x in walk.inputs]
                            assert found.nodes == walk.nodes


@pytest.mark.parametrize("scheduler", ["none", "agenda"])
def test_slicing_inside_a_pattern(parameters, scheduler):
    """A slice is an attribute of its op: the generated code must keep it."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal((3, 2, 4)).astype(np.float32)

    def graph():
        return [tf.sigmoid(tf.identity(value)[:, 1:]) * 2.0 for value in values]

    outputs, patterns = collect_and_replace(parameters, graph, depth=3,
                                            scheduler=scheduler)
    assert any("[(slice(None, None, None), slice(1, None, None))]" in pattern.source
               for pattern in patterns)
    for output, value in zip(outputs, values):
        np.testing.assert_allclose(output.numpy(), 2 / (1 + np.exp(-value[:, 1:])),
                                   rtol=1e-6)
    assert sum(pattern.matches for pattern in patterns) >= 3


def test_a_pattern_without_a_batch_rule_runs_per_instance(parameters):
    """A pattern holding an op with no batch rule (tf.math.cumsum, outside
    the table, recorded through dispatch) cannot run as one batched call:
    each instance runs the compiled pattern on its own, with the right
    values, and the statistics name the reason."""
    parameters(granularity="subgraph", collect=1, depth=3, scheduler="agenda")
    weight = tensorflow.Variable(np.arange(9, dtype=np.float32).reshape(3, 3) / 10)
    values = np.random.default_rng(0).standard_normal((4, 1, 3)).astype(np.float32)

    def instances():
        return [tf.tanh(tensorflow.math.cumsum(tf.matmul(tf.identity(value), weight),
                                               axis=1)) * 2.0
                for value in values]

    tf.build(instances())
    tf.reset_stats()
    results = tf.build(instances())
    for result, value in zip(results, values):
        np.testing.assert_allclose(
            result.numpy(), 2 * np.tanh(np.cumsum(value @ weight.numpy(), axis=1)),
            rtol=1e-5)
    stats = tf.stats()
    assert stats["pattern_matches"] == len(values)
    assert any(reason.startswith("pattern.") and "cumsum has no batch rule" in reason
               for reason in stats["unbatched"]), stats["unbatched"]


@pytest.fixture
def auto_trial(parameters, monkeypatch):
    """``auto`` granularity, patterns after one minibatch, programs compiled
    at their second sighting, and the trial's clock the test's: a one-item
    list whose value the test advances.  Every scope recorded: the tests
    count the trial's units, and a line's eager turn (eager_scopes.py,
    which minibatches of three trees can take: a few nodes a launch) would
    count as one."""
    parameters(granularity="auto", collect=1, compile=2, eager_scopes=False)
    now = [0.0]
    monkeypatch.setattr(search.Trial, "clock", staticmethod(lambda: now[0]))
    # (A full collection in a timed turn has it timed again: the collector
    # waits, so that the tests' turns are the ones they count.)
    collector_was_on = gc.isenabled()
    gc.disable()
    yield now
    if collector_was_on:
        gc.enable()


@pytest.mark.parametrize("faster", ["op", "subgraph"])
def test_auto_granularity_times_both_units_and_keeps_the_faster(auto_trial, faster):
    """``auto`` collects, runs each unit until its program is compiled,
    times it, and keeps the unit with the fewer seconds per node; every
    minibatch, on trial or after, equals eager TensorFlow.  The clock is
    the test's: each minibatch costs what the test says its unit costs."""
    now = auto_trial
    rng = np.random.default_rng(21)
    model = MODELS["tree_lstm"](rng)
    units = []
    for _ in range(20):
        matched = tf.stats()["pattern_matches"]
        assert_matches_eager(model, model.random_examples(rng, 3))
        unit = "subgraph" if tf.stats()["pattern_matches"] > matched else "op"
        units.append(unit)
        now[0] += 1.0 if unit == faster else 3.0
    stats = tf.stats()
    assert stats["granularity_chosen"] == {"training": faster}   # no inference yet
    slower = ({"op", "subgraph"} - {faster}).pop()
    trial = stats["granularity_trial"]["training"]
    assert trial[faster] < trial[slower]
    # Both tried (patterns collected at the first), then the choice kept.
    assert units[0] == "op" and "subgraph" in units
    assert units[-4:] == [faster] * 4
    assert stats["programs_compiled"] >= 2


def test_a_maps_rounds_are_one_turn_of_the_granularity_trial(auto_trial, monkeypatch):
    """Under ``auto``, the rounds of one ``tf.batching.map`` and the close
    of its scope take the unit of its first round, which the trial chose
    and times until the next scope: the trial is asked once per minibatch,
    however many rounds its map has; each map equals eager TensorFlow."""
    now = auto_trial
    asked = []
    choose = search.Trial.unit

    def unit(self, nodes, compile_after, clock):
        asked.append(self.mode)
        return choose(self, nodes, compile_after, clock)
    monkeypatch.setattr(search.Trial, "unit", unit)
    rng = np.random.default_rng(5)
    model = CONTROL_FLOW_MODELS["adaptive_computation"](rng)
    per_map = []
    for _ in range(8):
        examples = model.random_examples(rng, 3)
        before, rounds = len(asked), tf.stats()["concurrent_rounds"]
        with tf.batching():
            losses = tf.batching.map(lambda example: model.loss(tf, example), examples)
        np.testing.assert_allclose([np.asarray(loss) for loss in losses],
                                   [model.loss(tensorflow, example).numpy()
                                    for example in examples], rtol=1e-5, atol=1e-6)
        per_map.append((len(asked) - before, tf.stats()["concurrent_rounds"] - rounds))
        now[0] += 1.0
    # (The first map collects the patterns in its first round.)
    assert all(rounds > 1 for _, rounds in per_map)
    assert all(asked_in_minibatch == 1 for asked_in_minibatch, _ in per_map[1:]), per_map
    assert set(asked) == {"inference"}


@pytest.mark.parametrize("one_off", [False, True])
def test_auto_granularity_settles_a_unit_whose_program_is_refused(parameters,
                                                                  monkeypatch, one_off):
    """A unit whose programs cannot compile (here: every program has too
    many kinds) has settled after its first evaluation, not after
    2 x compile + 1; and that evaluation, which ran step by step as the
    unit's turns will, is the unit's first timed turn, unless it did
    one-off work.  The choice is made as the evaluation after 1 (collect)
    + 1 + 1 + the timed turns left starts."""
    from subgraphjit.batcher import program
    parameters(granularity="auto", collect=1, compile=4)
    monkeypatch.setattr(program, "MAX_KINDS", 0)
    monkeypatch.setattr(search.Trial, "SEPARATED", float("inf"))   # every turn
    monkeypatch.setattr(search.Trial, "FAR", float("inf"))
    monkeypatch.setattr(search.Trial, "RETIMES", 0)   # (new shapes trace patterns)
    work = itertools.count()
    monkeypatch.setattr(search, "one_off_work", lambda: next(work) if one_off else 0)
    tf.reset_stats()
    rng = np.random.default_rng(23)
    model = MODELS["tree_lstm"](rng)
    turns_taken = 0 if one_off else len(search.Trial.UNITS)
    evaluations = (1 + len(search.Trial.UNITS) + len(search.Trial.TIMED)
                   - turns_taken + 1)
    for _ in range(evaluations - 1):
        assert_matches_eager(model, model.random_examples(rng, 3))
    assert "training" not in tf.stats()["granularity_chosen"]
    assert_matches_eager(model, model.random_examples(rng, 3))
    assert "training" in tf.stats()["granularity_chosen"]
    assert tf.stats()["programs_compiled"] == 0


def timed_units(now, seed, per_node):
    """Training minibatches until the trial chooses; each timed evaluation
    costs ``per_node(unit, units timed so far)`` seconds per node on the
    test's clock.  Returns the units timed, in order."""
    rng = np.random.default_rng(seed)
    model = MODELS["tree_lstm"](rng)
    timed = []
    while "training" not in tf.stats()["granularity_chosen"]:
        assert len(timed) < 40
        assert_matches_eager(model, model.random_examples(rng, 3))
        # (unit, start, nodes, work, settling)
        timing = search.SEARCH.trials["training"].timing
        if timing is not None and not timing[4]:
            timed.append(timing[0])
            now[0] += timing[2] * per_node(timing[0], timed)
    return timed


@pytest.mark.parametrize("ratio,turns", [(1.2, len(search.Trial.TIMED)), (1.5, 4),
                                         (2.5, 4), (4.0, 2)])
def test_auto_granularity_ends_its_turns_early_once_the_times_are_apart(
        auto_trial, ratio, turns):
    """One turn each, one unit ``FAR`` times below the other, decide; or
    two turns each, every time of one unit ``SEPARATED`` times below every
    time of the other; closer times take every turn."""
    # Patterns ``ratio`` times cheaper than ops.
    timed = timed_units(auto_trial, 24,
                        lambda unit, _: 1.0 if unit == "subgraph" else ratio)
    assert len(timed) == turns
    assert tf.stats()["granularity_chosen"]["training"] == "subgraph"


def test_a_timed_evaluation_that_traced_is_timed_again(auto_trial):
    """An evaluation that traced a pattern for new shapes (one-off work)
    tells the trial nothing: its unit is timed again.  Here the first
    timed patterns evaluation "traces" and takes 100 times the ops' time
    per node; counted, it would have chosen ops at once (``FAR``)."""
    from subgraphjit.context import context

    def per_node(unit, timed):
        if unit == "subgraph" and timed.count("subgraph") == 1:
            context.pattern_traces += 1
            return 100.0
        return 1.0 if unit == "subgraph" else 4.0
    assert timed_units(auto_trial, 26, per_node) == ["op", "subgraph", "subgraph"]
    assert tf.stats()["granularity_chosen"]["training"] == "subgraph"


def test_a_timed_evaluation_with_a_full_collection_is_timed_again(monkeypatch):
    """A timed evaluation during which the cyclic collector ran a full
    collection (slow with a large heap) tells the trial nothing: its
    turn is not counted, and its unit is timed again."""
    # (A trial of its own; a new Trial forgets its mode's choice.)
    from subgraphjit.context import context
    monkeypatch.setattr(context, "granularity_chosen", {})
    monkeypatch.setattr(context, "granularity_trial", {})
    trial = search.Trial("training")
    trial.timed = 1   # (the evaluation took the first turn)
    trial.timing = ("op", 0.0, 100, search.one_off_work(), False)
    gc.collect()
    trial.stop(1.0)
    assert trial.per_node["op"] == [] and trial.retimed == 1 and trial.timed == 0
    trial.timed = 1
    trial.timing = ("op", 1.0, 100, search.one_off_work(), False)
    trial.stop(2.0)   # (no collection)
    assert trial.per_node["op"] == [0.01]


def test_one_slowed_turn_does_not_decide(auto_trial):
    """A turn slowed 2.5x (the machine, the collector) against the other
    unit's first is not ``FAR`` apart: the turns go on, and the unit that
    is faster in the others is kept."""
    def per_node(unit, timed):
        if unit == "subgraph":
            return 2.5 if timed.count("subgraph") == 1 else 0.6
        return 1.0
    assert len(timed_units(auto_trial, 27, per_node)) > 2
    assert tf.stats()["granularity_chosen"]["training"] == "subgraph"


def test_a_unit_settling_in_the_trial_compiles_its_program_at_first_sight(parameters):
    """While the trial settles the patterns unit, its program compiles at
    the first evaluation, though ``compile`` asks for four sightings
    outside the trial."""
    parameters(granularity="auto", collect=1, compile=4)
    tf.reset_stats()
    rng = np.random.default_rng(25)
    model = MODELS["tree_lstm"](rng)
    compiled = []
    for _ in range(4):   # collect; the op unit settles; then the patterns unit
        matched = tf.stats()["pattern_matches"]
        before = tf.stats()["programs_compiled"]
        assert_matches_eager(model, model.random_examples(rng, 3))
        if tf.stats()["pattern_matches"] > matched:
            compiled.append(tf.stats()["programs_compiled"] - before)
    assert compiled and compiled[0] == 1


def test_auto_granularity_chooses_for_training_and_inference_apart(auto_trial):
    """A trial per mode: training (under our tape) and inference alternate,
    each costing what the test's clock says, and each mode keeps its own
    faster unit; inference values equal eager TensorFlow's throughout."""
    now = auto_trial
    rng = np.random.default_rng(22)
    model = MODELS["tree_lstm"](rng)
    cheaper = {"training": "subgraph", "inference": "op"}
    for _ in range(20):
        for mode in ("training", "inference"):
            matched = tf.stats()["pattern_matches"]
            examples = model.random_examples(rng, 3)
            if mode == "training":
                assert_matches_eager(model, examples)
            else:
                with tf.batching():
                    losses = [model.loss(tf, example) for example in examples]
                for loss, example in zip(losses, examples):
                    np.testing.assert_allclose(float(loss), float(
                        model.loss(tensorflow, example)), rtol=1e-5)
            unit = "subgraph" if tf.stats()["pattern_matches"] > matched else "op"
            now[0] += 1.0 if unit == cheaper[mode] else 3.0
    assert tf.stats()["granularity_chosen"] == cheaper
