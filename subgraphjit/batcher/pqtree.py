"""PQ trees (Booth and Lueker 1976): every order of a set in which given
subsets are each consecutive, held in one tree.

Leaves are the items; a P-node's children may come in any order; a Q-node's
children come in their order or its reverse.  The tree's orders are those a
depth-first walk can give.  ``reduce(subset)`` adds a constraint -- the
subset must be consecutive -- by reshaping the smallest subtree holding the
subset (the *pertinent* subtree): each of its nodes is *full* (all its leaves
in the subset), *empty* (none) or *partial*, and the reduction templates turn
partial nodes into Q-nodes whose full children sit at one end (at either end
of a run, for the pertinent root).  If no order meets the constraint along
with the earlier ones, ``reduce`` returns False and leaves the tree as it
was.  This is the building block of ED-Batch's memory-layout planner
(section 3.2), which would make batched operands slices instead of gathers.

This version recomputes the pertinent subtree's labels from its leaves
instead of Booth and Lueker's bubbling, so a reduction costs the size of the
pertinent subtree rather than of the subset: simpler, and just as fast when
constraints are small, as batches' operands are.

>>> tree = PQTree("abcdef")
>>> tree.reduce("bc"), tree.reduce("cd"), tree.reduce("ef")
(True, True, True)
>>> tree
P[a, Q[b, c, d], P[e, f]]
>>> tree.count_orders()
24
>>> tree.reduce("bd")   # b, c, d are consecutive, c in the middle
False
>>> "".join(tree.frontier())
'abcdef'
"""

import math


class Node:
    __slots__ = ("kind", "children", "item", "parent")

    def __init__(self, kind, children=(), item=None):
        self.kind = kind            # "leaf", "P" or "Q"
        self.children = list(children)
        self.item = item
        # Set by PQTree._adopt once a reduction has succeeded, so a failed
        # one leaves every existing node as it was.  Until then a new node is
        # the only kind with no parent (besides the root).
        self.parent = None

    def __repr__(self):
        if self.kind == "leaf":
            return str(self.item)
        return f"{self.kind}[{', '.join(map(repr, self.children))}]"


class _Unsatisfiable(Exception):
    pass


def _group(nodes):
    """One node for some siblings that may come in any order."""
    return nodes[0] if len(nodes) == 1 else Node("P", nodes)


class PQTree:
    def __init__(self, items):
        items = list(items)
        self.leaf = {item: Node("leaf", item=item) for item in items}
        if len(self.leaf) != len(items):
            raise ValueError("PQTree: the items must be distinct")
        self.root = Node("P", self.leaf.values())
        self._adopt(self.root)

    @classmethod
    def of_groups(cls, groups):
        """The tree whose orders keep each of the disjoint ``groups``
        consecutive: built at once, where one reduction per group would cost
        the number of groups each.

        >>> PQTree.of_groups(["ab", "c", "def"])
        P[P[a, b], c, P[d, e, f]]
        """
        groups = [list(group) for group in groups if len(group)]
        tree = cls(item for group in groups for item in group)
        if len(groups) > 1:
            tree.root = Node("P", [
                tree.leaf[group[0]] if len(group) == 1
                else Node("P", [tree.leaf[item] for item in group])
                for group in groups])
            for leaf in tree.leaf.values():
                leaf.parent = None
            tree._adopt(tree.root)
        return tree

    def __repr__(self):
        return repr(self.root)

    def frontier(self):
        """One admissible order of the items."""
        return items_below(self.root)

    def count_orders(self):
        """How many orders the tree admits."""
        total, stack = 1, [self.root]
        while stack:
            node = stack.pop()
            if node.kind == "P":
                total *= math.factorial(len(node.children))
            elif node.kind == "Q":
                total *= 2
            stack.extend(node.children)
        return total

    def _pertinent(self, leaves):
        """Per ancestor of the leaves (by id), how many of them it holds; and
        the smallest subtree holding them all."""
        pertinent = {}
        for leaf in leaves:
            node = leaf
            while node is not None:
                pertinent[node] = pertinent.get(node, 0) + 1
                node = node.parent
        root = leaves[0]
        while pertinent[root] < len(leaves):
            root = root.parent
        return pertinent, root

    def block(self, subset):
        """The children whose leaves are exactly ``subset``, as (node, run):
        all of a node's children, or a run of a Q-node's; (leaf, []) for a
        single item.  None when the subset is not consecutive in every order
        the tree admits.

        >>> tree = PQTree("abcd")
        >>> tree.reduce("ab"), tree.reduce("bc")
        (True, True)
        >>> tree.block("bc")
        (Q[a, b, c], [b, c])
        >>> tree.block("ac") is None
        True
        """
        leaves = [self.leaf[item] for item in set(subset)]
        if len(leaves) == 1:
            return leaves[0], []
        pertinent, root = self._pertinent(leaves)
        children = [node for node in pertinent if node.parent is root]
        if root.kind != "Q":
            if len(children) < len(root.children):
                return None
            run = root.children
        else:
            places = sorted(map(root.children.index, children))
            if places[-1] - places[0] + 1 != len(places):
                return None
            run = root.children[places[0]:places[-1] + 1]
        if any(_leaf_count(child, pertinent[child]) != pertinent[child]
               for child in run):
            return None
        return root, run

    def reduce(self, subset):
        """Require the items of ``subset`` to be consecutive; False (and the
        tree unchanged) if that is impossible with the earlier constraints."""
        leaves = [self.leaf[item] for item in set(subset)]
        if len(leaves) <= 1 or len(leaves) == len(self.leaf):
            return True
        pertinent, root = self._pertinent(leaves)
        if _leaf_count(root, len(leaves)) == len(leaves):
            return True     # the leaves of one subtree: consecutive already
        try:
            replacement = self._arrange_root(root, pertinent)
        except _Unsatisfiable:
            return False
        parent = root.parent
        if parent is None:
            self.root = replacement
        else:
            parent.children[parent.children.index(root)] = replacement
        self._adopt(replacement)
        replacement.parent = parent
        return True

    @staticmethod
    def _adopt(node):
        """Point the children of the nodes a reduction built at them.  Old
        nodes reused by the reduction keep their children, so the walk stops
        at them."""
        stack = [node]
        while stack:
            node = stack.pop()
            for child in node.children:
                if child.parent is None:
                    stack.append(child)
                child.parent = node

    # -- the templates -----------------------------------------------------
    def _labels(self, node, pertinent):
        """(label, child or its children run from empty to full) per child:
        label 'E' empty, 'F' full, 'P' partial."""
        labelled = []
        for child in node.children:
            if child not in pertinent:
                labelled.append(("E", child))
            else:
                labelled.append(self._arrange(child, pertinent))
        return labelled

    def _arrange(self, node, pertinent):
        """A node below the pertinent root: ('F', node) if full, else
        ('P', [children from the empty end to the full end])."""
        if node.kind == "leaf":
            return "F", node
        labelled = self._labels(node, pertinent)
        if all(label == "F" for label, _ in labelled):
            return "F", node
        if node.kind == "P":     # templates P3 and P5
            empty = [child for label, child in labelled if label == "E"]
            full = [child for label, child in labelled if label == "F"]
            partial = [run for label, run in labelled if label == "P"]
            if len(partial) > 1:
                raise _Unsatisfiable
            return "P", (([_group(empty)] if empty else [])
                         + (partial[0] if partial else [])
                         + ([_group(full)] if full else []))
        # Q-node, template Q2: empties, at most one partial child, then
        # fulls -- in this order or reversed.
        for oriented in (labelled, labelled[::-1]):
            labels = "".join(label for label, _ in oriented)
            first = len(labels) - len(labels.lstrip("E"))
            rest = labels[first + 1:]
            if rest.strip("F") == "":
                run = []
                for label, part in oriented:
                    run.extend(part if label == "P" else [part])
                return "P", run
        raise _Unsatisfiable

    def _arrange_root(self, node, pertinent):
        """The pertinent root rebuilt so that its full leaves are one run."""
        labelled = self._labels(node, pertinent)
        if node.kind == "P":     # templates P2, P4 and P6
            empty = [child for label, child in labelled if label == "E"]
            full = [child for label, child in labelled if label == "F"]
            partial = [run for label, run in labelled if label == "P"]
            if len(partial) > 2:
                raise _Unsatisfiable
            middle = ((partial[0] if partial else [])
                      + ([_group(full)] if full else [])
                      + (partial[1][::-1] if len(partial) == 2 else []))
            core = middle[0] if len(middle) == 1 else Node(
                "Q" if partial else "P", middle)
            return Node("P", empty + [core]) if empty else core
        # Q-node, template Q3: empties, a partial child, fulls, a partial
        # child, empties; the pertinent children in one run.
        labels = "".join(label for label, _ in labelled)
        first = len(labels) - len(labels.lstrip("E"))
        last = len(labels.rstrip("E")) - 1
        if labels[first + 1:last].strip("F") != "":
            raise _Unsatisfiable
        children = []
        for position, (label, part) in enumerate(labelled):
            if label != "P":
                children.append(part)
            else:
                children.extend(part if position == first else part[::-1])
        return Node("Q", children)


def items_below(node):
    """The items of the leaves below a node, children in their order."""
    items, stack = [], [node]
    while stack:
        node = stack.pop()
        if node.kind == "leaf":
            items.append(node.item)
        else:
            stack.extend(reversed(node.children))
    return items


def _leaf_count(node, limit):
    """Leaves below the node, counting no further than ``limit`` + 1."""
    count, stack = 0, [node]
    while stack and count <= limit:
        node = stack.pop()
        if node.kind == "leaf":
            count += 1
        else:
            stack.extend(node.children)
    return count
