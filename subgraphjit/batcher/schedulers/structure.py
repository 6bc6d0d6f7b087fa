"""What the schedulers read off a graph's structure alone: node depths,
and ED-Batch's lower bound on the number of batches."""

from ... import _native


def depths(graph):
    """Topological depth of every node: 1 + the deepest operand in the graph
    (nodes that are not scheduled add nothing)."""
    return _native.depths(graph.type_of, graph.sources)


def lower_bound(graph):
    """ED-Batch's lower bound (appendix A.3) on the number of batches: for
    each type, the most nodes of that type on one path of the graph, summed
    over types (nodes of one type on one path need separate batches)."""
    total = 0
    for node_type in range(len(graph.types)):
        chain = [0] * len(graph)
        longest = 0
        for index, sources in enumerate(graph.sources):
            deepest = max((chain[source] for source in sources), default=0)
            chain[index] = deepest + (graph.type_of[index] == node_type)
            longest = max(longest, chain[index])
        total += longest
    return total
