"""Row layout of batched results, ED-Batch's PQ-tree memory planner
(section 3.2, Algorithm 2 with appendix B's Algorithms 3-6).

A batch's rows can come in any order, and its order fixes the order of its
operands' rows too: row i of every operand belongs to node i.  The executor
reads an operand as the earlier result itself or a slice of it when the rows
are an in-order run of one earlier result, and gathers otherwise.  ``plan``
chooses every batch's row order at once so that as many operands as possible
are such runs.

Think of all rows of all batches laid out in one sequence.  An operand is a
run of its source batch exactly when (adjacency) its rows are consecutive in
the sequence and (alignment) they come in the order of the consuming batch's
own rows.  The planner:

1. builds a PQ tree holding every sequence in which each batch's rows and
   each operand's rows are consecutive;
2. broadcasts constraints (BroadcastConstraint): whatever must be consecutive
   within a batch's rows must be consecutive within each aligned operand's
   rows and back, until the subtrees of the two are isomorphic;
3. decides node orders (DecideNodesOrder): the isomorphism ties a Q-node's
   direction, or a P-node's permutation, to its counterpart's; an extended
   union-find (Algorithm 5) keeps these ties and refuses contradicting ones;
4. walks the tree in the decided orders (GetLeafOrder).

An operand whose constraints cannot be met with the others is left to a
gather; an ideal layout, when one exists, is always found (tests check this
against brute force).  Pure Python, no TensorFlow.

>>> results = [["a1", "a2", "a3"], ["b1", "b2", "b3"]]
>>> operands = [(1, ["a3", "a1", "a2"])]   # b_i reads a3, a1, a2
>>> plan(results, operands).results
[['a3', 'a1', 'a2'], ['b1', 'b2', 'b3']]
"""

import collections

from .pqtree import PQTree, items_below


class Layout:
    """The planner's answer: ``results[b]``, batch b's items in row order;
    ``aligned``, the numbers of the operands that are now runs."""

    def __init__(self, results, aligned):
        self.results = results
        self.aligned = aligned


def plan(results, operands):
    """Row orders for batches.

    ``results[b]`` lists batch b's items (any hashable values, each in one
    batch).  ``operands`` lists ``(b, sources)`` pairs: batch b reads
    ``sources[i]`` for its item ``results[b][i]``.  Operands whose sources
    are not distinct items of one other batch can never be a run and are
    ignored.
    """
    batch_of = {item: number for number, items in enumerate(results)
                for item in items}
    if len(batch_of) != sum(map(len, results)):
        raise ValueError("layout.plan: an item is in more than one batch")
    pairs = [(number, results[consumer], list(sources))
             for number, (consumer, sources) in enumerate(operands)
             if _may_be_run(sources, results[consumer], batch_of, consumer)]
    # Batches no operand ties to anything keep their order, out of the tree.
    involved = sorted({batch_of[items[0]] for _, consumer, sources in pairs
                       for items in (consumer, sources)})
    if not involved:
        return Layout([list(items) for items in results], [])
    tree = PQTree.of_groups([results[number] for number in involved])
    pairs = [pair for pair in pairs if tree.reduce(pair[2])]
    pairs = _broadcast(tree, pairs, batch_of)
    orders = _OrderTies()
    pairs = [pair for pair in pairs if _tie_orders(tree, pair, orders)]
    place = {item: position
             for position, item in enumerate(_leaf_order(tree, orders))}
    ordered = [list(items) for items in results]
    for number in involved:
        ordered[number].sort(key=place.__getitem__)
    return Layout(ordered, [number for number, consumer, sources in pairs
                            if _is_run(consumer, sources, place)])


def _may_be_run(sources, consumer_items, batch_of, consumer):
    if len(sources) != len(consumer_items) or len(set(sources)) != len(sources):
        return False
    source_batches = {batch_of.get(item) for item in sources}
    return len(source_batches) == 1 and None not in source_batches and (
        consumer not in source_batches)


def _is_run(consumer, sources, place):
    """Do the sources come consecutively, in the consumer's row order?"""
    by_row = sorted(range(len(consumer)), key=lambda i: place[consumer[i]])
    positions = [place[sources[i]] for i in by_row]
    return positions == list(range(positions[0], positions[0] + len(positions)))


# -- BroadcastConstraint ----------------------------------------------------
def _broadcast(tree, pairs, batch_of):
    """Make each consumer's subtree and its operand's subtree isomorphic by
    applying each one's consecutive sets to the other (as row numbers), until
    nothing changes.  A reduction only reshapes the block of the batch whose
    items it holds, so only the pairs touching that batch are looked at
    again.  Pairs whose sets cannot be applied are dropped."""
    pairs_of_batch = collections.defaultdict(list)
    for number, (_, consumer, sources) in enumerate(pairs):
        pairs_of_batch[batch_of[consumer[0]]].append(number)
        pairs_of_batch[batch_of[sources[0]]].append(number)
    queue = collections.deque(range(len(pairs)))
    queued = [True] * len(pairs)
    dropped = set()
    while queue:
        number = queue.popleft()
        queued[number] = False
        if number in dropped:
            continue
        _, consumer, sources = pairs[number]
        # A set read off one side's subtree is consecutive on that side
        # already: it only needs applying to the other.  (The two sides are
        # different batches, whose subtrees a reduction never merges.)
        sets = ([(rows, sources) for rows in _row_sets(tree, consumer, _rows(consumer))]
                + [(rows, consumer) for rows in _row_sets(tree, sources, _rows(sources))])
        for rows, items in sets:
            subset = [items[row] for row in rows]
            if tree.block(subset) is not None:
                continue
            if not tree.reduce(subset):
                dropped.add(number)
                break
            for other in pairs_of_batch[batch_of[items[0]]]:
                if not queued[other]:
                    queued[other] = True
                    queue.append(other)
    return [pair for number, pair in enumerate(pairs) if number not in dropped]


def _rows(items):
    return {item: row for row, item in enumerate(items)}


def _row_sets(tree, items, row_of):
    """GetSubtreeCons: the sets the tree keeps consecutive within ``items``
    (a P-node's leaves, a Q-node's neighbouring children), as row numbers;
    the set of all of them, consecutive already, left out."""
    node, run = tree.block(items)
    sets = []
    stack = [(node, run)]
    while stack:
        node, run = stack.pop()
        leaves = [items_below(child) for child in run]
        if _kind(node, run) == "P":
            rows = frozenset(row_of[item] for part in leaves for item in part)
            if len(rows) < len(items):
                sets.append(rows)
        else:
            for first, second in zip(leaves, leaves[1:]):
                sets.append(frozenset(row_of[item] for item in first + second))
        stack.extend((child, child.children) for child in run
                     if child.kind != "leaf")
    return sets


def _kind(node, run):
    """Two children may come in two orders only: treat them as a Q-node."""
    return "P" if node.kind == "P" and len(run) > 2 else "Q"


# -- DecideNodesOrder ---------------------------------------------------------
class _OrderTies:
    """The extended union-find of Algorithm 5.

    A node's *order* is a permutation: for a P-node the sequence of its
    child numbers in the walk, for a Q-node (0, 1) forwards or (1, 0)
    backwards.  Each node's parent link carries ``tie``, with
    order(node) = tie o order(parent), composing as tuples: (a o b)[t] =
    a[b[t]].  Roots are walked in the identity order.  No path compression,
    so a failed batch of ties can be undone; union by size keeps paths short.
    """

    def __init__(self):
        self.parent = {}
        self.tie = {}
        self.size = {}
        self.undo = []

    def find(self, node):
        """(root, T) with order(node) = T o order(root)."""
        total = None
        while node in self.parent:
            tie = self.tie[node]
            total = tie if total is None else _compose(total, tie)
            node = self.parent[node]
        return node, total

    def tie_orders(self, first, second, permutation):
        """Require order(second) = permutation o order(first); False if the
        earlier ties contradict it."""
        root_a, a = self.find(first)
        root_b, b = self.find(second)
        identity = tuple(range(len(permutation)))
        a = a or identity
        b = b or identity
        if root_a is root_b:
            return b == _compose(permutation, a)
        tie = _compose(_inverse(b), _compose(permutation, a))  # rb from ra
        if self.size.get(root_b, 1) > self.size.get(root_a, 1):
            root_a, root_b, tie = root_b, root_a, _inverse(tie)
        self.parent[root_b] = root_a
        self.tie[root_b] = tie
        self.size[root_a] = self.size.get(root_a, 1) + self.size.get(root_b, 1)
        self.undo.append(root_b)
        return True

    def mark(self):
        return len(self.undo)

    def roll_back(self, mark):
        while len(self.undo) > mark:
            node = self.undo.pop()
            root = self.parent.pop(node)
            del self.tie[node]
            self.size[root] -= self.size.get(node, 1)

    def order(self, node, count):
        _, total = self.find(node)
        return total or tuple(range(count))


def _compose(a, b):
    return tuple(a[t] for t in b)


def _inverse(permutation):
    inverse = [0] * len(permutation)
    for position, value in enumerate(permutation):
        inverse[value] = position
    return tuple(inverse)


def _tie_orders(tree, pair, orders):
    """ParseEquivNodeOrderPair and the unions: walk the consumer's and the
    operand's subtrees side by side and tie each node's order to its
    counterpart's.  False (and no ties kept) if they are not isomorphic or
    a tie contradicts earlier ones."""
    _, consumer, sources = pair
    consumer_rows, source_rows = _rows(consumer), _rows(sources)
    mark = orders.mark()
    stack = [(tree.block(consumer), tree.block(sources))]
    while stack:
        (node, run), (other, other_run) = stack.pop()
        if not run and not other_run:          # leaves
            if consumer_rows[node.item] != source_rows[other.item]:
                break
            continue
        kind = _kind(node, run)
        if len(run) != len(other_run) or kind != _kind(other, other_run):
            break
        rows = [frozenset(consumer_rows[item] for item in items_below(child))
                for child in run]
        other_rows = [frozenset(source_rows[item] for item in items_below(child))
                      for child in other_run]
        if kind == "Q":
            if other_rows == rows:
                permutation = (0, 1)
            elif other_rows == rows[::-1]:
                permutation = (1, 0)
            else:
                break
            # A run of a Q-node turns with the whole node.
            if node is not other and not orders.tie_orders(node, other, permutation):
                break
            if node is other and permutation != (0, 1):
                break
            matched = (zip(run, other_run) if permutation == (0, 1)
                       else zip(run, other_run[::-1]))
        else:
            position = {rows_: place for place, rows_ in enumerate(other_rows)}
            if set(position) != set(rows):
                break
            permutation = tuple(position[rows_] for rows_ in rows)
            if not orders.tie_orders(node, other, permutation):
                break
            matched = ((child, other_run[position[rows_]])
                       for child, rows_ in zip(run, rows))
        stack.extend(((child, child.children), (counterpart, counterpart.children))
                     for child, counterpart in matched)
    else:
        return True
    orders.roll_back(mark)
    return False


# -- GetLeafOrder -------------------------------------------------------------
def _leaf_order(tree, orders):
    order, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        if node.kind == "leaf":
            order.append(node.item)
            continue
        children = node.children
        decided = orders.order(node, len(children) if _kind(node, children) == "P" else 2)
        if _kind(node, children) == "P":
            children = [children[number] for number in decided]
        elif decided == (1, 0):
            children = children[::-1]
        stack.extend(reversed(children))
    return order
