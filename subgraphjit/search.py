"""Frequent-subgraph search and replacement (thesis sections 4.5-4.7, 5.5).

Stage 1, collection: over the first ``collect`` evaluations, a queue search
from each root encodes the subgraph under every node it pops (to ``depth``),
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

An *input* (the unit of ``freq``) is one root of an evaluated DAG: a node
nothing else consumes.  When one loss sums a whole minibatch, the minibatch
is one input.
"""

import collections
import time

from .codegen import ROWS_BY_NAME, Pattern
from .context import context
from .patch.node import VirtualNode
from .patch.record import ACCESS
from .signature import Signer, Template, has_value_operand


class PatternSearch:
    """Collection statistics and frequent patterns, across evaluations."""

    def __init__(self):
        self.settings = None
        self.on_collected = None  # called with the patterns when collection ends
        self.reset()

    def reset(self):
        self.minibatches = 0
        self.inputs = 0
        self.counts = collections.Counter()
        self.examples = {}       # signature -> inputs of its first occurrence
        self.op_counts = {}      # signature -> ops in the subgraph
        self.templates = {}      # root op-table row -> [(Template, Pattern)]
        context.patterns = None  # signature -> Pattern, once collection ends

    def optimize(self, nodes, required):
        """Collect from, or replace patterns in, the nodes of one evaluation
        (in recording order); returns the nodes left to run, in order."""
        parameters = context.parameters
        settings = (parameters["depth"], parameters["equivalence"],
                    parameters["freq"], parameters["collect"])
        if settings != self.settings:  # statistics of other settings are moot
            self.settings = settings
            self.reset()
        depth, level = settings[0], settings[1]
        required = {node.id for node in required if type(node) is VirtualNode}
        # Roots: what nothing else consumes, and what the caller asked for.
        roots = [node for node in nodes
                 if not node.consumers or node.id in required]
        signer = Signer(level, for_patterns=True, required=required)
        if context.patterns is None:  # stage 1
            self._collect(roots, signer, depth)
            self.minibatches += 1
            self.inputs += len(roots)
            if self.minibatches >= settings[3]:
                self._select(settings[2])
            return nodes
        return self._replace(roots, signer, depth)

    # -- stage 1 -----------------------------------------------------------------
    def _collect(self, roots, signer, depth):
        for node, walk in _queue_search(roots):
            if node.row is ACCESS or has_value_operand(node):
                walk(node.inputs)
                continue
            found = signer.walk(node, depth)
            signature = found.signature
            self.counts[signature] += 1
            if signature not in self.examples:
                self.examples[signature] = found.inputs
                self.op_counts[signature] = len(found.nodes)
            walk(found.inputs)

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
            template = Template(signature.key, ROWS_BY_NAME, signature)
            self.templates.setdefault(template.detail, []).append((template, pattern))
        for candidates in self.templates.values():  # the largest first
            candidates.sort(key=lambda candidate: -candidate[1].op_count)
        context.patterns = patterns
        self.examples = {}
        if self.on_collected is not None:
            self.on_collected(patterns)

    # -- stage 2 -----------------------------------------------------------------
    def _replace(self, roots, signer, depth):
        templates = self.templates
        swallowed = context.swallowed
        kept = []
        matches = 0
        match = signer.match
        for node, walk in _queue_search(roots):
            kept.append(node)
            candidates = templates.get(node.row)
            found = None
            if candidates and not has_value_operand(node):
                for template, pattern in candidates:
                    found = match(node, depth, template)
                    if found is not None:
                        break
            if found is None:
                walk(node.inputs)
                continue
            arguments = tuple(found.inputs[position]
                              for position in pattern.argument_positions)
            node.row, node.attrs, node.inputs = pattern.row, (), arguments
            swallowed.update(inner.id for inner in found.nodes if inner is not node)
            pattern.matches += 1
            matches += 1
            walk(arguments)
        context.pattern_matches += matches
        kept.sort(key=_node_id)
        return kept


def _node_id(node):
    return node.id


def _queue_search(roots):
    """Yield (node, walk) for each unevaluated node reached from the roots,
    once; the consumer calls ``walk(operands)`` to go on from there."""
    queue = collections.deque(roots)
    seen = {node.id for node in roots}

    def walk(operands):
        for operand in operands:
            if type(operand) is VirtualNode and not operand.evaluated \
                    and operand.id not in seen:
                seen.add(operand.id)
                queue.append(operand)

    while queue:
        yield queue.popleft(), walk


SEARCH = PatternSearch()


def optimize(nodes, required):
    """Stage 1 or 2 on one evaluation's nodes, timed for the statistics."""
    started = time.perf_counter()
    try:
        return SEARCH.optimize(nodes, required)
    finally:
        context.search_seconds += time.perf_counter() - started
