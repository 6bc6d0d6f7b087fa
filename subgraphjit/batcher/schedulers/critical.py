"""Critical path first: of the types ready to run, run the one with the
highest ready node, a node's height being the number of scheduled nodes on
the longest chain from it to a result (ties: the type that became ready
first).

A type whose nodes lie near the results (a tree's root, a loss) waits while
longer chains still have work, and its nodes then run together: on every
example model this needs no more batches than agenda, and on the
Tree-LSTMs, MV-RNN and the BiLSTM tagger it reaches ED-Batch's lower bound
(BENCHMARKS.md, "Schedulers").  The schedule
is made in C (``native/analysis.c``)."""

from ... import _native


class CriticalScheduler:
    name = "critical"

    def schedule(self, graph):
        return _native.critical_schedule(graph.type_of, graph.sources,
                                         len(graph.types))
