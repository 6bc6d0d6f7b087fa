"""The batching layer: run a minibatch's work of one batching type as one op.

``execute.execute(nodes)`` takes the unevaluated nodes of one evaluation
(in recording order), builds their BatchGraph (graph.py: types, shared
operands, duplicates), lets the chosen scheduler (schedulers/) pick
batches, and runs each batch as one op through the executor
(executor.py, rules.py).  ``set_parameter("scheduler", "none")`` turns
batching off (each node runs on its own, the reference behaviour).  With
``layout="pq"`` the rows of every batch are ordered first (layout.py, on
the PQ tree of pqtree.py) so that operands are slices of earlier results
rather than gathers.  With the ``compile`` parameter set, the batches are
instead planned as a program (plan.py) and run as one compiled call
(program.py) once its key recurs.  An evaluation with little to batch
(a minibatch of one, a plain loop's reads of one instance) runs op by op
in recording order instead, as eager TensorFlow would.

This file imports nothing: the PQ tree and the row layout need neither
TensorFlow nor the rest of the package.
"""
