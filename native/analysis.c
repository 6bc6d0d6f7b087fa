/* The batching analysis in C (issue 17): the per-evaluation passes over a
 * recorded graph that cost milliseconds per minibatch in Python.
 *
 * - unevaluated_ancestors(targets): the nodes an evaluation must run.
 *
 * Everything is iterative (graphs can be 100,000 nodes deep) and works on
 * borrowed node pointers while no Python code runs: nothing can free a node
 * between reading it and handing it back in a list. */
#include "native.h"

/* -- growable arrays -------------------------------------------------------- */

/* The arrays grow by doubling; PyMem_Realloc keeps the old block on failure,
 * so a failed push leaves the array as it was (and MemoryError set). */
typedef struct {
    void **items;
    Py_ssize_t size, capacity;
} PtrArray;

static int
ptr_push(PtrArray *array, void *item)
{
    if (array->size == array->capacity) {
        Py_ssize_t capacity = array->capacity ? 2 * array->capacity : 64;
        void **items = PyMem_Realloc(array->items, capacity * sizeof(void *));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        array->items = items;
        array->capacity = capacity;
    }
    array->items[array->size++] = item;
    return 0;
}

/* -- unevaluated_ancestors -------------------------------------------------- */

/* Node ids seen, an open-addressing hash set (ids are distinct per node, and
 * the Python version keyed its ``found`` dict by id too). */
typedef struct {
    long long *keys;
    unsigned char *used;
    size_t mask, count;
} IdSet;

static size_t
id_slot(const IdSet *set, long long id)
{
    size_t slot = ((unsigned long long)id * 0x9E3779B97F4A7C15ull) >> 17;
    slot &= set->mask;
    while (set->used[slot] && set->keys[slot] != id)
        slot = (slot + 1) & set->mask;
    return slot;
}

static int
idset_init(IdSet *set, size_t capacity)
{
    set->mask = capacity - 1;
    set->count = 0;
    set->keys = PyMem_Malloc(capacity * sizeof(long long));
    set->used = PyMem_Calloc(capacity, 1);
    if (set->keys == NULL || set->used == NULL) {
        PyMem_Free(set->keys);
        PyMem_Free(set->used);
        set->keys = NULL;
        set->used = NULL;
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
idset_free(IdSet *set)
{
    PyMem_Free(set->keys);
    PyMem_Free(set->used);
}

/* Adds ``id``: 1 if it was new, 0 if present, -1 on memory error.  Kept at
 * most half full, so probes stay short. */
static int
idset_add(IdSet *set, long long id)
{
    size_t slot = id_slot(set, id);
    if (set->used[slot])
        return 0;
    if (2 * (set->count + 1) > set->mask + 1) {
        IdSet bigger;
        if (idset_init(&bigger, 2 * (set->mask + 1)) < 0)
            return -1;
        for (size_t i = 0; i <= set->mask; i++) {
            if (set->used[i]) {
                size_t to = id_slot(&bigger, set->keys[i]);
                bigger.used[to] = 1;
                bigger.keys[to] = set->keys[i];
                bigger.count++;
            }
        }
        idset_free(set);
        *set = bigger;
        slot = id_slot(set, id);
    }
    set->used[slot] = 1;
    set->keys[slot] = id;
    set->count++;
    return 1;
}

static int
idset_contains(const IdSet *set, long long id)
{
    return set->used[id_slot(set, id)];
}

/* Unevaluated: no value yet, neither its own nor a row of a batch.  A field
 * deleted from Python (NULL) is not None, so such a node counts as evaluated
 * and is never read further. */
static int
unevaluated(Node *node)
{
    return node->result == Py_None && node->batch == Py_None;
}

static int
by_id(const void *a, const void *b)
{
    long long x = (*(Node *const *)a)->id, y = (*(Node *const *)b)->id;
    return (x > y) - (x < y);
}

PyDoc_STRVAR(unevaluated_ancestors_doc,
"unevaluated_ancestors(targets)\n--\n\n"
"Every unevaluated node the targets depend on, in recording (id) order: the\n"
"unevaluated VirtualNodes among ``targets`` (an iterable; other values are\n"
"skipped) and, through their inputs, every unevaluated VirtualNode operand.\n"
"A node is unevaluated when its ``result`` and ``batch`` are both None.");

static PyObject *
unevaluated_ancestors(PyObject *module, PyObject *targets)
{
    /* Made a list or tuple first: iterating an arbitrary iterable runs
     * Python code, which must not happen once node pointers are borrowed. */
    PyObject *given = PySequence_Fast(targets,
                                      "unevaluated_ancestors() takes an "
                                      "iterable of nodes");
    if (given == NULL)
        return NULL;
    PtrArray stack = {0}, found = {0};
    IdSet seen;
    PyObject *result = NULL;
    if (idset_init(&seen, 1024) < 0)
        goto done;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(given);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *target = PySequence_Fast_GET_ITEM(given, i);
        if (Py_IS_TYPE(target, node_type) && unevaluated((Node *)target)
                && ptr_push(&stack, target) < 0)
            goto done;
    }
    while (stack.size > 0) {
        Node *node = stack.items[--stack.size];
        int added = idset_add(&seen, node->id);
        if (added < 0)
            goto done;
        if (!added)
            continue;
        if (ptr_push(&found, node) < 0)
            goto done;
        PyObject *inputs = node->inputs;
        if (inputs == NULL || !(PyTuple_Check(inputs) || PyList_Check(inputs))) {
            PyErr_Format(PyExc_TypeError,
                         "unevaluated_ancestors(): node %lld has inputs "
                         "that are not a tuple or list", node->id);
            goto done;
        }
        Py_ssize_t operands = PySequence_Fast_GET_SIZE(inputs);
        for (Py_ssize_t i = 0; i < operands; i++) {
            PyObject *operand = PySequence_Fast_GET_ITEM(inputs, i);
            if (Py_IS_TYPE(operand, node_type)
                    && unevaluated((Node *)operand)
                    && !idset_contains(&seen, ((Node *)operand)->id)
                    && ptr_push(&stack, operand) < 0)
                goto done;
        }
    }
    qsort(found.items, found.size, sizeof(void *), by_id);
    result = PyList_New(found.size);
    if (result == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < found.size; i++)
        PyList_SET_ITEM(result, i, Py_NewRef((PyObject *)found.items[i]));
done:
    PyMem_Free(stack.items);
    PyMem_Free(found.items);
    idset_free(&seen);
    Py_DECREF(given);
    return result;
}

/* -- registration ----------------------------------------------------------- */

static PyMethodDef analysis_methods[] = {
    {"unevaluated_ancestors", unevaluated_ancestors, METH_O,
     unevaluated_ancestors_doc},
    {NULL},
};

int
add_analysis_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, analysis_methods);
}
