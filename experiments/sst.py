"""The Stanford Sentiment Treebank: PTB-style binary trees, labels 0-4.

The files live in ``../shared/data/sst`` beside the repository, or in
``$SUBGRAPHJIT_DATA/sst``.  One tree per line, e.g.
``(3 (2 (2 The) (2 Rock)) (4 ...))``; every internal node has two children.
"""

from dataclasses import dataclass
from typing import Optional

from experiments.data import data_directory

UNKNOWN = "<unk>"


@dataclass
class Tree:
    label: int
    word: Optional[str] = None       # leaves
    left: Optional["Tree"] = None    # internal nodes
    right: Optional["Tree"] = None

    @property
    def is_leaf(self):
        return self.word is not None

    def nodes(self):
        """Every node, children before parents (no recursion)."""
        order, stack = [], [self]
        while stack:
            node = stack.pop()
            order.append(node)
            if not node.is_leaf:
                stack.extend((node.left, node.right))
        return order[::-1]

    def words(self):
        return [node.word for node in self.nodes() if node.is_leaf]


def parse_tree(text):
    """Parse one PTB-style line with an explicit stack (deep trees are fine)."""
    tokens = text.replace("(", " ( ").replace(")", " ) ").split()
    stack, position = [], 0
    while position < len(tokens):
        token = tokens[position]
        if token == "(":
            stack.append([int(tokens[position + 1])])
            position += 2
        elif token == ")":
            label, *children = stack.pop()
            if children and all(isinstance(child, str) for child in children):
                # A leaf; a few words hold a space ("8 1\\/2").
                node = Tree(label, word=" ".join(children))
            elif len(children) == 2:
                node = Tree(label, left=children[0], right=children[1])
            else:
                raise ValueError(f"not a binary tree node: {text[:80]!r}")
            if not stack:
                return node
            stack[-1].append(node)
            position += 1
        else:
            stack[-1].append(token)
            position += 1
    raise ValueError(f"unbalanced tree: {text[:80]!r}")


def load_split(name, limit=None, binary=True):
    """Trees of ``train``, ``dev`` or ``test``.  ``binary`` drops neutral
    sentences (root label 2) and maps labels 0-1 to 0 and 3-4 to 1 on every
    node, as in the binary SST task; otherwise labels stay 0-4."""
    path = data_directory("sst") / f"{name}.txt"
    if not path.exists():
        raise FileNotFoundError(
            f"SST file {path} not found: put the data in ../shared/data/sst "
            f"beside the repository or set SUBGRAPHJIT_DATA")
    trees = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            tree = parse_tree(line)
            if binary:
                if tree.label == 2:
                    continue
                for node in tree.nodes():
                    node.label = 0 if node.label < 2 else 1 if node.label > 2 else -1
            trees.append(tree)
            if limit is not None and len(trees) >= limit:
                break
    return trees


class Vocabulary:
    """Word ids; id 0 is the unknown word."""

    def __init__(self, trees):
        self.ids = {UNKNOWN: 0}
        for tree in trees:
            for word in tree.words():
                self.ids.setdefault(word, len(self.ids))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, word):
        return self.ids.get(word, 0)
