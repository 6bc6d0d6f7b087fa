"""The context: the one place that holds subgraphjit's global state.

Thesis section 5.1 names four duties; here is where each one lives:

* object tracking -- every VirtualNode gets a global id from a counter in
  ``_native`` (increasing, so ids are also a topological order).  The context keeps
  no table from ids to objects: a recorded node is referenced only by the
  user's own variables, by the nodes that consume it, and by the open
  evaluation scopes (``tf.batching()``, ``tf.GradientTape()``) until they close.
  Once a node is evaluated it drops its inputs, so nothing recorded outlives the
  user's references to it.
* frequent patterns -- ``patterns`` (signature -> Pattern, set by the
  optimizer when its collection stage ends; None until then).
* sessions -- ``session`` counts evaluations, so a pass can tag what it visited.
* parameters -- ``set_parameter`` / ``get_parameter``, validated against
  ``PARAMETERS``, with ``SUBGRAPHJIT_<KEY>`` environment variables as defaults.
"""

import collections
import dataclasses
import difflib
import gc
import os
import time
from typing import Any, Callable

from . import _native
from ._native import next_node_id, scope_leftovers  # next_node_id: the id the next node gets


@dataclasses.dataclass(frozen=True)
class Parameter:
    default: Any
    parse: Callable[[str], Any]  # from an environment variable's text
    check: Callable[[Any], bool]
    meaning: str


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _parse_flag(text):
    return text.strip().lower() in ("1", "true", "yes", "on")


def _is_flag(value):
    return isinstance(value, bool)


def _one_of(*choices):
    return lambda value: value in choices


# An inference scope smaller than twice the ``pipeline`` parameter (by the
# last inference scope's size) evaluates in two parts: the first at this share of
# that size, whose program runs while the rest records, and the rest when
# the scope closes.  At 25 trees of the SST Tree-LSTM (17,000 nodes):
# 0.91-0.92x the time of one program, against 0.94-0.96x for first shares of
# 0.4-0.5 and 0.97x for parts of 7,500 nodes (three, the last small)
# (BENCHMARKS.md).  Under MIN_PART nodes a part's own costs (its call's
# arguments, its program's steps) outweigh what it overlaps.
FIRST_SHARE = 0.35
MIN_PART = 5_000

PARAMETERS = {
    "mode": Parameter(
        "lazy", str, _one_of("lazy", "eager"),
        "'lazy' records VirtualNodes; 'eager' runs every op at once through "
        "TensorFlow (the debugging twin of every lazy path)"),
    "depth": Parameter(
        8, int, _positive_int,
        "P_Depth: depth limit of subgraph signatures (thesis 4.5)"),
    "freq": Parameter(
        1, int, _positive_int,
        "P_Freq: occurrences per input that make a subgraph frequent (thesis 4.1)"),
    "collect": Parameter(
        3, int, _positive_int,
        "P_Collect: minibatches used to collect pattern statistics (thesis 4.7; "
        "fewer, or part of one, once 50,000 recorded nodes are walked)"),
    "equivalence": Parameter(
        "signature", str, _one_of("shape", "structure", "signature"),
        "when two subgraphs are the same pattern (thesis 4.2): equal ops and "
        "shapes ('shape'), equal ops ('structure'), or equal ops with inputs "
        "told apart by dtype only ('signature')"),
    "granularity": Parameter(
        "auto", str, _one_of("auto", "op", "subgraph"),
        "the unit of work: single ops, or frequent subgraphs found over the "
        "first 'collect' minibatches, each compiled once (thesis chapter 4); "
        "'auto' (the default) collects the subgraphs, then times a few "
        "minibatches with each unit and keeps the faster (patterns/search.py)"),
    "scheduler": Parameter(
        "critical", str, _one_of("none", "depth", "agenda", "critical", "fsm"),
        "how batches are chosen: 'critical' (the default: critical path "
        "first, the type of the ready node farthest from the results), "
        "'agenda' (DyNet), "
        "'depth' (TensorFlow Fold), 'fsm' (ED-Batch: a policy learned by "
        "Q-learning on the first minibatch), or 'none' to run every node on "
        "its own"),
    "fuse": Parameter(
        True, _parse_flag, _is_flag,
        "join a pattern with the multi-output pattern whose outputs it reads "
        "into one compiled call, where that delays nothing (the Tree-LSTM's "
        "gates and memory cell: one launch per tree level instead of two)"),
    "layout": Parameter(
        "none", str, _one_of("none", "pq"),
        "row order of batched results: as scheduled ('none'), or planned "
        "with ED-Batch's PQ tree ('pq') so that operands are slices of "
        "earlier results instead of gathers"),
    "compile": Parameter(
        4, int, lambda value: _positive_int(value) or value == 0,
        "run an evaluation as one compiled TensorFlow call (batcher/plan.py, "
        "batcher/program.py) once its program's key is this many of the last "
        "16 evaluations' keys, so that a model whose keys keep changing "
        "never compiles (4, the default: faster than step by step for the "
        "example tree models, and for the SST Tree-LSTM's training and "
        "inference at minibatches of 25 and 256; see BENCHMARKS.md); "
        "0: never, every batch runs as its own op"),
    "overlap": Parameter(
        True, _parse_flag, _is_flag,
        "queue the backward (tape.gradient) and the optimizer update "
        "on an asynchronous TensorFlow executor, so that they run while "
        "the next minibatch records (overlap.py); False: every op runs "
        "where it is called"),
    "eager_scopes": Parameter(
        True, _parse_flag, _is_flag,
        "run a scope (tf.batching(), tf.GradientTape()) eagerly, recording "
        "nothing, at a line whose scopes had little to batch, where that "
        "measured faster (eager_scopes.py; a minibatch of one, a loop that "
        "reads each instance's values); False: every scope records"),
    "pipeline": Parameter(
        30_000, int, lambda value: _positive_int(value) or value == 0,
        "in inference (no tape could record), once a scope holds this many "
        "recorded nodes, evaluate them, up to where no later op read back "
        "(whole trees or sequences), while the rest of the scope records: "
        "their compiled program runs on another core (overlap.py), which "
        "needs 'overlap'; 0: a scope is evaluated only when it closes "
        "(30,000, the default: about 45 trees of the SST Tree-LSTM, so a "
        "minibatch of 256 evaluates in five parts and the rest; where the "
        "last inference scope recorded fewer than twice this many, as a "
        f"minibatch of 25 trees, one part of {FIRST_SHARE:.0%} of its count, "
        f"at least {MIN_PART:,} nodes, and the rest; see BENCHMARKS.md)"),
    "fsm_encoding": Parameter(
        "sort", str, _one_of("sort", "max", "base"),
        "the FSM scheduler's state: frontier types sorted by count ('sort'), "
        "their set plus the commonest ('max'), or their set ('base')"),
    "fsm_table": Parameter(
        "", str, lambda value: isinstance(value, str),
        "a file for the FSM scheduler's learned Q-table: loaded if it exists "
        "(no training), written after training otherwise; '' keeps it in memory"),
    "lower_bound": Parameter(
        False, _parse_flag, _is_flag,
        "compute ED-Batch's lower bound on batches per evaluation (costs "
        "one pass over the graph per node type)"),
    "debug": Parameter(
        False, _parse_flag, _is_flag,
        "print a summary after every evaluation"),
}


class ParameterError(ValueError):
    pass


def _unknown_parameter(key):
    close = difflib.get_close_matches(str(key), PARAMETERS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listing = "\n".join(f"  {name!r}: {p.meaning} (default {p.default!r})"
                        for name, p in PARAMETERS.items())
    return ParameterError(
        f"unknown parameter {key!r}{hint}; the parameters are:\n{listing}")


def _from_environment():
    values = {}
    for key, parameter in PARAMETERS.items():
        text = os.environ.get(f"SUBGRAPHJIT_{key.upper()}")
        if text is None:
            values[key] = parameter.default
            continue
        try:
            value = parameter.parse(text)
        except ValueError:
            value = text
        if not parameter.check(value):
            raise ParameterError(
                f"environment variable SUBGRAPHJIT_{key.upper()}={text!r} is not "
                f"a valid value for parameter {key!r}: {parameter.meaning}")
        values[key] = value
    return values


class Context:
    def __init__(self):
        self.parameters = _from_environment()
        self.lazy = self.parameters["mode"] == "lazy"
        # Open evaluation scopes, innermost last; ``pending`` is the innermost
        # one's list of recorded nodes (None outside every scope), read on the
        # recording hot path.
        self.scopes = []
        self.scopes_opened = 0   # ever (a granularity trial's turn ends at one)
        # The outermost scope's mode and first node id; the nodes the last
        # outermost inference scope recorded (None: none yet); the
        # pipeline's limit, and whether the scope has one part before its
        # close (FIRST_SHARE).
        self.scope_start = None
        self.last_inference_nodes = None
        self.pipeline_limit, self.one_part = 0, False
        self.pipeline_callback = None
        self.pending = None
        self.collector_was_on = True
        self.patterns = None
        # Granularity ``auto``, per mode ("training": under our
        # GradientTape; "inference"): the unit chosen, and the measured
        # seconds per node of each unit (search.Trial).
        self.granularity_chosen = {}
        self.granularity_trial = {}
        self.tapes = []   # our GradientTapes open, innermost last
        # The FSM scheduler's learned policy (batcher/schedulers/fsm.py), made
        # on first use; a new one is learned when its settings change.
        self.fsm_policy = None
        self.session = 0
        self.reset_stats()

    # -- parameters -------------------------------------------------------
    def set_parameter(self, key, value):
        parameter = PARAMETERS.get(key)
        if parameter is None:
            raise _unknown_parameter(key)
        if not parameter.check(value):
            raise ParameterError(
                f"{value!r} is not a valid value for parameter {key!r}: "
                f"{parameter.meaning}")
        changed = self.parameters[key] != value
        self.parameters[key] = value
        self.lazy = self.parameters["mode"] == "lazy"
        if changed and key in ("fsm_encoding", "fsm_table"):
            self.fsm_policy = None

    def get_parameter(self, key):
        if key not in PARAMETERS:
            raise _unknown_parameter(key)
        return self.parameters[key]

    @property
    def lazy(self):
        """Whether ops record (mode "lazy") or run at once: kept by the
        recorder (native/_native.c), which reads it at every recorded
        call.  (Looked up on this object, it took 20-30 ns of a recorded
        matmul's 150.)"""
        return _native.lazy()

    @lazy.setter
    def lazy(self, value):
        _native.set_lazy(bool(value))

    # -- scopes ------------------------------------------------------------
    @property
    def pending(self):
        return self._pending

    @pending.setter
    def pending(self, nodes):
        # Also given to the recorder (native/_native.c), which appends each
        # node it records there without looking the attribute up per op.
        # A scope's first ``pipeline`` nodes may be evaluated while the
        # rest records (evaluate.py gives ``pipeline_callback``).
        self._pending = nodes
        callback = self.pipeline_callback
        if nodes is None or callback is None:
            _native.set_pending(nodes)
        else:
            # (A limit under the parameter keeps the parameter's window.)
            _native.set_pending(nodes, self.pipeline_limit, callback,
                                max(self.pipeline_limit, self.parameters["pipeline"]))

    def _pipeline_limit(self, mode):
        """The nodes of a scope's parts, and whether it has only one before
        its close: the ``pipeline`` parameter, or for an inference scope
        whose last predecessor recorded fewer than twice it, one part of
        FIRST_SHARE of that (at least MIN_PART, at most the parameter).
        (A tape's scope is never pipelined: evaluate_so_far.)"""
        limit = self.parameters["pipeline"]
        last = self.last_inference_nodes
        if mode != "inference" or last is None or last >= 2 * limit:
            return limit, False
        return min(limit, max(MIN_PART, int(last * FIRST_SHARE))), True

    def pause_pipeline(self):
        """No pipelined evaluation in this scope (until another opens or
        closes)."""
        _native.set_pending(self._pending)

    def open_scope(self, mode):
        """A scope of ``mode``: "training" (a tape's) or "inference"."""
        # Everything recorded in a scope stays alive until the scope closes,
        # so the cyclic collector can free none of it; left on, it would
        # sweep the growing graph again and again (7 microseconds per op at
        # a minibatch of 256 trees).  It is paused until the outermost scope
        # closes, then resumes and collects whatever cycles the block made.
        if not self.scopes:
            self.collector_was_on = gc.isenabled()
            gc.disable()
            self.scope_start = (mode, next_node_id())
            self.pipeline_limit, self.one_part = self._pipeline_limit(mode)
        self.pending = []
        self.scopes.append(self.pending)
        self.scopes_opened += 1

    def close_scope(self):
        """Close the innermost scope; returns its nodes still to evaluate."""
        recorded = self.scopes.pop()
        self.pending = self.scopes[-1] if self.scopes else None
        mode, first = self.scope_start
        if not self.scopes and mode == "inference":
            self.last_inference_nodes = next_node_id() - first
        # A node nothing else references (not the user, not a later node)
        # can never be asked for its value, and no gradient reaches it, so
        # it is dropped, not evaluated: evaluated in one batch with live
        # nodes, a lookup of a variable's rows would add an entry to the
        # variable's IndexedSlices gradient that eager TensorFlow has not.
        # Usually a build in the scope has evaluated nearly everything, and
        # nodes inside patterns (``VirtualNode.swallowed``) are computed
        # only if asked for.  (In C: this visits every node recorded in the
        # scope.)
        return scope_leftovers(recorded)

    def resume_collector(self):
        """After the outermost scope closed and its nodes were evaluated:
        the cyclic collector back on, if it was.  It comes back on last:
        turned on while the scope's nodes were still being dropped, it
        swept all the young objects the scope made (a 256-tree minibatch's
        compiled program leaves 40,000 nodes, with their operand tuples,
        to drop: 270 ms); turned on before the scope's evaluation, the
        evaluation's first allocation swept them (1.4 ms a 256-tree
        minibatch)."""
        if not self.scopes and self.collector_was_on:
            gc.enable()

    # -- statistics ----------------------------------------------------------
    def reset_stats(self):
        self.first_node_id = next_node_id()
        self.nodes_evaluated = 0
        self.evaluations = 0
        self.pipelined_evaluations = 0   # of them, while the scope recorded
        # "<what> (<file>:<line>)" -> evaluations a read forced (forced.py),
        # and the batches they launched.
        self.forced_evaluations = collections.Counter()
        self.forced_batches = 0
        # For ForcedEvaluationWarning (forced.judge), given once per reset:
        # the reads that forced an evaluation since the program last asked
        # for one -> the batches those launched, and how many evaluations a
        # read forced while already among them.
        self.forced_since_asked = collections.Counter()
        self.forced_splits = 0
        self.forced_warned = False
        # "keras.layers.<class>: <reason>" -> calls with nodes that ran
        # Keras's own __call__ (dropin/layers.py).
        self.layers_not_recorded = collections.Counter()
        # tf.batching.map (concurrent.py): its batched evaluations, the
        # reads they served, and those by "<what> (<file>:<line>)".
        self.concurrent_rounds = 0
        self.concurrent_reads = 0
        self.concurrent_read_sites = collections.Counter()
        # Outermost scopes run eagerly, nothing recorded (eager_scopes.py).
        self.scopes_run_eagerly = 0
        self.evaluate_seconds = 0.0
        self.batching = {
            "batches": 0, "lower_bound": 0, "batch_sizes": collections.Counter(),
            "unbatched": collections.Counter(), "gathers": 0, "slices": 0,
            "stacks": 0, "bytes_gathered": 0, "duplicates_skipped": 0,
            "scheduler_fallbacks": 0, "fsm_training_seconds": 0.0,
            "fsm_training_iterations": 0,
            "layout_seconds": 0.0, "analysis_seconds": 0.0,
            "execute_seconds": 0.0,
            # Waiting, before an evaluation's first op, for the work the
            # previous one queued on the other core (overlap.py).
            "queue_wait_seconds": 0.0, "programs_compiled": 0,
            "programs_not_compiled": collections.Counter(),
            "compile_seconds": 0.0, "program_cache_hits": 0,
            "program_runs": 0, "program_steps": 0,
            # Training programs' backwards queued behind their forwards,
            # and those whose gradients tape.gradient took (program.py).
            "backwards_speculated": 0, "speculations_used": 0,
            # Evaluations with nothing or little to batch, run op by op in
            # recording order (batcher/execute.py, little_to_share).
            "unshared_evaluations": 0, "unshared_nodes": 0,
            # Batches over varying shapes (batcher/varying.py), by op name:
            # launches, and the instances they ran; output elements computed
            # for padding (only padded batches pad: rows are concatenated).
            "varying_batches": collections.Counter(),
            "varying_instances": collections.Counter(),
            "padding_elements": 0}
        self.inference_seconds = 0.0
        self.search_seconds = 0.0
        self.pattern_matches = 0
        self.pattern_fusions = 0
        self.pattern_traces = 0
        self.shape_inferences = 0
        self.started = time.perf_counter()

    def stats(self):
        """A fresh dict of counters since the last ``reset_stats()``."""
        return {
            "nodes_recorded": next_node_id() - self.first_node_id,
            "nodes_evaluated": self.nodes_evaluated,
            "evaluations": self.evaluations,
            "pipelined_evaluations": self.pipelined_evaluations,
            # Commonest first.
            "forced_evaluations": dict(self.forced_evaluations.most_common()),
            "forced_batches": self.forced_batches,
            "layers_not_recorded": dict(self.layers_not_recorded.most_common()),
            "concurrent_rounds": self.concurrent_rounds,
            "concurrent_reads": self.concurrent_reads,
            "concurrent_read_sites": dict(self.concurrent_read_sites.most_common()),
            "scopes_run_eagerly": self.scopes_run_eagerly,
            "shape_inferences": self.shape_inferences,
            "inference_seconds": self.inference_seconds,
            "patterns": len(self.patterns or {}),
            # ``granularity`` auto, per mode ("training", "inference"): the
            # unit chosen, once chosen, and the seconds per node measured.
            "granularity_chosen": dict(self.granularity_chosen),
            "granularity_trial": {mode: dict(trial) for mode, trial
                                  in self.granularity_trial.items()},
            "pattern_matches": self.pattern_matches,
            "pattern_fusions": self.pattern_fusions,
            "pattern_traces": self.pattern_traces,
            "search_seconds": self.search_seconds,
            "evaluate_seconds": self.evaluate_seconds,
            **{key: dict(value) if isinstance(value, collections.Counter) else value
               for key, value in self.batching.items()},
            # None unless the (costly) bound is asked for.
            "lower_bound": (self.batching["lower_bound"]
                            if self.parameters["lower_bound"] else None),
            # Wall time outside evaluation: the user's model code and its
            # recording, the thesis's "DAG construction" (timing each op
            # would cost a quarter of the recording budget).
            "construct_seconds": (time.perf_counter() - self.started
                                  - self.evaluate_seconds),
        }


context = Context()
