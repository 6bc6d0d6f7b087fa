/* What the C files of subgraphjit._native share: VirtualNode's storage. */
#ifndef SUBGRAPHJIT_NATIVE_H
#define SUBGRAPHJIT_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Not tracked by the cyclic collector (no Py_TPFLAGS_HAVE_GC, so no
 * tp_traverse): a recording scope holds hundreds of thousands of nodes, and
 * scanning them was a large part of recording's cost.  That is sound only
 * because nodes cannot form reference cycles through their fields:
 * - operands and attrs hold values that existed when the node was recorded
 *   (earlier nodes, tensors, variables, Python values); the passes that
 *   rewrite inputs (pattern matching and fusion in search.py) replace them
 *   with earlier nodes only, so a node never reaches itself;
 * - entry, spec and site are shared, long-lived values (an op entry, an
 *   interned Spec, a code object and line) that do not refer to nodes;
 * - result and batched hold tensors (or lists of them), row an int.
 * tests/test_native.py checks that freed graphs leave nothing behind. */
#define INLINE_INPUTS 2

typedef struct Node {
    PyObject_HEAD
    union {
        long long id;               /* global, increasing: a topological order */
        struct Node *next_release;  /* while queued in node_dealloc */
    };
    int consumers;          /* nodes recorded with this one as an operand */
    unsigned int input_count : 30;
    unsigned int swallowed : 1;   /* inside a matched pattern, or an output
                                     a compiled program did not keep:
                                     computed only if asked for, not when
                                     its scope closes */
    unsigned int is_row : 1;      /* ``value`` is (batched, row) */
    PyObject *entry;        /* the op entry (OpEntry) */
    PyObject *attrs;        /* the op's other arguments, hashable */
    PyObject *spec;         /* output Spec (a tuple of them: multi-output) */
    /* None until evaluated; then the tf.Tensor (``result`` in Python), or,
     * with ``is_row``, (batched, row): the value is row ``row`` of the
     * batched tensor ``batched`` (``batched`` and ``row`` in Python), taken
     * out when asked for.  One field for both: a node holds one value. */
    PyObject *value;
    PyObject *site;         /* (code, line) of the user's call, or None */
    PyObject *weakrefs;
    /* The operands (nodes, tensors, variables, values), held: inline up
     * to INLINE_INPUTS, else a PyMem array whose address takes the inline
     * slots' place.  In the node rather than in a tuple of its own, so
     * that a walk over the graph reads one place per node; Python sees a
     * tuple (``inputs``).  Read them through node_inputs. */
    union {
        PyObject *inline_inputs[INLINE_INPUTS];
        PyObject **heap_inputs;
    };
} Node;

/* A recorded op costs its node and little else (issue 17 asks at most 100
 * bytes per op; benchmarks/record_cost.py measures it): a field more is a
 * decision, not an accident. */
_Static_assert(sizeof(Node) == 96, "VirtualNode's storage grew beyond 96 bytes");

/* Most inputs a node can have (input_count's width). */
#define MAX_INPUTS ((1 << 30) - 1)

static inline PyObject **
node_inputs(Node *node)
{
    return node->input_count > INLINE_INPUTS ? node->heap_inputs
                                             : node->inline_inputs;
}

extern PyTypeObject *node_type;   /* VirtualNode, made in _native.c */

/* slab.c: a VirtualNode's memory, in chunks filled in recording order. */
void *slab_alloc(void);   /* NULL with MemoryError set */
void slab_free(void *slot);
PyObject *slab_statistics(PyObject *module, PyObject *unused);

static inline int
is_node(PyObject *object)
{
    return Py_IS_TYPE(object, node_type);
}

/* A node's memory (its two cache lines: 96 bytes from a 32-byte boundary of
 * its chunk, slab.c), asked for before it is read: a
 * pass that reads nodes scattered in memory waits for each in turn
 * otherwise.  A prefetch never faults, so any pointer will do. */
static inline void
prefetch_node(const void *node)
{
    __builtin_prefetch(node);
    __builtin_prefetch((const char *)node + 64);
}

/* A new list of ``size`` slots for nodes only, or NULL with an exception
 * set.  Nodes are not tracked by Python's cyclic collector (no cycle
 * through one is ever found), so neither is a list of them: tracked, the
 * collections after a 256-tree inference scope visited every node of the
 * scope's lists, 4 ms each (BENCHMARKS.md).  Appending keeps it untracked. */
static inline PyObject *
node_list(Py_ssize_t size)
{
    PyObject *list = PyList_New(size);
    if (list != NULL)
        PyObject_GC_UnTrack(list);
    return list;
}

/* A node's value that is a row of a batched value: the pair (batched, row),
 * untracked by the collector, as node_list: it is referenced by its node
 * only, and every node of a scope holds one.  NULL with an exception set. */
static inline PyObject *
row_pair(PyObject *batched, PyObject *row)
{
    PyObject *pair = PyTuple_Pack(2, batched, row);
    if (pair != NULL)
        PyObject_GC_UnTrack(pair);
    return pair;
}

/* Input ``i`` of a node, borrowed: valid until its inputs are set again,
 * which Python code may do (hold a reference across a callback). */
static inline PyObject *
node_input(Node *node, Py_ssize_t i)
{
    return node_inputs(node)[i];
}

/* _native.c: replace a node's inputs by ``count`` ``items`` (new
 * references taken; the old ones dropped last, since dropping one may run
 * any code).  0, or -1 with an exception set and the node unchanged. */
int node_set_inputs(Node *node, PyObject *const *items, Py_ssize_t count);

/* A node's inputs as a new tuple (what Python sees), or NULL. */
PyObject *node_inputs_tuple(Node *node);

/* Unevaluated: no value yet, neither its own nor a row of a batched value.
 * A value deleted from Python (NULL) is not None, so such a node counts as
 * evaluated and is never read further. */
static inline int
unevaluated(Node *node)
{
    return node->value == Py_None;
}

extern PyObject *access_entry;    /* the ACCESS entry setup() was given, or NULL */

/* A BatchGraph operand that is a recorded node (_native.c). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t index;   /* in the graph, or -1: evaluated earlier */
    PyObject *pick;     /* an output number, or None: the whole node */
    PyObject *node;
} NodeOperand;

extern PyTypeObject *node_operand_type;

/* A new NodeOperand (a new reference, or NULL with an exception set). */
PyObject *node_operand_new(Py_ssize_t index, PyObject *pick, PyObject *node);

/* operands.c: a BatchGraph's operands and sources as arrays, filled by
 * describe_graph node by node: node i's operands are items[first[i] ..
 * first[i + 1]), its sources (the canonical graph indices it reads, each
 * once) sources[source_first[i] .. source_first[i + 1]). */
enum { OPERAND_EARLIER = -1, OPERAND_VALUE = -2 };
typedef struct {
    Py_ssize_t index;   /* the node's graph index (a duplicate's original),
                           OPERAND_EARLIER: a node evaluated before, or
                           OPERAND_VALUE: no node, a foreign value */
    Py_ssize_t pick;    /* the output read of a multi-output node, or -1 */
    PyObject *object;   /* the node (an access node's source), or the value */
} Operand;

typedef struct {
    PyObject_HEAD
    Py_ssize_t count, capacity;             /* nodes described, and room */
    Py_ssize_t *first, *source_first;       /* count + 1 each */
    Operand *items;
    Py_ssize_t item_count, item_capacity;
    Py_ssize_t *sources;
    Py_ssize_t source_count, source_capacity;
    PyObject **lists, **tuples;             /* what Python was given, per node */
    PyObject *nodes;   /* the tuple of the nodes described (each checked to
                          be a VirtualNode), or NULL */
} OperandTable;

extern PyTypeObject *operand_table_type;

/* operands.c: an immutable sequence of ints held as a C array: a
 * BatchGraph's per-node integers (``type_of``, ``duplicate_of``), which
 * the passes after describe_graph read as arrays rather than converting a
 * list of Python ints each (their conversions cost as much as describing
 * the graph).  Python reads it like a list, an int per item. */
PyObject *indices_new(const Py_ssize_t *items, Py_ssize_t count);
/* The items of an Indices object (its length in ``count``), or NULL
 * without an exception for anything else. */
const Py_ssize_t *indices_items(PyObject *object, Py_ssize_t *count);
/* ``value``, an int in [low, high), into ``out``: 0; else -1 with a
 * TypeError or ValueError naming ``what`` (and ``position``, if it is not
 * negative). */
int index_in(PyObject *value, Py_ssize_t low, Py_ssize_t high, const char *what,
             Py_ssize_t position, Py_ssize_t *out);
/* The ``count`` ints of an Indices object or of a list or tuple of ints,
 * each checked to be in [low, high), as a new PyMem array; NULL with a
 * TypeError or ValueError naming ``what`` (or MemoryError). */
Py_ssize_t *index_array(PyObject *sequence, Py_ssize_t count, Py_ssize_t low,
                        Py_ssize_t high, const char *what);

/* A new table with room for ``count`` nodes (NULL with an exception set).
 * The node being described is number ``count``: push its operands (the
 * table takes a reference to ``object``) and add its sources, then end it. */
OperandTable *operand_table_new(Py_ssize_t count);
int operand_table_push(OperandTable *table, Py_ssize_t index, Py_ssize_t pick,
                       PyObject *object);
int operand_table_add_source(OperandTable *table, Py_ssize_t source);
int operand_table_end_node(OperandTable *table);
/* The table of a Sources view (``table.sources``), or NULL for anything else. */
OperandTable *sources_table(PyObject *object);
int add_operand_types(PyObject *module);

/* _native.c: the spec of a non-empty list of Python ints (a new
 * reference), or NULL: with an exception set on failure, else the operand
 * is no such list. */
PyObject *int_list_spec(PyObject *operand);

/* analysis.c: a new list of ``count`` Python ints, or NULL with an
 * exception set. */
PyObject *int_list(const Py_ssize_t *items, Py_ssize_t count);

/* analysis.c: the batching analysis over integer arrays; adds its
 * functions to the module (0, or -1 with an exception set). */
int add_analysis_functions(PyObject *module);

/* match.c: pattern matching and replacement; the same contract. */
int add_match_functions(PyObject *module);

/* plan.c: a program's bookkeeping and write-back; the same contract. */
int add_plan_functions(PyObject *module);

/* fuse.c: joining pattern nodes; the same contract. */
int add_fuse_functions(PyObject *module);

#endif
