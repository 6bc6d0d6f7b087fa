"""Frequent-subgraph search and replacement (thesis sections 4.5-4.7, 5.5).

Stage 1, collection: over the first ``collect`` evaluations, or until it
has walked ``COLLECT_NODES`` nodes (part of one large evaluation), a queue
search from each root in turn encodes the subgraph under every node it
pops (to ``depth``),
counts the signature, and goes on from that subgraph's inputs.  Afterwards
the signatures seen at least ``freq`` times per input become patterns, each
compiled once (``codegen.py``).

Stage 2, replacement: the same queue search, but a popped node whose
subgraph is a pattern is rewritten in place into one node running the
pattern, wired to the subgraph's inputs (section 4.6); the search goes on
from those inputs.  A node that matches nothing is passed by, and the search
goes on from its operands, so a pattern may start anywhere.

Nothing is computed twice (section 5.5): a node with more than one consumer
(ever recorded), or one the caller asked for, is never inside a subgraph,
only its root or an input.  A node swallowed by a pattern is not evaluated;
it keeps its inputs, so if the user asks for its value later it is computed
then.

That rule cuts a cell whose parent reads two of its values (the Tree-LSTM's
output gate, from the gates' split, and its memory cell) into two patterns.
After replacement, a pattern reading a multi-output pattern's outputs is
joined to it into one node running both (``codegen.FusedPattern``), where
that makes neither wait: one launch per cell instead of two.

An *input* (the unit of ``freq``) is one root of an evaluated DAG: a node
nothing else consumes.  When one loss sums a whole minibatch, the minibatch
is one input.

With granularity ``auto`` (the default), patterns are collected as above,
then ``Trial`` times minibatches with and without them and keeps whichever
unit is faster, for training and for inference apart.
"""

import collections
import gc
import statistics
import time

from .. import _native, concurrent
from ..context import context
from ..ir.node import VirtualNode
from ..ir.table import ACCESS, ENTRIES_BY_NAME
from .codegen import FusedPattern, Pattern
from .signature import Signer, Template, has_value_operand

# Collection also ends once it has walked this many nodes, however few
# evaluations that took, within an evaluation too: a 256-tree minibatch of
# the Tree-LSTM holds 170,000 (three of 25 trees: 52,000), and collection
# costs 10-20 us a node walked in Python (a collected evaluation also runs
# op by op).
COLLECT_NODES = 50_000


class PatternSearch:
    """Collection statistics and frequent patterns, across evaluations."""

    def __init__(self):
        self.settings = None
        self.on_collected = None  # called with the patterns when collection ends
        # This evaluation's unit is settling in a granularity trial (Trial).
        self.trial_settling = False
        self.reset()

    def reset(self):
        self.minibatches = 0
        self.inputs = 0
        self.nodes = 0
        self.counts = collections.Counter()
        self.examples = {}       # signature -> inputs of its first occurrence
        self.op_counts = {}      # signature -> ops in the subgraph
        self.templates = {}      # root (op entry, attrs) -> [(Template, Pattern)]
        self.fused = {}          # (producer, consumer, wiring) -> FusedPattern
        # What every replacement reads again, made once per settings (a
        # change of settings resets): the label caches match programs
        # read, and the match programs to try per root op (``_candidates``).
        self.label_caches = Signer.label_caches()
        self.candidates = None
        context.patterns = None  # signature -> Pattern, once collection ends
        # Granularity "auto": ops or patterns, timed, per mode (training
        # and inference can prefer different units).
        self.trials = {mode: Trial(mode) for mode in ("training", "inference")}
        # (map number, scopes opened, unit): a tf.batching.map's unit, kept
        # until another map or scope begins (Trial).
        self.map_unit = None

    def optimize(self, targets, required):
        """Collect from, or replace patterns in, the nodes of one evaluation
        (the unevaluated ancestors of ``targets``, of which ``required``
        must get values); returns the nodes left to run, in recording
        order.  Replacement rewrites the user's nodes in place
        (``_replace_in_place``).  It walks the graph itself: the ancestors
        are listed (a walk of every node) only to collect, or to run ops."""
        parameters = context.parameters
        settings = (parameters["depth"], parameters["equivalence"],
                    parameters["freq"], parameters["collect"])
        if settings != self.settings:  # statistics of other settings are moot
            self.settings = settings
            self.reset()
        self.trial_settling = False
        if context.patterns is not None and parameters["granularity"] == "auto":
            trial = self.trials["training" if context.tapes else "inference"]
            # The later rounds of a tf.batching.map, and what its scope
            # evaluates after it, take its first round's unit and count to
            # its time (Trial).
            pinned = (self.map_unit[2] if self.map_unit is not None
                      and self.map_unit[:2] == (concurrent.maps, context.scopes_opened)
                      else None)
            if pinned is None:
                # Any other evaluation ends the one being timed, of either mode.
                now = Trial.clock()
                for each in self.trials.values():
                    each.stop(now)
            # The ancestors are needed to time a unit (seconds per node) or
            # to run ops; once patterns are chosen, replacement finds them.
            if context.granularity_chosen.get(trial.mode) != "subgraph":
                nodes = _native.unevaluated_ancestors(targets)
                if pinned is None:
                    unit = trial.unit(len(nodes), parameters["compile"], now)
                    if concurrent.running:
                        self.map_unit = (concurrent.maps, context.scopes_opened, unit)
                else:
                    unit = pinned
                    trial.count(len(nodes))
                self.trial_settling = trial.settling < len(Trial.UNITS)
                if unit == "op":
                    return nodes   # (before any work: every evaluation passes here)
        depth, level = settings[0], settings[1]
        required = {node.id for node in required if type(node) is VirtualNode}
        # Roots: what nothing else consumes, and what the caller asked for.
        # Only targets can be roots: every other node feeds one.
        # (In C: a scope's targets are everything recorded in it.)
        roots = _native.search_roots(targets, required)
        signer = Signer(level, for_patterns=True, required=required,
                        labels=self.label_caches)
        if context.patterns is None:  # stage 1
            nodes = _native.unevaluated_ancestors(targets)
            self._collect(roots, signer, depth, COLLECT_NODES - self.nodes)
            self.minibatches += 1
            if self.minibatches >= settings[3] or self.nodes >= COLLECT_NODES:
                self._select(settings[2])
            return nodes
        return self._replace_in_place(roots, signer, depth)

    # -- stage 1 -----------------------------------------------------------------
    def _collect(self, roots, signer, depth, budget):
        """Count the signatures under ``roots``, one root's subgraph after
        another, until ``budget`` nodes are walked: the rest of a large
        minibatch adds nothing a sample of its instances does not show
        (walking all of a 256-tree minibatch of the Tree-LSTM, 85,000
        nodes, took 1.2-1.7 s of its 10-12 s warm-up).  Only the roots
        walked count as inputs."""
        reached = {node.id: node for node in roots}
        roots = collections.deque(roots)
        one_loss = len(roots) == 1 and bool(context.tapes)
        if one_loss:
            # The one root of a training evaluation (its loss) is not
            # counted: its subgraph, the sum of the minibatch's losses,
            # occurs once per evaluation, has nothing to batch with, and
            # changes with the minibatch's size (a 256-operand sum traced
            # in 2 s, and again for the epoch's last, smaller minibatch).
            # The instances under it are walked in turn; the evaluation is
            # one input, as before.
            alone = roots[0]
            self.inputs += 1
            if alone.entry.node_kind != "access" and not has_value_operand(alone):
                roots.clear()
                _enqueue(signer.walk(alone, depth).inputs, reached, roots)
        walked = 0
        while roots and walked < budget:
            queue = collections.deque([roots.popleft()])
            self.inputs += not one_loss
            while queue:
                node = queue.popleft()
                if node.entry.node_kind == "access" or has_value_operand(node):
                    _enqueue(node.inputs, reached, queue)
                    continue
                found = signer.walk(node, depth)
                signature = found.signature
                self.counts[signature] += 1
                if signature not in self.examples:
                    self.examples[signature] = found.inputs
                    self.op_counts[signature] = len(found.nodes)
                walked += len(found.nodes)
                _enqueue(found.inputs, reached, queue)
        self.nodes += walked

    def _select(self, freq):
        """Keep the signatures seen ``freq`` times per input or more."""
        patterns = {}
        inputs = max(self.inputs, 1)
        for signature, count in self.counts.items():
            if count / inputs < freq or self.op_counts[signature] < 2:
                continue
            pattern = Pattern(signature, self.examples[signature], count)
            if not pattern.arguments:  # nothing per instance: nothing to batch
                continue
            patterns[signature] = pattern
            template = Template(signature.key, ENTRIES_BY_NAME, signature)
            root = (template.detail, template.attrs)
            self.templates.setdefault(root, []).append((template, pattern))
        for candidates in self.templates.values():  # the largest first
            candidates.sort(key=lambda candidate: -candidate[1].op_count)
        context.patterns = patterns
        self.examples = {}
        if self.on_collected is not None:
            self.on_collected(patterns)

    # -- stage 2 -----------------------------------------------------------------
    def _replace_in_place(self, roots, signer, depth):
        """Stage 2: rewrite in place every node whose subgraph is a pattern
        into one node running it -- its op entry becomes the pattern's, its
        attributes none, its inputs the subgraph's inputs, and the
        subgraph's other nodes are marked swallowed (``native/match.c``) --
        then join pairs of pattern nodes (``_fuse_in_place``).  The nodes
        are the user's VirtualNodes: every later pass sees the rewrite.
        Returns the nodes reached (left to run), in recording order."""
        if self.candidates is None:
            self.candidates = self._candidates(depth)
        reached, replaced, matches = _native.replace(
            roots, self.candidates, signer.match_labels())
        for entry, count in matches.items():
            entry.pattern.matches += count
        context.pattern_matches += len(replaced)
        if context.parameters["fuse"]:   # (replaced: in recording order)
            reached = self._fuse_in_place(replaced, signer.required, reached)
        return reached

    def _candidates(self, depth):
        """Per root op: (program, pattern entry, argument positions) to try,
        the largest pattern first.  A leaf's 3-way split and an inner node's
        5-way one try different patterns: a program checks the root's
        attributes first, so one list per op tries the same ones in the
        same order as a list per (op, attributes) would.  (Made once: the
        templates change only in ``_select``, after a ``reset``.)"""
        by_entry = {}
        for (entry, _), candidates in self.templates.items():
            by_entry.setdefault(entry, []).extend(candidates)
        return {
            entry: tuple((template.program(depth), pattern.entry,
                          tuple(pattern.argument_positions))
                         for template, pattern in sorted(
                             candidates, key=lambda candidate: -candidate[1].op_count))
            for entry, candidates in by_entry.items()}

    def _fuse_in_place(self, pattern_nodes, required, reached):
        """Join each pattern node to the multi-output pattern node whose
        outputs it reads, into one node running both (``FusedPattern``),
        rewriting both nodes in place: the producer's node runs the pair
        (its op entry, inputs and spec change), and the consumer's becomes an
        access to its last output.  Only where that delays nothing: every
        other argument of the consumer is an argument of the producer, an
        ancestor of one (found by a walk of at most 64 nodes), or already
        evaluated.  In recording order, so a node is joined at most once,
        and a joined pair is never the producer of another (a tree's cells
        stay one launch per level).  The loop is C (``native/fuse.c``);
        a new pair's FusedPattern is made here.  Returns ``reached`` (the
        nodes to evaluate) without the joined consumers that other nodes
        read and whose id is not ``required``: the search leaves such access
        nodes out (their readers read the output from its node, and they
        take it when asked for)."""
        def make_fused(key, extra_count):
            fused = self.fused[key] = FusedPattern(*key, extra_count)
            return fused

        joined, reached = _native.fuse(pattern_nodes, self.fused, make_fused, _entry_kind,
                                       ACCESS, required, reached)
        for fused, count in joined.items():
            fused.matches += count
        context.pattern_fusions += sum(joined.values())
        return reached


OneOffWork = collections.namedtuple("OneOffWork",
                                    "traces shapes compile_seconds full_collections")


def one_off_work():
    """Counters of work an evaluation does once per new shape or key, and
    of the cyclic collector's full collections, which fall on any
    evaluation: one took 1.2 s of a 256-tree Tree-LSTM inference turn,
    after a benchmark's other systems had filled the heap, and the trial
    chose ops (inference at 0.57x of patterns)."""
    return OneOffWork(context.pattern_traces, context.shape_inferences,
                      context.batching["compile_seconds"],   # (grows with each compile tried)
                      gc.get_stats()[2]["collections"])


class Trial:
    """Granularity ``auto``: which unit of work, ops or patterns, trains
    (under our GradientTape) or infers this model faster -- a trial per
    mode, since the two can differ -- measured rather than guessed
    (patterns win big on trees and lose on models whose subgraphs hold a
    sequence's length: BENCHMARKS.md).  Once patterns are collected, each
    unit runs until it has settled -- a compiled program ran since its
    last evaluation (in either mode), or its program was refused (too many
    kinds: it will run step by step; with minibatches of 256 each
    evaluation waiting out the count below, or a second one, cost a
    second), or 2 x ``compile`` + 1
    evaluations passed (keys that vary with a rare kind take longer to
    recur); while it settles, its programs compile at first sight
    (``PatternSearch.trial_settling``: evaluations run step by step until
    a key recurs ``compile`` times tell the trial nothing, and cost
    seconds with minibatches of 256) -- then
    the two take turns in the order of ``TIMED`` (op, patterns, patterns,
    op, ...: a loop that alternates training and inference evaluations,
    or slows down over time, favours neither), and the unit with the
    lower median seconds per node is kept (a median, so that one
    evaluation that compiles decides nothing).  The turns end early once
    each unit has two and every time of one is ``SEPARATED`` times below
    every time of the other, or each has one and one is ``FAR`` times
    below the other: with minibatches of 256 each op evaluation of the
    Tree-LSTM takes about a second, four to five times a pattern
    evaluation's per node.  (One turn each decides only past the 2x by
    which this machine's drift or the collector can slow a single
    evaluation; the Tree-LSTM's inference units are 1.4-1.6x apart at
    256.)  An evaluation that did one-off work (traced a pattern for new
    shapes, compiled a program, inferred a shape) or ran into a full
    collection of the cyclic collector is timed again, up to
    ``RETIMES`` times: one Tree-LSTM evaluation that traced five patterns
    took 688 ms against the op unit's 58, and chose ops, which then
    trained at half the patterns' speed.  The time of an evaluation is
    until the next one (of either mode) starts, so it includes the
    backward, the update and the recording of the next minibatch: what the
    user waits for.  A ``tf.batching.map`` is one evaluation to the trial:
    its rounds, and the evaluations after it until another map or scope
    begins (its scope's loss, its close), take the unit of its first
    round, and their nodes and time count together.  (Its rounds shrink as
    instances finish, so timed one by one, each unit's turns fell on
    rounds of other sizes: adaptive_computation's inference chose
    patterns, 4.2-4.9x eager TensorFlow, where ops ran 5.1-6.6x.)"""

    UNITS = ("op", "subgraph")
    TIMED = ("op", "subgraph", "subgraph", "op") * 2
    SEPARATED = 1.25
    FAR = 3.0
    RETIMES = len(TIMED)
    clock = staticmethod(time.perf_counter)

    def __init__(self, mode):
        self.mode = mode       # what context.granularity_* say it under
        self.settling = 0      # into UNITS: the unit settling, then len(UNITS)
        self.evaluations = 0   # of the unit settling
        self.timed = 0         # into TIMED
        self.runs = 0          # compiled program runs before this evaluation
        self.refused = 0       # ... and programs refused compilation
        # (unit, started, nodes, one-off work, settling) of the evaluation
        # being timed: a timed turn's, or a settling unit's
        self.timing = None
        self.retimed = 0       # timed evaluations discarded for one-off work
        self.per_node = {unit: [] for unit in self.UNITS}   # seconds, per evaluation
        self.settled_time = None   # the last settling evaluation's, if it did no one-off work
        self.banked = {unit: 0 for unit in self.UNITS}   # timed turns a settling evaluation took
        context.granularity_chosen.pop(mode, None)
        context.granularity_trial.pop(mode, None)

    def stop(self, now):
        """End the timed evaluation, if any: another one starts ``now``."""
        if self.timing is not None:
            unit, started, count, work, settling = self.timing
            self.timing = None
            per_node, one_off = (now - started) / max(count, 1), work != one_off_work()
            if settling:
                self.settled_time = None if one_off else per_node
                return
            if one_off and self.retimed < self.RETIMES:
                self.retimed += 1
                self.timed -= 1   # (this unit's turn again)
                return
            self.per_node[unit].append(per_node)

    def count(self, nodes):
        """``nodes`` more for the timed evaluation (a later round of its map)."""
        if self.timing is not None:
            unit, started, count, work, settling = self.timing
            self.timing = (unit, started, count + nodes, work, settling)

    def unit(self, nodes, compile_after, now):
        """The unit for an evaluation of ``nodes`` nodes starting ``now``."""
        chosen = context.granularity_chosen.get(self.mode)
        if chosen is not None:
            return chosen
        if not context.patterns:   # nothing frequent: nothing to try
            context.granularity_chosen[self.mode] = "op"
            return "op"
        runs, self.runs = self.runs, context.batching["program_runs"]
        refused = self.refused
        self.refused = sum(context.batching["programs_not_compiled"].values())
        if self.settling < len(self.UNITS):
            refused_now = self.evaluations > 0 and self.refused > refused
            if refused_now and self.settled_time is not None:
                # Its program refused, the evaluation ran step by step, as
                # this unit's timed turns will: it is the unit's first
                # turn (a second at batch 256, where op evaluations take
                # a second each).
                self.per_node[self.UNITS[self.settling]].append(self.settled_time)
                self.banked[self.UNITS[self.settling]] += 1
            if self.evaluations > 2 * compile_after or (
                    self.evaluations > 0 and self.runs > runs) or refused_now:
                self.settling += 1
                self.evaluations = 0
        if self.settling < len(self.UNITS):
            self.evaluations += 1
            self.timing = (self.UNITS[self.settling], now, nodes, one_off_work(), True)
            return self.UNITS[self.settling]
        # (Turns a settling evaluation took are skipped.)
        while self.timed < len(self.TIMED) and self.banked[self.TIMED[self.timed]]:
            self.banked[self.TIMED[self.timed]] -= 1
            self.timed += 1
        if self.timed == len(self.TIMED) or self._separated():
            trial = context.granularity_trial[self.mode] = {
                unit: statistics.median(self.per_node[unit]) for unit in self.UNITS}
            chosen = context.granularity_chosen[self.mode] = min(self.UNITS, key=trial.get)
            return chosen
        unit = self.TIMED[self.timed]
        self.timed += 1
        self.timing = (unit, now, nodes, one_off_work(), False)
        return unit

    def _separated(self):
        times = [self.per_node[unit] for unit in self.UNITS]
        if min(map(len, times)) < 1:
            return False
        fast, slow = sorted(times, key=min)
        factor = self.SEPARATED if min(map(len, times)) >= 2 else self.FAR
        return max(fast) * factor < min(slow)


def _entry_kind(entry):
    """What ``_fuse_in_place`` needs of an op entry, as bits: 1, its node has
    several outputs; 2, a pattern's (not a joined pair's) that others may
    join."""
    return (int(entry.multi_output)
            | 2 * (entry.multi_output and entry.node_kind == "pattern"))


def _enqueue(operands, reached, queue):
    """The queue search's step (stage 1; stage 2's is in native/match.c):
    queue the unevaluated nodes among ``operands`` not reached before.
    (``evaluated`` is inlined: this runs for every operand of every node.)"""
    for operand in operands:
        if type(operand) is VirtualNode and operand.result is None \
                and operand.batched is None and operand.id not in reached:
            reached[operand.id] = operand
            queue.append(operand)


SEARCH = PatternSearch()


def optimize(targets, required):
    """Stage 1 or 2 on one evaluation's nodes, timed for the statistics;
    stage 2 rewrites matched nodes in place (``PatternSearch.optimize``)."""
    started = time.perf_counter()
    try:
        return SEARCH.optimize(targets, required)
    finally:
        context.search_seconds += time.perf_counter() - started
