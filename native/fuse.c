/* Joining patterns in C (issue 17): after stage 2 of the pattern search has
 * rewritten matches into pattern nodes, each pattern node that reads a
 * multi-output pattern node's outputs is joined to it, where that makes
 * neither wait (subgraphjit/search.py, PatternSearch._fuse, says when and
 * why).  This runs over every pattern node of every minibatch. */
#include "containers.h"

static PyObject *str_row, *str_pattern, *str_output, *str_argument;

/* Row kinds row_kind gives (bits). */
enum { MULTI_OUTPUT = 1, PRODUCER = 2 };

/* row_kind(row), cached per row for the call. */
static int
kind_of_row(PyObject *row, PyObject *row_kind, PyObject *cache)
{
    PyObject *kind = memo(cache, row, row_kind, row);
    if (kind == NULL)
        return -1;
    long value = PyLong_AsLong(kind);
    if (value == -1 && PyErr_Occurred())
        return -1;
    return (int)value;
}

/* The last recorded multi-output pattern node (a plain one, not joined)
 * whose outputs ``node`` reads through access nodes, or NULL (borrowed). */
static Node *
latest_producer(Node *node, PyObject *access_row, PyObject *row_kind,
                PyObject *cache, int *error)
{
    Node *latest = NULL;
    for (Py_ssize_t i = 0; i < node->input_count; i++) {
        PyObject *operand = node_input(node, i);
        if (!is_node(operand))
            continue;
        Node *access = (Node *)operand;
        if (access->row != access_row || access->input_count == 0)
            continue;   /* (an evaluated access node has no inputs) */
        PyObject *source = node_input(access, 0);
        if (!is_node(source))
            continue;
        int kind = kind_of_row(((Node *)source)->row, row_kind, cache);
        if (kind < 0) {
            *error = 1;
            return NULL;
        }
        if ((kind & PRODUCER) && (latest == NULL || ((Node *)source)->id > latest->id))
            latest = (Node *)source;
    }
    return latest;
}

/* Is ``node`` an unevaluated ancestor of an argument of ``producer`` (so
 * ready before it)?  Ancestors have smaller ids, which bounds the walk; a
 * long one gives up (no).  The walk pops at most FEEDS_BUDGET nodes, so
 * the nodes it has seen are few enough for a plain list. */
#define FEEDS_BUDGET 64
#define FEEDS_NODES 1024   /* more seen or stacked than this: "no" */
static int
feeds(Node *node, Node *producer)
{
    Node *stack[FEEDS_NODES], *seen[FEEDS_NODES];
    Py_ssize_t depth = 0, seen_count = 0, budget = FEEDS_BUDGET;
    for (Py_ssize_t i = 0; i < producer->input_count; i++) {
        PyObject *operand = node_input(producer, i);
        if (is_node(operand) && ((Node *)operand)->id > node->id && depth < FEEDS_NODES)
            stack[depth++] = (Node *)operand;
    }
    while (depth > 0 && budget > 0) {
        budget--;
        Node *current = stack[--depth];
        for (Py_ssize_t i = 0; i < current->input_count; i++) {
            PyObject *operand = node_input(current, i);
            if (operand == (PyObject *)node)
                return 1;
            if (!is_node(operand) || ((Node *)operand)->id <= node->id
                    || !unevaluated((Node *)operand))
                continue;
            int known = 0;
            for (Py_ssize_t k = 0; k < seen_count && !known; k++)
                known = seen[k] == (Node *)operand;
            if (known)
                continue;
            if (seen_count == FEEDS_NODES || depth == FEEDS_NODES)
                return 0;   /* too far to tell: no */
            seen[seen_count++] = (Node *)operand;
            stack[depth++] = (Node *)operand;
        }
    }
    return 0;
}

/* Where each argument of ``consumer`` comes from once joined to
 * ``producer`` (a tuple of ("output", i) and ("argument", place)), with the
 * arguments it adds appended to ``extras``; Py_None if joining would make
 * the pair wait for something the producer does not. */
static PyObject *
wiring_of(Node *consumer, Node *producer, PyObject *access_row, PyObject *extras)
{
    Py_ssize_t count = consumer->input_count;
    Py_ssize_t arguments = producer->input_count;
    PyObject *wiring = PyTuple_New(count);
    if (wiring == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *operand = node_input(consumer, i);
        PyObject *entry = NULL;
        if (is_node(operand) && ((Node *)operand)->row == access_row
                && ((Node *)operand)->input_count > 0
                && node_input((Node *)operand, 0) == (PyObject *)producer) {
            PyObject *attrs = ((Node *)operand)->attrs;
            if (!PyTuple_Check(attrs) || PyTuple_GET_SIZE(attrs) < 1) {
                PyErr_SetString(PyExc_ValueError, "a malformed access node");
                Py_DECREF(wiring);
                return NULL;
            }
            entry = PyTuple_Pack(2, str_output, PyTuple_GET_ITEM(attrs, 0));
        }
        else {
            Py_ssize_t place = 0;
            while (place < arguments && node_input(producer, place) != operand)
                place++;
            if (place == arguments) {
                if (is_node(operand) && unevaluated((Node *)operand)
                        && !feeds((Node *)operand, producer)) {
                    Py_DECREF(wiring);
                    Py_RETURN_NONE;
                }
                place = arguments + PyList_GET_SIZE(extras);
                if (PyList_Append(extras, operand) < 0) {
                    Py_DECREF(wiring);
                    return NULL;
                }
            }
            entry = Py_BuildValue("(On)", str_argument, place);
        }
        if (entry == NULL) {
            Py_DECREF(wiring);
            return NULL;
        }
        PyTuple_SET_ITEM(wiring, i, entry);
    }
    return wiring;
}

/* Join ``consumer`` to ``producer`` as ``fused`` reads them: the producer's
 * node runs the pair, the consumer's becomes an access to its last output. */
static int
join(Node *consumer, Node *producer, PyObject *fused, PyObject *extras,
     PyObject *access_row)
{
    PyObject *row = PyObject_GetAttr(fused, str_row);
    if (row == NULL)
        return -1;
    PyObject *own = node_inputs_tuple(producer);
    PyObject *added = PyList_AsTuple(extras);
    PyObject *inputs = own == NULL || added == NULL ? NULL : PySequence_Concat(own, added);
    Py_XDECREF(own);
    Py_XDECREF(added);
    PyObject *specs = PySequence_Tuple(producer->spec);
    PyObject *output = specs == NULL ? NULL : PyLong_FromSsize_t(PyTuple_GET_SIZE(specs));
    PyObject *spec_added = PyTuple_Pack(1, consumer->spec);
    PyObject *spec = specs == NULL || spec_added == NULL ? NULL
                     : PySequence_Concat(specs, spec_added);
    PyObject *attrs = output == NULL ? NULL : PyTuple_Pack(1, output);
    Py_XDECREF(specs);
    Py_XDECREF(spec_added);
    Py_XDECREF(output);
    PyObject *reads = (PyObject *)producer;
    /* (One input is kept inline: the consumer's cannot fail.) */
    if (inputs == NULL || spec == NULL || attrs == NULL
            || node_set_inputs(producer, PySequence_Fast_ITEMS(inputs),
                               PyTuple_GET_SIZE(inputs)) < 0
            || node_set_inputs(consumer, &reads, 1) < 0) {
        Py_DECREF(row);
        Py_XDECREF(inputs);
        Py_XDECREF(spec);
        Py_XDECREF(attrs);
        return -1;
    }
    Py_DECREF(inputs);
    Py_XSETREF(producer->row, row);
    Py_XSETREF(producer->spec, spec);
    Py_XSETREF(consumer->row, Py_NewRef(access_row));
    Py_XSETREF(consumer->attrs, attrs);
    return 0;
}

PyDoc_STRVAR(fuse_doc,
"fuse(pattern_nodes, fused, make_fused, row_kind, access_row)\n--\n\n"
"Join each of ``pattern_nodes`` (in recording order) to the multi-output\n"
"pattern node whose outputs it reads, where that delays nothing (see\n"
"search.py).  ``fused`` maps (producer pattern, consumer pattern, wiring)\n"
"to a joined pattern, ``make_fused(key, extra_count)`` makes one for a new\n"
"key (and stores it); ``row_kind(row)`` gives bits: 1 multi-output, 2 a\n"
"pattern that can be joined to.  Returns the joined pattern of each join.");

static PyObject *
fuse(PyObject *module, PyObject *args)
{
    PyObject *given, *fused, *make_fused, *row_kind, *access_row;
    if (!PyArg_ParseTuple(args, "OO!OOO:fuse", &given, &PyDict_Type, &fused,
                          &make_fused, &row_kind, &access_row))
        return NULL;
    /* Our own tuple: callbacks run Python code, which could change a list. */
    PyObject *nodes = PySequence_Tuple(given);
    if (nodes == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nodes); i++) {
        Node *node = (Node *)PyTuple_GET_ITEM(nodes, i);
        if (!is_node((PyObject *)node)) {
            PyErr_Format(PyExc_TypeError, "pattern_nodes[%zd] is not a recorded node", i);
            Py_DECREF(nodes);
            return NULL;
        }
    }
    PyObject *cache = PyDict_New(), *joined = PyList_New(0), *extras = NULL;
    if (cache == NULL || joined == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nodes); i++) {
        Node *node = (Node *)PyTuple_GET_ITEM(nodes, i);
        int kind = kind_of_row(node->row, row_kind, cache), error = 0;
        if (kind < 0)
            goto fail;
        if (kind & MULTI_OUTPUT)
            continue;   /* its outputs' accesses would nest */
        Node *producer = latest_producer(node, access_row, row_kind, cache, &error);
        if (error)
            goto fail;
        if (producer == NULL)
            continue;
        Py_INCREF(producer);   /* held while Python runs */
        extras = PyList_New(0);
        PyObject *wiring = extras == NULL ? NULL
                           : wiring_of(node, producer, access_row, extras);
        if (wiring == Py_None) {
            Py_DECREF(wiring);
            Py_DECREF(producer);
            Py_CLEAR(extras);
            continue;
        }
        PyObject *producer_pattern = wiring == NULL ? NULL
                                     : PyObject_GetAttr(producer->row, str_pattern);
        PyObject *consumer_pattern = producer_pattern == NULL ? NULL
                                     : PyObject_GetAttr(node->row, str_pattern);
        PyObject *key = consumer_pattern == NULL ? NULL
            : PyTuple_Pack(3, producer_pattern, consumer_pattern, wiring);
        Py_XDECREF(producer_pattern);
        Py_XDECREF(consumer_pattern);
        Py_XDECREF(wiring);
        PyObject *pair = key == NULL ? NULL : Py_XNewRef(PyDict_GetItemWithError(fused, key));
        if (pair == NULL && key != NULL && !PyErr_Occurred())
            pair = PyObject_CallFunction(make_fused, "On", key, PyList_GET_SIZE(extras));
        Py_XDECREF(key);
        int failed = pair == NULL || join(node, producer, pair, extras, access_row) < 0
                     || PyList_Append(joined, pair) < 0;
        Py_XDECREF(pair);
        Py_DECREF(producer);
        Py_CLEAR(extras);
        if (failed)
            goto fail;
    }
    Py_DECREF(cache);
    Py_DECREF(nodes);
    return joined;
fail:
    Py_XDECREF(cache);
    Py_XDECREF(joined);
    Py_XDECREF(extras);
    Py_DECREF(nodes);
    return NULL;
}

static PyMethodDef fuse_methods[] = {
    {"fuse", fuse, METH_VARARGS, fuse_doc},
    {NULL},
};

int
add_fuse_functions(PyObject *module)
{
    str_row = PyUnicode_InternFromString("row");
    str_pattern = PyUnicode_InternFromString("pattern");
    str_output = PyUnicode_InternFromString("output");
    str_argument = PyUnicode_InternFromString("argument");
    if (str_row == NULL || str_pattern == NULL || str_output == NULL
            || str_argument == NULL)
        return -1;
    return PyModule_AddFunctions(module, fuse_methods);
}
