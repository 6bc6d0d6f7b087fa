/* Joining patterns in C (issue 17): after stage 2 of the pattern search has
 * rewritten matches into pattern nodes, each pattern node that reads a
 * multi-output pattern node's outputs is joined to it, where that makes
 * neither wait (patterns/search.py, PatternSearch._fuse, says when and
 * why).  This runs over every pattern node of every minibatch. */
#include "containers.h"

static PyObject *str_entry, *str_pattern, *str_output, *str_argument;

/* Entry kinds entry_kind gives (bits). */
enum { MULTI_OUTPUT = 1, PRODUCER = 2 };

/* entry_kind(entry), cached per op entry for the call. */
static int
kind_of_entry(PyObject *entry, PyObject *entry_kind, PyObject *cache)
{
    PyObject *kind = memo(cache, entry, entry_kind, entry);
    if (kind == NULL)
        return -1;
    long value = PyLong_AsLong(kind);
    if (value == -1 && PyErr_Occurred())
        return -1;
    return (int)value;
}

/* The last recorded multi-output pattern node (a plain one, not joined,
 * not evaluated) whose outputs ``node`` reads through access nodes, or
 * NULL (borrowed). */
static Node *
latest_producer(Node *node, PyObject *access_entry, PyObject *entry_kind,
                PyObject *cache, int *error)
{
    Node *latest = NULL;
    for (Py_ssize_t i = 0; i < node->input_count; i++) {
        PyObject *operand = node_input(node, i);
        if (!is_node(operand))
            continue;
        Node *access = (Node *)operand;
        if (access->entry != access_entry || access->input_count == 0)
            continue;   /* (an evaluated access node has no inputs) */
        PyObject *source = node_input(access, 0);
        /* (A producer evaluated before, in a pipelined part, keeps its
         * value: its outputs are read, not joined.) */
        if (!is_node(source) || !unevaluated((Node *)source))
            continue;
        int kind = kind_of_entry(((Node *)source)->entry, entry_kind, cache);
        if (kind < 0) {
            *error = 1;
            return NULL;
        }
        if ((kind & PRODUCER) && (latest == NULL || ((Node *)source)->id > latest->id))
            latest = (Node *)source;
    }
    return latest;
}

/* What the loop over pattern nodes reads a few iterations on, asked for
 * early (prefetch_node): each node, then its inputs (access nodes), then
 * theirs (the producers), each read only once it has arrived.  Waiting for
 * them in turn was 70% of this pass's time. */
static inline void
prefetch_ahead(PyObject *nodes, Py_ssize_t i, Py_ssize_t count)
{
    if (i + 6 < count)
        prefetch_node(PyTuple_GET_ITEM(nodes, i + 6));
    if (i + 4 < count) {
        Node *node = (Node *)PyTuple_GET_ITEM(nodes, i + 4);
        for (Py_ssize_t k = 0; k < node->input_count; k++)
            prefetch_node(node_input(node, k));
    }
    if (i + 2 < count) {
        Node *node = (Node *)PyTuple_GET_ITEM(nodes, i + 2);
        for (Py_ssize_t k = 0; k < node->input_count; k++) {
            PyObject *operand = node_input(node, k);
            if (is_node(operand) && ((Node *)operand)->input_count > 0)
                prefetch_node(node_input((Node *)operand, 0));
        }
    }
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
 * ``producer``, as codes: -(k + 1) for the producer's output k, else the
 * argument's place among the pair's (the producer's arguments, then the
 * consumer's own, which are appended to ``extras``, borrowed).  1 if
 * joinable, 0 if joining would make the pair wait for something the
 * producer does not, -1 with an exception set. */
static int
wiring_codes(Node *consumer, Node *producer, PyObject *access_entry,
             Py_ssize_t *codes, PtrArray *extras)
{
    Py_ssize_t arguments = producer->input_count;
    for (Py_ssize_t i = 0; i < consumer->input_count; i++) {
        PyObject *operand = node_input(consumer, i);
        if (is_node(operand) && ((Node *)operand)->entry == access_entry
                && ((Node *)operand)->input_count > 0
                && node_input((Node *)operand, 0) == (PyObject *)producer) {
            PyObject *attrs = ((Node *)operand)->attrs;
            Py_ssize_t output = -1;
            if (PyTuple_Check(attrs) && PyTuple_GET_SIZE(attrs) >= 1
                    && PyLong_Check(PyTuple_GET_ITEM(attrs, 0)))
                output = PyLong_AsSsize_t(PyTuple_GET_ITEM(attrs, 0));
            if (output < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "a malformed access node");
                return -1;
            }
            codes[i] = -(output + 1);
            continue;
        }
        Py_ssize_t place = 0;
        while (place < arguments && node_input(producer, place) != operand)
            place++;
        if (place == arguments) {
            if (is_node(operand) && unevaluated((Node *)operand)
                    && !feeds((Node *)operand, producer))
                return 0;
            place = arguments + extras->size;
            if (ptr_push(extras, operand) < 0)
                return -1;
        }
        codes[i] = place;
    }
    return 1;
}

/* The Python wiring FusedPattern takes: ("output", k) or ("argument", i)
 * per consumer argument. */
static PyObject *
wiring_tuple(const Py_ssize_t *codes, Py_ssize_t count)
{
    PyObject *wiring = PyTuple_New(count);
    for (Py_ssize_t i = 0; wiring != NULL && i < count; i++) {
        PyObject *item = codes[i] < 0 ? Py_BuildValue("(On)", str_output, -codes[i] - 1)
                                      : Py_BuildValue("(On)", str_argument, codes[i]);
        if (item == NULL)
            Py_CLEAR(wiring);
        else
            PyTuple_SET_ITEM(wiring, i, item);
    }
    return wiring;
}

/* The pattern for a pair not in the call's memo: from ``fused`` (by the
 * Python key), else made by ``make_fused``; kept in ``memo`` under
 * ``quick``.  A new reference, or NULL with an exception set. */
static PyObject *
made_pattern(Node *producer, Node *consumer, const Py_ssize_t *codes, Py_ssize_t count,
             Py_ssize_t extra_count, PyObject *fused, PyObject *make_fused,
             PyObject *memo, PyObject *quick)
{
    PyObject *pair;
    PyObject *producer_pattern = PyObject_GetAttr(producer->entry, str_pattern);
    PyObject *consumer_pattern = producer_pattern == NULL ? NULL
                                 : PyObject_GetAttr(consumer->entry, str_pattern);
    PyObject *wiring = consumer_pattern == NULL ? NULL : wiring_tuple(codes, count);
    PyObject *key = wiring == NULL ? NULL
        : PyTuple_Pack(3, producer_pattern, consumer_pattern, wiring);
    Py_XDECREF(producer_pattern);
    Py_XDECREF(consumer_pattern);
    Py_XDECREF(wiring);
    pair = key == NULL ? NULL : Py_XNewRef(PyDict_GetItemWithError(fused, key));
    if (pair == NULL && key != NULL && !PyErr_Occurred())
        pair = PyObject_CallFunction(make_fused, "On", key, extra_count);
    Py_XDECREF(key);
    /* (The entries in a key stay alive, so their addresses stay theirs, for
     * the call: each is a pattern's entry, which its pattern holds.) */
    if (pair != NULL && PyDict_SetItem(memo, quick, pair) < 0)
        Py_CLEAR(pair);
    return pair;
}

/* The pairs a call joined last, by their packed keys, in front of its
 * memo: a part joins hundreds of pairs of a few kinds, and making a bytes
 * key for each and looking it up was a quarter of this pass (in a 25-tree
 * inference; BENCHMARKS.md).  Keys of more words go to the memo only. */
#define RECENT 4
#define RECENT_WORDS 16
typedef struct {
    Py_ssize_t words;                  /* 0: empty */
    Py_ssize_t key[RECENT_WORDS];
    PyObject *pair;                    /* held */
} Recent;

static void
recent_clear(Recent *recent)
{
    for (int i = 0; i < RECENT; i++)
        Py_CLEAR(recent[i].pair);
}

/* The joined pattern for a pair of op entries wired by ``codes``: from
 * ``recent`` or ``memo`` (this call's, keyed by the entries' addresses and
 * the codes), else from ``fused`` (by the Python key), else made by
 * ``make_fused``.  A new reference to the pattern, or NULL with an
 * exception set. */
static PyObject *
joined_pattern(Node *consumer, Node *producer, const Py_ssize_t *codes,
               Py_ssize_t extra_count, Recent *recent, int *recent_next,
               PyObject *memo, PyObject *fused, PyObject *make_fused)
{
    Py_ssize_t count = consumer->input_count;
    Py_ssize_t words = 3 + count;
    Py_ssize_t local[RECENT_WORDS];
    Py_ssize_t *packed = words <= RECENT_WORDS ? local : PyMem_New(Py_ssize_t, words);
    if (packed == NULL)
        return PyErr_NoMemory();
    packed[0] = (Py_ssize_t)producer->entry;
    packed[1] = (Py_ssize_t)consumer->entry;
    packed[2] = extra_count;
    memcpy(packed + 3, codes, count * sizeof(Py_ssize_t));
    size_t bytes = (size_t)words * sizeof(Py_ssize_t);
    for (int i = 0; words <= RECENT_WORDS && i < RECENT; i++)
        if (recent[i].words == words && memcmp(recent[i].key, packed, bytes) == 0)
            return Py_NewRef(recent[i].pair);
    PyObject *quick = PyBytes_FromStringAndSize((const char *)packed, (Py_ssize_t)bytes);
    if (quick == NULL) {
        if (packed != local)
            PyMem_Free(packed);
        return NULL;
    }
    PyObject *pair = Py_XNewRef(PyDict_GetItemWithError(memo, quick));
    if (pair == NULL && !PyErr_Occurred())
        pair = made_pattern(producer, consumer, codes, count, extra_count, fused,
                            make_fused, memo, quick);
    if (pair != NULL && words <= RECENT_WORDS) {
        Recent *slot = &recent[*recent_next];
        *recent_next = (*recent_next + 1) % RECENT;
        slot->words = words;
        memcpy(slot->key, packed, bytes);
        Py_XSETREF(slot->pair, Py_NewRef(pair));
    }
    if (packed != local)
        PyMem_Free(packed);
    Py_DECREF(quick);
    return pair;
}

/* The joined node's spec (the producer's outputs', then the consumer's)
 * and the consumer's attributes as an access to the last of them, new
 * references.  Specs are interned, so most joins of a call share a few
 * pairs of them: the last SHAPES pairs are kept, by the specs' addresses,
 * rather than made anew per join (a kept pair holds references to its
 * specs, so an address stays theirs). */
#define SHAPES 8
typedef struct {
    PyObject *producer_spec, *consumer_spec, *spec, *attrs;
} Shape;

static int
joined_shape(Shape *shapes, Node *producer, Node *consumer, PyObject **spec_out,
             PyObject **attrs_out)
{
    if (producer->spec == NULL || consumer->spec == NULL) {
        PyErr_SetString(PyExc_TypeError, "a pattern node to join has no spec");
        return -1;
    }
    size_t slot = (((uintptr_t)producer->spec ^ ((uintptr_t)consumer->spec >> 4)) >> 4)
                  % SHAPES;
    Shape *shape = &shapes[slot];
    if (shape->spec == NULL || shape->producer_spec != producer->spec
            || shape->consumer_spec != consumer->spec) {
        PyObject *specs = PySequence_Fast(producer->spec,
                                          "a multi-output node's spec is a tuple");
        if (specs == NULL)
            return -1;
        Py_ssize_t outputs = PySequence_Fast_GET_SIZE(specs);
        PyObject *spec = PyTuple_New(outputs + 1);
        PyObject *attrs = Py_BuildValue("(n)", outputs);
        if (spec == NULL || attrs == NULL) {
            Py_DECREF(specs);
            Py_XDECREF(spec);
            Py_XDECREF(attrs);
            return -1;
        }
        for (Py_ssize_t n = 0; n < outputs; n++)
            PyTuple_SET_ITEM(spec, n, Py_NewRef(PySequence_Fast_GET_ITEM(specs, n)));
        PyTuple_SET_ITEM(spec, outputs, Py_NewRef(consumer->spec));
        Py_DECREF(specs);
        Py_XSETREF(shape->producer_spec, Py_NewRef(producer->spec));
        Py_XSETREF(shape->consumer_spec, Py_NewRef(consumer->spec));
        Py_XSETREF(shape->spec, spec);
        Py_XSETREF(shape->attrs, attrs);
    }
    *spec_out = Py_NewRef(shape->spec);
    *attrs_out = Py_NewRef(shape->attrs);
    return 0;
}

static void
shapes_clear(Shape *shapes)
{
    for (int i = 0; i < SHAPES; i++) {
        Py_CLEAR(shapes[i].producer_spec);
        Py_CLEAR(shapes[i].consumer_spec);
        Py_CLEAR(shapes[i].spec);
        Py_CLEAR(shapes[i].attrs);
    }
}

/* Join ``consumer`` to ``producer`` as ``fused`` reads them: the producer's
 * node runs the pair (on its arguments and then ``extras``), the
 * consumer's becomes an access to its last output. */
static int
join(Node *consumer, Node *producer, PyObject *fused, const PtrArray *extras,
     PyObject *access_entry, Shape *shapes)
{
    PyObject *spec = NULL, *attrs = NULL;
    PyObject *entry = PyObject_GetAttr(fused, str_entry);
    if (entry == NULL || joined_shape(shapes, producer, consumer, &spec, &attrs) < 0) {
        Py_XDECREF(entry);
        return -1;
    }
    Py_ssize_t own = producer->input_count, count = own + extras->size;
    PyObject **inputs = PyMem_New(PyObject *, count + 1);
    PyObject *reads = (PyObject *)producer;
    int failed = inputs == NULL;
    if (inputs == NULL)
        PyErr_NoMemory();
    if (!failed) {
        for (Py_ssize_t i = 0; i < own; i++)
            inputs[i] = node_input(producer, i);
        for (Py_ssize_t i = 0; i < extras->size; i++)
            inputs[own + i] = extras->items[i];
        /* The producer takes the extras before the consumer lets them go;
         * one input is kept inline, so the consumer's cannot fail. */
        failed = node_set_inputs(producer, inputs, count) < 0
                 || node_set_inputs(consumer, &reads, 1) < 0;
    }
    PyMem_Free(inputs);
    if (failed) {
        Py_DECREF(entry);
        Py_DECREF(spec);
        Py_DECREF(attrs);
        return -1;
    }
    Py_XSETREF(producer->entry, entry);
    Py_XSETREF(producer->spec, spec);
    Py_XSETREF(consumer->entry, Py_NewRef(access_entry));
    Py_XSETREF(consumer->attrs, attrs);
    return 0;
}

PyDoc_STRVAR(fuse_doc,
"fuse(pattern_nodes, fused, make_fused, entry_kind, access_entry,\n"
"     required_ids, reached)\n--\n\n"
"Join each of ``pattern_nodes`` (in recording order) to the multi-output\n"
"pattern node whose outputs it reads, where that delays nothing (see\n"
"search.py).  ``fused`` maps (producer pattern, consumer pattern, wiring)\n"
"to a joined pattern, ``make_fused(key, extra_count)`` makes one for a new\n"
"key (and stores it); ``entry_kind(entry)`` gives bits: 1 multi-output, 2 a\n"
"pattern that can be joined to.  A joined consumer, now an access node,\n"
"that nodes read and whose id is not in the set ``required_ids`` is passed\n"
"through as the search passes such nodes (``replace``): marked swallowed\n"
"and left out of ``reached`` (the search's list of nodes to evaluate).\n"
"Returns (a dict of the joins per joined pattern, the nodes of\n"
"``reached`` left to evaluate).");

/* After a join, the consumer is an access node to the pair's last output:
 * unless someone asked for it or nothing reads it (a root), it leaves the
 * evaluation now, as ``enqueue`` leaves the search's access nodes out
 * (``stays_out``): the Tree-LSTM's joined cells made two in five of the
 * nodes each later pass visited.  1 if it left, 0 if not, -1 with an
 * exception set. */
static int
pass_through(Node *consumer, PyObject *access_entry, const IdSet *required,
             IdBits *passed)
{
    if (!stays_out(consumer, access_entry, required))
        return 0;
    if (idbits_add(passed, consumer->id) < 0)
        return -1;
    consumer->swallowed = 1;
    return 1;
}

/* ``reached`` without the ``passed_count`` nodes in ``passed``: a new list,
 * untracked as the search's own (node_list), or ``reached`` itself if none
 * passed.  (Read after the joins: no Python code runs here to change it.) */
static PyObject *
without_passed(PyObject *reached, const IdBits *passed, Py_ssize_t passed_count)
{
    Py_ssize_t count = PyList_GET_SIZE(reached), kept = 0;
    for (Py_ssize_t i = 0; i < count; i++)
        if (!is_node(PyList_GET_ITEM(reached, i)))
            return PyErr_Format(PyExc_TypeError, "reached[%zd] is not a recorded node", i);
    if (passed_count == 0)
        return Py_NewRef(reached);
    PyObject *left = node_list(count);
    if (left == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(reached, i);
        if (!idbits_contains(passed, ((Node *)item)->id))
            PyList_SET_ITEM(left, kept++, Py_NewRef(item));
    }
    Py_SET_SIZE(left, kept);   /* (the slots past it are NULL) */
    return left;
}

static PyObject *
fuse(PyObject *module, PyObject *args)
{
    PyObject *given, *fused, *make_fused, *entry_kind, *access_entry, *required_ids,
             *reached;
    if (!PyArg_ParseTuple(args, "OO!OOOOO!:fuse", &given, &PyDict_Type, &fused,
                          &make_fused, &entry_kind, &access_entry, &required_ids,
                          &PyList_Type, &reached))
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
    IdSet required;
    if (idset_read(&required, required_ids, "required_ids") < 0) {
        Py_DECREF(nodes);
        return NULL;
    }
    PyObject *cache = PyDict_New(), *memo = PyDict_New(), *result = NULL;
    /* The joins per joined pattern; the memo holds each pattern. */
    Tally joined = {0};
    Shape shapes[SHAPES] = {{0}};
    Recent recent[RECENT] = {{0}};
    int recent_next = 0;
    PtrArray extras = {0};
    Py_ssize_t *codes = NULL, code_capacity = 0;
    /* The joined consumers that left the evaluation (pass_through). */
    IdBits passed = {0};
    Py_ssize_t passed_count = 0;
    if (cache == NULL || memo == NULL)
        goto done;
    Py_ssize_t count = PyTuple_GET_SIZE(nodes);
    for (Py_ssize_t i = 0; i < count; i++) {
        Node *node = (Node *)PyTuple_GET_ITEM(nodes, i);
        prefetch_ahead(nodes, i, count);
        int kind = kind_of_entry(node->entry, entry_kind, cache), error = 0;
        if (kind < 0)
            goto done;
        if (kind & MULTI_OUTPUT)
            continue;   /* its outputs' accesses would nest */
        Node *producer = latest_producer(node, access_entry, entry_kind, cache, &error);
        if (error)
            goto done;
        if (producer == NULL)
            continue;
        while (code_capacity < node->input_count)
            if (array_grow((void **)&codes, &code_capacity, sizeof(Py_ssize_t)) < 0)
                goto done;
        extras.size = 0;
        int joinable = wiring_codes(node, producer, access_entry, codes, &extras);
        if (joinable <= 0) {
            if (joinable < 0)
                goto done;
            continue;
        }
        /* Held while Python runs (the pattern may be made), with the
         * extras, which the consumer's inputs hold. */
        Py_INCREF(producer);
        for (Py_ssize_t k = 0; k < extras.size; k++)
            Py_INCREF(extras.items[k]);
        PyObject *pair = joined_pattern(node, producer, codes, extras.size, recent,
                                        &recent_next, memo, fused, make_fused);
        int failed = pair == NULL
                     || join(node, producer, pair, &extras, access_entry, shapes) < 0
                     || tally_add(&joined, pair) < 0;
        Py_XDECREF(pair);
        Py_DECREF(producer);
        for (Py_ssize_t k = 0; k < extras.size; k++)
            Py_DECREF(extras.items[k]);
        if (failed)
            goto done;
        int left = pass_through(node, access_entry, &required, &passed);
        if (left < 0)
            goto done;
        passed_count += left;
    }
    PyObject *joins = tally_dict(&joined);   /* (before the memo lets the pairs go) */
    PyObject *remaining = joins == NULL ? NULL
                          : without_passed(reached, &passed, passed_count);
    result = remaining == NULL ? NULL : Py_BuildValue("(NN)", joins, remaining);
    if (remaining == NULL)
        Py_XDECREF(joins);
done:
    Py_XDECREF(cache);
    Py_XDECREF(memo);
    Py_DECREF(nodes);
    idset_free(&required);
    idbits_free(&passed);
    PyMem_Free(joined.items);
    shapes_clear(shapes);
    recent_clear(recent);
    PyMem_Free(extras.items);
    PyMem_Free(codes);
    return result;
}

static PyMethodDef fuse_methods[] = {
    {"fuse", fuse, METH_VARARGS, fuse_doc},
    {NULL},
};

int
add_fuse_functions(PyObject *module)
{
    str_entry = PyUnicode_InternFromString("entry");
    str_pattern = PyUnicode_InternFromString("pattern");
    str_output = PyUnicode_InternFromString("output");
    str_argument = PyUnicode_InternFromString("argument");
    if (str_entry == NULL || str_pattern == NULL || str_output == NULL
            || str_argument == NULL)
        return -1;
    return PyModule_AddFunctions(module, fuse_methods);
}
