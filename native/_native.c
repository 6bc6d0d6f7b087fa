/* subgraphjit._native: the recording hot path in C.
 *
 * Two things live here:
 *
 * - VirtualNode's storage.  The type is made here and completed in Python
 *   (subgraphjit/ir/node.py attaches the tensor protocol and the operators
 *   to it).  It is VirtualNode itself rather than a base class because
 *   CPython makes every class statement's instances tracked by the cyclic
 *   garbage collector (a heap class could hold its own instance), even with
 *   __slots__ = (); a type made here with PyType_FromSpec is not.
 *
 * - record(entry, inputs, attrs): one op recorded, the body of every
 *   generated wrapper (subgraphjit/ir/record.py holds the op entries and the
 *   Python callbacks used on rare paths: shape inference on a cache miss,
 *   specs of foreign operands, freezing unhashable attributes).
 *
 * Node ids come from a counter kept here: ``next_node_id()`` peeks at it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "native.h"

/* CPython 3.11's interpreter frames, for the call site (current_site):
 * internal headers, so only for the version whose layout they give, and
 * only where they are installed (else sys._getframe, as elsewhere). */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 \
    && defined(__has_include)
#if __has_include("internal/pycore_frame.h")
#define SITES_FROM_INTERPRETER_FRAMES 1
#endif
#endif
#ifdef SITES_FROM_INTERPRETER_FRAMES
#define Py_BUILD_CORE
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE
#endif

/* -- VirtualNode ---------------------------------------------------------- */

PyTypeObject *node_type;   /* VirtualNode */
static long long next_id;          /* the id the next node gets */

int
node_set_inputs(Node *node, PyObject *const *items, Py_ssize_t count)
{
    if (count > MAX_INPUTS) {
        PyErr_SetString(PyExc_OverflowError, "too many inputs");
        return -1;
    }
    PyObject **fresh = count <= INLINE_INPUTS ? NULL : PyMem_New(PyObject *, count);
    if (count > INLINE_INPUTS && fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* The old inputs are dropped last: kept aside (inline ones would be
     * overwritten) while the new ones are set. */
    PyObject **old = node_inputs(node), *aside[INLINE_INPUTS];
    Py_ssize_t old_count = node->input_count;
    if (old == node->inline_inputs) {
        memcpy(aside, old, old_count * sizeof(PyObject *));
        old = aside;
    }
    PyObject **target = fresh == NULL ? node->inline_inputs : fresh;
    for (Py_ssize_t i = 0; i < count; i++)
        target[i] = Py_NewRef(items[i]);
    if (fresh != NULL)
        node->heap_inputs = fresh;
    node->input_count = (unsigned int)count;
    for (Py_ssize_t i = 0; i < old_count; i++)
        Py_DECREF(old[i]);
    if (old != aside)
        PyMem_Free(old);
    return 0;
}

PyObject *
node_inputs_tuple(Node *node)
{
    PyObject *tuple = PyTuple_New(node->input_count);
    if (tuple != NULL)
        for (Py_ssize_t i = 0; i < node->input_count; i++)
            PyTuple_SET_ITEM(tuple, i, Py_NewRef(node_input(node, i)));
    return tuple;
}

static Node *
new_node(long long id, PyObject *entry, PyObject *const *inputs, Py_ssize_t count,
         PyObject *attrs, PyObject *spec, PyObject *site)
{
    Node *node = (Node *)slab_alloc();
    if (node == NULL)
        return NULL;
    PyObject_Init((PyObject *)node, node_type);
    node->id = id;
    node->consumers = 0;
    node->swallowed = 0;
    node->is_row = 0;
    node->input_count = 0;
    node->entry = Py_NewRef(entry);
    node->attrs = Py_NewRef(attrs);
    node->spec = Py_NewRef(spec);
    node->value = Py_NewRef(Py_None);
    node->site = Py_NewRef(site);
    node->weakrefs = NULL;
    if (node_set_inputs(node, inputs, count) < 0) {
        Py_DECREF(node);
        return NULL;
    }
    return node;
}

static PyObject *
node_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"id", "entry", "inputs", "attrs", "spec", "site",
                               NULL};
    long long id;
    PyObject *entry, *inputs, *attrs, *spec, *site;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LOOOOO:VirtualNode",
                                     keywords, &id, &entry, &inputs, &attrs,
                                     &spec, &site))
        return NULL;
    if (!PyTuple_Check(inputs) && !PyList_Check(inputs)) {
        PyErr_Format(PyExc_TypeError, "VirtualNode inputs must be a tuple or "
                     "list, not %.100s", Py_TYPE(inputs)->tp_name);
        return NULL;
    }
    return (PyObject *)new_node(id, entry, PySequence_Fast_ITEMS(inputs),
                                PySequence_Fast_GET_SIZE(inputs), attrs, spec,
                                site);
}

static PyObject *
node_get_inputs(PyObject *self, void *unused)
{
    return node_inputs_tuple((Node *)self);
}

static int
node_set_inputs_attribute(PyObject *self, PyObject *value, void *unused)
{
    if (value == NULL)   /* del node.inputs: none */
        return node_set_inputs((Node *)self, NULL, 0);
    if (!PyTuple_Check(value) && !PyList_Check(value)) {
        PyErr_Format(PyExc_TypeError, "VirtualNode inputs must be a tuple or "
                     "list, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    /* A list's items are copied before any is released. */
    PyObject *items = PySequence_Tuple(value);
    if (items == NULL)
        return -1;
    int done = node_set_inputs((Node *)self, PySequence_Fast_ITEMS(items),
                               PyTuple_GET_SIZE(items));
    Py_DECREF(items);
    return done;
}

/* ``result``, ``batched`` and ``row``: the node's one ``value`` seen as
 * the three fields Python code reads (native.h).  Setting ``result``
 * replaces a row of a batched value; setting ``batched`` replaces a
 * result, and keeps the row given before (set ``batched`` first, then
 * ``row``); setting ``batched`` to None forgets the row (a result stays). */
static PyObject *
row_part(Node *node, Py_ssize_t part)
{
    if (!node->is_row || node->value == NULL)
        Py_RETURN_NONE;
    return Py_NewRef(PyTuple_GET_ITEM(node->value, part));
}

static PyObject *
node_get_result(PyObject *self, void *unused)
{
    Node *node = (Node *)self;
    if (node->value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "result");
        return NULL;
    }
    return node->is_row ? Py_NewRef(Py_None) : Py_NewRef(node->value);
}

static int
node_set_result(PyObject *self, PyObject *value, void *unused)
{
    Node *node = (Node *)self;
    node->is_row = 0;
    Py_XSETREF(node->value, Py_XNewRef(value));   /* (del: NULL) */
    return 0;
}

static PyObject *
node_get_batched(PyObject *self, void *unused)
{
    return row_part((Node *)self, 0);
}

static PyObject *
node_get_row(PyObject *self, void *unused)
{
    return row_part((Node *)self, 1);
}

/* Sets ``value`` to (batched, row); 0, or -1 with an exception set. */
static int
set_row(Node *node, PyObject *batched, PyObject *row)
{
    PyObject *pair = row_pair(batched, row);
    if (pair == NULL)
        return -1;
    node->is_row = 1;
    Py_XSETREF(node->value, pair);
    return 0;
}

static int
node_set_batched(PyObject *self, PyObject *batched, void *unused)
{
    Node *node = (Node *)self;
    if (batched == NULL || batched == Py_None) {
        if (node->is_row) {
            node->is_row = 0;
            Py_XSETREF(node->value, Py_NewRef(Py_None));
        }
        return 0;
    }
    PyObject *row = node->is_row && node->value != NULL
                    ? PyTuple_GET_ITEM(node->value, 1) : Py_None;
    Py_INCREF(row);
    int done = set_row(node, batched, row);
    Py_DECREF(row);
    return done;
}

static int
node_set_row(PyObject *self, PyObject *row, void *unused)
{
    Node *node = (Node *)self;
    if ((!node->is_row || node->value == NULL) && (row == NULL || row == Py_None))
        return 0;   /* no batched value, no row */
    if (!node->is_row || node->value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "row is set after batched: "
                        "this node holds no batched value");
        return -1;
    }
    PyObject *batched = Py_NewRef(PyTuple_GET_ITEM(node->value, 0));
    int done = set_row(node, batched, row == NULL ? Py_None : row);
    Py_DECREF(batched);
    return done;
}

static PyObject *
node_get_swallowed(PyObject *self, void *unused)
{
    return PyBool_FromLong(((Node *)self)->swallowed);
}

static int
node_set_swallowed(PyObject *self, PyObject *value, void *unused)
{
    int truth = value == NULL ? 0 : PyObject_IsTrue(value);
    if (truth < 0)
        return -1;
    ((Node *)self)->swallowed = truth;
    return 0;
}

static PyGetSetDef node_getset[] = {
    {"inputs", node_get_inputs, node_set_inputs_attribute,
     "operands: VirtualNodes, tensors, variables or Python values (a tuple; "
     "assigning a tuple or list replaces them)", NULL},
    {"result", node_get_result, node_set_result,
     "the tf.Tensor once evaluated, else None", NULL},
    {"batched", node_get_batched, node_set_batched,
     "a batched value holding this node's value as a row, else None", NULL},
    {"row", node_get_row, node_set_row,
     "the row of ``batched`` holding this node's value", NULL},
    {"swallowed", node_get_swallowed, node_set_swallowed,
     "inside a matched pattern (or an output a compiled program did not "
     "keep): computed only if asked for, not when its scope closes", NULL},
    {NULL},
};

/* Freeing a node drops its inputs, which may free theirs: a chain of 100,000
 * recorded ops would free itself 100,000 C calls deep and overflow the C
 * stack.  (CPython's trashcan, which bounds this for containers, works only
 * on objects the collector tracks.)  So below a small depth nodes are queued
 * -- linked through their id, which nobody reads any more -- and the
 * outermost call frees the queue in a loop. */
#define RELEASE_DEPTH 64
static int release_depth;
static Node *release_queue;

static void
node_release(Node *node)
{
    PyTypeObject *type = Py_TYPE(node);
    PyObject **inputs = node_inputs(node);
    for (Py_ssize_t i = 0; i < node->input_count; i++)
        Py_DECREF(inputs[i]);
    if (inputs != node->inline_inputs)
        PyMem_Free(inputs);
    Py_XDECREF(node->entry);
    Py_XDECREF(node->attrs);
    Py_XDECREF(node->spec);
    Py_XDECREF(node->value);
    Py_XDECREF(node->site);
    slab_free(node);
    Py_DECREF(type);        /* instances of a heap type own a reference */
}

static void
node_dealloc(PyObject *self)
{
    Node *node = (Node *)self;
    if (node->weakrefs != NULL)
        PyObject_ClearWeakRefs(self);
    if (release_depth >= RELEASE_DEPTH) {
        node->next_release = release_queue;
        release_queue = node;
        return;
    }
    release_depth++;
    node_release(node);
    if (release_depth == 1) {
        while (release_queue != NULL) {
            Node *next = release_queue;
            release_queue = next->next_release;
            node_release(next);
        }
    }
    release_depth--;
}

static PyMemberDef node_members[] = {
    {"id", T_LONGLONG, offsetof(Node, id), 0,
     "global id, increasing: ids are a topological order"},
    {"consumers", T_INT, offsetof(Node, consumers), 0,
     "nodes recorded with this one as an operand"},
    {"entry", T_OBJECT_EX, offsetof(Node, entry), 0, "the op entry"},
    {"attrs", T_OBJECT_EX, offsetof(Node, attrs), 0,
     "the op's other arguments, hashable"},
    {"spec", T_OBJECT_EX, offsetof(Node, spec), 0, "output dtype and shape"},
    {"site", T_OBJECT_EX, offsetof(Node, site), 0,
     "(code object, line) of the user's call, for error messages"},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(Node, weakrefs), READONLY},
    {NULL},
};

/* Defined with record, below. */
static PyObject *node_add(PyObject *, PyObject *), *node_subtract(PyObject *, PyObject *),
    *node_multiply(PyObject *, PyObject *), *node_true_divide(PyObject *, PyObject *),
    *node_floor_divide(PyObject *, PyObject *), *node_remainder(PyObject *, PyObject *),
    *node_matrix_multiply(PyObject *, PyObject *), *node_and(PyObject *, PyObject *),
    *node_or(PyObject *, PyObject *), *node_xor(PyObject *, PyObject *),
    *node_negative(PyObject *), *node_absolute(PyObject *), *node_invert(PyObject *),
    *node_power(PyObject *, PyObject *, PyObject *);

static PyType_Slot node_slots[] = {
    {Py_nb_add, node_add},
    {Py_nb_subtract, node_subtract},
    {Py_nb_multiply, node_multiply},
    {Py_nb_true_divide, node_true_divide},
    {Py_nb_floor_divide, node_floor_divide},
    {Py_nb_remainder, node_remainder},
    {Py_nb_power, node_power},
    {Py_nb_matrix_multiply, node_matrix_multiply},
    {Py_nb_and, node_and},
    {Py_nb_or, node_or},
    {Py_nb_xor, node_xor},
    {Py_nb_negative, node_negative},
    {Py_nb_absolute, node_absolute},
    {Py_nb_invert, node_invert},
    {Py_tp_new, node_new},
    {Py_tp_dealloc, node_dealloc},
    {Py_tp_members, node_members},
    {Py_tp_getset, node_getset},
    {0, NULL},
};

/* No Py_TPFLAGS_BASETYPE: a subclass would be tracked by the collector. */
static PyType_Spec node_spec = {
    .name = "subgraphjit.ir.node.VirtualNode",
    .basicsize = sizeof(Node),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = node_slots,
};

/* -- NodeOperand ------------------------------------------------------------ */

/* A BatchGraph operand that is a recorded node (batcher/graph.py).  Made
 * here, not as a Python class: a graph of a 256-tree minibatch has 360,000
 * of them, which a class with __init__ cost about 100 ns each to make and
 * as much to free, and which the planner's C reads as fields rather than
 * attributes.  Not tracked by the cyclic collector: it refers to a node
 * and to an int or None, none of which refers to an operand. */
PyTypeObject *node_operand_type;

PyObject *
node_operand_new(Py_ssize_t index, PyObject *pick, PyObject *node)
{
    NodeOperand *operand = PyObject_New(NodeOperand, node_operand_type);
    if (operand == NULL)
        return NULL;
    operand->index = index;
    operand->pick = Py_NewRef(pick);
    operand->node = Py_NewRef(node);
    return (PyObject *)operand;
}

static PyObject *
node_operand_py_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"index", "pick", "node", NULL};
    Py_ssize_t index;
    PyObject *pick, *node;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nOO:NodeOperand", keywords,
                                     &index, &pick, &node))
        return NULL;
    if (index < -1 || (pick != Py_None && !PyLong_Check(pick)) || !is_node(node)) {
        PyErr_SetString(PyExc_TypeError, "NodeOperand(index >= -1, pick: int or None, "
                        "node: a VirtualNode)");
        return NULL;
    }
    return node_operand_new(index, pick, node);
}

static void
node_operand_dealloc(PyObject *self)
{
    NodeOperand *operand = (NodeOperand *)self;
    PyTypeObject *type = Py_TYPE(self);
    Py_DECREF(operand->pick);
    Py_DECREF(operand->node);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMemberDef node_operand_members[] = {
    {"index", T_PYSSIZET, offsetof(NodeOperand, index), READONLY,
     "the node's index in the graph, -1: evaluated earlier"},
    {"pick", T_OBJECT, offsetof(NodeOperand, pick), READONLY,
     "the output read of a multi-output node, else None"},
    {"node", T_OBJECT, offsetof(NodeOperand, node), READONLY, "the VirtualNode"},
    {NULL},
};

static PyType_Slot node_operand_slots[] = {
    {Py_tp_new, node_operand_py_new},
    {Py_tp_dealloc, node_operand_dealloc},
    {Py_tp_members, node_operand_members},
    {Py_tp_doc, "An operand that is a recorded node: in the graph (index >= 0) "
                "or evaluated earlier (index -1); pick selects one output of a "
                "multi-output node."},
    {0, NULL},
};

static PyType_Spec node_operand_spec = {
    .name = "subgraphjit.batcher.graph.NodeOperand",
    .basicsize = sizeof(NodeOperand),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = node_operand_slots,
};

/* -- the call site ---------------------------------------------------------- */

/* A recorded op's site is the (code, line) of the user's call: the frame
 * above the wrapper that called record.  Lines are found by scanning the
 * code's line table, so sites are cached per (code, instruction offset):
 * one tuple per call site in the user's code, shared by every node
 * recorded there.  The cache holds references to the code objects, so a
 * slot's key cannot be reused by another code object. */
#define SITE_SLOTS 1024
static struct {
    PyObject *code;
    int offset;
    PyObject *site;         /* (code, line) */
} site_cache[SITE_SLOTS];

/* The site of instruction ``offset`` (in bytes, or -1: none yet) of
 * ``code`` (borrowed), cached. */
static PyObject *
site_at(PyObject *code, int offset)
{
    size_t slot = (((size_t)code >> 4) ^ ((size_t)offset * 2654435761u))
                  % SITE_SLOTS;
    if (site_cache[slot].code == code && site_cache[slot].offset == offset)
        return Py_NewRef(site_cache[slot].site);
    PyObject *site = Py_BuildValue(
        "(Oi)", code, PyCode_Addr2Line((PyCodeObject *)code, offset));
    if (site != NULL) {
        Py_XSETREF(site_cache[slot].site, Py_NewRef(site));
        site_cache[slot].code = code;   /* kept alive by the site */
        site_cache[slot].offset = offset;
    }
    return site;
}

/* The site of the running Python frame (``above`` 0: for a C function the
 * user's line called, a Recorder or an operator) or of the one above it (1:
 * the generated wrapper's caller), or None where there is none. */
static PyObject *
current_site(int above)
{
#ifdef SITES_FROM_INTERPRETER_FRAMES
    /* The frame sys._getframe(above) would give (the previous complete
     * one), read in place: no call, and no frame object made for the
     * user's frame.  Through sys._getframe, an op recorded from a frame of
     * its own took 250 ns against 180, and the Tree-LSTM's recording 4-8%
     * longer; through PyEval_GetFrame (a frame object made for each user
     * frame), a Recorder's or an operator's site took 2-3% of recording
     * it (BENCHMARKS.md). */
    _PyInterpreterFrame *frame = PyThreadState_Get()->cframe->current_frame;
    for (int up = 0; up < above && frame != NULL; up++) {
        do {
            frame = frame->previous;
        } while (frame != NULL && _PyFrame_IsIncomplete(frame));
    }
    if (frame == NULL)
        Py_RETURN_NONE;
    int last = _PyInterpreterFrame_LASTI(frame);
    return site_at((PyObject *)frame->f_code,
                   last < 0 ? -1 : last * (int)sizeof(_Py_CODEUNIT));
#else
    /* sys._getframe(above) makes no frame object for the wrapper
     * (PyEval_GetFrame would). */
    static PyObject *getframe, *levels[2];   /* sys._getframe, 0 and 1 */
    if (getframe == NULL) {
        levels[0] = PyLong_FromLong(0);
        levels[1] = PyLong_FromLong(1);
        getframe = Py_XNewRef(PySys_GetObject("_getframe"));
        if (levels[0] == NULL || levels[1] == NULL || getframe == NULL) {
            Py_CLEAR(levels[0]);
            Py_CLEAR(levels[1]);
            Py_CLEAR(getframe);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "sys._getframe is missing");
            return NULL;
        }
    }
    PyObject *frame = PyObject_Vectorcall(getframe, &levels[above], 1, NULL);
    if (frame == NULL) {
        /* Called with no Python caller above: no site to name. */
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!PyFrame_Check(frame)) {
        Py_DECREF(frame);
        PyErr_SetString(PyExc_TypeError, "sys._getframe returned no frame");
        return NULL;
    }
    PyObject *code = (PyObject *)PyFrame_GetCode((PyFrameObject *)frame);
    PyObject *site = site_at(code, PyFrame_GetLasti((PyFrameObject *)frame));
    Py_DECREF(code);
    Py_DECREF(frame);
    return site;
#endif
}

/* -- record ----------------------------------------------------------------- */

/* Python callbacks and values, given once by setup(). */
static PyObject *context;          /* subgraphjit.context.context */
static PyObject *not_lazy;         /* subgraphjit.ir.spec.NotLazy (set_operators) */
/* Whether ops record: ``context.lazy``, a property kept here (set_lazy). */
static int lazy_mode;
static PyObject *spec_of_foreign;  /* spec of an operand that is no node */
static PyObject *infer;            /* _infer(entry, inputs, attrs, key, site) */
static PyObject *freeze;           /* hashable form of attributes */
PyObject *access_entry;            /* ACCESS: output i of a multi-output op */
static PyObject *scalar_specs;     /* {int: Spec, float: ..., bool: ...} */
static PyObject *variable_types;   /* {type of each variable seen} */

static PyObject *str_cache, *str_multi_output, *str_append,
                *str_variable_spec, *str_datatype_enum, *str_shape_tuple;
static PyObject *eager_tensor_type;  /* TensorFlow's EagerTensor */

/* Attributes of output i of a multi-output op, (i,), shared by all. */
#define SHARED_INDICES 16
static PyObject *index_attrs[SHARED_INDICES];

/* Per op entry, its spec cache (``entry.cache``, a dict) and whether it
 * is multi-output: read once, not as two attribute lookups per op.  The
 * cache dict is made with the entry (ir/record.py); multi_output may be
 * learnt by shape inference (a generic entry's, dropin/dispatch.py), so it
 * is read again after each (``forget_entry``).  The table holds the entry,
 * so no other entry takes its address. */
#define ENTRY_SLOTS 256
static struct {
    PyObject *entry, *cache;
    int multi_output;
} entry_table[ENTRY_SLOTS];

/* The op entry's cache (borrowed) and multi-output flag, or NULL with an
 * exception set. */
static PyObject *
entry_cache(PyObject *op_entry, int *multi_output)
{
    size_t slot = ((size_t)op_entry >> 4) % ENTRY_SLOTS;
    if (entry_table[slot].entry != op_entry) {
        PyObject *cache = PyObject_GetAttr(op_entry, str_cache);
        if (cache == NULL)
            return NULL;
        if (!PyDict_Check(cache)) {
            Py_DECREF(cache);
            PyErr_SetString(PyExc_TypeError, "entry.cache must be a dict");
            return NULL;
        }
        PyObject *multi = PyObject_GetAttr(op_entry, str_multi_output);
        int is_multi = multi == NULL ? -1 : PyObject_IsTrue(multi);
        Py_XDECREF(multi);
        if (is_multi < 0) {
            Py_DECREF(cache);
            return NULL;
        }
        Py_XSETREF(entry_table[slot].cache, cache);
        Py_XSETREF(entry_table[slot].entry, Py_NewRef(op_entry));
        entry_table[slot].multi_output = is_multi;
    }
    *multi_output = entry_table[slot].multi_output;
    return entry_table[slot].cache;
}

static void
forget_entry(PyObject *op_entry)
{
    size_t slot = ((size_t)op_entry >> 4) % ENTRY_SLOTS;
    if (entry_table[slot].entry == op_entry) {
        Py_CLEAR(entry_table[slot].entry);
        Py_CLEAR(entry_table[slot].cache);
    }
}

/* ``context.pending``, which the context gives here whenever it changes
 * (set_pending): the innermost scope's list of recorded nodes, or None.
 * Once it holds ``pending_limit`` nodes (0: never), a later record may
 * first call ``pending_full`` (evaluate.py's pipelined evaluation) with a
 * position in the list: it evaluates the nodes before it, or says not now
 * by giving a limit of 0. */
static PyObject *pending_nodes, *pending_full;
static Py_ssize_t pending_limit, pending_window;

/* Where a part may end: the list's length when an op that reads no
 * recorded node (a leaf's lookup, say) was about to be recorded, and the
 * id its node got.  Such a point is a clean cut while no op recorded
 * after it reads an unevaluated node recorded before it: then the nodes
 * before it are whole instances (trees, sequences), and the part
 * evaluated early holds the kinds of a whole scope.  A cut inside a tree
 * (at its right subtree's first leaf, whose parent later reads the left
 * subtree's outputs) leaves cells whose patterns reach into the part
 * before; their ops then run as kinds of their own, in programs of their
 * own (at 256 trees: 7-14 kinds a part, against 4 for a whole scope).
 * The clean ones, oldest first (at most CUTS: the oldest are the ones
 * taken); an op reading an older node pops every newer one.  A cut is
 * taken once a window of ``pending_window`` nodes, 1/CUT_WINDOW of the
 * limit (or of the larger one given: set_pending's ``window_of``), has
 * been recorded after it and it is still clean: no instance of a scope
 * that holds ``pending_limit`` nodes is likely to read that far back (the
 * SST Tree-LSTM: 1,250 nodes at the default limit, against about 660 a
 * tree; only a right subtree longer than that, in a sentence of over 40
 * words, can be cut from its parent; a smaller limit for a smaller scope
 * keeps the default's window).  The window's
 * nodes always go to the next part, the last part too, which nothing
 * overlaps: so it is small.  If no cut is clean when the list holds
 * twice the limit (an instance that large: a long sequence), the part
 * ends at the next op that reads no recorded node, wherever it is. */
typedef struct {
    long long id;
    Py_ssize_t position;
} Cut;
enum { CUTS = 64, CUT_WINDOW = 16 };
static Cut cuts[CUTS];
static int cut_count;

/* A count argument of set_pending: 0 with *count set, or -1 with an
 * exception set (not an int, or negative). */
static int
count_argument(PyObject *given, const char *name, Py_ssize_t *count)
{
    *count = PyLong_AsSsize_t(given);
    if (*count == -1 && PyErr_Occurred())
        return -1;
    if (*count < 0) {
        PyErr_Format(PyExc_ValueError, "set_pending: %s is negative", name);
        return -1;
    }
    return 0;
}

static PyObject *
set_pending(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t limit = 0, window_of = -1;
    if (nargs < 1 || nargs > 4 || (nargs >= 3 && !PyCallable_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError,
                        "set_pending(nodes[, limit[, callback[, window_of]]]) takes a "
                        "list or None, an int, a callable and an int");
        return NULL;
    }
    if ((nargs >= 2 && count_argument(args[1], "the limit", &limit) < 0)
            || (nargs == 4 && count_argument(args[3], "window_of", &window_of) < 0))
        return NULL;
    if (nargs >= 3)
        Py_XSETREF(pending_full, Py_NewRef(args[2]));
    if (limit > 0 && pending_full == NULL) {
        PyErr_SetString(PyExc_ValueError,
                        "set_pending: a limit needs a callback, given once");
        return NULL;
    }
    Py_XSETREF(pending_nodes, Py_NewRef(args[0]));
    pending_limit = limit;
    pending_window = (window_of >= 0 ? window_of : limit) / CUT_WINDOW;
    cut_count = 0;   /* (positions in another list, or none wanted) */
    Py_RETURN_NONE;
}

/* Call back to evaluate the pending nodes before ``position``.  The
 * cuts after it are forgotten: the list's rest is shorter than the limit,
 * and the next part's cuts come after the limit. */
static int
cut_pending(Py_ssize_t position)
{
    cut_count = 0;
    PyObject *at = PyLong_FromSsize_t(position);
    PyObject *done = at == NULL ? NULL : PyObject_CallOneArg(pending_full, at);
    Py_XDECREF(at);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* Before an op on ``inputs`` is recorded (every node recorded so far is
 * whole): keep the clean cuts clean, and end a part where one is due.
 * (Cuts are taken only past the limit, and forgotten whenever the list
 * shrinks or changes, so a list under the limit has none.) */
static int
pending_full_check(PyObject *const *inputs, Py_ssize_t count)
{
    if (pending_limit == 0 || pending_nodes == NULL || !PyList_CheckExact(pending_nodes))
        return 0;
    Py_ssize_t size = PyList_GET_SIZE(pending_nodes);
    if (size < pending_limit)
        return 0;
    int reads_node = 0;
    long long oldest = LLONG_MAX;   /* the oldest unevaluated node read */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *operand = inputs[i];
        if (Py_IS_TYPE(operand, node_type)) {
            reads_node = 1;
            if (unevaluated((Node *)operand) && ((Node *)operand)->id < oldest)
                oldest = ((Node *)operand)->id;
        }
    }
    while (cut_count > 0 && cuts[cut_count - 1].id > oldest)
        cut_count--;
    if (cut_count > 0 && next_id - cuts[0].id > pending_window)
        return cut_pending(Py_MIN(cuts[0].position, size));
    if (reads_node)
        return 0;
    if (cut_count == 0 && size >= 2 * pending_limit)
        return cut_pending(size);
    if (cut_count < CUTS)
        cuts[cut_count++] = (Cut){next_id, size};
    return 0;
}

static int
append_pending(PyObject *node)
{
    if (pending_nodes == NULL || pending_nodes == Py_None)
        return 0;
    PyObject *pending = Py_NewRef(pending_nodes);   /* (append may run code) */
    int status = 0;
    if (PyList_CheckExact(pending)) {
        status = PyList_Append(pending, node);
    }
    else if (pending != Py_None) {
        PyObject *done = PyObject_CallMethodOneArg(pending, str_append, node);
        status = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    Py_DECREF(pending);
    return status;
}

/* Specs of lists of Python ints, by length: ``[word_ids[word]]`` given to
 * an embedding lookup is the commonest foreign operand after variables, and
 * spec_of_foreign would convert each with NumPy. */
static PyObject *int_list_specs;   /* {length: Spec} */

/* The spec ``table`` keeps under ``key`` (stolen), else spec_of_foreign's
 * for ``operand``, kept there: a new reference, or NULL. */
static PyObject *
remembered_spec(PyObject *table, PyObject *key, PyObject *operand)
{
    if (key == NULL)
        return NULL;
    PyObject *spec = Py_XNewRef(PyDict_GetItemWithError(table, key));
    if (spec == NULL && !PyErr_Occurred()) {
        spec = PyObject_CallOneArg(spec_of_foreign, operand);
        if (spec != NULL && PyDict_SetItem(table, key, spec) < 0)
            Py_CLEAR(spec);
    }
    Py_DECREF(key);
    return spec;
}

PyObject *
int_list_spec(PyObject *operand)
{
    if (!PyList_CheckExact(operand) || int_list_specs == NULL)
        return NULL;
    Py_ssize_t length = PyList_GET_SIZE(operand);
    if (length == 0)
        return NULL;
    for (Py_ssize_t i = 0; i < length; i++) {
        PyObject *item = PyList_GET_ITEM(operand, i);
        int overflow;
        if (!PyLong_CheckExact(item))
            return NULL;   /* bools, floats, nested lists: the general path */
        (void)PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow)
            return NULL;   /* beyond int64: NumPy's verdict, not ours */
    }
    return remembered_spec(int_list_specs, PyLong_FromSsize_t(length), operand);
}

/* The spec of an eager tensor, by its dtype number and shape (two C
 * methods of EagerTensor) in a table of the specs spec_of_foreign gave:
 * tensors among the operands (a constant, a tensor the user computed
 * eagerly) otherwise cost a Python call building a TensorShape. */
static PyObject *eager_tensor_specs;   /* (dtype number, shape) -> Spec */

static PyObject *
eager_tensor_spec(PyObject *tensor)
{
    PyObject *dtype = PyObject_CallMethodNoArgs(tensor, str_datatype_enum);
    PyObject *shape = dtype == NULL ? NULL
                      : PyObject_CallMethodNoArgs(tensor, str_shape_tuple);
    PyObject *key = shape == NULL ? NULL : PyTuple_Pack(2, dtype, shape);
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    return remembered_spec(eager_tensor_specs, key, tensor);
}

/* The specs of the variables last met, by address: a weight is an operand
 * of most recorded ops, and reading the spec it keeps on itself (an
 * attribute lookup through a deep class hierarchy) was 6% of recording a
 * Tree-LSTM.  A slot holds a weak reference, so a variable freed and
 * another object made at its address never match; a variable's dtype
 * and shape never change (spec_of_foreign). */
#define VARIABLE_SLOTS 64
static struct {
    PyObject *object;   /* compared by address only */
    PyObject *ref;      /* a weak reference to it */
    PyObject *spec;
} variable_cache[VARIABLE_SLOTS];

static size_t
variable_slot(PyObject *operand)
{
    return ((size_t)operand >> 4) % VARIABLE_SLOTS;
}

/* Keep ``spec`` for the variable ``operand`` (where it takes a weak
 * reference; else nothing is kept). */
static void
remember_variable(PyObject *operand, PyObject *spec)
{
    PyObject *ref = PyWeakref_NewRef(operand, NULL);
    if (ref == NULL) {
        PyErr_Clear();
        return;
    }
    size_t slot = variable_slot(operand);
    PyObject *old_ref = variable_cache[slot].ref, *old_spec = variable_cache[slot].spec;
    variable_cache[slot].object = operand;
    variable_cache[slot].ref = ref;
    variable_cache[slot].spec = Py_NewRef(spec);
    Py_XDECREF(old_ref);   /* last: may run code */
    Py_XDECREF(old_spec);
}

/* spec_of_foreign(operand), with its common cases taken here: variables
 * (by address, else the spec they keep on themselves once spec_of_foreign
 * has seen them), Python numbers (by exact type), eager tensors and lists
 * of ints. */
static PyObject *
foreign_spec(PyObject *operand)
{
    size_t slot = variable_slot(operand);
    if (variable_cache[slot].object == operand
            && PyWeakref_GET_OBJECT(variable_cache[slot].ref) == operand)
        return Py_NewRef(variable_cache[slot].spec);
    PyObject *type = (PyObject *)Py_TYPE(operand);
    PyObject *spec = PyDict_GetItemWithError(scalar_specs, type);
    if (spec != NULL)
        return Py_NewRef(spec);
    if (PyErr_Occurred())
        return NULL;
    int variable = PySet_Contains(variable_types, type);
    if (variable < 0)
        return NULL;
    if (variable) {
        spec = PyObject_GetAttr(operand, str_variable_spec);
        if (spec != NULL && spec != Py_None) {
            remember_variable(operand, spec);
            return spec;
        }
        Py_XDECREF(spec);
        if (spec == NULL && !PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
    }
    if (Py_IS_TYPE(operand, (PyTypeObject *)eager_tensor_type))
        return eager_tensor_spec(operand);
    spec = int_list_spec(operand);
    if (spec != NULL || PyErr_Occurred())
        return spec;
    return PyObject_CallOneArg(spec_of_foreign, operand);
}

/* The cache key: (attrs, tuple of attribute types, spec of each operand).
 * Attribute types are part of it because equal values of different types
 * (1, 1.0, True) can make different dtypes (tf.one_hot's on_value). */
static PyObject *
cache_key(PyObject *inputs, PyObject *attrs)
{
    Py_ssize_t operands = PyTuple_GET_SIZE(inputs);
    Py_ssize_t count = PyTuple_GET_SIZE(attrs);
    PyObject *key = PyTuple_New(2 + operands);
    PyObject *types = PyTuple_New(count);
    if (key == NULL || types == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++)
        PyTuple_SET_ITEM(types, i,
                         Py_NewRef(Py_TYPE(PyTuple_GET_ITEM(attrs, i))));
    PyTuple_SET_ITEM(key, 0, Py_NewRef(attrs));
    PyTuple_SET_ITEM(key, 1, types);
    types = NULL;
    for (Py_ssize_t i = 0; i < operands; i++) {
        PyObject *operand = PyTuple_GET_ITEM(inputs, i);
        PyObject *spec;
        if (Py_IS_TYPE(operand, node_type)) {
            spec = ((Node *)operand)->spec;
            if (spec == NULL) {
                PyErr_SetString(PyExc_AttributeError,
                                "an operand VirtualNode has no spec");
                goto fail;
            }
            Py_INCREF(spec);
        }
        else {
            /* May raise NotLazy: the wrapper then runs the op eagerly. */
            spec = foreign_spec(operand);
            if (spec == NULL)
                goto fail;
        }
        PyTuple_SET_ITEM(key, 2 + i, spec);
    }
    return key;
fail:
    Py_XDECREF(key);
    Py_XDECREF(types);
    return NULL;
}

/* Output ``index`` of a multi-output node (the thesis's ``access``). */
static PyObject *
output_node(Node *node, Py_ssize_t index, PyObject *site)
{
    PyObject *attrs = index < SHARED_INDICES ? Py_NewRef(index_attrs[index])
                                             : Py_BuildValue("(n)", index);
    PyObject *spec = PySequence_GetItem(node->spec, index);
    PyObject *output = NULL;
    if (attrs != NULL && spec != NULL) {
        PyObject *source = (PyObject *)node;
        output = (PyObject *)new_node(next_id++, access_entry, &source, 1, attrs,
                                      spec, site);
        if (output != NULL) {
            node->consumers++;
            if (append_pending(output) < 0)
                Py_CLEAR(output);
        }
    }
    Py_XDECREF(attrs);
    Py_XDECREF(spec);
    return output;
}

static PyObject *
outputs_of(Node *node, PyObject *site)
{
    Py_ssize_t count = PyObject_Size(node->spec);
    if (count < 0)
        return NULL;
    PyObject *outputs = PyList_New(count);
    if (outputs == NULL)
        return NULL;
    for (Py_ssize_t index = 0; index < count; index++) {
        PyObject *output = output_node(node, index, site);
        if (output == NULL) {
            Py_DECREF(outputs);
            return NULL;
        }
        PyList_SET_ITEM(outputs, index, output);
    }
    return outputs;
}

PyDoc_STRVAR(record_doc,
"record(entry, inputs, attrs, site=<the caller's caller>)\n--\n\n"
"Record op entry ``entry`` applied to ``inputs`` (a tuple of operands) with\n"
"``attrs`` (a tuple of its other arguments), at ``site`` ((code, line) or\n"
"None; by default the frame that called the generated wrapper calling\n"
"record, the user's); returns a VirtualNode, or a\n"
"list of them for a multi-output entry.  Raises NotLazy for an operand the\n"
"recorder cannot describe, and TensorFlow's error (noting the user's line)\n"
"for an op that cannot run on these operands.");

/* Attributes equal to an earlier op's, item by item of the same exact
 * type, are that op's tuple: a Tree-LSTM minibatch's 932 matmuls share one
 * instead of holding a tuple each (allocated, scattered in memory, read
 * by the pattern matcher, freed).  Only flat tuples of None, bools, ints
 * and strings are shared: for those, equal and of one type means the same
 * value (unlike 0.0 and -0.0, or 1 and 1.0 inside a nested tuple).  The
 * table keeps at most ATTRS_SHARED tuples: attributes that never repeat
 * (a slice's index per instance) stop being added once it is full. */
#define ATTRS_SHARED 4096
static PyObject *attrs_shared;   /* {attrs: attrs} */

static int
plain_item(PyObject *item)
{
    PyTypeObject *type = Py_TYPE(item);
    return item == Py_None || type == &PyBool_Type || type == &PyLong_Type
           || type == &PyUnicode_Type;
}

/* ``attrs``, or an equal tuple recorded before (a new reference, or NULL
 * with an exception set). */
static PyObject *
shared_attrs(PyObject *attrs)
{
    Py_ssize_t count = PyTuple_GET_SIZE(attrs);
    if (count == 0 || !PyTuple_CheckExact(attrs))
        return Py_NewRef(attrs);
    for (Py_ssize_t i = 0; i < count; i++)
        if (!plain_item(PyTuple_GET_ITEM(attrs, i)))
            return Py_NewRef(attrs);
    PyObject *found = PyDict_GetItemWithError(attrs_shared, attrs);
    if (found == NULL) {
        if (PyErr_Occurred())
            return NULL;
        if (PyDict_GET_SIZE(attrs_shared) < ATTRS_SHARED
                && PyDict_SetItem(attrs_shared, attrs, attrs) < 0)
            return NULL;
        return Py_NewRef(attrs);
    }
    for (Py_ssize_t i = 0; i < count; i++)   /* (True == 1, of another type) */
        if (Py_TYPE(PyTuple_GET_ITEM(found, i)) != Py_TYPE(PyTuple_GET_ITEM(attrs, i)))
            return Py_NewRef(attrs);
    return Py_NewRef(found);
}

/* The record cache: the output spec and the shared attributes of recent
 * record keys (an op entry, its attributes with their types, its operand
 * specs), found without building the cache key.  ``entry.cache`` still
 * holds the spec of every record key (shape inference fills it); this
 * table answers the common case in front of it: an op whose operands are
 * at most RECORD_OPERANDS and whose attributes are a flat tuple of plain
 * items (shared_attrs' condition).  Building, hashing and comparing the
 * key tuples (the attributes, their types, the operand specs) and then
 * sharing the attributes by a second lookup were most of record's own
 * time.  An entry is keyed by the op entry and the operand specs by
 * identity (specs are interned) and by the attributes item by item (same
 * type and equal); it holds references to all of them, so no key's
 * address is reused while it is cached.  Direct-mapped: a collision
 * replaces. */
#define RECORD_SLOTS 4096
#define RECORD_OPERANDS 4
typedef struct {
    Py_uhash_t hash;
    PyObject *op_entry, *attrs, *spec;
    Py_ssize_t count;
    PyObject *specs[RECORD_OPERANDS];
} RecordEntry;
static RecordEntry record_cache[RECORD_SLOTS];

/* The operand specs (new references) of ``inputs``, or -1 with an
 * exception set (NotLazy for an operand the recorder cannot describe). */
static int
operand_specs(PyObject *const *inputs, Py_ssize_t count, PyObject **specs)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *operand = inputs[i];
        if (Py_IS_TYPE(operand, node_type)) {
            specs[i] = ((Node *)operand)->spec;
            if (specs[i] == NULL) {
                PyErr_SetString(PyExc_AttributeError,
                                "an operand VirtualNode has no spec");
            }
            Py_XINCREF(specs[i]);
        }
        else {
            specs[i] = foreign_spec(operand);
        }
        if (specs[i] == NULL) {
            while (i-- > 0)
                Py_DECREF(specs[i]);
            return -1;
        }
    }
    return 0;
}

/* The hash of a record key, or -1 with an exception set (an unhashable
 * item: never, for plain items). */
static Py_hash_t
record_hash(PyObject *op_entry, PyObject *attrs, PyObject *const *specs,
            Py_ssize_t count)
{
    Py_uhash_t hash = (Py_uhash_t)op_entry >> 4;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(attrs); i++) {
        Py_hash_t item = PyObject_Hash(PyTuple_GET_ITEM(attrs, i));
        if (item == -1)
            return -1;
        hash = (hash ^ (Py_uhash_t)item) * 1000003u;
        hash ^= (Py_uhash_t)Py_TYPE(PyTuple_GET_ITEM(attrs, i)) >> 4;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        hash = (hash ^ ((Py_uhash_t)specs[i] >> 4)) * 1000003u;
    hash ^= (Py_uhash_t)count;
    return (Py_hash_t)(hash & ~(Py_uhash_t)1);   /* never -1 */
}

/* 1 if ``entry`` is this record key's, 0 if not, -1 with an exception set. */
static int
record_entry_is(RecordEntry *entry, Py_uhash_t hash, PyObject *op_entry,
                PyObject *attrs, PyObject *const *specs, Py_ssize_t count)
{
    if (entry->op_entry != op_entry || entry->hash != hash || entry->count != count)
        return 0;
    for (Py_ssize_t i = 0; i < count; i++)
        if (entry->specs[i] != specs[i])
            return 0;
    Py_ssize_t size = PyTuple_GET_SIZE(attrs);
    if (entry->attrs == attrs)
        return 1;
    if (PyTuple_GET_SIZE(entry->attrs) != size)
        return 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *a = PyTuple_GET_ITEM(entry->attrs, i);
        PyObject *b = PyTuple_GET_ITEM(attrs, i);
        if (a == b)
            continue;
        if (Py_TYPE(a) != Py_TYPE(b))
            return 0;
        int same = PyObject_RichCompareBool(a, b, Py_EQ);
        if (same <= 0)
            return same;
    }
    return 1;
}

static void
record_entry_set(RecordEntry *entry, Py_uhash_t hash, PyObject *op_entry,
                 PyObject *attrs, PyObject *spec, PyObject *const *specs,
                 Py_ssize_t count)
{
    Py_ssize_t old_count = entry->count;
    PyObject *old[3 + RECORD_OPERANDS] = {entry->op_entry, entry->attrs, entry->spec};
    for (Py_ssize_t i = 0; i < old_count; i++)
        old[3 + i] = entry->specs[i];
    entry->hash = hash;
    entry->op_entry = Py_NewRef(op_entry);
    entry->attrs = Py_NewRef(attrs);
    entry->spec = Py_NewRef(spec);
    entry->count = count;
    for (Py_ssize_t i = 0; i < count; i++)
        entry->specs[i] = Py_NewRef(specs[i]);
    for (Py_ssize_t i = 0; i < 3 + old_count; i++)   /* last: may run code */
        Py_XDECREF(old[i]);
}

/* Can the record cache hold this record key? */
static int
cacheable(Py_ssize_t count, PyObject *attrs)
{
    if (count > RECORD_OPERANDS || !PyTuple_CheckExact(attrs))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(attrs); i++)
        if (!plain_item(PyTuple_GET_ITEM(attrs, i)))
            return 0;
    return 1;
}

/* Record ``op_entry`` on the ``count`` operands at ``operands`` with
 * ``attrs`` (a tuple) at ``given_site``, or, if NULL, at the site of the
 * running frame or the one ``above`` it (current_site).  The operands
 * come as an array, not a tuple: a tuple made and freed per op was a
 * tenth of recording; one is made only for a key the record cache lacks. */
static PyObject *
record_op(PyObject *op_entry, PyObject *const *operands, Py_ssize_t count,
          PyObject *given_attrs, PyObject *given_site, int above)
{
    /* (Before anything is made: every node recorded so far is whole.) */
    if (pending_full_check(operands, count) < 0)
        return NULL;
    PyObject *attrs = Py_NewRef(given_attrs);
    PyObject *inputs = NULL;   /* the operands as a tuple, if needed */
    PyObject *key = NULL, *spec = NULL, *site = NULL;
    PyObject *result = NULL;
    Node *node = NULL;
    int is_multi;
    PyObject *specs[RECORD_OPERANDS];
    Py_ssize_t spec_count = 0;
    RecordEntry *entry = NULL;
    Py_hash_t hash = 0;

    /* Held: shape inference below runs Python code. */
    PyObject *cache = Py_XNewRef(entry_cache(op_entry, &is_multi));
    if (cache == NULL)
        goto done;
    if (cacheable(count, attrs)) {
        if (operand_specs(operands, count, specs) < 0)
            goto done;
        spec_count = count;
        hash = record_hash(op_entry, attrs, specs, spec_count);
        if (hash == -1)
            goto done;
        entry = &record_cache[((Py_uhash_t)hash >> 3) % RECORD_SLOTS];
        int found = record_entry_is(entry, hash, op_entry, attrs, specs, spec_count);
        if (found < 0)
            goto done;
        if (found) {
            spec = Py_NewRef(entry->spec);
            Py_SETREF(attrs, Py_NewRef(entry->attrs));
            goto known;
        }
    }
    inputs = PyTuple_New(count);
    if (inputs == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++)
        PyTuple_SET_ITEM(inputs, i, Py_NewRef(operands[i]));
    key = cache_key(inputs, attrs);
    if (key == NULL)
        goto done;
    spec = Py_XNewRef(PyDict_GetItemWithError(cache, key));
    if (spec == NULL && PyErr_Occurred()) {
        /* An unhashable attribute, such as a list: freeze the attributes
         * (the key keeps the types of the ones given). */
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            goto done;
        PyErr_Clear();
        Py_SETREF(attrs, PyObject_CallOneArg(freeze, attrs));
        if (attrs == NULL)
            goto done;
        PyObject *rest = PyTuple_GetSlice(key, 1, PyTuple_GET_SIZE(key));
        if (rest == NULL)
            goto done;
        PyObject *head = PyTuple_Pack(1, attrs);
        Py_SETREF(key, head == NULL ? NULL : PySequence_Concat(head, rest));
        Py_XDECREF(head);
        Py_DECREF(rest);
        if (key == NULL)
            goto done;
        spec = Py_XNewRef(PyDict_GetItemWithError(cache, key));
        if (spec == NULL && PyErr_Occurred())
            goto done;
    }
known:
    /* Callers a frame further from the user (TensorFlow's dispatch, the
     * Keras layer hook) give the site they found. */
    site = given_site != NULL ? Py_NewRef(given_site) : current_site(above);
    if (site == NULL)
        goto done;
    if (spec == NULL) {
        /* A new record key: run the op once on stand-ins (rare). */
        spec = PyObject_CallFunctionObjArgs(infer, op_entry, inputs, attrs, key,
                                            site, NULL);
        if (spec == NULL)
            goto done;
        forget_entry(op_entry);
        if (entry_cache(op_entry, &is_multi) == NULL)
            goto done;
    }
    if (key != NULL) {   /* (not found in the record cache) */
        Py_SETREF(attrs, shared_attrs(attrs));
        if (attrs == NULL)
            goto done;
        if (entry != NULL)
            record_entry_set(entry, hash, op_entry, attrs, spec, specs, spec_count);
    }
    node = new_node(next_id++, op_entry, operands, count, attrs, spec, site);
    if (node == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++)
        if (Py_IS_TYPE(operands[i], node_type))
            ((Node *)operands[i])->consumers++;
    if (append_pending((PyObject *)node) < 0)
        goto done;
    result = is_multi ? outputs_of(node, site) : Py_NewRef(node);
done:
    Py_XDECREF(node);
    Py_XDECREF(site);
    Py_XDECREF(spec);
    Py_XDECREF(key);
    Py_XDECREF(inputs);
    Py_XDECREF(cache);
    Py_XDECREF(attrs);
    for (Py_ssize_t i = 0; i < spec_count; i++)
        Py_DECREF(specs[i]);
    return result;
}

/* 1 once setup() has run, else 0 with RuntimeError set. */
static int
set_up(void)
{
    if (context == NULL)
        PyErr_SetString(PyExc_RuntimeError, "subgraphjit._native.setup() has not run");
    return context != NULL;
}

static PyObject *
record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!set_up())
        return NULL;
    if (nargs < 3 || nargs > 4 || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2])
            || (nargs == 4 && args[3] != Py_None
                && !(PyTuple_Check(args[3]) && PyTuple_GET_SIZE(args[3]) == 2))) {
        PyErr_SetString(PyExc_TypeError,
                        "record(entry, inputs, attrs[, site]) takes an op "
                        "entry, two tuples and a (code, line) tuple or None");
        return NULL;
    }
    return record_op(args[0], PySequence_Fast_ITEMS(args[1]), PyTuple_GET_SIZE(args[1]),
                     args[2], nargs == 4 ? args[3] : NULL, 1);
}

/* record_operands(entry, attrs, *operands): record's fast form, for the
 * generated wrappers of ops of a fixed number of operands, which leave
 * the mode to it: NotLazy in eager mode. */
static PyObject *
record_operands(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!set_up())
        return NULL;
    if (nargs < 2 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "record_operands(entry, attrs, *operands) takes an op "
                        "entry, a tuple and the operands");
        return NULL;
    }
    if (!lazy_mode) {
        if (not_lazy == NULL)
            PyErr_SetString(PyExc_RuntimeError, "record_operands: eager mode");
        else
            PyErr_SetNone(not_lazy);
        return NULL;
    }
    return record_op(args[0], args + 2, nargs - 2, args[1], NULL, 1);
}

/* -- operators -------------------------------------------------------------- */

/* VirtualNode's arithmetic operators record their op here, with no Python
 * frame of their own: half of a Tree-LSTM cell's ops are operators (``*``,
 * ``+``), and a Python method per call was a third of their recording.
 * The entries and fallbacks come from set_operators() (dropin/namespace.py);
 * until then, and for an operand the recorder cannot describe (NotLazy),
 * the fallback runs: the op on the node's value, computed now.  The
 * comparisons and ``[]`` stay Python methods (``==`` with None is no op). */
enum {
    OP_ADD, OP_SUB, OP_MUL, OP_TRUEDIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_MATMUL,
    OP_AND, OP_OR, OP_XOR, OP_NEG, OP_ABS, OP_INVERT, OPERATOR_COUNT
};
static const char *operator_names[OPERATOR_COUNT] = {
    "__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__",
    "__pow__", "__matmul__", "__and__", "__or__", "__xor__", "__neg__",
    "__abs__", "__invert__",
};
static PyObject *operator_entries[OPERATOR_COUNT];
static PyObject *operator_fallbacks[OPERATOR_COUNT];
static PyObject *no_attrs;      /* () */

/* ``left op right`` (``op left`` when right is NULL), either a node. */
static PyObject *
apply_operator(int op, PyObject *left, PyObject *right)
{
    if (operator_entries[op] == NULL || context == NULL)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *operands[2] = {left, right};
    Py_ssize_t count = right != NULL ? 2 : 1;
    /* The user's line is the running frame: no Python method in between. */
    PyObject *result = record_op(operator_entries[op], operands, count, no_attrs,
                                 NULL, 0);
    if (result == NULL && PyErr_ExceptionMatches(not_lazy)) {
        PyErr_Clear();
        result = PyObject_Vectorcall(operator_fallbacks[op], operands, count, NULL);
    }
    return result;
}

#define BINARY_OPERATOR(name, op) \
    static PyObject *name(PyObject *left, PyObject *right) \
    { return apply_operator(op, left, right); }
#define UNARY_OPERATOR(name, op) \
    static PyObject *name(PyObject *operand) \
    { return apply_operator(op, operand, NULL); }
BINARY_OPERATOR(node_add, OP_ADD)
BINARY_OPERATOR(node_subtract, OP_SUB)
BINARY_OPERATOR(node_multiply, OP_MUL)
BINARY_OPERATOR(node_true_divide, OP_TRUEDIV)
BINARY_OPERATOR(node_floor_divide, OP_FLOORDIV)
BINARY_OPERATOR(node_remainder, OP_MOD)
BINARY_OPERATOR(node_matrix_multiply, OP_MATMUL)
BINARY_OPERATOR(node_and, OP_AND)
BINARY_OPERATOR(node_or, OP_OR)
BINARY_OPERATOR(node_xor, OP_XOR)
UNARY_OPERATOR(node_negative, OP_NEG)
UNARY_OPERATOR(node_absolute, OP_ABS)
UNARY_OPERATOR(node_invert, OP_INVERT)

static PyObject *
node_power(PyObject *base, PyObject *exponent, PyObject *modulus)
{
    if (modulus != Py_None)   /* pow(node, x, m): no such op, as tf.Tensor */
        Py_RETURN_NOTIMPLEMENTED;
    return apply_operator(OP_POW, base, exponent);
}

/* -- functions -------------------------------------------------------------- */

/* A patched TensorFlow function (``tf.matmul``, ``tf.split``...) whose
 * lazy calls record here with no Python frame of their own: the generated
 * wrapper's frame, binding its parameters and building its attributes'
 * tuple, was 60 of a matmul's 230 ns of recording (BENCHMARKS.md).
 * ir/record.py makes one per op entry with tensor operands, but those a
 * Keras layer may take as its activation.  It takes the common call
 * only: lazy mode, the parameters
 * bound by position or by name, each tensor operand given (a list or
 * tuple of them for an entry whose first parameter takes a list); every
 * other call, and one whose operand the recorder cannot describe
 * (NotLazy), goes to ``fallback``, the generated wrapper, which does what
 * TensorFlow's function would.  ``name`` is taken and ignored, as the
 * wrapper's recording ignores it. */
#define RECORDER_PARAMETERS 16

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *entry;       /* the op entry */
    PyObject *fallback;    /* the generated wrapper */
    PyObject *names;       /* the parameters' names, in order */
    PyObject *defaults;    /* per parameter, its default or ``empty`` */
    PyObject *empty;       /* inspect.Parameter.empty: no default */
    PyObject *attrs;       /* the attributes' defaults, as record takes them */
    PyObject *dict;        /* __name__, __doc__, __wrapped__... */
    Py_ssize_t tensors;    /* leading parameters that are operands */
    Py_ssize_t name_index; /* ``name``'s position, or -1 */
    int list_input;        /* the first parameter takes a list of operands */
} Recorder;

/* Where ``keyword`` is among the parameters, or -1. */
static Py_ssize_t
parameter_index(Recorder *self, PyObject *keyword)
{
    Py_ssize_t count = PyTuple_GET_SIZE(self->names);
    for (Py_ssize_t i = 0; i < count; i++)
        if (PyTuple_GET_ITEM(self->names, i) == keyword)
            return i;
    for (Py_ssize_t i = 0; i < count; i++) {
        int equal = PyUnicode_Compare(PyTuple_GET_ITEM(self->names, i), keyword);
        if (equal == 0)
            return i;
        if (equal == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
    }
    return -1;
}

/* The call recorded, or NULL with no exception set: the fallback's to make. */
static PyObject *
recorder_record(Recorder *self, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    Py_ssize_t count = PyTuple_GET_SIZE(self->names);
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (context == NULL || !lazy_mode || nargs + keywords > count)
        return NULL;
    PyObject *bound[RECORDER_PARAMETERS] = {NULL};
    for (Py_ssize_t i = 0; i < nargs; i++)
        bound[i] = args[i];
    for (Py_ssize_t k = 0; k < keywords; k++) {
        Py_ssize_t i = parameter_index(self, PyTuple_GET_ITEM(kwnames, k));
        if (i < 0 || bound[i] != NULL)
            return NULL;   /* (the wrapper raises TensorFlow's TypeError) */
        bound[i] = args[nargs + k];
    }
    int defaults_only = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *fallback_value = PyTuple_GET_ITEM(self->defaults, i);
        if (bound[i] == NULL) {
            if (fallback_value == self->empty)
                return NULL;
            bound[i] = fallback_value;
        }
        else if (i >= self->tensors && i != self->name_index && bound[i] != fallback_value)
            defaults_only = 0;
    }
    PyObject *attrs;
    if (defaults_only)
        attrs = Py_NewRef(self->attrs);
    else {
        attrs = PyTuple_New(PyTuple_GET_SIZE(self->attrs));
        if (attrs == NULL)
            return NULL;   /* (the fallback meets the same shortage) */
        Py_ssize_t next = 0;
        for (Py_ssize_t i = self->tensors; i < count; i++)
            if (i != self->name_index)
                PyTuple_SET_ITEM(attrs, next++, Py_NewRef(bound[i]));
    }
    PyObject *listed = NULL;
    PyObject *const *operands = bound;
    Py_ssize_t operand_count = self->tensors;
    if (self->list_input) {
        if (PyTuple_Check(bound[0]))
            listed = Py_NewRef(bound[0]);
        else if (PyList_Check(bound[0]))
            listed = PyList_AsTuple(bound[0]);
        if (listed == NULL) {
            PyErr_Clear();
            Py_DECREF(attrs);
            return NULL;
        }
        operands = &PyTuple_GET_ITEM(listed, 0);
        operand_count = PyTuple_GET_SIZE(listed);
    }
    /* The user's line is the running frame: no Python frame in between. */
    PyObject *result = record_op(self->entry, operands, operand_count, attrs,
                                 NULL, 0);
    Py_XDECREF(listed);
    Py_DECREF(attrs);
    return result;
}

static PyObject *
recorder_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *result = recorder_record((Recorder *)self, args, nargs, kwnames);
    if (result != NULL)
        return result;
    if (PyErr_Occurred()) {
        if (not_lazy == NULL || !PyErr_ExceptionMatches(not_lazy))
            return NULL;
        PyErr_Clear();
    }
    return PyObject_Vectorcall(((Recorder *)self)->fallback, args, nargsf, kwnames);
}

static PyObject *
recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *entry, *fallback, *names, *defaults, *empty;
    Py_ssize_t tensors, name_index;
    int list_input;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "Recorder() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOO!O!Onnp:Recorder", &entry, &fallback,
                          &PyTuple_Type, &names, &PyTuple_Type, &defaults, &empty,
                          &tensors, &name_index, &list_input))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    Py_ssize_t operands = list_input ? 1 : tensors;
    if (!PyCallable_Check(fallback) || PyTuple_GET_SIZE(defaults) != count
            || count > RECORDER_PARAMETERS || operands < 1 || operands > count
            || operands > RECORD_OPERANDS || name_index < -1 || name_index >= count
            || (name_index >= 0 && name_index < operands)) {
        PyErr_SetString(PyExc_ValueError, "Recorder(entry, fallback, names, defaults, "
                        "empty, tensors, name_index, list_input): inconsistent parameters");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "Recorder(): parameter names are strings");
            return NULL;
        }
    PyObject *attrs = PyTuple_New(count - operands - (name_index >= 0));
    if (attrs == NULL)
        return NULL;
    for (Py_ssize_t i = operands, next = 0; i < count; i++)
        if (i != name_index)
            PyTuple_SET_ITEM(attrs, next++, Py_NewRef(PyTuple_GET_ITEM(defaults, i)));
    Recorder *self = PyObject_GC_New(Recorder, type);
    if (self == NULL) {
        Py_DECREF(attrs);
        return NULL;
    }
    self->vectorcall = recorder_call;
    self->entry = Py_NewRef(entry);
    self->fallback = Py_NewRef(fallback);
    self->names = Py_NewRef(names);
    self->defaults = Py_NewRef(defaults);
    self->empty = Py_NewRef(empty);
    self->attrs = attrs;
    self->dict = NULL;
    self->tensors = operands;
    self->name_index = name_index;
    self->list_input = list_input;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int
recorder_traverse(Recorder *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->entry);
    Py_VISIT(self->fallback);
    Py_VISIT(self->names);
    Py_VISIT(self->defaults);
    Py_VISIT(self->empty);
    Py_VISIT(self->attrs);
    Py_VISIT(self->dict);
    return 0;
}

static int
recorder_clear(Recorder *self)
{
    Py_CLEAR(self->entry);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->names);
    Py_CLEAR(self->defaults);
    Py_CLEAR(self->empty);
    Py_CLEAR(self->attrs);
    Py_CLEAR(self->dict);
    return 0;
}

static void
recorder_dealloc(Recorder *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    recorder_clear(self);
    PyObject_GC_Del(self);
    Py_DECREF(type);
}

/* Bound as a method, as a Python function is (TensorFlow's functions are). */
static PyObject *
recorder_get(PyObject *self, PyObject *instance, PyObject *owner)
{
    if (instance == NULL || instance == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, instance);
}

static PyObject *
recorder_repr(Recorder *self)
{
    PyObject *name = self->dict == NULL ? NULL
                     : PyDict_GetItemString(self->dict, "__qualname__");
    if (name == NULL)
        return PyUnicode_FromFormat("<subgraphjit function at %p>", self);
    return PyUnicode_FromFormat("<subgraphjit function %S>", name);
}

/* Pickled by name, as a Python function is. */
static PyObject *
recorder_reduce(PyObject *self, PyObject *unused)
{
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef recorder_methods[] = {
    {"__reduce__", recorder_reduce, METH_NOARGS, NULL},
    {NULL},
};

static PyMemberDef recorder_members[] = {
    {"fallback", T_OBJECT, offsetof(Recorder, fallback), READONLY,
     "the generated wrapper, which takes every call not recorded here"},
    {"__dictoffset__", T_PYSSIZET, offsetof(Recorder, dict), READONLY},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Recorder, vectorcall), READONLY},
    {NULL},
};

static PyGetSetDef recorder_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL},
};

static PyType_Slot recorder_slots[] = {
    {Py_tp_new, recorder_new},
    {Py_tp_dealloc, recorder_dealloc},
    {Py_tp_traverse, recorder_traverse},
    {Py_tp_clear, recorder_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, recorder_get},
    {Py_tp_repr, recorder_repr},
    {Py_tp_members, recorder_members},
    {Py_tp_methods, recorder_methods},
    {Py_tp_getset, recorder_getset},
    {0, NULL},
};

static PyType_Spec recorder_spec = {
    .name = "subgraphjit._native.Recorder",
    .basicsize = sizeof(Recorder),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
             | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = recorder_slots,
};

static PyObject *
set_operators(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "set_operators(operators, not_lazy) "
                        "takes a dict {dunder: (entry, fallback)} and NotLazy");
        return NULL;
    }
    PyObject *given[OPERATOR_COUNT][2];
    for (int op = 0; op < OPERATOR_COUNT; op++) {
        PyObject *pair = PyDict_GetItemString(args[0], operator_names[op]);
        if (pair == NULL || !PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
                || !PyCallable_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_Format(PyExc_TypeError, "set_operators(): %s needs "
                         "(entry, callable fallback)", operator_names[op]);
            return NULL;
        }
        given[op][0] = PyTuple_GET_ITEM(pair, 0);
        given[op][1] = PyTuple_GET_ITEM(pair, 1);
    }
    if (!PyExceptionClass_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set_operators(): not_lazy must be "
                        "an exception class");
        return NULL;
    }
    for (int op = 0; op < OPERATOR_COUNT; op++) {
        Py_XSETREF(operator_entries[op], Py_NewRef(given[op][0]));
        Py_XSETREF(operator_fallbacks[op], Py_NewRef(given[op][1]));
    }
    Py_XSETREF(not_lazy, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(setup_doc,
"setup(context, spec_of_foreign, infer, freeze, access_entry, scalar_specs,\n"
"      variable_types, eager_tensor_type)\n--\n\n"
"Give record() the context object, its Python callbacks, the tables of\n"
"spec_of_foreign's fast cases (a dict by type and a set of types) and\n"
"TensorFlow's EagerTensor type (whose specs record() keeps by dtype and\n"
"shape).");

static PyObject *
setup(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"context", "spec_of_foreign", "infer",
                               "freeze", "access_entry", "scalar_specs",
                               "variable_types", "eager_tensor_type", NULL};
    PyObject *given[8];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO!O!O!:setup",
                                     keywords, &given[0], &given[1],
                                     &given[2], &given[3], &given[4],
                                     &PyDict_Type, &given[5], &PySet_Type,
                                     &given[6], &PyType_Type, &given[7]))
        return NULL;
    for (int i = 1; i <= 3; i++) {
        if (!PyCallable_Check(given[i])) {
            PyErr_Format(PyExc_TypeError, "setup(): %s must be callable",
                         keywords[i]);
            return NULL;
        }
    }
    PyObject **fields[] = {&context, &spec_of_foreign, &infer, &freeze,
                           &access_entry, &scalar_specs, &variable_types,
                           &eager_tensor_type};
    for (int i = 0; i < 8; i++)
        Py_XSETREF(*fields[i], Py_NewRef(given[i]));
    Py_RETURN_NONE;
}

static PyObject *
set_lazy(PyObject *module, PyObject *flag)
{
    int value = PyObject_IsTrue(flag);
    if (value < 0)
        return NULL;
    lazy_mode = value;
    Py_RETURN_NONE;
}

static PyObject *
lazy(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(lazy_mode);
}

static PyObject *
next_node_id(PyObject *module, PyObject *unused)
{
    return PyLong_FromLongLong(next_id);
}

static PyMethodDef methods[] = {
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL, record_doc},
    {"record_operands", (PyCFunction)(void (*)(void))record_operands, METH_FASTCALL,
     "record_operands(entry, attrs, *operands): record(entry, operands, attrs)\n"
     "without a tuple of the operands."},
    {"set_operators", (PyCFunction)(void (*)(void))set_operators, METH_FASTCALL,
     "set_operators(operators, not_lazy)\n--\n\nVirtualNode's arithmetic "
     "operators: ``operators`` maps each dunder (``__add__``, ``__neg__``, ...) "
     "to (op entry, fallback); the fallback gets the operands when record "
     "raises ``not_lazy``."},
    {"setup", (PyCFunction)(void (*)(void))setup,
     METH_VARARGS | METH_KEYWORDS, setup_doc},
    {"set_pending", (PyCFunction)(void (*)(void))set_pending, METH_FASTCALL,
     "set_pending(nodes, limit=0, callback=None, window_of=limit)\n--\n\n"
     "Where record() appends "
     "each node it records: the context's ``pending`` (a list, None, or "
     "anything with append).  Once the list holds ``limit`` nodes (0: never), "
     "a later record() first calls ``callback`` (given once, kept) with a "
     "position in the list: the nodes before it are whole instances (no "
     "later op read one of them unevaluated in the window of "
     "``window_of`` / 16 nodes since), or, if none were found, all "
     "of them (pending_full_check)."},
    {"set_lazy", set_lazy, METH_O,
     "set_lazy(flag)\n--\n\nWhether ops record (``context.lazy``): the "
     "recorders read it at every call."},
    {"lazy", lazy, METH_NOARGS, "Whether ops record (set_lazy; takes none)."},
    {"next_node_id", next_node_id, METH_NOARGS,
     "The id the next recorded node will get (takes none)."},
    {"slab_statistics", slab_statistics, METH_NOARGS,
     "Node storage (slab.c): live nodes, chunks held, empty chunks kept for "
     "reuse, nodes per chunk and a chunk's bytes, as a dict (takes none)."},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "subgraphjit._native",
    .m_doc = "The recording hot path of subgraphjit, in C.",
    .m_size = -1,   /* state is global: one recorder per process */
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    str_cache = PyUnicode_InternFromString("cache");
    str_multi_output = PyUnicode_InternFromString("multi_output");
    str_append = PyUnicode_InternFromString("append");
    str_variable_spec = PyUnicode_InternFromString("_subgraphjit_spec");
    str_datatype_enum = PyUnicode_InternFromString("_datatype_enum");
    str_shape_tuple = PyUnicode_InternFromString("_shape_tuple");
    eager_tensor_specs = PyDict_New();
    int_list_specs = PyDict_New();
    attrs_shared = PyDict_New();
    for (Py_ssize_t i = 0; i < SHARED_INDICES; i++) {
        index_attrs[i] = Py_BuildValue("(n)", i);
        if (index_attrs[i] == NULL) {
            Py_DECREF(module);
            return NULL;
        }
    }
    no_attrs = PyTuple_New(0);
    node_type = (PyTypeObject *)PyType_FromSpec(&node_spec);
    node_operand_type = (PyTypeObject *)PyType_FromSpec(&node_operand_spec);
    PyObject *recorder_type = PyType_FromSpec(&recorder_spec);
    if (add_analysis_functions(module) < 0 || add_match_functions(module) < 0
            || add_plan_functions(module) < 0 || add_fuse_functions(module) < 0
            || add_operand_types(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (str_cache == NULL || str_multi_output == NULL
            || str_append == NULL || str_variable_spec == NULL
            || str_datatype_enum == NULL || str_shape_tuple == NULL
            || eager_tensor_specs == NULL
            || int_list_specs == NULL || attrs_shared == NULL
            || no_attrs == NULL || recorder_type == NULL
            || PyModule_AddObject(module, "Recorder", recorder_type) < 0
            || node_type == NULL || node_operand_type == NULL
            || PyModule_AddObjectRef(module, "VirtualNode",
                                     (PyObject *)node_type) < 0
            || PyModule_AddObjectRef(module, "NodeOperand",
                                     (PyObject *)node_operand_type) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ImportError, "subgraphjit._native: setup failed");
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
