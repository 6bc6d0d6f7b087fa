/* The batching analysis in C (issue 17): the per-evaluation passes over a
 * recorded graph that cost milliseconds per minibatch in Python.
 *
 * - unevaluated_ancestors(targets): the nodes an evaluation must run.
 * - scope_leftovers: what a closing scope (or a pipelined part of one) still
 *   has to evaluate.
 * - search_roots: where the pattern search starts.
 * - depths, agenda_schedule, depth_schedule, critical_schedule,
 *   fsm_schedule: the schedulers' integer work (and the FSM's table look-ups)
 *   on a BatchGraph's ``type_of`` and ``sources`` (batcher/schedulers).
 * - describe_graph: BatchGraph's loop (types, duplicates, operands,
 *   sources), calling back into batcher/graph.py for rare operands.
 *
 * Everything is iterative (graphs can be 100,000 nodes deep) and works on
 * borrowed node pointers while no Python code runs: nothing can free a node
 * between reading it and handing it back in a list. */
#include "native.h"
#include "containers.h"

/* -- unevaluated_ancestors -------------------------------------------------- */

/* Node ids seen: IdBits (containers.h). */

PyDoc_STRVAR(unevaluated_ancestors_doc,
"unevaluated_ancestors(targets)\n--\n\n"
"Every unevaluated node the targets depend on, in recording (id) order: the\n"
"unevaluated VirtualNodes among ``targets`` (an iterable; other values are\n"
"skipped) and, through their inputs, every unevaluated VirtualNode operand.\n"
"A node is unevaluated when its ``result`` and ``batched`` are both None.");

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
    PtrArray stack = {0};
    KeyedArray found = {0};
    IdBits seen = {0};
    PyObject *result = NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(given);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *target = PySequence_Fast_GET_ITEM(given, i);
        if (Py_IS_TYPE(target, node_type) && unevaluated((Node *)target)
                && ptr_push(&stack, target) < 0)
            goto done;
    }
    while (stack.size > 0) {
        Node *node = stack.items[--stack.size];
        int added = idbits_add(&seen, node->id);
        if (added < 0)
            goto done;
        if (!added)
            continue;
        if (keyed_push(&found, node) < 0)
            goto done;
        for (Py_ssize_t i = 0; i < node->input_count; i++) {
            PyObject *operand = node_input(node, i);
            if (Py_IS_TYPE(operand, node_type)
                    && unevaluated((Node *)operand)
                    && !idbits_contains(&seen, ((Node *)operand)->id)
                    && ptr_push(&stack, operand) < 0)
                goto done;
        }
    }
    result = keyed_list(&found);
done:
    PyMem_Free(stack.items);
    PyMem_Free(found.items);
    idbits_free(&seen);
    Py_DECREF(given);
    return result;
}

/* -- the pattern search's roots ---------------------------------------------- */

PyDoc_STRVAR(search_roots_doc,
"search_roots(targets, required_ids)\n--\n\n"
"The roots of a pattern search (search.py): the unevaluated VirtualNodes\n"
"among ``targets`` that nothing consumes or whose id is in the set\n"
"``required_ids``, each once, in recording (id) order.");

static PyObject *
search_roots(PyObject *module, PyObject *args)
{
    PyObject *targets, *required;
    if (!PyArg_ParseTuple(args, "OO!:search_roots", &targets, &PySet_Type, &required))
        return NULL;
    PyObject *given = PySequence_Fast(targets, "search_roots() takes an iterable of nodes");
    if (given == NULL)
        return NULL;
    KeyedArray found = {0};
    PyObject *result = NULL;
    int any_required = PySet_GET_SIZE(required) > 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(given); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(given, i);
        if (!Py_IS_TYPE(item, node_type) || !unevaluated((Node *)item))
            continue;
        int wanted = ((Node *)item)->consumers == 0;
        if (!wanted && any_required) {
            PyObject *id = PyLong_FromLongLong(((Node *)item)->id);
            wanted = id == NULL ? -1 : PySet_Contains(required, id);
            Py_XDECREF(id);
            if (wanted < 0)
                goto done;
        }
        if (wanted && keyed_push(&found, (Node *)item) < 0)
            goto done;
    }
    result = keyed_list(&found);   /* (a node given twice: once) */
done:
    PyMem_Free(found.items);
    Py_DECREF(given);
    return result;
}

/* -- a closing scope's nodes -------------------------------------------------- */

/* scope_leftovers of the whole list ``recorded`` (see its doc).  One pass,
 * newest first: a node's readers come after it, so by its turn each of
 * them has been dropped or kept, and whether only the list still holds it
 * is final.  The unevaluated nodes kept are collected on the way and put
 * back in recording order.  (A second pass, which read every node again,
 * took a 25-tree inference's part 72-90 us and its close 113-143, against
 * 60-71 and 84-97 in one: BENCHMARKS.md.) */
static PyObject *
leftovers(PyObject *recorded)
{
    PyObject *left = node_list(0);
    if (left == NULL)
        return NULL;
    /* Dropping a node frees plain values, but a weakref callback on a
     * node could run Python code: the size is checked at every step. */
    for (Py_ssize_t i = PyList_GET_SIZE(recorded) - 1; i >= 0; i--) {
        if (i >= PyList_GET_SIZE(recorded))
            continue;   /* a weakref callback of a freed node shrank it */
        PyObject *item = PyList_GET_ITEM(recorded, i);
        if (!Py_IS_TYPE(item, node_type))
            continue;
        if (Py_REFCNT(item) == 1) {
            PyList_SET_ITEM(recorded, i, Py_NewRef(Py_None));
            Py_DECREF(item);
            continue;
        }
        Node *node = (Node *)item;
        if (!unevaluated(node))
            continue;
        Node *source = node;   /* an access node goes with its source */
        if (access_entry != NULL && node->entry == access_entry && node->input_count > 0
                && is_node(node_input(node, 0)))
            source = (Node *)node_input(node, 0);
        if (node->swallowed || source->swallowed)
            continue;
        if (PyList_Append(left, item) < 0) {
            Py_DECREF(left);
            return NULL;
        }
    }
    if (PyList_Reverse(left) < 0) {
        Py_DECREF(left);
        return NULL;
    }
    return left;
}

PyDoc_STRVAR(scope_leftovers_doc,
"scope_leftovers(recorded, upto=None)\n--\n\n"
"The nodes of a closing scope still to evaluate, in order.  First, newest\n"
"first, every node only the list ``recorded`` references is dropped from\n"
"it (which frees the operands only it read); then the unevaluated nodes\n"
"are returned, except swallowed ones (``VirtualNode.swallowed``) and\n"
"access nodes of those.  ``recorded`` is changed in place.  With ``upto``,\n"
"only its first ``upto`` items, which are taken out of it (a pipelined\n"
"part: ``recorded[:upto]`` and ``del recorded[:upto]``, without touching\n"
"each node's count twice more).");

/* The first ``upto`` items of ``list``, moved (not copied) to a new list. */
static PyObject *
take_first(PyObject *list, Py_ssize_t upto)
{
    Py_ssize_t size = PyList_GET_SIZE(list);
    if (upto < 0 || upto > size) {
        PyErr_Format(PyExc_ValueError, "scope_leftovers(): upto %zd is not "
                     "between 0 and the list's length, %zd", upto, size);
        return NULL;
    }
    PyObject *taken = node_list(upto);
    if (taken == NULL)
        return NULL;
    if (upto == 0)
        return taken;
    PyObject **items = ((PyListObject *)list)->ob_item;
    memcpy(((PyListObject *)taken)->ob_item, items, upto * sizeof(PyObject *));
    memmove(items, items + upto, (size - upto) * sizeof(PyObject *));
    Py_SET_SIZE(list, size - upto);
    return taken;
}

static PyObject *
scope_leftovers(PyObject *module, PyObject *args)
{
    PyObject *given, *upto = Py_None;
    if (!PyArg_ParseTuple(args, "O!|O:scope_leftovers", &PyList_Type, &given, &upto))
        return NULL;
    PyObject *recorded;
    if (upto == Py_None) {
        recorded = Py_NewRef(given);
    }
    else {
        Py_ssize_t count = PyNumber_AsSsize_t(upto, PyExc_OverflowError);
        if (count == -1 && PyErr_Occurred())
            return NULL;
        recorded = take_first(given, count);
        if (recorded == NULL)
            return NULL;
    }
    PyObject *left = leftovers(recorded);
    Py_DECREF(recorded);
    return left;
}

/* -- the schedulers' integer work ------------------------------------------ */

/* A BatchGraph's structure as C arrays: type_of[i] (-1: not scheduled) and
 * the sources of node i, sources[offset[i] .. offset[i + 1]).  Sources must
 * be earlier nodes, which is what BatchGraph makes (operands come before
 * their consumers) and what makes the graph acyclic; anything else is a
 * ValueError rather than a schedule that silently drops nodes. */
typedef struct {
    Py_ssize_t count, type_count;
    Py_ssize_t *type_of, *offset, *sources, *depth;
} Structure;

static void
structure_free(Structure *graph)
{
    PyMem_Free(graph->type_of);
    PyMem_Free(graph->offset);
    PyMem_Free(graph->sources);
    PyMem_Free(graph->depth);
}

/* The sources of a Python sequence of tuples (or lists) of graph indices,
 * into ``graph``'s offset and sources, unchecked. */
static int
sources_read(Structure *graph, PyObject *sources_arg)
{
    PyObject *sources = PySequence_Fast(sources_arg, "sources must be a sequence");
    if (sources == NULL)
        return -1;
    int status = -1;
    Py_ssize_t count = graph->count;
    if (PySequence_Fast_GET_SIZE(sources) != count) {
        PyErr_Format(PyExc_ValueError, "type_of has %zd nodes but sources has %zd",
                     count, PySequence_Fast_GET_SIZE(sources));
        goto done;
    }
    /* Entries must be tuples or lists: their items are read in place. */
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PySequence_Fast_GET_ITEM(sources, i);
        if (!PyTuple_Check(entry) && !PyList_Check(entry)) {
            PyErr_Format(PyExc_TypeError,
                         "sources of node %zd must be a tuple, not %.100s",
                         i, Py_TYPE(entry)->tp_name);
            goto done;
        }
        graph->offset[i] = total;
        total += PySequence_Fast_GET_SIZE(entry);
    }
    graph->offset[count] = total;
    graph->sources = PyMem_New(Py_ssize_t, total + 1);
    if (graph->sources == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PySequence_Fast_GET_ITEM(sources, i);
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(entry); k++) {
            /* (in range: checked with the table's, in structure_read) */
            if (index_in(PySequence_Fast_GET_ITEM(entry, k), PY_SSIZE_T_MIN,
                         PY_SSIZE_T_MAX, "a source", i,
                         &graph->sources[graph->offset[i] + k]) < 0)
                goto done;
        }
    }
    status = 0;
done:
    Py_DECREF(sources);
    return status;
}

/* Reads and checks the structure, and computes every node's depth: 1 + the
 * deepest source, where nodes that are not scheduled add nothing.  The
 * types are an Indices object or a list or tuple of ints; the
 * sources of a BatchGraph (describe_graph's Sources view) are copied from
 * its arrays; any other sequence of tuples is read item by item.  Nothing
 * here runs Python code once the sequences are made. */
static int
structure_read(Structure *graph, PyObject *type_of_arg, PyObject *sources_arg,
               Py_ssize_t type_count)
{
    memset(graph, 0, sizeof(*graph));
    Py_ssize_t count;
    if (indices_items(type_of_arg, &count) == NULL
            && (count = PySequence_Size(type_of_arg)) < 0)
        return -1;
    if (type_count < 0) {
        PyErr_SetString(PyExc_ValueError, "type_count must not be negative");
        return -1;
    }
    int status = -1;
    graph->count = count;
    graph->type_count = type_count;
    graph->type_of = index_array(type_of_arg, count, -1, type_count, "type_of");
    if (graph->type_of == NULL)
        goto done;
    graph->offset = PyMem_New(Py_ssize_t, count + 1);
    graph->depth = PyMem_New(Py_ssize_t, count + 1);
    if (graph->offset == NULL || graph->depth == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    OperandTable *table = sources_table(sources_arg);
    if (table != NULL) {
        if (table->count != count) {
            PyErr_Format(PyExc_ValueError, "type_of has %zd nodes but sources "
                         "has %zd", count, table->count);
            goto done;
        }
        Py_ssize_t total = table->source_first[count];
        graph->sources = PyMem_New(Py_ssize_t, total + 1);
        if (graph->sources == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(graph->offset, table->source_first, (count + 1) * sizeof(Py_ssize_t));
        memcpy(graph->sources, table->sources, total * sizeof(Py_ssize_t));
    }
    else if (sources_read(graph, sources_arg) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t deepest = 0;
        for (Py_ssize_t k = graph->offset[i]; k < graph->offset[i + 1]; k++) {
            Py_ssize_t source = graph->sources[k];
            if (source < 0 || source >= i) {
                PyErr_Format(PyExc_ValueError, "a source of node %zd is %zd, not "
                             "in [0, %zd)", i, source, i);
                goto done;
            }
            if (graph->depth[source] > deepest)
                deepest = graph->depth[source];
        }
        graph->depth[i] = deepest + (graph->type_of[i] >= 0);
    }
    status = 0;
done:
    if (status < 0)
        structure_free(graph);
    return status;
}

PyObject *
int_list(const Py_ssize_t *items, Py_ssize_t count)
{
    PyObject *list = PyList_New(count);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *number = PyLong_FromSsize_t(items[i]);
        if (number == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, number);
    }
    return list;
}

PyDoc_STRVAR(depths_doc,
"depths(type_of, sources)\n--\n\n"
"Topological depth of every node: 1 + the deepest of its sources (earlier\n"
"node indices); nodes whose type is -1 (not scheduled) add nothing.");

static PyObject *
depths(PyObject *module, PyObject *args)
{
    PyObject *type_of, *sources;
    if (!PyArg_ParseTuple(args, "OO:depths", &type_of, &sources))
        return NULL;
    Structure graph;
    /* No type bound here: depths reads types only for their sign. */
    if (structure_read(&graph, type_of, sources, PY_SSIZE_T_MAX) < 0)
        return NULL;
    PyObject *result = int_list(graph.depth, graph.count);
    structure_free(&graph);
    return result;
}

/* The depth scheduler's order: by depth, then type, then index. */
typedef struct {
    Py_ssize_t depth, type, index;
} Placed;

static int
by_depth_type_index(const void *a, const void *b)
{
    const Placed *x = a, *y = b;
    if (x->depth != y->depth)
        return x->depth < y->depth ? -1 : 1;
    if (x->type != y->type)
        return x->type < y->type ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

PyDoc_STRVAR(depth_schedule_doc,
"depth_schedule(type_of, sources, type_count)\n--\n\n"
"TensorFlow Fold's schedule: one batch per (depth, type) of the scheduled\n"
"nodes (type >= 0), by increasing depth then type, each in index order.");

static PyObject *
depth_schedule(PyObject *module, PyObject *args)
{
    PyObject *type_of, *sources;
    Py_ssize_t type_count;
    if (!PyArg_ParseTuple(args, "OOn:depth_schedule", &type_of, &sources,
                          &type_count))
        return NULL;
    Structure graph;
    if (structure_read(&graph, type_of, sources, type_count) < 0)
        return NULL;
    PyObject *batches = NULL;
    Placed *placed = PyMem_New(Placed, graph.count + 1);
    Py_ssize_t *members = PyMem_New(Py_ssize_t, graph.count + 1);
    if (placed == NULL || members == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t scheduled = 0;
    for (Py_ssize_t i = 0; i < graph.count; i++) {
        if (graph.type_of[i] >= 0)
            placed[scheduled++] = (Placed){graph.depth[i], graph.type_of[i], i};
    }
    qsort(placed, scheduled, sizeof(Placed), by_depth_type_index);
    batches = PyList_New(0);
    if (batches == NULL)
        goto done;
    for (Py_ssize_t start = 0, end; start < scheduled; start = end) {
        for (end = start; end < scheduled && placed[end].depth == placed[start].depth
                          && placed[end].type == placed[start].type; end++)
            members[end - start] = placed[end].index;
        PyObject *batch = int_list(members, end - start);
        if (batch == NULL || PyList_Append(batches, batch) < 0) {
            Py_XDECREF(batch);
            Py_CLEAR(batches);
            goto done;
        }
        Py_DECREF(batch);
    }
done:
    PyMem_Free(placed);
    PyMem_Free(members);
    structure_free(&graph);
    return batches;
}

/* The agenda and critical-path schedulers' state.  ``ready`` mirrors the
 * Python dict it replaced, {type: ready nodes}: a type enters when its
 * first node becomes ready and leaves when its nodes run, and ``entered``
 * numbers the entries so that ties go to the type that entered first, as
 * min() over the dict in insertion order did.  ``highest``: the greatest
 * height (see critical_schedule) of its ready nodes. */
typedef struct {
    Py_ssize_t *nodes, size, capacity, highest;
    long long entered;      /* -1 while the type has no ready node */
} Ready;

static int
make_ready(Ready *ready, Py_ssize_t *active, Py_ssize_t *active_count,
           long long *entries, Py_ssize_t type, Py_ssize_t index, Py_ssize_t height)
{
    Ready *list = &ready[type];
    if (list->entered < 0) {
        list->entered = (*entries)++;
        list->highest = height;
        active[(*active_count)++] = type;
    }
    if (height > list->highest)
        list->highest = height;
    if (list->size == list->capacity) {
        Py_ssize_t capacity = list->capacity ? 2 * list->capacity : 8;
        Py_ssize_t *nodes = PyMem_Resize(list->nodes, Py_ssize_t, capacity);
        if (nodes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        list->nodes = nodes;
        list->capacity = capacity;
    }
    list->nodes[list->size++] = index;
    return 0;
}

/* How a ready-list scheduler picks the next type. */
enum { LOWEST_AVERAGE_DEPTH, HIGHEST_READY };

/* The FSM scheduler's choice (batcher/schedulers/fsm.py, FsmPolicy): the
 * learned table's greedy type name for the frontier's state, else the
 * commonest choice the learned schedule made for the same set of ready
 * names, else none (the agenda rule picks).  Names are given as ids that
 * are their ranks in sorted order, so every ordering below is integer
 * work; the states are the tuples of name strings FsmPolicy keys by. */
enum { ENCODE_SORT, ENCODE_MAX, ENCODE_BASE };

typedef struct {
    PyObject *table, *coarse;   /* {state: {name: value}}, {base state: {name: votes}} */
    PyObject *names;            /* list of the names, sorted: id = rank */
    const Py_ssize_t *name_of_type;
    int encoding;
    /* Per name id, for one decision (count 0 outside it): its ready
     * nodes, and the active slot of its earliest-entered type. */
    Py_ssize_t *count, *slot, *present, present_count;
    Py_ssize_t decisions, coarse_decisions, fallbacks;
} Fsm;

static const Fsm *sort_fsm;   /* (qsort has no context argument) */

static int
by_rank(const void *a, const void *b)
{
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return (x > y) - (x < y);
}

/* -count, then rank: encode("sort")'s order. */
static int
by_count_rank(const void *a, const void *b)
{
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    Py_ssize_t cx = sort_fsm->count[x], cy = sort_fsm->count[y];
    if (cx != cy)
        return cx > cy ? -1 : 1;
    return (x > y) - (x < y);
}

/* A tuple of the names with these ids (a new reference, or NULL). */
static PyObject *
name_tuple(const Fsm *fsm, const Py_ssize_t *ids, Py_ssize_t size)
{
    PyObject *tuple = PyTuple_New(size);
    if (tuple != NULL)
        for (Py_ssize_t i = 0; i < size; i++)
            PyTuple_SET_ITEM(tuple, i, Py_NewRef(PyList_GET_ITEM(fsm->names, ids[i])));
    return tuple;
}

/* The name in ``scores`` (a dict {name: number}) with the highest (score,
 * name) among the present names: its id, -1 for none, -2 on error. */
static Py_ssize_t
best_present(const Fsm *fsm, PyObject *scores)
{
    Py_ssize_t best = -1;
    double best_score = 0.0;
    for (Py_ssize_t i = 0; i < fsm->present_count; i++) {
        Py_ssize_t id = fsm->present[i];
        PyObject *score = PyDict_GetItemWithError(scores, PyList_GET_ITEM(fsm->names, id));
        if (score == NULL) {
            if (PyErr_Occurred())
                return -2;
            continue;
        }
        double value = PyFloat_AsDouble(score);
        if (value == -1.0 && PyErr_Occurred())
            return -2;
        if (best < 0 || value > best_score || (value == best_score && id > best)) {
            best = id;
            best_score = value;
        }
    }
    return best;
}

/* The active slot of the present name that ``dict[key]`` (a dict {name:
 * score}) rates highest; -1 for none (no such key, or no present name in
 * it), -2 on error. */
static Py_ssize_t
choice_in(const Fsm *fsm, PyObject *dict, PyObject *key)
{
    PyObject *scores = PyDict_GetItemWithError(dict, key);
    if (scores == NULL)
        return PyErr_Occurred() ? -2 : -1;
    if (!PyDict_Check(scores))
        return -1;
    Py_ssize_t best = best_present(fsm, scores);
    return best < 0 ? best : fsm->slot[best];
}

/* The active slot of the type the FSM picks from the ready lists, -1 for
 * none (the agenda rule decides), -2 on error. */
static Py_ssize_t
fsm_choose(Fsm *fsm, const Ready *ready, const Py_ssize_t *active,
           Py_ssize_t active_count)
{
    fsm->decisions++;
    fsm->present_count = 0;
    for (Py_ssize_t a = 0; a < active_count; a++) {
        Py_ssize_t type = active[a], id = fsm->name_of_type[type];
        if (fsm->count[id] == 0) {
            fsm->present[fsm->present_count++] = id;
            fsm->slot[id] = a;
        }
        else if (ready[type].entered < ready[active[fsm->slot[id]]].entered) {
            fsm->slot[id] = a;
        }
        fsm->count[id] += ready[type].size;
    }
    Py_ssize_t size = fsm->present_count, chosen = -1;
    Py_ssize_t *ids = PyMem_New(Py_ssize_t, size + 1);
    PyObject *state = NULL, *base = NULL;
    if (ids == NULL) {
        PyErr_NoMemory();
        chosen = -2;
        goto done;
    }
    memcpy(ids, fsm->present, size * sizeof(Py_ssize_t));
    qsort(ids, size, sizeof(Py_ssize_t), by_rank);
    base = name_tuple(fsm, ids, size);
    if (base == NULL) {
        chosen = -2;
        goto done;
    }
    if (fsm->encoding == ENCODE_BASE) {
        state = Py_NewRef(base);
    }
    else {
        sort_fsm = fsm;
        qsort(ids, size, sizeof(Py_ssize_t), by_count_rank);
        state = fsm->encoding == ENCODE_SORT ? name_tuple(fsm, ids, size)
            : PyTuple_Pack(2, base, PyList_GET_ITEM(fsm->names, ids[0]));
        if (state == NULL) {
            chosen = -2;
            goto done;
        }
    }
    chosen = choice_in(fsm, fsm->table, state);
    if (chosen == -1) {   /* an unseen state: its set of ready names, else agenda */
        chosen = choice_in(fsm, fsm->coarse, base);
        if (chosen >= 0)
            fsm->coarse_decisions++;
        else if (chosen == -1)
            fsm->fallbacks++;
    }
done:
    for (Py_ssize_t i = 0; i < fsm->present_count; i++)
        fsm->count[fsm->present[i]] = 0;
    PyMem_Free(ids);
    Py_XDECREF(state);
    Py_XDECREF(base);
    return chosen;
}

/* Repeatedly run every ready node of the type the FSM (if given) or else
 * ``rule`` picks (ties: the type that became ready first): the batches,
 * lists of node indices in the order they became ready.  Nodes of type -1
 * are not scheduled.  Frees ``graph``. */
static PyObject *
ready_schedule(Structure graph, int rule, Fsm *fsm)
{
    Py_ssize_t count = graph.count, types = graph.type_count;
    const Py_ssize_t *type_of = graph.type_of, *depth = graph.depth;
    PyObject *batches = NULL;
    /* Consumers of each node (scheduled ones, in index order, once per
     * source entry) as one array: consumers[first[i] .. first[i + 1]). */
    Py_ssize_t *first = PyMem_New(Py_ssize_t, count + 1);
    Py_ssize_t *consumers = PyMem_New(Py_ssize_t, graph.offset[count] + 1);
    Py_ssize_t *waiting = PyMem_New(Py_ssize_t, count + 1);
    Py_ssize_t *height = PyMem_Calloc(count + 1, sizeof(Py_ssize_t));
    Py_ssize_t *remaining = PyMem_New(Py_ssize_t, types + 1);
    long long *depth_sum = PyMem_New(long long, types + 1);
    Ready *ready = PyMem_New(Ready, types + 1);
    Py_ssize_t *active = PyMem_New(Py_ssize_t, types + 1);
    if (ready != NULL) {
        for (Py_ssize_t t = 0; t < types; t++)
            ready[t] = (Ready){NULL, 0, 0, 0, -1};
    }
    if (first == NULL || consumers == NULL || waiting == NULL || height == NULL
            || remaining == NULL || depth_sum == NULL || ready == NULL
            || active == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t t = 0; t < types; t++) {
        remaining[t] = 0;
        depth_sum[t] = 0;
    }
    memset(first, 0, (count + 1) * sizeof(Py_ssize_t));
    for (Py_ssize_t i = 0; i < count; i++) {
        if (type_of[i] >= 0) {
            for (Py_ssize_t k = graph.offset[i]; k < graph.offset[i + 1]; k++)
                first[graph.sources[k] + 1]++;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++)
        first[i + 1] += first[i];
    Py_ssize_t active_count = 0;
    long long entries = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t type = type_of[i];
        waiting[i] = 0;
        if (type < 0)
            continue;
        remaining[type]++;
        depth_sum[type] += depth[i];
        waiting[i] = graph.offset[i + 1] - graph.offset[i];
        /* ``first`` is advanced as each consumer is placed, then restored
         * below (shifted back by one slot). */
        for (Py_ssize_t k = graph.offset[i]; k < graph.offset[i + 1]; k++)
            consumers[first[graph.sources[k]]++] = i;
    }
    for (Py_ssize_t i = count; i > 0; i--)
        first[i] = first[i - 1];
    first[0] = 0;
    /* Heights: the scheduled nodes on the longest chain from a node to
     * one nothing consumes, itself included (consumers come later). */
    for (Py_ssize_t i = count - 1; rule == HIGHEST_READY && i >= 0; i--) {
        if (type_of[i] < 0)
            continue;
        Py_ssize_t highest = 0;
        for (Py_ssize_t k = first[i]; k < first[i + 1]; k++)
            if (height[consumers[k]] > highest)
                highest = height[consumers[k]];
        height[i] = highest + 1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (type_of[i] >= 0 && waiting[i] == 0
                && make_ready(ready, active, &active_count, &entries, type_of[i], i,
                              height[i]) < 0)
            goto done;
    }

    batches = PyList_New(0);
    if (batches == NULL)
        goto done;
    while (active_count > 0) {
        /* LOWEST_AVERAGE_DEPTH: the lowest average remaining depth, as
         * Python's float division gave it (exact for sums below 2**53);
         * HIGHEST_READY: the highest ready node (as the lowest negated
         * height); then the earliest entry. */
        Py_ssize_t best = fsm == NULL ? -1 : fsm_choose(fsm, ready, active, active_count);
        if (best == -2) {
            Py_CLEAR(batches);
            goto done;
        }
        double best_key = 0.0;
        Py_ssize_t best_rule = 0;
        for (Py_ssize_t a = 0; best < 0 && a < active_count; a++) {
            Py_ssize_t t = active[a];
            double key = rule == HIGHEST_READY ? -(double)ready[t].highest
                : (double)depth_sum[t] / (double)remaining[t];
            if (a == 0 || key < best_key
                    || (key == best_key
                        && ready[t].entered < ready[active[best_rule]].entered)) {
                best_rule = a;
                best_key = key;
            }
        }
        if (best < 0)
            best = best_rule;
        Py_ssize_t chosen = active[best];
        active[best] = active[--active_count];
        /* Taken out whole: post-processing may make new nodes of the same
         * type ready, which form a new entry. */
        Ready batch = ready[chosen];
        ready[chosen] = (Ready){NULL, 0, 0, 0, -1};
        PyObject *list = int_list(batch.nodes, batch.size);
        int failed = list == NULL || PyList_Append(batches, list) < 0;
        Py_XDECREF(list);
        for (Py_ssize_t b = 0; !failed && b < batch.size; b++) {
            Py_ssize_t index = batch.nodes[b];
            remaining[chosen]--;
            depth_sum[chosen] -= depth[index];
            for (Py_ssize_t k = first[index]; k < first[index + 1]; k++) {
                Py_ssize_t consumer = consumers[k];
                if (--waiting[consumer] == 0
                        && make_ready(ready, active, &active_count, &entries,
                                      type_of[consumer], consumer, height[consumer]) < 0)
                    failed = 1;
            }
        }
        PyMem_Free(batch.nodes);
        if (failed) {
            Py_CLEAR(batches);
            goto done;
        }
    }
done:
    if (ready != NULL) {
        for (Py_ssize_t t = 0; t < types; t++)
            PyMem_Free(ready[t].nodes);
    }
    PyMem_Free(first);
    PyMem_Free(consumers);
    PyMem_Free(waiting);
    PyMem_Free(height);
    PyMem_Free(remaining);
    PyMem_Free(depth_sum);
    PyMem_Free(ready);
    PyMem_Free(active);
    structure_free(&graph);
    return batches;
}

PyDoc_STRVAR(agenda_schedule_doc,
"agenda_schedule(type_of, sources, type_count)\n--\n\n"
"DyNet's agenda schedule: repeatedly run every ready node of the type whose\n"
"remaining nodes have the lowest average depth (ties: the type that became\n"
"ready first); returns the batches, lists of node indices in the order\n"
"they became ready.  Nodes of type -1 are not scheduled.");

/* The Structure of (type_of, sources, type_count) arguments. */
static int
structure_args(PyObject *args, const char *format, Structure *graph)
{
    PyObject *type_of, *sources;
    Py_ssize_t type_count;
    if (!PyArg_ParseTuple(args, format, &type_of, &sources, &type_count))
        return -1;
    return structure_read(graph, type_of, sources, type_count);
}

static PyObject *
agenda_schedule(PyObject *module, PyObject *args)
{
    Structure graph;
    if (structure_args(args, "OOn:agenda_schedule", &graph) < 0)
        return NULL;
    return ready_schedule(graph, LOWEST_AVERAGE_DEPTH, NULL);
}

PyDoc_STRVAR(critical_schedule_doc,
"critical_schedule(type_of, sources, type_count)\n--\n\n"
"Critical path first: repeatedly run every ready node of the type with the\n"
"highest ready node, a node's height being the number of scheduled nodes\n"
"on the longest chain from it to a node nothing consumes (ties: the type\n"
"that became ready first); returns the batches as agenda_schedule does.");

static PyObject *
critical_schedule(PyObject *module, PyObject *args)
{
    Structure graph;
    if (structure_args(args, "OOn:critical_schedule", &graph) < 0)
        return NULL;
    return ready_schedule(graph, HIGHEST_READY, NULL);
}

PyDoc_STRVAR(fsm_schedule_doc,
"fsm_schedule(type_of, sources, type_count, names, name_of_type, encoding,\n"
"             table, coarse)\n--\n\n"
"The FSM scheduler's schedule with a learned policy (batcher/schedulers/fsm.py):\n"
"agenda's ready lists, with the type chosen by the policy's ``table`` for\n"
"the frontier's state (``encoding``: 'sort', 'max' or 'base', as\n"
"fsm.encode), else by ``coarse`` for its set of ready names, else by the\n"
"agenda rule.  ``names``: the type names, sorted; ``name_of_type``: each\n"
"type's index in ``names``.  Returns (batches, decisions, coarse decisions,\n"
"fallbacks to agenda).");

static PyObject *
fsm_schedule(PyObject *module, PyObject *args)
{
    PyObject *type_of, *sources, *names, *name_of_type_arg, *encoding;
    Py_ssize_t type_count;
    Fsm fsm = {0};
    if (!PyArg_ParseTuple(args, "OOnO!OUO!O!:fsm_schedule", &type_of, &sources,
                          &type_count, &PyList_Type, &names, &name_of_type_arg,
                          &encoding, &PyDict_Type, &fsm.table, &PyDict_Type,
                          &fsm.coarse))
        return NULL;
    if (PyUnicode_CompareWithASCIIString(encoding, "sort") == 0)
        fsm.encoding = ENCODE_SORT;
    else if (PyUnicode_CompareWithASCIIString(encoding, "max") == 0)
        fsm.encoding = ENCODE_MAX;
    else if (PyUnicode_CompareWithASCIIString(encoding, "base") == 0)
        fsm.encoding = ENCODE_BASE;
    else {
        PyErr_Format(PyExc_ValueError, "unknown FSM encoding %R", encoding);
        return NULL;
    }
    Py_ssize_t name_count = PyList_GET_SIZE(names);
    Py_ssize_t *name_of_type = PyMem_New(Py_ssize_t, type_count + 1);
    PyObject *given = PySequence_Fast(name_of_type_arg, "name_of_type must be a sequence");
    if (name_of_type == NULL || given == NULL) {
        PyMem_Free(name_of_type);
        Py_XDECREF(given);
        return given == NULL ? NULL : PyErr_NoMemory();
    }
    if (PySequence_Fast_GET_SIZE(given) != type_count) {
        PyErr_SetString(PyExc_ValueError, "name_of_type must give every type a name");
        goto fail;
    }
    for (Py_ssize_t t = 0; t < type_count; t++) {
        if (index_in(PySequence_Fast_GET_ITEM(given, t), 0, name_count, "the name",
                     t, &name_of_type[t]) < 0)
            goto fail;
    }
    fsm.names = names;
    fsm.name_of_type = name_of_type;
    fsm.count = PyMem_Calloc(name_count + 1, sizeof(Py_ssize_t));
    fsm.slot = PyMem_New(Py_ssize_t, name_count + 1);
    fsm.present = PyMem_New(Py_ssize_t, name_count + 1);
    if (fsm.count == NULL || fsm.slot == NULL || fsm.present == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Structure graph;
    Py_INCREF(names);   /* (held: dict lookups may run code) */
    PyObject *batches = structure_read(&graph, type_of, sources, type_count) < 0
                        ? NULL : ready_schedule(graph, LOWEST_AVERAGE_DEPTH, &fsm);
    Py_DECREF(names);
    PyObject *result = batches == NULL ? NULL
        : Py_BuildValue("(Onnn)", batches, fsm.decisions, fsm.coarse_decisions,
                        fsm.fallbacks);
    Py_XDECREF(batches);
    PyMem_Free(fsm.count);
    PyMem_Free(fsm.slot);
    PyMem_Free(fsm.present);
    PyMem_Free(name_of_type);
    Py_DECREF(given);
    return result;
fail:
    PyMem_Free(fsm.count);
    PyMem_Free(fsm.slot);
    PyMem_Free(fsm.present);
    PyMem_Free(name_of_type);
    Py_DECREF(given);
    return NULL;
}

/* -- the BatchGraph's description ------------------------------------------- */

/* The power-of-two size of an open-addressing table that holds ``count``
 * entries at most half full (probes stay short), sized once. */
static size_t
half_full_capacity(Py_ssize_t count)
{
    size_t capacity = 64;
    while (capacity < 2 * (size_t)count + 2)
        capacity *= 2;
    return capacity;
}

/* Node id -> graph index (BatchGraph's ``index_of``).  Ids increase in
 * recording order, so a graph's ids usually fill most of their range: then
 * the map is an array over the range, whose look-ups of recent operands hit
 * the cache (a hash table's slots are random accesses: at 170,000 nodes,
 * a cache miss per look-up).  Sparse ids fall back to open addressing. */
typedef struct {
    long long low;        /* dense: the smallest id; ``dense`` covers span ids */
    Py_ssize_t span;
    Py_ssize_t *dense;    /* -1: not in the graph */
    long long *keys;      /* sparse */
    Py_ssize_t *values;
    size_t mask;
} IdMap;

static size_t
idmap_slot(const IdMap *map, long long id)
{
    size_t slot = (((unsigned long long)id * 0x9E3779B97F4A7C15ull) >> 17) & map->mask;
    while (map->values[slot] >= 0 && map->keys[slot] != id)
        slot = (slot + 1) & map->mask;
    return slot;
}

/* For ``count`` nodes whose ids are in [low, high]; never grows. */
static int
idmap_init(IdMap *map, Py_ssize_t count, long long low, long long high)
{
    if (high - low < 4 * (long long)count + 64) {
        map->low = low;
        map->span = (Py_ssize_t)(high - low + 1);
        map->dense = PyMem_New(Py_ssize_t, map->span + 1);
        if (map->dense == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < map->span; i++)
            map->dense[i] = -1;
        return 0;
    }
    size_t capacity = half_full_capacity(count);
    map->mask = capacity - 1;
    map->keys = PyMem_New(long long, capacity);
    map->values = PyMem_New(Py_ssize_t, capacity);
    if (map->keys == NULL || map->values == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < capacity; i++)
        map->values[i] = -1;
    return 0;
}

static void
idmap_free(IdMap *map)
{
    PyMem_Free(map->dense);
    PyMem_Free(map->keys);
    PyMem_Free(map->values);
}

static Py_ssize_t
idmap_get(const IdMap *map, long long id)
{
    if (map->dense != NULL)
        return id >= map->low && id - map->low < map->span ? map->dense[id - map->low] : -1;
    return map->values[idmap_slot(map, id)];
}

/* ``id`` must be one of the nodes' the map was made for. */
static void
idmap_put(IdMap *map, long long id, Py_ssize_t value)
{
    if (map->dense != NULL) {
        map->dense[id - map->low] = value;
        return;
    }
    size_t slot = idmap_slot(map, id);
    map->keys[slot] = id;
    map->values[slot] = value;
}

/* What BatchGraph's Python gives per call: the callbacks of the rare cases
 * and per-call caches (by op entry, by operand type). */
typedef struct {
    PyObject *access_entry, *entry_info, *kind_of,
             *spec_of_foreign, *value_key, *take_output;
    PyObject *entry_cache, *kind_cache, *str_shared;
    int own_rows;   /* whether lookups of a variable's rows keep their own */
} Describe;

/* The kinds of a foreign operand kind_of gives (by its type). */
enum { KIND_NUMBER, KIND_TENSOR, KIND_VARIABLE, KIND_OTHER };

static int
operand_kind(Describe *d, PyObject *operand)
{
    PyObject *kind = memo(d->kind_cache, (PyObject *)Py_TYPE(operand), d->kind_of,
                          operand);
    if (kind == NULL)
        return -1;
    long value = PyLong_AsLong(kind);
    if ((value == -1 && PyErr_Occurred()) || value < KIND_NUMBER || value > KIND_OTHER) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "kind_of must give 0, 1, 2 or 3");
        return -1;
    }
    return (int)value;
}

/* (index_positions, gathers) of an op entry, from entry_info, cached per
 * entry. */
static PyObject *
info_of_entry(Describe *d, PyObject *op_entry)
{
    PyObject *info = memo(d->entry_cache, op_entry, d->entry_info, op_entry);
    if (info != NULL && (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 2)) {
        PyErr_SetString(PyExc_TypeError,
                        "entry_info must give (index_positions, gathers)");
        return NULL;
    }
    return info;
}

/* A node's batching type and identity are C values, compared and hashed
 * here: the Python tuple of a batching type (graph.types) is made once per
 * type, not once per node, since allocating and freeing a handful of tuples
 * per node was most of this loop's cost.  Equal means what it meant for
 * those tuples: op entries, specs and shared tensors by identity, numbers
 * and value keys by ``==`` (an object equals itself). */

/* One operand's part of the batching type (a new reference each). */
enum { PART_SPEC, PART_NUMBER, PART_SHARED };
typedef struct {
    int tag;
    PyObject *object;   /* the Spec; the number; the tensor or variable */
} Part;

/* One operand's part of the identity: what makes two nodes of one type the
 * same work.  ``object`` is a new reference (or NULL for IDENT_NONE). */
enum { IDENT_NONE, IDENT_INDEX, IDENT_ADDRESS, IDENT_INTS, IDENT_KEY };
typedef struct {
    int tag;
    Py_ssize_t index;   /* IDENT_INDEX: the operand's canonical index */
    PyObject *object;   /* INDEX: the pick (None or an output number);
                           ADDRESS: the node evaluated earlier; INTS: the
                           list of ints; KEY: value_key's key */
} Ident;

typedef struct {
    Part *items;
    Py_ssize_t size, capacity;
} PartArray;

typedef struct {
    Ident *items;
    Py_ssize_t size, capacity;
} IdentArray;

static int
part_push(PartArray *array, int tag, PyObject *object)
{
    if (array->size == array->capacity
            && array_grow((void **)&array->items, &array->capacity, sizeof(Part)) < 0) {
        Py_DECREF(object);
        return -1;
    }
    array->items[array->size++] = (Part){tag, object};
    return 0;
}

static int
ident_push(IdentArray *array, int tag, Py_ssize_t index, PyObject *object)
{
    if (array->size == array->capacity
            && array_grow((void **)&array->items, &array->capacity, sizeof(Ident)) < 0) {
        Py_XDECREF(object);
        return -1;
    }
    array->items[array->size++] = (Ident){tag, index, object};
    return 0;
}

/* Drop the references of the items from ``from`` on. */
static void
parts_release(PartArray *array, Py_ssize_t from)
{
    for (Py_ssize_t i = from; i < array->size; i++)
        Py_DECREF(array->items[i].object);
    array->size = from;
}

static void
idents_release(IdentArray *array, Py_ssize_t from)
{
    for (Py_ssize_t i = from; i < array->size; i++)
        Py_XDECREF(array->items[i].object);
    array->size = from;
}

static inline Py_uhash_t
mix(Py_uhash_t hash, Py_uhash_t value)
{
    return (hash ^ value) * 0x100000001B3ull + (hash >> 29);
}

/* A table slot from a hash: MurmurHash3's finalizer, so that every bit of
 * the hash moves the slot (mix alone leaves runs of near slots). */
static inline size_t
slot_of(Py_uhash_t hash, size_t mask)
{
    hash ^= hash >> 33;
    hash *= 0xFF51AFD7ED558CCDull;
    hash ^= hash >> 33;
    hash *= 0xC4CEB9FE1A85EC53ull;
    hash ^= hash >> 33;
    return (size_t)hash & mask;
}

static inline Py_uhash_t
pointer_hash(const void *pointer)
{
    return (Py_uhash_t)(uintptr_t)pointer * 0x9E3779B97F4A7C15ull;
}

static int
part_hash(const Part *part, Py_uhash_t *hash)
{
    if (part->tag != PART_NUMBER) {
        *hash = mix(*hash, pointer_hash(part->object) + (Py_uhash_t)part->tag);
        return 0;
    }
    Py_hash_t value = PyObject_Hash(part->object);
    if (value == -1)
        return -1;
    *hash = mix(mix(*hash, pointer_hash(Py_TYPE(part->object))), (Py_uhash_t)value);
    return 0;
}

/* 1 equal, 0 not, -1 error. */
static int
part_equal(const Part *a, const Part *b)
{
    if (a->tag != b->tag)
        return 0;
    if (a->tag != PART_NUMBER || a->object == b->object)
        return a->object == b->object;
    if (Py_TYPE(a->object) != Py_TYPE(b->object))
        return 0;
    return PyObject_RichCompareBool(a->object, b->object, Py_EQ);
}

static int
ident_hash(const Ident *ident, Py_uhash_t *hash)
{
    Py_hash_t value = 0;
    switch (ident->tag) {
    case IDENT_NONE:
        break;
    case IDENT_ADDRESS:
        value = (Py_hash_t)pointer_hash(ident->object);
        break;
    case IDENT_INDEX:
        value = ident->object == Py_None ? 0 : PyObject_Hash(ident->object);
        if (value == -1)
            return -1;
        value = (Py_hash_t)mix((Py_uhash_t)value, (Py_uhash_t)ident->index);
        break;
    case IDENT_INTS: {   /* a list: hashed by its items, as its tuple was */
        Py_uhash_t items = 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ident->object); i++) {
            Py_hash_t item = PyObject_Hash(PyList_GET_ITEM(ident->object, i));
            if (item == -1)
                return -1;
            items = mix(items, (Py_uhash_t)item);
        }
        value = (Py_hash_t)items;
        break;
    }
    default:
        value = PyObject_Hash(ident->object);
        if (value == -1)
            return -1;
    }
    *hash = mix(mix(*hash, (Py_uhash_t)ident->tag), (Py_uhash_t)value);
    return 0;
}

static int
ident_equal(const Ident *a, const Ident *b)
{
    if (a->tag != b->tag)
        return 0;
    switch (a->tag) {
    case IDENT_NONE:
        return 1;
    case IDENT_ADDRESS:
        return a->object == b->object;
    case IDENT_INDEX:
        if (a->index != b->index)
            return 0;
        /* fall through: the picks */
    default:
        return PyObject_RichCompareBool(a->object, b->object, Py_EQ);
    }
}

/* Open-addressing slots (entry numbers, -1 empty) for ``count`` entries. */
typedef struct {
    int *slots;   /* int32: half the memory to miss in */
    size_t mask;
} Slots;

static int
slots_init(Slots *slots, Py_ssize_t count)
{
    if (count > 1000000000) {
        PyErr_SetString(PyExc_OverflowError, "too many nodes for one graph");
        return -1;
    }
    size_t capacity = half_full_capacity(count);
    slots->mask = capacity - 1;
    slots->slots = PyMem_New(int, capacity);
    if (slots->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < capacity; i++)
        slots->slots[i] = -1;
    return 0;
}

/* The types seen: per type, its representative's op entry and attrs, and
 * its parts (in ``parts``, from ``first``).  References held. */
typedef struct {
    PyObject *op_entry, *attrs;
    Py_uhash_t hash;
    Py_ssize_t first, count;
} TypeEntry;

typedef struct {
    TypeEntry *items;
    Py_ssize_t size, capacity;
    PartArray parts;
    Slots slots;
} TypeTable;

/* The work seen: per node that does work of its own, its type and its
 * identity (in ``idents``, from ``first``).  Two nodes do the same work
 * only if they read the same in-graph operands, so an entry whose identity
 * names one is found through its newest such operand: a chain per operand
 * (``chain``, by graph index), whose nodes were described recently and are
 * in the cache.  Entries without one, and those past CHAIN_LIMIT on a
 * chain (a node read by thousands of different ops), are in the hash
 * table (``slots``). */
#define CHAIN_LIMIT 16

typedef struct {
    Py_uhash_t hash;
    Py_ssize_t type, index, first, count;
    int next;   /* the next older entry on its chain, or -1 */
} WorkEntry;

typedef struct {
    WorkEntry *items;
    Py_ssize_t size;
    IdentArray idents;
    Slots slots;
    int *chain;          /* per graph index: the newest entry naming it, or -1 */
    int *chain_length;   /* ... and how many entries its chain holds */
} WorkTable;

static void
type_table_free(TypeTable *types)
{
    for (Py_ssize_t t = 0; t < types->size; t++) {
        Py_DECREF(types->items[t].op_entry);
        Py_DECREF(types->items[t].attrs);
    }
    parts_release(&types->parts, 0);
    PyMem_Free(types->parts.items);
    PyMem_Free(types->items);
    PyMem_Free(types->slots.slots);
}

static int
work_table_init(WorkTable *work, Py_ssize_t count)
{
    work->items = PyMem_New(WorkEntry, count + 1);
    work->chain = PyMem_New(int, count + 1);
    work->chain_length = PyMem_Calloc(count + 1, sizeof(int));
    if (work->items == NULL || work->chain == NULL || work->chain_length == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        work->chain[i] = -1;
    return slots_init(&work->slots, count);
}

static void
work_table_free(WorkTable *work)
{
    PyMem_Free(work->chain);
    PyMem_Free(work->chain_length);
    idents_release(&work->idents, 0);
    PyMem_Free(work->idents.items);
    PyMem_Free(work->items);
    PyMem_Free(work->slots.slots);
}

/* The batching type's hash: op entry, attrs (with their types), parts. */
static int
type_hash(Node *node, const PartArray *parts, Py_uhash_t *hash)
{
    if (node->entry == NULL || node->attrs == NULL || !PyTuple_Check(node->attrs)) {
        /* (changed by a callback since describe_node checked them) */
        PyErr_Format(PyExc_TypeError, "node %lld has no op entry or attrs tuple", node->id);
        return -1;
    }
    Py_hash_t attrs = PyObject_Hash(node->attrs);
    if (attrs == -1)
        return -1;
    *hash = mix(pointer_hash(node->entry), (Py_uhash_t)attrs);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(node->attrs); i++)
        *hash = mix(*hash, pointer_hash(Py_TYPE(PyTuple_GET_ITEM(node->attrs, i))));
    for (Py_ssize_t i = 0; i < parts->size; i++) {
        if (part_hash(&parts->items[i], hash) < 0)
            return -1;
    }
    return 0;
}

static int
same_type(const TypeTable *types, const TypeEntry *entry, Node *node,
          const PartArray *parts)
{
    if (entry->op_entry != node->entry || entry->count != parts->size)
        return 0;
    Py_ssize_t attr_count = PyTuple_GET_SIZE(node->attrs);
    if (PyTuple_GET_SIZE(entry->attrs) != attr_count)
        return 0;
    for (Py_ssize_t i = 0; i < attr_count; i++) {
        if (Py_TYPE(PyTuple_GET_ITEM(entry->attrs, i))
                != Py_TYPE(PyTuple_GET_ITEM(node->attrs, i)))
            return 0;
    }
    int equal = PyObject_RichCompareBool(entry->attrs, node->attrs, Py_EQ);
    for (Py_ssize_t i = 0; equal == 1 && i < parts->size; i++)
        equal = part_equal(&types->parts.items[entry->first + i], &parts->items[i]);
    return equal;
}

/* The batching type's tuple BatchGraph gives (op entry, attrs, attr types, a
 * part per operand) and the shared-operand flags, for a new type. */
static int
type_tuples(Describe *d, Node *node, const PartArray *parts,
            PyObject **type_out, PyObject **shared_out)
{
    Py_ssize_t attr_count = PyTuple_GET_SIZE(node->attrs);
    PyObject *batching_type = PyTuple_New(3 + parts->size);
    PyObject *shared = PyTuple_New(parts->size);
    PyObject *attr_types = PyTuple_New(attr_count);
    if (batching_type == NULL || shared == NULL || attr_types == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < attr_count; i++)
        PyTuple_SET_ITEM(attr_types, i,
                         Py_NewRef(Py_TYPE(PyTuple_GET_ITEM(node->attrs, i))));
    PyTuple_SET_ITEM(batching_type, 0, Py_NewRef(node->entry));
    PyTuple_SET_ITEM(batching_type, 1, Py_NewRef(node->attrs));
    PyTuple_SET_ITEM(batching_type, 2, attr_types);
    attr_types = NULL;
    for (Py_ssize_t i = 0; i < parts->size; i++) {
        const Part *part = &parts->items[i];
        PyObject *item;
        if (part->tag == PART_SPEC)
            item = Py_NewRef(part->object);
        else if (part->tag == PART_NUMBER)   /* a constant such as 0.5: by value */
            item = PyTuple_Pack(2, (PyObject *)Py_TYPE(part->object), part->object);
        else {
            PyObject *address = PyLong_FromVoidPtr(part->object);
            item = address == NULL ? NULL : PyTuple_Pack(2, d->str_shared, address);
            Py_XDECREF(address);
        }
        if (item == NULL)
            goto fail;
        PyTuple_SET_ITEM(batching_type, 3 + i, item);
        PyTuple_SET_ITEM(shared, i, Py_NewRef(part->tag == PART_SPEC ? Py_False : Py_True));
    }
    *type_out = batching_type;
    *shared_out = shared;
    return 0;
fail:
    Py_XDECREF(batching_type);
    Py_XDECREF(shared);
    Py_XDECREF(attr_types);
    return -1;
}

/* The type of a node whose parts are ``parts`` (taken: the table keeps
 * them or they are released), adding a new type to the table and to
 * ``batching_types`` / ``shared_operand``. */
static Py_ssize_t
intern_type(Describe *d, TypeTable *types, Node *node, PartArray *parts,
            PyObject *batching_types, PyObject *shared_operand)
{
    Py_uhash_t hash;
    if (type_hash(node, parts, &hash) < 0)
        return -1;
    size_t slot = slot_of(hash, types->slots.mask);
    Py_ssize_t found;
    while ((found = types->slots.slots[slot]) >= 0) {
        const TypeEntry *entry = &types->items[found];
        if (entry->hash == hash) {
            int equal = same_type(types, entry, node, parts);
            if (equal < 0)
                return -1;
            if (equal) {
                parts_release(parts, 0);
                return found;
            }
        }
        slot = (slot + 1) & types->slots.mask;
    }
    PyObject *batching_type, *shared;
    if (type_tuples(d, node, parts, &batching_type, &shared) < 0)
        return -1;
    int failed = PyList_Append(batching_types, batching_type) < 0
        || PyList_Append(shared_operand, shared) < 0;
    Py_DECREF(batching_type);
    Py_DECREF(shared);
    if (failed)
        return -1;
    if (types->size == types->capacity
            && array_grow((void **)&types->items, &types->capacity, sizeof(TypeEntry)) < 0)
        return -1;
    Py_ssize_t first = types->parts.size;
    for (Py_ssize_t i = 0; i < parts->size; i++) {
        if (types->parts.size == types->parts.capacity
                && array_grow((void **)&types->parts.items, &types->parts.capacity,
                              sizeof(Part)) < 0) {
            types->parts.size = first;   /* the references stay the caller's */
            return -1;
        }
        types->parts.items[types->parts.size++] = parts->items[i];
    }
    parts->size = 0;   /* the references are the table's now */
    types->items[types->size] = (TypeEntry){Py_NewRef(node->entry), Py_NewRef(node->attrs),
                                            hash, first, types->parts.size - first};
    types->slots.slots[slot] = (int)types->size;
    return types->size++;
}

/* 1 if entry ``found`` is of type ``type`` with identity ``idents``. */
static int
same_entry(const WorkTable *work, Py_ssize_t found, Py_uhash_t hash, Py_ssize_t type,
           const IdentArray *idents)
{
    const WorkEntry *entry = &work->items[found];
    if (entry->hash != hash || entry->type != type || entry->count != idents->size)
        return 0;
    int equal = 1;
    for (Py_ssize_t i = 0; equal == 1 && i < idents->size; i++)
        equal = ident_equal(&work->idents.items[entry->first + i], &idents->items[i]);
    return equal;
}

/* The node whose work node ``index`` (of type ``type``, identity
 * ``idents``: taken) repeats, or ``index`` itself, recorded as seen. */
static Py_ssize_t
same_work(WorkTable *work, Py_ssize_t type, Py_ssize_t index, IdentArray *idents)
{
    Py_uhash_t hash = pointer_hash((void *)(uintptr_t)(type + 1));
    Py_ssize_t newest = -1;   /* the newest in-graph operand */
    for (Py_ssize_t i = 0; i < idents->size; i++) {
        if (ident_hash(&idents->items[i], &hash) < 0)
            return -1;
        if (idents->items[i].tag == IDENT_INDEX && idents->items[i].index > newest)
            newest = idents->items[i].index;
    }
    int equal = 0;
    int found = newest < 0 ? -1 : work->chain[newest];
    for (; found >= 0 && !equal; found = equal ? found : work->items[found].next)
        equal = same_entry(work, found, hash, type, idents);
    size_t slot = 0;
    if (!equal && (newest < 0 || work->chain_length[newest] >= CHAIN_LIMIT)) {
        slot = slot_of(hash, work->slots.mask);
        while (!equal && (found = work->slots.slots[slot]) >= 0) {
            equal = same_entry(work, found, hash, type, idents);
            if (!equal)
                slot = (slot + 1) & work->slots.mask;
        }
    }
    if (equal < 0)
        return -1;
    if (equal) {
        idents_release(idents, 0);
        return work->items[found].index;
    }
    Py_ssize_t first = work->idents.size;
    for (Py_ssize_t i = 0; i < idents->size; i++) {
        if (work->idents.size == work->idents.capacity
                && array_grow((void **)&work->idents.items, &work->idents.capacity,
                              sizeof(Ident)) < 0) {
            work->idents.size = first;   /* the references stay the caller's */
            return -1;
        }
        work->idents.items[work->idents.size++] = idents->items[i];
    }
    idents->size = 0;   /* the table's now */
    WorkEntry *entry = &work->items[work->size];
    *entry = (WorkEntry){hash, type, index, first, work->idents.size - first, -1};
    if (newest >= 0 && work->chain_length[newest] < CHAIN_LIMIT) {
        entry->next = work->chain[newest];
        work->chain[newest] = (int)work->size;
        work->chain_length[newest]++;
    }
    else
        work->slots.slots[slot] = (int)work->size;
    work->size++;
    return index;
}

/* One scheduled node's operands and sources (pushed to ``table``), and its
 * batching type's parts and identity (appended to ``parts`` and ``idents``,
 * which start empty). */
static int
describe_node(Describe *d, Node *node, const IdMap *index_of,
              const Py_ssize_t *duplicate_of, PyObject *index_positions,
              PartArray *parts, IdentArray *idents, OperandTable *table)
{
    PyObject *attrs = node->attrs;
    if (attrs == NULL || !PyTuple_Check(attrs)) {
        PyErr_Format(PyExc_TypeError, "node %lld: attrs must be a tuple",
                     node->id);
        return -1;
    }
    /* Held: the callbacks below run Python code (so is each operand while
     * it is described; one whose inputs a callback replaced is an error). */
    PyObject *operand = NULL;
    Py_INCREF(attrs);
    Py_ssize_t count = node->input_count;
    for (Py_ssize_t position = 0; position < count; position++) {
        if (node->input_count != count) {
            PyErr_Format(PyExc_RuntimeError, "node %lld: inputs replaced while "
                         "the graph was described", node->id);
            goto fail;
        }
        Py_XSETREF(operand, Py_NewRef(node_input(node, position)));
        int pushed;
        if (Py_IS_TYPE(operand, node_type)) {
            Node *source = (Node *)operand;
            Py_ssize_t index = idmap_get(index_of, source->id);
            PyObject *pick = Py_None;
            Py_ssize_t pick_number = -1;
            /* An access node of this graph, or one the pattern search
             * left out of it whose multi-output node is in it (replace):
             * read the picked output of that node. */
            Node *op = source->entry == d->access_entry && source->input_count > 0
                       && is_node(node_input(source, 0))
                       ? (Node *)node_input(source, 0) : NULL;
            Py_ssize_t op_index = op == NULL ? -1 : idmap_get(index_of, op->id);
            if (source->entry == d->access_entry && (index >= 0 || op_index >= 0)) {
                if (op == NULL || !PyTuple_Check(source->attrs)
                        || PyTuple_GET_SIZE(source->attrs) < 1) {
                    PyErr_SetString(PyExc_TypeError, "a malformed access node");
                    goto fail;
                }
                pick = PyTuple_GET_ITEM(source->attrs, 0);
                pick_number = PyLong_Check(pick) ? PyLong_AsSsize_t(pick) : -1;
                if (pick_number < 0) {
                    if (!PyErr_Occurred())
                        PyErr_SetString(PyExc_TypeError, "an access node's output "
                                        "must be a non-negative int");
                    goto fail;
                }
                source = op;
                index = op_index;
                if (index < 0) {
                    PyErr_Format(PyExc_KeyError, "%lld", source->id);
                    goto fail;
                }
            }
            if (index >= 0) {
                index = duplicate_of[index];
                if (operand_table_add_source(table, index) < 0)
                    goto fail;
            }
            if (source->spec == NULL) {
                PyErr_SetString(PyExc_AttributeError, "an operand node has no spec");
                goto fail;
            }
            /* (A multi-output node's spec is a tuple: read in place.) */
            PyObject *spec = pick == Py_None ? Py_NewRef(source->spec)
                : PyTuple_CheckExact(source->spec) && pick_number < PyTuple_GET_SIZE(source->spec)
                ? Py_NewRef(PyTuple_GET_ITEM(source->spec, pick_number))
                : PyObject_GetItem(source->spec, pick);
            pushed = spec == NULL ? -1 : part_push(parts, PART_SPEC, spec);
            if (pushed == 0)
                pushed = index >= 0
                    ? ident_push(idents, IDENT_INDEX, index, Py_NewRef(pick))
                    : ident_push(idents, IDENT_ADDRESS, 0, Py_NewRef(source));
            if (pushed == 0)
                pushed = operand_table_push(table, index >= 0 ? index : OPERAND_EARLIER,
                                            pick_number, (PyObject *)source);
        }
        else {
            int kind = operand_kind(d, operand);
            if (kind < 0)
                goto fail;
            int is_index = 0;
            if (kind == KIND_NUMBER) {
                PyObject *number = PyLong_FromSsize_t(position);
                is_index = number == NULL ? -1
                                          : PySequence_Contains(index_positions, number);
                Py_XDECREF(number);
                if (is_index < 0)
                    goto fail;
            }
            PyObject *spec;
            if (kind == KIND_NUMBER && !is_index) {
                /* A constant such as the 0.5 in x * 0.5: shared by value. */
                pushed = part_push(parts, PART_NUMBER, Py_NewRef(operand));
                if (pushed == 0)
                    pushed = ident_push(idents, IDENT_NONE, 0, NULL);
            }
            else if (kind == KIND_TENSOR || kind == KIND_VARIABLE) {
                pushed = part_push(parts, PART_SHARED, Py_NewRef(operand));
                if (pushed == 0)
                    pushed = ident_push(idents, IDENT_NONE, 0, NULL);
            }
            else if ((spec = int_list_spec(operand)) != NULL) {
                /* A list of ints (word ids): its items are its value. */
                pushed = part_push(parts, PART_SPEC, spec);
                if (pushed == 0)
                    pushed = ident_push(idents, IDENT_INTS, 0, Py_NewRef(operand));
            }
            else if (PyErr_Occurred()) {
                pushed = -1;
            }
            else {   /* other lists, arrays and indices: per instance, stacked */
                spec = PyObject_CallOneArg(d->spec_of_foreign, operand);
                pushed = spec == NULL ? -1 : part_push(parts, PART_SPEC, spec);
                if (pushed == 0) {
                    PyObject *key = PyObject_CallOneArg(d->value_key, operand);
                    pushed = key == NULL ? -1 : ident_push(idents, IDENT_KEY, 0, key);
                }
            }
            if (pushed == 0)
                pushed = operand_table_push(table, OPERAND_VALUE, -1, operand);
        }
        if (pushed < 0)
            goto fail;
    }
    Py_XDECREF(operand);
    Py_DECREF(attrs);
    return 0;
fail:
    Py_XDECREF(operand);
    Py_DECREF(attrs);
    return -1;
}

/* Whether a node's work is never shared (a lookup of a variable's rows,
 * where ``own_rows``): entry_info's ``gathers`` is a bool, or the position
 * of the operand that makes it so when it is a variable, or None. */
static int
keeps_own_row(Describe *d, Node *node, PyObject *gathers)
{
    if (gathers == Py_None || !d->own_rows)
        return 0;
    if (PyBool_Check(gathers))
        return gathers == Py_True;
    Py_ssize_t position = PyLong_AsSsize_t(gathers);
    if (position == -1 && PyErr_Occurred())
        return -1;
    if (position < 0 || position >= node->input_count) {
        PyErr_SetString(PyExc_IndexError, "gathers_from is not an operand");
        return -1;
    }
    PyObject *operand = node_input(node, position);
    if (Py_IS_TYPE(operand, node_type))
        return 0;
    int kind = operand_kind(d, operand);
    return kind < 0 ? -1 : kind == KIND_VARIABLE;
}

PyDoc_STRVAR(describe_graph_doc,
"describe_graph(nodes, access_entry, entry_info, kind_of,\n"
"               spec_of_foreign, value_key, take_output, own_rows=True)\n--\n\n"
"BatchGraph's loop over its nodes (see batcher/graph.py, which gives the\n"
"callbacks); returns (type_of, duplicate_of, operands, sources, types,\n"
"shared_operand, duplicates): ``operands`` an OperandTable, ``sources`` its\n"
"Sources view, ``duplicates`` counting the nodes whose work an earlier node\n"
"does.  ``own_rows``: lookups of a variable's rows keep their own (a\n"
"tape could record them), else they are shared like other work.");

static PyObject *
describe_graph(PyObject *module, PyObject *args)
{
    PyObject *nodes;
    Describe d = {0};
    d.own_rows = 1;
    if (!PyArg_ParseTuple(args, "O!OOOOOO|p:describe_graph", &PyList_Type,
                          &nodes, &d.access_entry, &d.entry_info,
                          &d.kind_of, &d.spec_of_foreign, &d.value_key,
                          &d.take_output, &d.own_rows))
        return NULL;
    /* The nodes are held by a tuple of our own: callbacks run Python code,
     * which could change the list. */
    nodes = PyList_AsTuple(nodes);
    if (nodes == NULL)
        return NULL;
    /* One look at each node before the loop (each a cache miss at 65,000
     * nodes): its type, and the range of the ids. */
    Py_ssize_t count = PyTuple_GET_SIZE(nodes);
    long long low = 0, high = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        Node *node = (Node *)PyTuple_GET_ITEM(nodes, i);
        if (i + 8 < count)
            prefetch_node(PyTuple_GET_ITEM(nodes, i + 8));
        if (!Py_IS_TYPE(node, node_type)) {
            PyErr_Format(PyExc_TypeError, "nodes[%zd] is not a VirtualNode", i);
            Py_DECREF(nodes);
            return NULL;
        }
        if (i == 0 || node->id < low)
            low = node->id;
        if (i == 0 || node->id > high)
            high = node->id;
    }
    IdMap index_of = {0};
    TypeTable types = {0};
    WorkTable work = {0};
    PartArray parts = {0};
    IdentArray idents = {0};
    Py_ssize_t *type_of = PyMem_New(Py_ssize_t, count + 1);
    Py_ssize_t *duplicate_of = PyMem_New(Py_ssize_t, count + 1);
    OperandTable *table = operand_table_new(count);
    PyObject *batching_types = PyList_New(0), *shared_operand = PyList_New(0);
    PyObject *result = NULL;
    d.entry_cache = PyDict_New();
    d.kind_cache = PyDict_New();
    d.str_shared = PyUnicode_InternFromString("shared");
    if (type_of == NULL || duplicate_of == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (table == NULL || batching_types == NULL
            || shared_operand == NULL || d.entry_cache == NULL
            || d.kind_cache == NULL || d.str_shared == NULL
            || idmap_init(&index_of, count, low, high) < 0
            || slots_init(&types.slots, count) < 0
            || work_table_init(&work, count) < 0)
        goto done;
    for (Py_ssize_t index = 0; index < count; index++) {
        Node *node = (Node *)PyTuple_GET_ITEM(nodes, index);
        if (index + 6 < count)
            prefetch_node(PyTuple_GET_ITEM(nodes, index + 6));
        if (node->entry == NULL) {
            PyErr_Format(PyExc_TypeError, "node %lld has no op entry", node->id);
            goto done;
        }
        if (node->entry == d.access_entry) {
            if (node->input_count < 1 || !is_node(node_input(node, 0))) {
                PyErr_SetString(PyExc_TypeError, "a malformed access node");
                goto done;
            }
            PyObject *source = Py_NewRef(node_input(node, 0));
            Py_ssize_t source_index = idmap_get(&index_of, ((Node *)source)->id);
            if (source_index < 0) {   /* its op ran in an earlier evaluation */
                PyObject *done = PyObject_CallFunctionObjArgs(
                    d.take_output, (PyObject *)node, source, NULL);
                if (done == NULL) {
                    Py_DECREF(source);
                    goto done;
                }
                Py_DECREF(done);
            }
            else
                idmap_put(&index_of, node->id, index);
            int failed = operand_table_push(table, source_index >= 0 ? source_index
                                            : OPERAND_EARLIER, -1, source) < 0
                || (source_index >= 0
                    && operand_table_add_source(table, duplicate_of[source_index]) < 0)
                || operand_table_end_node(table) < 0;
            Py_DECREF(source);
            if (failed)
                goto done;
            type_of[index] = -1;
            duplicate_of[index] = index;
            continue;
        }
        idmap_put(&index_of, node->id, index);
        PyObject *info = info_of_entry(&d, node->entry);
        if (info == NULL)
            goto done;
        if (describe_node(&d, node, &index_of, duplicate_of,
                          PyTuple_GET_ITEM(info, 0), &parts, &idents, table) < 0
                || operand_table_end_node(table) < 0)
            goto done;
        int own = keeps_own_row(&d, node, PyTuple_GET_ITEM(info, 1));
        if (own < 0)
            goto done;
        Py_ssize_t node_type_index = intern_type(&d, &types, node, &parts,
                                                 batching_types, shared_operand);
        if (node_type_index < 0)
            goto done;
        Py_ssize_t earlier = index;
        if (own)
            idents_release(&idents, 0);
        else if ((earlier = same_work(&work, node_type_index, index, &idents)) < 0)
            goto done;
        type_of[index] = earlier == index ? node_type_index : -1;
        duplicate_of[index] = earlier;
    }
    Py_ssize_t duplicates = 0;
    for (Py_ssize_t index = 0; index < count; index++)
        duplicates += duplicate_of[index] != index;
    /* The passes after this one read these as arrays, and the table's
     * nodes as checked (plan.c). */
    PyObject *type_list = indices_new(type_of, count);
    PyObject *duplicate_list = indices_new(duplicate_of, count);
    table->nodes = Py_NewRef(nodes);
    PyObject *sources = PyObject_GetAttrString((PyObject *)table, "sources");
    if (type_list != NULL && duplicate_list != NULL && sources != NULL)
        result = Py_BuildValue("(OOOOOOn)", type_list, duplicate_list, table,
                               sources, batching_types, shared_operand, duplicates);
    Py_XDECREF(type_list);
    Py_XDECREF(duplicate_list);
    Py_XDECREF(sources);
done:
    parts_release(&parts, 0);
    idents_release(&idents, 0);
    PyMem_Free(parts.items);
    PyMem_Free(idents.items);
    type_table_free(&types);
    work_table_free(&work);
    idmap_free(&index_of);
    PyMem_Free(type_of);
    PyMem_Free(duplicate_of);
    Py_XDECREF(table);
    Py_XDECREF(batching_types);
    Py_XDECREF(shared_operand);
    Py_XDECREF(d.entry_cache);
    Py_XDECREF(d.kind_cache);
    Py_XDECREF(d.str_shared);
    Py_DECREF(nodes);
    return result;
}

/* -- registration ----------------------------------------------------------- */

static PyMethodDef analysis_methods[] = {
    {"unevaluated_ancestors", unevaluated_ancestors, METH_O,
     unevaluated_ancestors_doc},
    {"scope_leftovers", scope_leftovers, METH_VARARGS, scope_leftovers_doc},
    {"search_roots", search_roots, METH_VARARGS, search_roots_doc},
    {"depths", depths, METH_VARARGS, depths_doc},
    {"depth_schedule", depth_schedule, METH_VARARGS, depth_schedule_doc},
    {"agenda_schedule", agenda_schedule, METH_VARARGS, agenda_schedule_doc},
    {"critical_schedule", critical_schedule, METH_VARARGS, critical_schedule_doc},
    {"fsm_schedule", fsm_schedule, METH_VARARGS, fsm_schedule_doc},
    {"describe_graph", describe_graph, METH_VARARGS, describe_graph_doc},
    {NULL},
};

int
add_analysis_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, analysis_methods);
}
