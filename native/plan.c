/* A program's bookkeeping over every node (batcher/plan.py) and the write-back
 * of its results (batcher/program.py), in C: these are loops over all the
 * nodes of an evaluation, which in Python cost more than the compiled
 * program's own forward at a minibatch of 256 trees.
 *
 * Everything here reads a BatchGraph's lists (type_of, duplicate_of), its
 * OperandTable (operands.c) and the nodes; indices are checked, so bad
 * input raises rather than reading out of bounds.  Arrays go back to
 * Python as bytes of native int32 (read with numpy.frombuffer). */

#include "containers.h"

/* -- reading Python values -------------------------------------------------- */

/* Operand ``position`` of graph node ``index``, with its index checked to
 * be in the graph (or OPERAND_EARLIER, OPERAND_VALUE). */
static const Operand *
operand_at(OperandTable *table, Py_ssize_t index, Py_ssize_t position)
{
    Py_ssize_t first = table->first[index];
    if (position < 0 || position >= table->first[index + 1] - first) {
        PyErr_Format(PyExc_ValueError, "node %zd has no operand %zd", index, position);
        return NULL;
    }
    const Operand *operand = &table->items[first + position];
    if (operand->index < OPERAND_VALUE || operand->index >= table->count) {
        PyErr_Format(PyExc_ValueError, "an operand's index %zd is out of range",
                     operand->index);
        return NULL;
    }
    return operand;
}

/* How many outputs a node has: a multi-output node's spec is a tuple of
 * specs (-1 for a single output, so that one output of a split into one
 * stays a list). */
static Py_ssize_t
output_count(Node *node)
{
    return node->spec != NULL && PyTuple_Check(node->spec)
        ? PyTuple_GET_SIZE(node->spec) : -1;
}

/* The slots a node with ``outputs`` (as output_count gives it) takes. */
static Py_ssize_t
slots_of(Py_ssize_t outputs)
{
    return outputs < 0 ? 1 : outputs;
}

/* An access node's output number (attrs[0]). */
static int
access_number(Node *node, Py_ssize_t *number)
{
    if (node->attrs == NULL || !PyTuple_Check(node->attrs)
            || PyTuple_GET_SIZE(node->attrs) < 1) {
        PyErr_SetString(PyExc_ValueError, "a malformed access node");
        return -1;
    }
    return index_in(PyTuple_GET_ITEM(node->attrs, 0), 0, PY_SSIZE_T_MAX,
                    "an access node's output", -1, number);
}

/* How many of ``nodes`` (a list) from the first are the very nodes the
 * table describes, which describe_graph checked to be VirtualNodes: those
 * need no check of their own (a look at each node is a cache miss per
 * node, at 65,000 nodes a pass). */
static Py_ssize_t
described_nodes(PyObject *nodes, OperandTable *table)
{
    Py_ssize_t count = PyList_GET_SIZE(nodes), same = 0;
    if (table->nodes != NULL && PyTuple_GET_SIZE(table->nodes) == count)
        while (same < count && PyList_GET_ITEM(nodes, same)
                               == PyTuple_GET_ITEM(table->nodes, same))
            same++;
    return same;
}

/* The graph's lists, checked: nodes are VirtualNodes, type_of and
 * duplicate_of ints in range, operands the graph's OperandTable. */
typedef struct {
    PyObject *nodes, *access_entry;
    OperandTable *operands;
    Py_ssize_t count, type_count;
    Py_ssize_t *type_of, *duplicate_of;
} Graph;

static void
graph_free(Graph *graph)
{
    PyMem_Free(graph->type_of);
    PyMem_Free(graph->duplicate_of);
}

static int
graph_read(Graph *graph, PyObject *nodes, PyObject *type_of,
           PyObject *duplicate_of, PyObject *operands, Py_ssize_t type_count,
           PyObject *access_entry)
{
    memset(graph, 0, sizeof(*graph));
    if (type_count < 0) {
        PyErr_SetString(PyExc_ValueError, "type_count must not be negative");
        return -1;
    }
    if (!PyList_Check(nodes) || !Py_IS_TYPE(operands, operand_table_type)
            || ((OperandTable *)operands)->count != PyList_GET_SIZE(nodes)) {
        PyErr_SetString(PyExc_ValueError, "nodes must be a list and operands "
                        "its graph's OperandTable");
        return -1;
    }
    graph->count = PyList_GET_SIZE(nodes);
    for (Py_ssize_t i = described_nodes(nodes, (OperandTable *)operands);
         i < graph->count; i++) {
        if (!Py_IS_TYPE(PyList_GET_ITEM(nodes, i), node_type)) {
            PyErr_Format(PyExc_TypeError, "nodes[%zd] is not a VirtualNode", i);
            return -1;
        }
    }
    graph->nodes = nodes;
    graph->operands = (OperandTable *)operands;
    graph->access_entry = access_entry;
    graph->type_count = type_count;
    graph->type_of = index_array(type_of, graph->count, -1, type_count, "type_of");
    if (graph->type_of == NULL)
        return -1;
    graph->duplicate_of = index_array(duplicate_of, graph->count, 0, graph->count,
                                    "duplicate_of");
    if (graph->duplicate_of == NULL) {
        graph_free(graph);
        return -1;
    }
    return 0;
}

static Node *
graph_node(Graph *graph, Py_ssize_t index)
{
    return (Node *)PyList_GET_ITEM(graph->nodes, index);
}

/* The graph index of an access node's source (-1: evaluated earlier). */
static int
access_source(Graph *graph, Py_ssize_t index, Py_ssize_t *source)
{
    const Operand *operand = operand_at(graph->operands, index, 0);
    if (operand == NULL)
        return -1;
    if (operand->index == OPERAND_VALUE) {
        PyErr_Format(PyExc_TypeError, "access node %zd reads no node", index);
        return -1;
    }
    *source = operand->index;
    return 0;
}

static PyObject *
int32_bytes(const int *items, Py_ssize_t count)
{
    return PyBytes_FromStringAndSize((const char *)items, count * (Py_ssize_t)sizeof(int));
}

/* -- which outputs some node reads ------------------------------------------ */

PyDoc_STRVAR(read_outputs_doc,
"read_outputs(nodes, type_of, duplicate_of, operands, type_count,\n"
"             required_ids, access_entry)\n--\n\n"
"The set of (node type, output number) that some node needs: read by a\n"
"node of the graph, or of a node nothing consumes or whose id is in\n"
"``required_ids`` (see plan.py's outline).");

static PyObject *
read_outputs(PyObject *module, PyObject *args)
{
    PyObject *nodes, *type_of, *duplicate_of, *operands, *required, *access_entry;
    Py_ssize_t type_count;
    if (!PyArg_ParseTuple(args, "OOOOnO!O:read_outputs", &nodes, &type_of,
                          &duplicate_of, &operands, &type_count, &PySet_Type,
                          &required, &access_entry))
        return NULL;
    Graph graph;
    if (graph_read(&graph, nodes, type_of, duplicate_of, operands, type_count,
                   access_entry) < 0)
        return NULL;
    PyObject *result = NULL;
    IdSet required_ids = {0};
    /* Per type, its output count (from a node of it) and the offset of its
     * flags in ``read``. */
    Py_ssize_t *outputs = PyMem_New(Py_ssize_t, type_count + 1);
    Py_ssize_t *offset = PyMem_New(Py_ssize_t, type_count + 2);
    unsigned char *read = NULL;
    if (outputs == NULL || offset == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t t = 0; t < type_count; t++)
        outputs[t] = 0;
    for (Py_ssize_t i = 0; i < graph.count; i++) {
        Py_ssize_t t = graph.type_of[i];
        if (t >= 0 && outputs[t] == 0) {
            outputs[t] = slots_of(output_count(graph_node(&graph, i)));
        }
    }
    offset[0] = 0;
    for (Py_ssize_t t = 0; t < type_count; t++)
        offset[t + 1] = offset[t] + outputs[t];
    read = PyMem_Calloc(offset[type_count] + 1, 1);
    if (read == NULL) {
        PyErr_NoMemory();
        goto done;
    }
#define MARK(type, number)                                                   \
    do {                                                                     \
        Py_ssize_t t_ = (type), n_ = (number);                               \
        if (t_ >= 0) {                                                       \
            if (n_ >= outputs[t_]) {                                         \
                PyErr_Format(PyExc_ValueError,                               \
                             "output %zd of a type with %zd outputs read",   \
                             n_, outputs[t_]);                               \
                goto done;                                                   \
            }                                                                \
            read[offset[t_] + n_] = 1;                                       \
        }                                                                    \
    } while (0)
    for (Py_ssize_t i = 0; i < graph.count; i++) {
        if (graph.type_of[i] < 0)
            continue;   /* a duplicate reads what its original reads */
        OperandTable *table = graph.operands;
        for (Py_ssize_t p = 0; p < table->first[i + 1] - table->first[i]; p++) {
            const Operand *operand = operand_at(table, i, p);
            if (operand == NULL)
                goto done;
            if (operand->index >= 0)
                MARK(graph.type_of[operand->index], operand->pick < 0 ? 0 : operand->pick);
        }
    }
    if (idset_read(&required_ids, required, "required_ids") < 0)
        goto done;
    for (Py_ssize_t i = 0; i < graph.count; i++) {
        Node *node = graph_node(&graph, i);
        if (i + 8 < graph.count)
            prefetch_node(graph_node(&graph, i + 8));
        if (node->consumers != 0 && !idset_contains(&required_ids, node->id))
            continue;
        if (node->entry == graph.access_entry) {
            Py_ssize_t source, number;
            if (access_source(&graph, i, &source) < 0 || access_number(node, &number) < 0)
                goto done;
            if (source >= 0)
                MARK(graph.type_of[graph.duplicate_of[source]], number);
        }
        else {
            Py_ssize_t t = graph.type_of[graph.duplicate_of[i]];
            if (t >= 0)
                for (Py_ssize_t n = 0; n < outputs[t]; n++)
                    MARK(t, n);
        }
    }
#undef MARK
    result = PySet_New(NULL);
    if (result == NULL)
        goto done;
    for (Py_ssize_t t = 0; t < type_count; t++) {
        for (Py_ssize_t n = 0; n < outputs[t]; n++) {
            if (!read[offset[t] + n])
                continue;
            PyObject *pair = Py_BuildValue("(nn)", t, n);
            if (pair == NULL || PySet_Add(result, pair) < 0) {
                Py_XDECREF(pair);
                Py_CLEAR(result);
                goto done;
            }
            Py_DECREF(pair);
        }
    }
done:
    PyMem_Free(outputs);
    PyMem_Free(offset);
    PyMem_Free(read);
    idset_free(&required_ids);
    graph_free(&graph);
    return result;
}

/* -- the step table ---------------------------------------------------------- */

/* A kind as fill reads it: the (position, buffer) of each per-instance
 * operand and the buffer of each output (-1: not kept). */
typedef struct {
    Py_ssize_t operand_count, output_count;
    Py_ssize_t *positions, *operand_buffers, *output_buffers;
    int multi_output;
} KindInfo;

static void
kinds_free(KindInfo *kinds, Py_ssize_t count)
{
    if (kinds == NULL)
        return;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyMem_Free(kinds[k].positions);
        PyMem_Free(kinds[k].operand_buffers);
        PyMem_Free(kinds[k].output_buffers);
    }
    PyMem_Free(kinds);
}

static KindInfo *
kinds_read(PyObject *list, Py_ssize_t buffer_count, Py_ssize_t *count)
{
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "kinds must be a list");
        return NULL;
    }
    *count = PyList_GET_SIZE(list);
    KindInfo *kinds = PyMem_Calloc(*count + 1, sizeof(KindInfo));
    if (kinds == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < *count; k++) {
        PyObject *rows, *outputs;
        int multi;
        if (!PyTuple_Check(PyList_GET_ITEM(list, k))) {
            PyErr_SetString(PyExc_TypeError, "a kind is a tuple");
            goto fail;
        }
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, k), "O!O!p;a kind is "
                              "(rows, outputs, multi_output)", &PyTuple_Type,
                              &rows, &PyTuple_Type, &outputs, &multi))
            goto fail;
        KindInfo *kind = &kinds[k];
        kind->multi_output = multi;
        kind->operand_count = PyTuple_GET_SIZE(rows);
        kind->output_count = PyTuple_GET_SIZE(outputs);
        kind->positions = PyMem_New(Py_ssize_t, kind->operand_count + 1);
        kind->operand_buffers = PyMem_New(Py_ssize_t, kind->operand_count + 1);
        kind->output_buffers = PyMem_New(Py_ssize_t, kind->output_count + 1);
        if (kind->positions == NULL || kind->operand_buffers == NULL
                || kind->output_buffers == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t p = 0; p < kind->operand_count; p++) {
            if (!PyTuple_Check(PyTuple_GET_ITEM(rows, p))) {
                PyErr_SetString(PyExc_TypeError, "a kind's rows are tuples");
                goto fail;
            }
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(rows, p), "nn;a kind's rows are "
                                  "(position, buffer) pairs", &kind->positions[p],
                                  &kind->operand_buffers[p]))
                goto fail;
            if (kind->positions[p] < 0 || kind->operand_buffers[p] < 0
                    || kind->operand_buffers[p] >= buffer_count) {
                PyErr_SetString(PyExc_ValueError, "a kind's operand is out of range");
                goto fail;
            }
        }
        for (Py_ssize_t n = 0; n < kind->output_count; n++) {
            PyObject *buffer = PyTuple_GET_ITEM(outputs, n);
            kind->output_buffers[n] = -1;
            if (buffer != Py_None && index_in(buffer, 0, buffer_count, "an output's buffer",
                                              -1, &kind->output_buffers[n]) < 0)
                goto fail;
        }
    }
    return kinds;
fail:
    kinds_free(kinds, *count);
    return NULL;
}

/* A row not known until every input is: the ``number``-th Python value
 * (or earlier node) of ``buffer``. */
typedef struct {
    Py_ssize_t place, buffer, number;
    int is_node;
} Pending;

/* A step's row in ``steps``: kind, count, the start and end of its operand
 * rows, distinct, then each output's first row and end (from STEP_OUTPUTS
 * on, two ints per output).  The ends are there so that a compiled step
 * need not compute them: every op in its loop costs at each step. */
#define STEP_END 3
#define STEP_DISTINCT 4
#define STEP_OUTPUTS 5

/* Each step's ``distinct``: 1 if no row of a buffer is among its operand
 * rows twice, else 0.  The backward adds a step's gradient into those rows
 * by reading, adding and writing them back, which is right only for rows
 * read once in the step, and several times faster on the CPU than
 * TensorFlow's scatter_add (program.py, ``_add_rows``).  One pass over the
 * rows: per buffer row, the last step that read it. */
static int
mark_distinct(IntArray *steps, Py_ssize_t width, const IntArray *rows,
              const KindInfo *kinds, Py_ssize_t buffer_count,
              const Py_ssize_t *computed, PyObject *input_values,
              PyObject *input_nodes)
{
    Py_ssize_t *first = PyMem_New(Py_ssize_t, buffer_count + 1), total = 0;
    if (first == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t b = 0; b < buffer_count; b++) {
        first[b] = total;
        total += computed[b] + PyList_GET_SIZE(PyList_GET_ITEM(input_values, b))
                 + PyList_GET_SIZE(PyList_GET_ITEM(input_nodes, b));
    }
    first[buffer_count] = total;   /* (so each buffer's size is first[b + 1] - first[b]) */
    int *last = PyMem_New(int, total + 1);
    if (last == NULL) {
        PyMem_Free(first);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t r = 0; r < total; r++)
        last[r] = -1;
    int status = 0;
    for (Py_ssize_t s = 0; s * width < steps->size && status == 0; s++) {
        int *step = &steps->items[s * width];
        const KindInfo *kind = &kinds[step[0]];
        Py_ssize_t size = step[1], start = step[2];
        for (Py_ssize_t p = 0; p < kind->operand_count; p++) {
            Py_ssize_t buffer = kind->operand_buffers[p];
            Py_ssize_t limit = first[buffer + 1] - first[buffer];
            for (Py_ssize_t j = 0; j < size; j++) {
                Py_ssize_t row = rows->items[start + p * size + j];
                if (row < 0 || row >= limit) {
                    PyErr_Format(PyExc_ValueError, "step %zd reads row %zd of "
                                 "buffer %zd, which has %zd", s, row, buffer, limit);
                    status = -1;
                    break;
                }
                int *seen = &last[first[buffer] + row];
                if (*seen == (int)s)
                    step[STEP_DISTINCT] = 0;
                *seen = (int)s;
            }
            if (status < 0)
                break;
        }
    }
    PyMem_Free(last);
    PyMem_Free(first);
    return status;
}

PyDoc_STRVAR(fill_doc,
"fill(batches, nodes, type_of, duplicate_of, operands, type_count,\n"
"     kind_of_type, kinds, computed, access_entry)\n--\n\n"
"The program's arrays (see plan.py): returns (steps, rows, input_values,\n"
"input_nodes, where, outputs, slots).  ``steps`` and ``rows`` are int32\n"
"bytes (steps: STEP_OUTPUTS + 2 * most outputs ints per step: kind,\n"
"count, start, end, distinct, each output's start and end); per node, ``where``\n"
"is its first slot (-1: none) and ``outputs`` its number of outputs (-1:\n"
"a single-output node); ``slots`` holds (buffer, row) pairs, buffer -1\n"
"for an output not kept.  ``kinds``: per kind, (((position, buffer), ...)\n"
"of its per-instance operands, (buffer or None per output), multi_output).");

static PyObject *
fill(PyObject *module, PyObject *args)
{
    PyObject *batches, *nodes, *type_of, *duplicate_of, *operands, *kind_of_type,
             *kind_list, *computed_list, *access_entry;
    Py_ssize_t type_count;
    if (!PyArg_ParseTuple(args, "O!OOOOnOOO!O:fill", &PyList_Type, &batches,
                          &nodes, &type_of, &duplicate_of, &operands, &type_count,
                          &kind_of_type, &kind_list, &PyList_Type, &computed_list,
                          &access_entry))
        return NULL;
    Graph graph;
    if (graph_read(&graph, nodes, type_of, duplicate_of, operands, type_count,
                   access_entry) < 0)
        return NULL;
    Py_ssize_t buffer_count = PyList_GET_SIZE(computed_list), kind_count = 0;
    Py_ssize_t count = graph.count, width = STEP_OUTPUTS;
    PyObject *result = NULL, *input_values = NULL, *input_nodes = NULL,
             *input_number = NULL;
    IntArray steps = {0}, rows = {0}, slots = {0};
    Pending *pending = NULL;
    Py_ssize_t pending_count = 0, pending_capacity = 0;
    int *where = NULL, *outputs = NULL;
    Py_ssize_t *computed = NULL, *filled = NULL;
    Py_ssize_t *members = NULL, members_capacity = 0;   /* a batch's nodes */
    KindInfo *kinds = NULL;
    Py_ssize_t *kind_of = index_array(kind_of_type, type_count, -1, PY_SSIZE_T_MAX,
                                    "kind_of_type");
    if (kind_of == NULL)
        goto done;
    kinds = kinds_read(kind_list, buffer_count, &kind_count);
    computed = index_array(computed_list, buffer_count, 0, PY_SSIZE_T_MAX, "computed");
    filled = PyMem_Calloc(buffer_count + 1, sizeof(Py_ssize_t));
    where = PyMem_New(int, count + 1);
    outputs = PyMem_New(int, count + 1);
    input_values = PyList_New(buffer_count);
    input_nodes = PyList_New(buffer_count);
    input_number = PyDict_New();   /* earlier node -> its number among inputs */
    if (kinds == NULL || computed == NULL || input_values == NULL
            || input_nodes == NULL || input_number == NULL)
        goto done;
    if (filled == NULL || where == NULL || outputs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t b = 0; b < buffer_count; b++) {
        PyObject *values = PyList_New(0), *earlier = PyList_New(0);
        if (values == NULL || earlier == NULL) {
            Py_XDECREF(values);
            Py_XDECREF(earlier);
            goto done;
        }
        PyList_SET_ITEM(input_values, b, values);
        PyList_SET_ITEM(input_nodes, b, earlier);
    }
    for (Py_ssize_t k = 0; k < kind_count; k++)
        if (width < STEP_OUTPUTS + 2 * kinds[k].output_count)
            width = STEP_OUTPUTS + 2 * kinds[k].output_count;
    for (Py_ssize_t i = 0; i < count; i++)
        where[i] = outputs[i] = -1;

    Py_ssize_t batch_count = PyList_GET_SIZE(batches);
    for (Py_ssize_t s = 0; s < batch_count; s++) {
        PyObject *batch = PyList_GET_ITEM(batches, s);
        if (!PyList_Check(batch) || PyList_GET_SIZE(batch) == 0) {
            PyErr_SetString(PyExc_ValueError, "a batch must be a non-empty list");
            goto done;
        }
        /* The batch's nodes, checked once: in range, of one type. */
        Py_ssize_t size = PyList_GET_SIZE(batch);
        while (members_capacity < size)
            if (array_grow((void **)&members, &members_capacity, sizeof(Py_ssize_t)) < 0)
                goto done;
        for (Py_ssize_t j = 0; j < size; j++) {
            if (index_in(PyList_GET_ITEM(batch, j), 0, count, "a batch's node", j,
                         &members[j]) < 0)
                goto done;
            if (graph.type_of[members[j]] != graph.type_of[members[0]]) {
                PyErr_Format(PyExc_ValueError, "batch %zd mixes node types", s);
                goto done;
            }
        }
        Py_ssize_t node_type = graph.type_of[members[0]];
        Py_ssize_t kind_number = node_type < 0 ? -1 : kind_of[node_type];
        if (kind_number < 0 || kind_number >= kind_count) {
            PyErr_Format(PyExc_ValueError, "node %zd of a batch has no kind", members[0]);
            goto done;
        }
        KindInfo *kind = &kinds[kind_number];
        if (int_push(&steps, kind_number) < 0 || int_push(&steps, size) < 0
                || int_push(&steps, rows.size) < 0
                || int_push(&steps, rows.size + kind->operand_count * size) < 0
                || int_push(&steps, 1) < 0)
            goto done;
        /* Each per-instance operand's rows in turn. */
        for (Py_ssize_t p = 0; p < kind->operand_count; p++) {
            Py_ssize_t buffer = kind->operand_buffers[p];
            for (Py_ssize_t j = 0; j < size; j++) {
                Py_ssize_t index = members[j];
                const Operand *operand = operand_at(graph.operands, index,
                                                    kind->positions[p]);
                if (operand == NULL)
                    goto done;
                Py_ssize_t source = operand->index, pick = operand->pick, row = 0;
                int is_pending = 0, is_node = 0;
                Py_ssize_t number = 0;
                if (source == OPERAND_VALUE) {   /* a Python list or array */
                    PyObject *values = PyList_GET_ITEM(input_values, buffer);
                    number = PyList_GET_SIZE(values);
                    if (PyList_Append(values, operand->object) < 0)
                        goto done;
                    is_pending = 1;
                }
                else {
                    if (source >= 0) {
                        Py_ssize_t slot = where[source];
                        if (slot >= 0 && pick >= 0) {
                            if (pick >= slots_of(outputs[source])) {
                                PyErr_SetString(PyExc_ValueError, "an operand picks "
                                                "an output its node lacks");
                                goto done;
                            }
                            slot += pick;
                        }
                        if (slot < 0 || slots.items[2 * slot] < 0) {
                            PyErr_Format(PyExc_ValueError, "node %zd reads node %zd "
                                         "before a step computes it", index, source);
                            goto done;
                        }
                        row = slots.items[2 * slot + 1];
                    }
                    else {   /* evaluated earlier: an input */
                        PyObject *earlier = Py_NewRef(operand->object);
                        PyObject *known = PyDict_GetItemWithError(input_number, earlier);
                        if (known != NULL) {
                            number = PyLong_AsSsize_t(known);
                        }
                        else if (!PyErr_Occurred()) {
                            PyObject *list = PyList_GET_ITEM(input_nodes, buffer);
                            number = PyList_GET_SIZE(list);
                            PyObject *value = PyLong_FromSsize_t(number);
                            if (value == NULL || PyDict_SetItem(input_number, earlier, value) < 0
                                    || PyList_Append(list, earlier) < 0) {
                                Py_XDECREF(value);
                                Py_DECREF(earlier);
                                goto done;
                            }
                            Py_DECREF(value);
                        }
                        Py_DECREF(earlier);
                        if (PyErr_Occurred())
                            goto done;
                        is_pending = is_node = 1;
                    }
                }
                if (is_pending) {
                    if (pending_count == pending_capacity
                            && array_grow((void **)&pending, &pending_capacity,
                                          sizeof(Pending)) < 0)
                        goto done;
                    pending[pending_count++] = (Pending){rows.size, buffer, number, is_node};
                }
                if (int_push(&rows, row) < 0)
                    goto done;
            }
        }
        /* Each output's rows are the next ones of its buffer. */
        Py_ssize_t starts = steps.size;
        for (Py_ssize_t n = STEP_OUTPUTS; n < width; n++)
            if (int_push(&steps, 0) < 0)
                goto done;
        for (Py_ssize_t n = 0; n < kind->output_count; n++) {
            Py_ssize_t buffer = kind->output_buffers[n];
            if (buffer < 0)
                continue;
            if (as_int32(filled[buffer], &steps.items[starts + 2 * n]) < 0
                    || as_int32(filled[buffer] + size, &steps.items[starts + 2 * n + 1]) < 0)
                goto done;
            filled[buffer] += size;
        }
        for (Py_ssize_t j = 0; j < size; j++) {
            Py_ssize_t index = members[j];
            if (where[index] >= 0) {
                PyErr_Format(PyExc_ValueError, "node %zd is in two batches", index);
                goto done;
            }
            if (as_int32(slots.size / 2, &where[index]) < 0)
                goto done;
            outputs[index] = kind->multi_output ? (int)kind->output_count : -1;
            for (Py_ssize_t n = 0; n < kind->output_count; n++) {
                Py_ssize_t buffer = kind->output_buffers[n];
                if (int_push(&slots, buffer) < 0
                        || int_push(&slots, buffer < 0 ? 0
                                     : steps.items[starts + 2 * n] + j) < 0)
                    goto done;
            }
        }
    }
    for (Py_ssize_t b = 0; b < buffer_count; b++) {
        if (filled[b] != computed[b]) {
            PyErr_Format(PyExc_ValueError, "buffer %zd: the steps compute %zd rows, "
                         "not %zd", b, filled[b], computed[b]);
            goto done;
        }
    }
    /* Duplicates share their original's place; an access node has its
     * multi-output node's output's. */
    for (Py_ssize_t i = 0; i < count; i++) {
        if (where[i] >= 0)
            continue;
        Node *node = graph_node(&graph, i);
        if (node->entry == graph.access_entry) {
            Py_ssize_t source, number;
            if (access_source(&graph, i, &source) < 0 || access_number(node, &number) < 0)
                goto done;
            if (source < 0)
                continue;
            Py_ssize_t original = graph.duplicate_of[source];
            if (where[original] < 0)
                continue;
            if (number >= slots_of(outputs[original])) {
                PyErr_SetString(PyExc_ValueError, "an access node picks an output "
                                "its node lacks");
                goto done;
            }
            where[i] = where[original] + (int)number;
            outputs[i] = -1;
        }
        else {
            where[i] = where[graph.duplicate_of[i]];
            outputs[i] = outputs[graph.duplicate_of[i]];
        }
    }
    /* Input rows: after the computed rows, Python values, then nodes. */
    for (Py_ssize_t k = 0; k < pending_count; k++) {
        Pending *entry = &pending[k];
        Py_ssize_t row = computed[entry->buffer] + entry->number;
        if (entry->is_node)
            row += PyList_GET_SIZE(PyList_GET_ITEM(input_values, entry->buffer));
        if (as_int32(row, &rows.items[entry->place]) < 0)
            goto done;
    }
    if (mark_distinct(&steps, width, &rows, kinds, buffer_count, computed,
                      input_values, input_nodes) < 0)
        goto done;
    PyObject *parts[] = {
        int32_bytes(steps.items, steps.size), int32_bytes(rows.items, rows.size),
        int32_bytes(where, count), int32_bytes(outputs, count),
        int32_bytes(slots.items, slots.size), PyLong_FromSsize_t(width)};
    if (parts[0] && parts[1] && parts[2] && parts[3] && parts[4] && parts[5])
        result = Py_BuildValue("(OOOOOOOO)", parts[0], parts[1], input_values,
                               input_nodes, parts[2], parts[3], parts[4], parts[5]);
    for (int p = 0; p < 6; p++)
        Py_XDECREF(parts[p]);
done:
    Py_XDECREF(input_values);
    Py_XDECREF(input_nodes);
    Py_XDECREF(input_number);
    PyMem_Free(steps.items);
    PyMem_Free(rows.items);
    PyMem_Free(slots.items);
    PyMem_Free(pending);
    PyMem_Free(members);
    PyMem_Free(where);
    PyMem_Free(outputs);
    PyMem_Free(computed);
    PyMem_Free(filled);
    PyMem_Free(kind_of);
    kinds_free(kinds, kind_count);
    graph_free(&graph);
    return result;
}

/* -- the write-back ---------------------------------------------------------- */

/* bytes of int32, checked to hold ``count`` of them. */
static const int *
int32_view(PyObject *bytes, Py_ssize_t count, const char *what)
{
    if (!PyBytes_Check(bytes)
            || PyBytes_GET_SIZE(bytes) != count * (Py_ssize_t)sizeof(int)) {
        PyErr_Format(PyExc_ValueError, "%s must be bytes of %zd int32", what, count);
        return NULL;
    }
    return (const int *)PyBytes_AS_STRING(bytes);
}

/* An evaluated node needs neither its operands nor its call site. */
static int
release_node(Node *node)
{
    if (node_set_inputs(node, NULL, 0) < 0)
        return -1;
    Py_XSETREF(node->site, Py_NewRef(Py_None));
    return 0;
}

/* -- operands held while a queued program runs --------------------------- */

/* The operands and call sites of the nodes a queued program evaluates
 * (write_back with ``keep``), kept aside: the nodes look evaluated (no
 * operands, which the passes read as "evaluated") until the queue is known
 * to have run; then they are dropped with the capsule, or, if it failed,
 * given back (``restore``) so the nodes can run anew.  ``items`` holds,
 * per node: the node, its site, its operand count, its operands (all
 * owned but the count). */
#define HELD_NAME "subgraphjit.held"

static void
held_clear(PtrArray *held)
{
    Py_ssize_t i = 0;
    while (i < held->size) {
        Py_ssize_t count = (Py_ssize_t)(intptr_t)held->items[i + 2];
        Py_DECREF((PyObject *)held->items[i]);
        Py_DECREF((PyObject *)held->items[i + 1]);
        for (Py_ssize_t k = 0; k < count; k++)
            Py_DECREF((PyObject *)held->items[i + 3 + k]);
        i += 3 + count;
    }
    held->size = 0;
}

static void
held_free(PyObject *capsule)
{
    PtrArray *held = PyCapsule_GetPointer(capsule, HELD_NAME);
    if (held == NULL) {
        PyErr_Clear();
        return;
    }
    held_clear(held);
    PyMem_Free(held->items);
    PyMem_Free(held);
}

/* Move ``node``'s operands and site into ``held``. */
static int
held_take(PtrArray *held, Node *node)
{
    Py_ssize_t count = node->input_count;
    Py_ssize_t start = held->size;
    if (ptr_push(held, Py_NewRef(node)) < 0)
        return -1;
    if (ptr_push(held, Py_NewRef(node->site == NULL ? Py_None : node->site)) < 0
            || ptr_push(held, (void *)(intptr_t)0) < 0)
        goto undo;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (ptr_push(held, Py_NewRef(node_input(node, k))) < 0)
            goto undo;
        held->items[start + 2] = (void *)(intptr_t)(k + 1);
    }
    return release_node(node);
undo:
    /* (Everything pushed is owned but the count, at start + 2.) */
    for (Py_ssize_t j = held->size - 1; j >= start; j--)
        if (j != start + 2)
            Py_DECREF((PyObject *)held->items[j]);
    held->size = start;
    return -1;
}

PyDoc_STRVAR(write_back_doc,
"write_back(nodes, operands, where, outputs, slots, buffers,\n"
"           access_entry, keep=False)\n--\n\n"
"Leave each node's value as its row of the program's ``buffers`` (fill's\n"
"arrays say where) and drop its operands; a node with an output not kept\n"
"stays unevaluated and is marked swallowed.  Returns the nodes nothing\n"
"consumes that were given a row, whose values the caller takes at once.\n"
"With ``keep`` true (the buffers are still being computed: a pipelined\n"
"evaluation), returns that list and a capsule holding the operands and\n"
"call sites dropped, to give back (``restore``) if the computation fails.");

static PyObject *
write_back(PyObject *module, PyObject *args)
{
    PyObject *nodes, *operands, *where_bytes, *outputs_bytes, *slots_bytes, *buffers,
             *access_entry;
    int keep = 0;
    if (!PyArg_ParseTuple(args, "O!O!SSSO!O|p:write_back", &PyList_Type, &nodes,
                          operand_table_type, &operands, &where_bytes, &outputs_bytes,
                          &slots_bytes, &PyList_Type, &buffers, &access_entry, &keep))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(nodes);
    Py_ssize_t slot_count = PyBytes_GET_SIZE(slots_bytes) / (2 * (Py_ssize_t)sizeof(int));
    Py_ssize_t buffer_count = PyList_GET_SIZE(buffers);
    const int *where = int32_view(where_bytes, count, "where");
    const int *outputs = where == NULL ? NULL : int32_view(outputs_bytes, count, "outputs");
    const int *slots = outputs == NULL ? NULL
        : int32_view(slots_bytes, 2 * slot_count, "slots");
    if (slots == NULL)
        return NULL;
    if (((OperandTable *)operands)->count != count) {
        PyErr_SetString(PyExc_ValueError, "write_back: operands must match nodes");
        return NULL;
    }
    Py_ssize_t described = described_nodes(nodes, (OperandTable *)operands);
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t used = slots_of(outputs[i]);
        if (i >= described && !Py_IS_TYPE(PyList_GET_ITEM(nodes, i), node_type)) {
            PyErr_Format(PyExc_TypeError, "nodes[%zd] is not a VirtualNode", i);
            return NULL;
        }
        if (where[i] >= 0 && where[i] + used > slot_count) {
            PyErr_SetString(PyExc_ValueError, "write_back: a slot is out of range");
            return NULL;
        }
        for (Py_ssize_t n = 0; where[i] >= 0 && n < used; n++) {
            if (slots[2 * (where[i] + n)] >= buffer_count) {
                PyErr_SetString(PyExc_ValueError, "write_back: a buffer is out of range");
                return NULL;
            }
        }
    }
    Graph graph = {.nodes = nodes, .operands = (OperandTable *)operands,
                   .access_entry = access_entry,
                   .count = count};
    PtrArray *held = NULL;
    PyObject *capsule = NULL;
    if (keep) {
        held = PyMem_Calloc(1, sizeof(PtrArray));
        if (held == NULL)
            return PyErr_NoMemory();
        capsule = PyCapsule_New(held, HELD_NAME, held_free);
        if (capsule == NULL) {
            PyMem_Free(held);
            return NULL;
        }
    }
    PyObject *results = PyList_New(0);
    if (results == NULL) {
        Py_XDECREF(capsule);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Node *node = graph_node(&graph, i);
        if (i + 8 < count)
            prefetch_node(graph_node(&graph, i + 8));
        PyObject *batched = NULL, *row = NULL;
        if (where[i] >= 0 && outputs[i] >= 0) {   /* a multi-output node */
            const int *slot = &slots[2 * where[i]];
            int kept = 1;
            for (Py_ssize_t n = 0; n < outputs[i]; n++)
                kept &= slot[2 * n] >= 0;
            if (!kept)
                goto swallow;   /* stays unevaluated, with its inputs */
            batched = PyList_New(outputs[i]);
            row = PyTuple_New(outputs[i]);
            if (batched == NULL || row == NULL)
                goto fail_node;
            PyObject_GC_UnTrack(batched);   /* (held by its pair only: row_pair) */
            for (Py_ssize_t n = 0; n < outputs[i]; n++) {
                PyObject *number = PyLong_FromLong(slot[2 * n + 1]);
                if (number == NULL)
                    goto fail_node;
                PyList_SET_ITEM(batched, n, Py_NewRef(PyList_GET_ITEM(buffers, slot[2 * n])));
                PyTuple_SET_ITEM(row, n, number);
            }
        }
        else if (where[i] >= 0 && slots[2 * where[i]] >= 0) {
            batched = Py_NewRef(PyList_GET_ITEM(buffers, slots[2 * where[i]]));
            row = PyLong_FromLong(slots[2 * where[i] + 1]);
            if (row == NULL)
                goto fail_node;
        }
        else if (node->entry != access_entry) {
            goto swallow;   /* not kept */
        }
        else {
            /* An access node of an op evaluated earlier: describe_graph
             * gave it its value; an access node of an output not kept
             * stays unevaluated. */
            Py_ssize_t source;
            if (access_source(&graph, i, &source) < 0)
                goto fail;
            if (source >= 0)
                goto swallow;
        }
        if (batched != NULL) {
            PyObject *pair = row_pair(batched, row);
            Py_CLEAR(batched);
            Py_CLEAR(row);
            if (pair == NULL)
                goto fail;
            node->is_row = 1;
            Py_XSETREF(node->value, pair);
        }
        if ((held == NULL ? release_node(node) : held_take(held, node)) < 0)
            goto fail;
        if (node->consumers == 0 && node->is_row
                && PyList_Append(results, (PyObject *)node) < 0)
            goto fail;
        continue;
swallow:
        node->swallowed = 1;
        continue;
fail_node:
        Py_XDECREF(batched);
        Py_XDECREF(row);
        goto fail;
    }
    if (capsule != NULL)
        return Py_BuildValue("(NN)", results, capsule);
    return results;
fail:
    Py_DECREF(results);
    Py_XDECREF(capsule);
    return NULL;
}

PyDoc_STRVAR(restore_doc,
"restore(held)\n--\n\n"
"Give the nodes ``write_back`` evaluated with ``keep`` their operands and\n"
"call sites back and make them unevaluated: their queued program failed,\n"
"and they run anew.  The capsule is empty afterwards.");

static PyObject *
restore(PyObject *module, PyObject *capsule)
{
    PtrArray *held = PyCapsule_GetPointer(capsule, HELD_NAME);
    if (held == NULL)
        return NULL;
    Py_ssize_t i = 0;
    while (i < held->size) {
        Node *node = (Node *)held->items[i];
        Py_ssize_t count = (Py_ssize_t)(intptr_t)held->items[i + 2];
        if (node_set_inputs(node, (PyObject *const *)&held->items[i + 3], count) < 0)
            return NULL;
        Py_XSETREF(node->site, Py_NewRef((PyObject *)held->items[i + 1]));
        Py_XSETREF(node->value, Py_NewRef(Py_None));
        node->is_row = 0;
        i += 3 + count;
    }
    held_clear(held);
    Py_RETURN_NONE;
}

static PyMethodDef plan_methods[] = {
    {"read_outputs", read_outputs, METH_VARARGS, read_outputs_doc},
    {"fill", fill, METH_VARARGS, fill_doc},
    {"write_back", write_back, METH_VARARGS, write_back_doc},
    {"restore", restore, METH_O, restore_doc},
    {NULL},
};

int
add_plan_functions(PyObject *module)
{
    /* The step table's columns, for program.py. */
    if (PyModule_AddIntConstant(module, "STEP_END", STEP_END) < 0
            || PyModule_AddIntConstant(module, "STEP_DISTINCT", STEP_DISTINCT) < 0
            || PyModule_AddIntConstant(module, "STEP_OUTPUTS", STEP_OUTPUTS) < 0)
        return -1;
    return PyModule_AddFunctions(module, plan_methods);
}
