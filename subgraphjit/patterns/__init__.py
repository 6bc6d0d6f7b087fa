"""The pattern optimizer (``granularity="subgraph"``): frequent subgraphs of
the recorded graph found and run as one compiled function each.

signature.py describes a node's subgraph to a depth as a signature and
matches known ones; search.py collects the frequent signatures over the
first minibatches, then replaces each occurrence by a pattern node (and
joins adjacent pattern nodes); codegen.py turns a pattern into Python source
and compiled functions."""
