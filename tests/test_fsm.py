"""The FSM scheduler (ED-Batch section 2): valid schedules, learned policies
that reach the lower bound where ED-Batch's do, persistence, fallbacks."""

import json

import numpy as np
import pytest

import subgraphjit as tf
from subgraphjit.batcher.schedulers import SCHEDULERS, lower_bound
from subgraphjit.batcher.schedulers.structure import depths
from subgraphjit.batcher.schedulers.fsm import (
    ENCODINGS, FsmConfig, FsmPolicy, FsmScheduler, Simulation, encode, ready_names)
from subgraphjit.tools.scheduler_comparison import count_batches, recorded_graph
from experiments.example_models import MODELS


class FakeGraph:
    """The four attributes schedulers read, for hand-made dependency graphs."""

    def __init__(self, types, sources):
        names = sorted(set(types))
        self.type_names = names
        self.types = names
        self.type_of = [names.index(t) for t in types]
        self.sources = [tuple(s) for s in sources]

    def __len__(self):
        return len(self.type_of)


def figure_1_trees(rng, count):
    """ED-Batch figure 1: internal nodes (I) over a chain, an output node (O)
    per internal node and leaf, and one reduction (R) of the outputs."""
    types, sources = [], []

    def add(node_type, reads):
        types.append(node_type)
        sources.append(reads)
        return len(types) - 1

    for _ in range(count):
        outputs, previous = [], add("I", [])
        outputs.append(add("O", [previous]))
        for _ in range(int(rng.integers(1, 6))):
            previous = add("I", [previous])
            outputs.append(add("O", [previous]))
        add("R", outputs)
    return FakeGraph(types, sources)


def assert_valid(graph, batches):
    done = set()
    for batch in batches:
        assert len({graph.type_of[i] for i in batch}) == 1
        for index in batch:
            assert index not in done
            assert all(source in done for source in graph.sources[index])
        done.update(batch)
    assert done == {i for i, t in enumerate(graph.type_of) if t >= 0}


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_learned_schedules_are_valid_and_reach_the_lower_bound(encoding):
    rng = np.random.default_rng(0)
    train, test = figure_1_trees(rng, 8), figure_1_trees(rng, 8)
    policy = FsmPolicy(FsmConfig(encoding=encoding))
    report = policy.train(train, progress=False)
    assert report.batches == report.lower_bound <= report.agenda_batches
    heuristics = [scheduler() for name, scheduler in SCHEDULERS.items() if name != "fsm"]
    for scheduler in (FsmScheduler(policy), *heuristics):
        assert_valid(test, scheduler.schedule(test))
    assert count_batches(test, FsmScheduler(policy)) == lower_bound(test)


def test_fsm_beats_agenda_on_figure_1():
    graph = figure_1_trees(np.random.default_rng(1), 1)
    agenda = count_batches(graph, SCHEDULERS["agenda"]())
    policy = FsmPolicy()
    policy.train(graph, progress=False)
    assert count_batches(graph, FsmScheduler(policy)) == lower_bound(graph) < agenda


@pytest.mark.parametrize("model_name", ["tree_lstm", "tree_gru", "bilstm_tagger",
                                        "tree_lstm_2type", "lattice_lstm", "mv_rnn"])
def test_fsm_on_example_models(model_name):
    """Trained on one minibatch, scheduling another: never more batches than
    agenda; the lower bound on the models where ED-Batch reaches it."""
    rng = np.random.default_rng(2)
    model = MODELS[model_name](rng)
    graphs = [recorded_graph(lambda tf, examples=model.random_examples(rng, 16):
                             tf.add_n([model.loss(tf, e) for e in examples]))
              for _ in range(2)]
    policy = FsmPolicy(FsmConfig(max_iterations=200))
    policy.train(graphs[0], progress=False)
    scheduler = FsmScheduler(policy)
    batches = scheduler.schedule(graphs[1])
    assert_valid(graphs[1], batches)
    assert len(batches) <= count_batches(graphs[1], SCHEDULERS["agenda"]())
    if model_name in ("tree_lstm", "tree_gru", "bilstm_tagger"):
        assert len(batches) == lower_bound(graphs[1])


class StepByStepAgenda:
    """Agenda's schedule a batch at a time (``init``, then ``next_batch``
    and ``post_process`` in turn), whose ready lists the reference FSM
    schedule below picks from."""

    def init(self, graph):
        self._type_of = graph.type_of
        depth = self._depth_of_index = depths(graph)
        type_count = len(graph.types)
        self._remaining = [0] * type_count
        self._depth_sum = [0] * type_count
        self._waiting_for = {}
        self._consumers = {}
        # Ready nodes by type (public: the FSM scheduler picks from them).
        self.ready = {}
        for index, node_type in enumerate(graph.type_of):
            if node_type < 0:
                continue
            self._remaining[node_type] += 1
            self._depth_sum[node_type] += depth[index]
            needed = graph.sources[index]
            if needed:
                self._waiting_for[index] = len(needed)
                for source in needed:
                    self._consumers.setdefault(source, []).append(index)
            else:
                self.ready.setdefault(node_type, []).append(index)

    def next_batch(self):
        if not self.ready:
            return None
        chosen = min(self.ready, key=lambda node_type:
                     self._depth_sum[node_type] / self._remaining[node_type])
        return self.ready.pop(chosen)

    def post_process(self, batch):
        depth = self._depth_of_index
        for index in batch:
            node_type = self._type_of[index]
            self._remaining[node_type] -= 1
            self._depth_sum[node_type] -= depth[index]
            for consumer in self._consumers.pop(index, ()):
                self._waiting_for[consumer] -= 1
                if self._waiting_for[consumer] == 0:
                    del self._waiting_for[consumer]
                    self.ready.setdefault(self._type_of[consumer], []).append(consumer)


def reference_learned_schedule(policy, graph):
    """The FSM's schedule a decision at a time in Python (what the native
    fsm_schedule replaced, kept as its reference): agenda's ready lists,
    the type chosen by the table, else by the coarse votes, else by agenda.
    Returns (batches, decisions, coarse decisions, fallbacks)."""
    agenda = StepByStepAgenda()
    agenda.init(graph)
    ready, names = agenda.ready, graph.type_names
    batches, decisions, coarse, fallbacks = [], 0, 0, 0
    while ready:
        decisions += 1
        counts, type_of_name = ready_names(ready, names)
        name = policy.choose(encode(policy.config.encoding, counts), counts)
        if name is None:
            name = policy.choose_coarse(counts)
            coarse += name is not None
        if name is None:
            fallbacks += 1
            batch = agenda.next_batch()
        else:
            batch = ready.pop(type_of_name[name])
        agenda.post_process(batch)
        batches.append(batch)
    return batches, decisions, coarse, fallbacks


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("model_name", ["tree_lstm_2type", "lattice_lstm", "bilstm_tagger"])
def test_native_fsm_schedule_equals_the_python_one(model_name, encoding):
    """The C schedule (native/analysis.c, fsm_schedule) against the Python
    it replaced: the same batches, decisions, coarse decisions and
    fallbacks, on a graph the policy learned from, on another minibatch
    (unseen states: coarse votes and agenda), and with a table whose
    values tie (the larger name wins, as max over (value, name))."""
    rng = np.random.default_rng(8)
    model = MODELS[model_name](rng)
    graphs = [recorded_graph(lambda tf, examples=model.random_examples(rng, count):
                             tf.add_n([model.loss(tf, e) for e in examples]))
              for count in (12, 20)]
    policy = FsmPolicy(FsmConfig(encoding=encoding, max_iterations=30))
    policy.train(graphs[0], progress=False)
    tied = FsmPolicy(FsmConfig(encoding=encoding))
    tied.table = {state: dict.fromkeys(values, 1.0) for state, values in policy.table.items()}
    tied.coarse = {state: dict.fromkeys(votes, 2) for state, votes in policy.coarse.items()}
    outcomes = set()
    for trained in (policy, tied):
        for graph in graphs:
            scheduler = FsmScheduler(trained)
            expected = reference_learned_schedule(trained, graph)
            batches = scheduler._learned_schedule(graph)
            assert (batches, scheduler.decisions, scheduler.coarse_decisions,
                    scheduler.fallbacks) == expected
            outcomes.add((scheduler.coarse_decisions > 0, scheduler.fallbacks > 0))
    assert len(outcomes) > 1   # (not every schedule went one way)


def test_training_starts_from_the_better_heuristic():
    """On a lattice the critical-path rule needs fewer batches than Lemma
    2.1's share rule; on trees of two internal types, more.  Learning starts
    from the better of the two, and the learned schedule is valid."""
    rng = np.random.default_rng(6)
    for model_name, better in (("lattice_lstm", "critical path"),
                               ("tree_lstm_2type", "share")):
        model = MODELS[model_name](rng)
        graph = recorded_graph(lambda tf, examples=model.random_examples(rng, 16):
                               tf.add_n([model.loss(tf, e) for e in examples]))
        simulation = Simulation(graph)
        counts = {name: simulation.heuristic_batches(choose) for name, choose in
                  (("share", simulation.share_choice),
                   ("critical path", simulation.critical_path_choice))}
        assert counts[better] < max(counts.values()), (model_name, counts)
        policy = FsmPolicy(FsmConfig(max_iterations=0))
        report = policy.train(graph, progress=False)
        assert report.heuristic == better
        batches = FsmScheduler(policy).schedule(graph)
        assert_valid(graph, batches)
        assert len(batches) == report.batches
        assert len(batches) <= count_batches(graph, SCHEDULERS["agenda"]())


def test_save_and_load_skip_training(tmp_path):
    rng = np.random.default_rng(3)
    graph = figure_1_trees(rng, 6)
    policy = FsmPolicy()
    policy.train(graph, progress=False)
    path = tmp_path / "table.json"
    policy.save(path)
    loaded = FsmPolicy.load(path, "sort")
    assert not loaded.needs_training
    assert FsmScheduler(loaded).schedule(graph) == FsmScheduler(policy).schedule(graph)
    with pytest.raises(ValueError, match="'sort' state encoding, not 'max'"):
        FsmPolicy.load(path, "max")
    (tmp_path / "junk.json").write_text(json.dumps({"table": 3}))
    with pytest.raises(ValueError, match="not a saved FSM policy"):
        FsmPolicy.load(tmp_path / "junk.json")


def test_unseen_states_fall_back_to_agenda_and_ask_for_retraining():
    rng = np.random.default_rng(4)
    policy = FsmPolicy()
    policy.train(figure_1_trees(rng, 3), progress=False)
    # Another model entirely: chains of a type the policy never saw.
    chains = FakeGraph(["X", "Y"] * 4, [[], [0], [1], [2], [], [4], [5], [6]])
    scheduler = FsmScheduler(policy)
    batches = scheduler.schedule(chains)
    assert_valid(chains, batches)
    assert scheduler.fallbacks == scheduler.decisions == len(batches)
    assert policy.needs_training


def test_states_encode_the_frontier():
    counts = {"b": 1, "a": 3, "c": 3}
    assert encode("base", counts) == ("a", "b", "c")
    assert encode("max", counts) == (("a", "b", "c"), "a")
    assert encode("sort", counts) == ("a", "c", "b")
    with pytest.raises(ValueError, match="encoding"):
        FsmConfig(encoding="fancy")


def test_fsm_table_parameter_trains_once_then_loads(tmp_path, parameters):
    rng = np.random.default_rng(5)
    model = MODELS["tree_gru"](rng)
    path = tmp_path / "fsm.json"
    parameters(scheduler="fsm", fsm_table=str(path))
    tf.reset_stats()
    tf.build([model.loss(tf, e) for e in model.random_examples(rng, 4)])
    assert path.exists()
    assert tf.stats()["fsm_training_seconds"] > 0
    tf.set_parameter("fsm_table", "")
    tf.set_parameter("fsm_table", str(path))   # a new run, same file
    tf.reset_stats()
    tf.build([model.loss(tf, e) for e in model.random_examples(rng, 4)])
    assert tf.stats()["fsm_training_seconds"] == 0

