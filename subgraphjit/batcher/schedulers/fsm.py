"""ED-Batch's FSM scheduler: a batching policy learned by Q-learning.

Algorithm 1 of ED-Batch: while nodes remain, encode the graph's *frontier*
(the nodes whose operands are all computed) as a state, let the policy pick a
node type for that state, and run every frontier node of that type as one
batch.  The policy is a finite-state machine -- a table from states to types
-- so it costs one dictionary lookup per batch, and it depends only on the
model's structure, not on the inputs or the minibatch size: learned on one
minibatch, it schedules every later one.

States (section 2.3) are made of type *names* (``BatchGraph.type_names``),
which are the same in every minibatch:

* ``base``: the set of types on the frontier;
* ``max``: that set plus the type with the most frontier nodes;
* ``sort`` (the default, ED-Batch's best): the frontier's types ordered by
  how many of their nodes are ready.

Learning is tabular Q-learning on a simulation of Algorithm 1 over the
dependency structure alone (nothing runs).  Each batch earns the reward of
equation 1, ``-1 + alpha * ready_a / frontier_of_a``: -1 per batch, plus a
bonus when the batch takes *every* type-a node that could run before the
other type-a nodes (Lemma 2.1: then batching ``a`` now is optimal).  Here
``frontier_of_a`` counts the remaining type-a nodes with no remaining type-a
node among their ancestors, however many other ops lie between (in a
Tree-LSTM a node's matmul waits for its children's matmuls through a dozen
elementwise ops; counting only direct edges would see no chain at all).
Where the table knows no action yet, exploitation follows a heuristic, so
learning starts from a good schedule.  Two are tried on each training graph
and the one whose own schedule needs fewer batches is kept: that same
condition (the ready type with the largest share of its own frontier; on
trees and chains it already meets the lower bound), and a critical-path
rule (types whose whole frontier is ready first, then the most work after
the ready nodes; on the lattices measured it needs about an eighth fewer
batches).  Q-values are updated with N-step returns and exploration is
epsilon-greedy; training stops once the greedy policy needs no more batches
than ED-Batch's lower bound (appendix A.3, checked every ``check_every``
episodes), or at ``max_iterations`` or the time limit, and keeps the table
of the best greedy schedule it saw.

At run time a state the table has never seen is looked up by its set of
ready types, else decided by the agenda heuristic (counted as a fallback);
a schedule with any such guess is compared with agenda's own and the
shorter runs, so the FSM never costs more batches than agenda.
"""

import dataclasses
import json
import os
import random
import time

from tqdm import tqdm

from ... import _native
from .agenda import AgendaScheduler
from .structure import depths, lower_bound

ENCODINGS = ("sort", "max", "base")


@dataclasses.dataclass(frozen=True)
class FsmConfig:
    """Every hyperparameter of the FSM scheduler (``subgraphjit tune
    --schedulers --fsm-sweep KEY=V1,V2`` sweeps any of them)."""
    encoding: str = "sort"        # state encoding: sort, max or base
    alpha: float = 1.0            # weight of the Lemma 2.1 bonus in the reward
    learning_rate: float = 0.5
    discount: float = 1.0         # episodes are short and finite: no discount
    n_step: int = 4               # N of N-step bootstrapping
    epsilon: float = 0.2          # exploration rate of epsilon-greedy
    max_iterations: int = 1000    # training episodes at most (as ED-Batch)
    check_every: int = 50         # episodes between lower-bound checks
    time_limit_seconds: float = 5.0    # "at most a few seconds"
    train_graphs: int = 1         # minibatches to learn from before freezing
    retrain_share: float = 0.5    # learn again when more decisions fell back
    seed: int = 0

    def __post_init__(self):
        if self.encoding not in ENCODINGS:
            raise ValueError(f"FSM encoding must be one of {ENCODINGS}, "
                             f"not {self.encoding!r}")


def encode(encoding, ready_count_of_name):
    """The state of a frontier given as {type name: ready nodes}."""
    if encoding == "base":
        return tuple(sorted(ready_count_of_name))
    if encoding == "max":
        commonest = min(ready_count_of_name,
                        key=lambda name: (-ready_count_of_name[name], name))
        return (tuple(sorted(ready_count_of_name)), commonest)
    return tuple(sorted(ready_count_of_name,
                        key=lambda name: (-ready_count_of_name[name], name)))


@dataclasses.dataclass
class TrainingReport:
    iterations: int
    seconds: float
    batches: int          # of the greedy policy on the training graph
    lower_bound: int
    agenda_batches: int
    states: int
    heuristic: str        # the one learning started from


def ready_names(ready, names):
    """{type name: ready nodes} of a frontier given as {type: ready nodes},
    and the ready type of each name."""
    counts, type_of_name = {}, {}
    for node_type, nodes in ready.items():
        name = names[node_type]
        counts[name] = counts.get(name, 0) + len(nodes)
        type_of_name.setdefault(name, node_type)
    return counts, type_of_name


class Simulation:
    """Algorithm 1 over a BatchGraph's dependency structure: which nodes are
    ready, and the frontier of each type's own subgraph (for the reward)."""

    def __init__(self, graph):
        type_of = graph.type_of
        self.nodes = [index for index, node_type in enumerate(type_of)
                      if node_type >= 0]
        self.type_of = type_of
        self.names = graph.type_names
        self.consumers = {index: [] for index in self.nodes}
        for index in self.nodes:
            for source in graph.sources[index]:
                self.consumers[source].append(index)
        self.sources = graph.sources
        self.depth = depths(graph)
        self.type_count = len(graph.types)
        # Nearest same-type ancestors of each node: the nodes of its type
        # reached walking back from it without passing another of its type.
        # (A walk per node; it stops at the first node of the type, so it
        # covers about one cell's worth of ops.)
        self.same_type_parents = {}
        self.same_type_children = {index: [] for index in self.nodes}
        for index in self.nodes:
            node_type = type_of[index]
            parents, seen = [], set()
            stack = list(graph.sources[index])
            while stack:
                source = stack.pop()
                if source in seen:
                    continue
                seen.add(source)
                if type_of[source] == node_type:
                    parents.append(source)
                else:
                    stack.extend(graph.sources[source])
            self.same_type_parents[index] = len(parents)
            for parent in parents:
                self.same_type_children[parent].append(index)
        # Height: the most scheduled nodes on a path from a node to the end
        # of the graph (node ids are a topological order).
        self.height = {}
        for index in reversed(self.nodes):
            self.height[index] = 1 + max(
                (self.height[consumer] for consumer in self.consumers[index]),
                default=0)
        self.heuristic_choice = self.share_choice

    def reset(self):
        self.waiting = {index: len(self.sources[index]) for index in self.nodes}
        self.ready = {}
        self.ready_height = [0] * self.type_count   # summed over ready nodes
        for index in self.nodes:
            if not self.waiting[index]:
                self._make_ready(index)
        self.type_waiting = dict(self.same_type_parents)
        self.type_frontier = [0] * self.type_count
        self.remaining = [0] * self.type_count
        self.remaining_depth = [0] * self.type_count
        for index in self.nodes:
            node_type = self.type_of[index]
            self.remaining[node_type] += 1
            self.remaining_depth[node_type] += self.depth[index]
            if not self.type_waiting[index]:
                self.type_frontier[node_type] += 1

    def step(self, node_type, alpha):
        """Run the ready nodes of one type; returns the reward (equation 1)."""
        batch = self.ready.pop(node_type)
        self.ready_height[node_type] = 0
        reward = -1.0 + alpha * len(batch) / self.type_frontier[node_type]
        self.type_frontier[node_type] -= len(batch)
        self.remaining[node_type] -= len(batch)
        for index in batch:
            self.remaining_depth[node_type] -= self.depth[index]
            for child in self.same_type_children[index]:
                self.type_waiting[child] -= 1
                if not self.type_waiting[child]:
                    self.type_frontier[node_type] += 1
            for consumer in self.consumers[index]:
                self.waiting[consumer] -= 1
                if not self.waiting[consumer]:
                    self._make_ready(consumer)
        return reward

    def _make_ready(self, index):
        node_type = self.type_of[index]
        self.ready.setdefault(node_type, []).append(index)
        self.ready_height[node_type] += self.height[index]

    def heuristic_batches(self, choose):
        """Batches of the schedule that always takes ``choose()``."""
        self.reset()
        batches = 0
        while self.ready:
            self.step(choose(), 0.0)
            batches += 1
        return batches

    def share_choice(self):
        """Lemma 2.1's condition as a heuristic: the ready type holding the
        largest share of its own subgraph's frontier (ties: agenda's)."""
        return max(self.ready, key=lambda node_type: (
            len(self.ready[node_type]) / self.type_frontier[node_type],
            -self.remaining_depth[node_type] / self.remaining[node_type]))

    def critical_path_choice(self):
        """Types whose whole frontier is ready first (Lemma 2.1); among
        those, or else among all, the one whose ready nodes have the most
        nodes after them, summed.  Where work waits on one type's long chain
        (a lattice's character cells), this runs that chain first."""
        return max(self.ready, key=lambda node_type: (
            len(self.ready[node_type]) == self.type_frontier[node_type],
            self.ready_height[node_type]))


class FsmPolicy:
    """The learned FSM: a Q-table from states to {type name: value}."""

    def __init__(self, config=None):
        self.config = config or FsmConfig()
        self.table = {}
        # The learned schedule's choices by the coarser 'base' state (the
        # set of ready types), consulted when a state is unseen: frontiers
        # of new inputs often hold the same types in other proportions.
        self.coarse = {}
        self.graphs_trained = 0
        self.retrain = False

    @property
    def needs_training(self):
        return self.retrain or self.graphs_trained < self.config.train_graphs

    def choose(self, state, ready_counts):
        """The greedy type name for a state, or None if the state is unseen."""
        values = self.table.get(state)
        if not values:
            return None
        known = [name for name in ready_counts if name in values]
        if not known:
            return None
        return max(known, key=lambda name: (values[name], name))

    def choose_coarse(self, ready_counts):
        """The learned schedule's commonest choice for this set of ready
        types, or None."""
        votes = self.coarse.get(encode("base", ready_counts))
        if not votes:
            return None
        return max(votes, key=lambda name: (votes[name], name))

    # -- learning ----------------------------------------------------------
    def train(self, graph, progress=True):
        """Learn from one graph (merging into the table); a TrainingReport.

        Exploitation needs a choice where the table knows no action yet: the
        heuristic of the two (``Simulation.share_choice`` and
        ``critical_path_choice``) whose own schedule needs fewer batches
        here, which is where learning starts; Q-learning then improves on it
        where exploration finds fewer batches.  The table of the best greedy
        schedule seen is kept."""
        config = self.config
        started = time.perf_counter()
        simulation = Simulation(graph)
        bound = lower_bound(graph)
        agenda = len(AgendaScheduler().schedule(graph))
        rng = random.Random(config.seed)
        # Judged by their own schedules: a table made from one may need fewer
        # batches on this graph yet carry over worse to the next.  The share
        # rule first: where it meets the lower bound (trees, chains) the
        # other is not tried.
        heuristic, choose = "share", simulation.share_choice
        share_batches = simulation.heuristic_batches(choose)
        if share_batches > bound and simulation.heuristic_batches(
                simulation.critical_path_choice) < share_batches:
            heuristic, choose = "critical path", simulation.critical_path_choice
        simulation.heuristic_choice = choose
        best, best_table = self._greedy_episode(simulation), _copy(self.table)
        iterations = 0
        with tqdm(total=config.max_iterations, desc="learning FSM schedule",
                  unit="episode", leave=False, delay=1.0,
                  disable=not progress) as bar:
            while best > bound and iterations < config.max_iterations \
                    and time.perf_counter() - started < config.time_limit_seconds:
                self._learn_episode(simulation, rng)
                iterations += 1
                bar.update()
                if iterations % config.check_every == 0:
                    greedy = self._greedy_episode(simulation)
                    if greedy < best:
                        best, best_table = greedy, _copy(self.table)
                    bar.set_postfix(batches=best, lower_bound=bound)
        self.table = best_table
        # Every state of the final greedy schedule goes into the table, so
        # the schedule runs as learned (not through the runtime's fallback).
        best = self._greedy_episode(simulation, record=True)
        self.graphs_trained += 1
        self.retrain = False
        return TrainingReport(iterations, time.perf_counter() - started, best,
                              bound, agenda, len(self.table), heuristic)

    def _greedy_episode(self, simulation, record=False):
        """Batches of the schedule the table gives: its choice where it has
        one, else the heuristic's, which a later visit to the same state
        then repeats (as it would once recorded, so the count is what the
        recorded table gives at run time); ``record`` puts the choices into
        the tables."""
        simulation.reset()
        decided = {}   # the heuristic's choice in each state the table lacks
        batches = 0
        while simulation.ready:
            names, type_of_name = ready_names(simulation.ready, simulation.names)
            state = encode(self.config.encoding, names)
            name = self.choose(state, names)
            if name is None:
                name = decided.get(state)
            if name is None:
                name = decided[state] = simulation.names[simulation.heuristic_choice()]
            if record:
                votes = self.coarse.setdefault(encode("base", names), {})
                votes[name] = votes.get(name, 0) + 1
            simulation.step(type_of_name[name], self.config.alpha)
            batches += 1
        if record:
            for state, name in decided.items():
                self.table.setdefault(state, {})[name] = 0.0
        return batches

    def _learn_episode(self, simulation, rng):
        """One epsilon-greedy schedule, then N-step Q updates along it."""
        config = self.config
        simulation.reset()
        trajectory = []   # (state, action name, reward)
        while simulation.ready:
            names, type_of_name = ready_names(simulation.ready, simulation.names)
            state = encode(config.encoding, names)
            if rng.random() < config.epsilon:
                action = rng.choice(sorted(names))
            else:
                action = self.choose(state, names)
                if action is None:
                    action = simulation.names[simulation.heuristic_choice()]
            reward = simulation.step(type_of_name[action], config.alpha)
            trajectory.append((state, action, reward))
        count = len(trajectory)
        for t, (state, action, _) in enumerate(trajectory):
            horizon = min(t + config.n_step, count)
            target = sum(config.discount ** (k - t) * trajectory[k][2]
                         for k in range(t, horizon))
            if horizon < count:
                later = self.table.get(trajectory[horizon][0])
                # An unvalued later state: assume the rest costs what the
                # remaining steps of this episode did.
                target += config.discount ** (horizon - t) * (
                    max(later.values()) if later else
                    sum(step[2] for step in trajectory[horizon:]))
            values = self.table.setdefault(state, {})
            if action not in values:
                values[action] = target
            else:
                values[action] += config.learning_rate * (target - values[action])

    # -- persistence -------------------------------------------------------
    def save(self, path):
        entries = [{"state": _to_json(state), "values": values}
                   for state, values in self.table.items()]
        with open(path, "w") as handle:
            json.dump({"config": dataclasses.asdict(self.config),
                       "graphs_trained": self.graphs_trained,
                       "table": entries,
                       "coarse": [{"state": list(state), "votes": votes}
                                  for state, votes in self.coarse.items()]},
                      handle)

    @classmethod
    def load(cls, path, encoding=None):
        """A saved policy; ``encoding``, if given, must be the file's."""
        try:
            with open(path) as handle:
                saved = json.load(handle)
            config = FsmConfig(**saved["config"])
            table = {_from_json(entry["state"]): entry["values"]
                     for entry in saved["table"]}
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path} is not a saved FSM policy: {error}") from None
        if encoding is not None and config.encoding != encoding:
            raise ValueError(
                f"{path} holds an FSM policy learned with the {config.encoding!r} "
                f"state encoding, not {encoding!r}: set fsm_encoding to "
                f"{config.encoding!r} or use another fsm_table file")
        policy = cls(config)
        policy.table = table
        policy.coarse = {tuple(entry["state"]): entry["votes"]
                         for entry in saved.get("coarse", ())}
        policy.graphs_trained = saved.get("graphs_trained", config.train_graphs)
        return policy


def _copy(table):
    return {state: dict(values) for state, values in table.items()}


def _to_json(state):
    return [_to_json(part) for part in state] if isinstance(state, tuple) else state


def _from_json(state):
    return tuple(_from_json(part) for part in state) if isinstance(state, list) else state


class FsmScheduler:
    """Algorithm 1 with a learned policy.

    A state the table lacks is looked up by its set of ready types (the
    learned schedule's commonest choice there), else decided by the agenda
    heuristic.  When the schedule needed any such guess, agenda's own
    schedule is made too and the shorter one runs, so the FSM never costs
    more batches than agenda.  ``policy``: the FsmPolicy to schedule with
    (and to train while it needs training; a new one if not given).
    ``statistics`` (optional) receives the training time and the
    fallbacks; ``on_trained(policy)`` is called after training."""

    name = "fsm"

    def __init__(self, policy=None, statistics=None, on_trained=None):
        self.policy = policy if policy is not None else FsmPolicy()
        self.statistics = statistics
        self.on_trained = on_trained
        self.fallbacks = 0          # unseen states: agenda's choice
        self.coarse_decisions = 0   # unseen states known by their type set
        self.decisions = 0

    def schedule(self, graph):
        """The policy's schedule, or agenda's where that is shorter; the
        policy learns from this graph first if it needs training."""
        if self.policy.needs_training:
            report = self.policy.train(graph)
            if self.statistics is not None:
                self.statistics["fsm_training_seconds"] += report.seconds
                self.statistics["fsm_training_iterations"] += report.iterations
            if self.on_trained is not None:
                self.on_trained(self.policy)
        batches = self._learned_schedule(graph)
        if self.fallbacks or self.coarse_decisions:
            agenda_batches = AgendaScheduler().schedule(graph)
            if len(agenda_batches) < len(batches):
                batches = agenda_batches
        if self.statistics is not None:
            self.statistics["scheduler_fallbacks"] += self.fallbacks
        if self.fallbacks > self.policy.config.retrain_share * self.decisions:
            self.policy.retrain = True   # a graph it mostly does not know
        return batches

    def _learned_schedule(self, graph):
        """The policy's schedule: agenda's ready lists, the policy's choice
        of type (in C, ``native/analysis.c``: ``fsm_schedule``; the
        decisions are table look-ups, the bookkeeping is agenda's)."""
        names = sorted(set(graph.type_names))
        rank = {name: number for number, name in enumerate(names)}
        batches, decisions, coarse, fallbacks = _native.fsm_schedule(
            graph.type_of, graph.sources, len(graph.types), names,
            [rank[name] for name in graph.type_names], self.policy.config.encoding,
            self.policy.table, self.policy.coarse)
        self.decisions += decisions
        self.coarse_decisions += coarse
        self.fallbacks += fallbacks
        return batches


def policy_for(encoding, path):
    """The policy to schedule with: loaded from ``path`` if that file exists
    (no training), else a new one to be learned."""
    if path and os.path.exists(path):
        return FsmPolicy.load(path, encoding)
    return FsmPolicy(FsmConfig(encoding=encoding))
