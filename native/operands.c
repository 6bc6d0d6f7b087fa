/* A BatchGraph's operands and sources as C arrays (issue 17).
 *
 * describe_graph (analysis.c) fills an OperandTable; the passes after it
 * (the schedulers, plan.c's read_outputs, fill and write_back) read its
 * arrays.  A 256-tree minibatch's graph has 65,000 nodes: a Python list of
 * operands and a tuple of sources per node, with a NodeOperand per node
 * operand, cost more to make and to free than those passes' own work.
 * Python code that asks (the step-by-step executor, varying shapes, the
 * FSM scheduler, statistics) still sees ``operands[i]``, a list of
 * NodeOperands and foreign values, and ``sources[i]``, a tuple of graph
 * indices: made on the first request and kept, so that every request for
 * one node gives the same objects, as the lists of lists did.
 *
 * Not tracked by the cyclic collector: a table refers to nodes, foreign
 * values (tensors, variables, Python values) and the lists made from them,
 * none of which refers to a table. */
#include "containers.h"

PyTypeObject *operand_table_type;
static PyTypeObject *sources_view_type;

/* The sources view (``table.sources``): the same table, seen per node as
 * the tuple of its sources. */
typedef struct {
    PyObject_HEAD
    OperandTable *table;
} SourcesView;

OperandTable *
operand_table_new(Py_ssize_t count)
{
    OperandTable *table = PyObject_New(OperandTable, operand_table_type);
    if (table == NULL)
        return NULL;
    table->count = 0;
    table->capacity = count;
    table->items = NULL;
    table->item_count = table->item_capacity = 0;
    table->sources = NULL;
    table->source_count = table->source_capacity = 0;
    table->lists = table->tuples = NULL;
    table->nodes = NULL;
    table->first = PyMem_New(Py_ssize_t, count + 1);
    table->source_first = PyMem_New(Py_ssize_t, count + 1);
    if (table->first == NULL || table->source_first == NULL) {
        Py_DECREF(table);
        PyErr_NoMemory();
        return NULL;
    }
    table->first[0] = table->source_first[0] = 0;
    return table;
}

int
operand_table_push(OperandTable *table, Py_ssize_t index, Py_ssize_t pick,
                   PyObject *object)
{
    if (table->item_count == table->item_capacity
            && array_grow((void **)&table->items, &table->item_capacity,
                          sizeof(Operand)) < 0)
        return -1;
    table->items[table->item_count++] = (Operand){index, pick, Py_NewRef(object)};
    return 0;
}

int
operand_table_add_source(OperandTable *table, Py_ssize_t source)
{
    for (Py_ssize_t k = table->source_first[table->count]; k < table->source_count; k++)
        if (table->sources[k] == source)
            return 0;
    if (table->source_count == table->source_capacity
            && array_grow((void **)&table->sources, &table->source_capacity,
                          sizeof(Py_ssize_t)) < 0)
        return -1;
    table->sources[table->source_count++] = source;
    return 0;
}

int
operand_table_end_node(OperandTable *table)
{
    if (table->count == table->capacity) {
        PyErr_SetString(PyExc_RuntimeError, "an OperandTable got more nodes "
                        "than it was made for");
        return -1;
    }
    table->count++;
    table->first[table->count] = table->item_count;
    table->source_first[table->count] = table->source_count;
    return 0;
}

static void
operand_table_dealloc(PyObject *self)
{
    OperandTable *table = (OperandTable *)self;
    PyTypeObject *type = Py_TYPE(self);
    for (Py_ssize_t i = 0; i < table->item_count; i++)
        Py_DECREF(table->items[i].object);
    for (Py_ssize_t i = 0; table->lists != NULL && i < table->count; i++)
        Py_XDECREF(table->lists[i]);
    for (Py_ssize_t i = 0; table->tuples != NULL && i < table->count; i++)
        Py_XDECREF(table->tuples[i]);
    PyMem_Free(table->items);
    PyMem_Free(table->sources);
    PyMem_Free(table->first);
    PyMem_Free(table->source_first);
    PyMem_Free(table->lists);
    PyMem_Free(table->tuples);
    Py_XDECREF(table->nodes);
    type->tp_free(self);
    Py_DECREF(type);
}

static Py_ssize_t
operand_table_length(PyObject *self)
{
    return ((OperandTable *)self)->count;
}

/* A per-node cache of Python objects, allocated on the first request. */
static PyObject **
made_slot(PyObject ***made, Py_ssize_t count, Py_ssize_t index)
{
    if (*made == NULL) {
        *made = PyMem_Calloc(count + 1, sizeof(PyObject *));
        if (*made == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
    }
    return &(*made)[index];
}

static int
index_check(Py_ssize_t index, Py_ssize_t count)
{
    if (index < 0 || index >= count) {
        PyErr_SetString(PyExc_IndexError, "graph index out of range");
        return -1;
    }
    return 0;
}

/* ``operands[index]``: NodeOperands for nodes, foreign values as they are. */
static PyObject *
operand_table_item(PyObject *self, Py_ssize_t index)
{
    OperandTable *table = (OperandTable *)self;
    if (index_check(index, table->count) < 0)
        return NULL;
    PyObject **slot = made_slot(&table->lists, table->count, index);
    if (slot == NULL)
        return NULL;
    if (*slot != NULL)
        return Py_NewRef(*slot);
    Py_ssize_t first = table->first[index], count = table->first[index + 1] - first;
    PyObject *list = PyList_New(count);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t p = 0; p < count; p++) {
        const Operand *operand = &table->items[first + p];
        PyObject *item;
        if (operand->index == OPERAND_VALUE) {
            item = Py_NewRef(operand->object);
        }
        else {
            PyObject *pick = operand->pick < 0 ? Py_NewRef(Py_None)
                                               : PyLong_FromSsize_t(operand->pick);
            item = pick == NULL ? NULL
                : node_operand_new(operand->index, pick, operand->object);
            Py_XDECREF(pick);
        }
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, p, item);
    }
    *slot = Py_NewRef(list);
    return list;
}

static PyObject *
operand_table_sources(PyObject *self, void *unused)
{
    SourcesView *view = PyObject_New(SourcesView, sources_view_type);
    if (view != NULL)
        view->table = (OperandTable *)Py_NewRef(self);
    return (PyObject *)view;
}

static PyGetSetDef operand_table_getset[] = {
    {"sources", operand_table_sources, NULL,
     "per node, the tuple of the graph indices it reads (canonical: a "
     "duplicate's original), for the schedulers", NULL},
    {NULL},
};

static PyType_Slot operand_table_slots[] = {
    {Py_tp_dealloc, operand_table_dealloc},
    {Py_sq_length, operand_table_length},
    {Py_sq_item, operand_table_item},
    {Py_tp_getset, operand_table_getset},
    {Py_tp_doc, "A BatchGraph's operands (made by describe_graph): "
                "operands[i] lists node i's operands, a NodeOperand for each "
                "recorded node, foreign values as they are."},
    {0, NULL},
};

static PyType_Spec operand_table_spec = {
    .name = "subgraphjit._native.OperandTable",
    .basicsize = sizeof(OperandTable),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = operand_table_slots,
};

/* -- the sources view ------------------------------------------------------- */

static void
sources_view_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_DECREF(((SourcesView *)self)->table);
    type->tp_free(self);
    Py_DECREF(type);
}

static Py_ssize_t
sources_view_length(PyObject *self)
{
    return ((SourcesView *)self)->table->count;
}

static PyObject *
sources_view_item(PyObject *self, Py_ssize_t index)
{
    OperandTable *table = ((SourcesView *)self)->table;
    if (index_check(index, table->count) < 0)
        return NULL;
    PyObject **slot = made_slot(&table->tuples, table->count, index);
    if (slot == NULL)
        return NULL;
    if (*slot != NULL)
        return Py_NewRef(*slot);
    Py_ssize_t first = table->source_first[index];
    /* (Asked for rarely, by Python code: the list is a step, not a cost.) */
    PyObject *list = int_list(&table->sources[first],
                              table->source_first[index + 1] - first);
    PyObject *tuple = list == NULL ? NULL : PyList_AsTuple(list);
    Py_XDECREF(list);
    if (tuple == NULL)
        return NULL;
    *slot = Py_NewRef(tuple);
    return tuple;
}

static PyType_Slot sources_view_slots[] = {
    {Py_tp_dealloc, sources_view_dealloc},
    {Py_sq_length, sources_view_length},
    {Py_sq_item, sources_view_item},
    {Py_tp_doc, "An OperandTable's sources: sources[i] is the tuple of the "
                "graph indices node i reads."},
    {0, NULL},
};

static PyType_Spec sources_view_spec = {
    .name = "subgraphjit._native.Sources",
    .basicsize = sizeof(SourcesView),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = sources_view_slots,
};

/* -- Indices ----------------------------------------------------------------- */

static PyTypeObject *indices_type;

typedef struct {
    PyObject_HEAD
    Py_ssize_t count;
    Py_ssize_t *items;
} Indices;

PyObject *
indices_new(const Py_ssize_t *items, Py_ssize_t count)
{
    Indices *indices = PyObject_New(Indices, indices_type);
    if (indices == NULL)
        return NULL;
    indices->count = count;
    indices->items = PyMem_New(Py_ssize_t, count + 1);
    if (indices->items == NULL) {
        Py_DECREF(indices);
        return PyErr_NoMemory();
    }
    memcpy(indices->items, items, count * sizeof(Py_ssize_t));
    return (PyObject *)indices;
}

const Py_ssize_t *
indices_items(PyObject *object, Py_ssize_t *count)
{
    if (!Py_IS_TYPE(object, indices_type))
        return NULL;
    *count = ((Indices *)object)->count;
    return ((Indices *)object)->items;
}

int
index_in(PyObject *value, Py_ssize_t low, Py_ssize_t high, const char *what,
         Py_ssize_t position, Py_ssize_t *out)
{
    if (!PyLong_Check(value)) {
        if (position < 0)
            PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what,
                         Py_TYPE(value)->tp_name);
        else
            PyErr_Format(PyExc_TypeError, "%s at %zd must be an int, not %.100s",
                         what, position, Py_TYPE(value)->tp_name);
        return -1;
    }
    Py_ssize_t number = PyLong_AsSsize_t(value);
    if (number == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        number = high;   /* beyond Py_ssize_t: out of range below */
    }
    if (number < low || number >= high) {
        if (position < 0)
            PyErr_Format(PyExc_ValueError, "%s is %R, not in [%zd, %zd)", what,
                         value, low, high);
        else
            PyErr_Format(PyExc_ValueError, "%s at %zd is %R, not in [%zd, %zd)",
                         what, position, value, low, high);
        return -1;
    }
    *out = number;
    return 0;
}

Py_ssize_t *
index_array(PyObject *sequence, Py_ssize_t count, Py_ssize_t low, Py_ssize_t high,
            const char *what)
{
    Py_ssize_t given_count = -1;
    const Py_ssize_t *given = indices_items(sequence, &given_count);
    if (given == NULL && (PyList_Check(sequence) || PyTuple_Check(sequence)))
        given_count = PySequence_Fast_GET_SIZE(sequence);
    if (given_count != count) {
        PyErr_Format(given_count < 0 ? PyExc_TypeError : PyExc_ValueError,
                     "%s must be a list of %zd ints", what, count);
        return NULL;
    }
    Py_ssize_t *items = PyMem_New(Py_ssize_t, count + 1);
    if (items == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (given == NULL) {
            if (index_in(PySequence_Fast_GET_ITEM(sequence, i), low, high, what, i,
                         &items[i]) < 0)
                goto fail;
        }
        else if (given[i] < low || given[i] >= high) {
            PyErr_Format(PyExc_ValueError, "%s at %zd is %zd, not in [%zd, %zd)",
                         what, i, given[i], low, high);
            goto fail;
        }
        else
            items[i] = given[i];
    }
    return items;
fail:
    PyMem_Free(items);
    return NULL;
}

static void
indices_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyMem_Free(((Indices *)self)->items);
    type->tp_free(self);
    Py_DECREF(type);
}

static Py_ssize_t
indices_length(PyObject *self)
{
    return ((Indices *)self)->count;
}

static PyObject *
indices_item(PyObject *self, Py_ssize_t index)
{
    if (index < 0 || index >= ((Indices *)self)->count) {
        PyErr_SetString(PyExc_IndexError, "index out of range");
        return NULL;
    }
    return PyLong_FromSsize_t(((Indices *)self)->items[index]);
}

/* As a list (equal to a list of the same ints; shown as one). */
static PyObject *
indices_list(PyObject *self)
{
    return int_list(((Indices *)self)->items, ((Indices *)self)->count);
}

static PyObject *
indices_richcompare(PyObject *self, PyObject *other, int op)
{
    PyObject *list = indices_list(self);
    if (list == NULL)
        return NULL;
    PyObject *result = PyObject_RichCompare(list, other, op);
    Py_DECREF(list);
    return result;
}

static PyObject *
indices_repr(PyObject *self)
{
    PyObject *list = indices_list(self);
    if (list == NULL)
        return NULL;
    PyObject *repr = PyUnicode_FromFormat("Indices(%R)", list);
    Py_DECREF(list);
    return repr;
}

static PyType_Slot indices_slots[] = {
    {Py_tp_dealloc, indices_dealloc},
    {Py_sq_length, indices_length},
    {Py_sq_item, indices_item},
    {Py_tp_richcompare, indices_richcompare},
    {Py_tp_repr, indices_repr},
    {Py_tp_hash, PyObject_HashNotImplemented},
    {Py_tp_doc, "A BatchGraph's per-node integers (type_of, duplicate_of): "
                "read like a list of ints, held as a C array for the passes "
                "in C."},
    {0, NULL},
};

static PyType_Spec indices_spec = {
    .name = "subgraphjit._native.Indices",
    .basicsize = sizeof(Indices),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = indices_slots,
};

OperandTable *
sources_table(PyObject *object)
{
    return Py_IS_TYPE(object, sources_view_type) ? ((SourcesView *)object)->table : NULL;
}

int
add_operand_types(PyObject *module)
{
    operand_table_type = (PyTypeObject *)PyType_FromSpec(&operand_table_spec);
    sources_view_type = (PyTypeObject *)PyType_FromSpec(&sources_view_spec);
    indices_type = (PyTypeObject *)PyType_FromSpec(&indices_spec);
    if (operand_table_type == NULL || sources_view_type == NULL || indices_type == NULL)
        return -1;
    if (PyModule_AddObjectRef(module, "OperandTable", (PyObject *)operand_table_type) < 0
            || PyModule_AddObjectRef(module, "Sources", (PyObject *)sources_view_type) < 0
            || PyModule_AddObjectRef(module, "Indices", (PyObject *)indices_type) < 0)
        return -1;
    return 0;
}
