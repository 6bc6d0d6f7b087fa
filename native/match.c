/* Pattern matching and replacement in C (issue 17): stage 2 of the pattern
 * search (patterns/search.py), which runs on every minibatch and visits
 * every node of it.
 *
 * - MatchProgram(instructions): one pattern's structural comparison at one
 *   depth, as a flat tuple of instructions decided once in Python
 *   (signature.py: _match_program), checked and stored here as C structs.
 * - match(program, root, labels): runs a program from one node.
 * - replace(roots, candidates, labels, swallowed): the queue search that
 *   rewrites every match into one node running its pattern.
 *
 * A program names nodes by registers: register 0 is the root, and each
 * "child" or "output" instruction loads a new one, numbered in order.  The
 * instructions (each a tuple, the opcode first):
 *
 *   ("op", r, entry, arity, attrs, attr_types or None, outside, spec_label)
 *       node r runs op entry ``entry`` on ``arity`` operands with ``attrs``
 *       (and, if given, attributes of exactly those types), has that spec
 *       label, and, if ``outside`` is true, may be inside a pattern (one
 *       consumer, not required)
 *   ("child", r, position, target)       operand ``position`` of node r is a
 *                                         node: register ``target``
 *   ("identity", r, position, kind, address)   ... is no node but the very
 *       object at ``address`` (its id), of label kind ``kind`` ("parameter"
 *       or "tensor"): an input
 *   ("constant", r, position, type, value)      ... is a Python number of
 *       exactly ``type`` equal to ``value``: an input
 *   ("label", r, position, label)        ... is no node, with this operand
 *                                         label (asked of Python): an input
 *   ("rows", r, position, table, label)  ... is a list or tuple of Python
 *       ints, each a row of operand ``table`` (a lookup's row numbers,
 *       signature.looked_up_rows), with this operand label: an input
 *   ("node", r)                          node r is one of the subgraph's
 *   ("unseen", r)                        node r is no input met before
 *   ("input", r, access, deep, label)    node r is an input of the subgraph
 *       (where a walk ``deep`` enough stops) with this input label
 *   ("output", r, access, index, deep, target)  node r is output ``index``
 *       of a multi-output node, register ``target``, which the walk goes into
 *   ("same", r, other)                   registers r and other hold one node
 *   ("fail",)                            no node matches
 *
 * ``labels`` is the Signer's per-evaluation state (Signer._match_labels):
 * the required node ids and the label caches, with the Python functions
 * that fill them on a miss.  Everything a program reads is held by a
 * reference for as long as it is used, since label callbacks and
 * comparisons run Python code. */
#include "native.h"
#include "containers.h"


/* -- MatchProgram -------------------------------------------------------------- */

enum { OP, CHILD, IDENTITY, CONSTANT, LABEL, ROWS, NODE, UNSEEN, INPUT, OUTPUT,
       SAME, FAIL };

static const struct {
    const char *name;
    Py_ssize_t size;    /* the instruction tuple's length */
} opcodes[] = {
    [OP] = {"op", 8}, [CHILD] = {"child", 4}, [IDENTITY] = {"identity", 5},
    [CONSTANT] = {"constant", 5}, [LABEL] = {"label", 4}, [ROWS] = {"rows", 5},
    [NODE] = {"node", 2}, [UNSEEN] = {"unseen", 2}, [INPUT] = {"input", 5},
    [OUTPUT] = {"output", 6}, [SAME] = {"same", 3}, [FAIL] = {"fail", 1},
};
#define OPCODES ((int)(sizeof(opcodes) / sizeof(opcodes[0])))

typedef struct {
    int code;
    Py_ssize_t node;       /* the register checked */
    Py_ssize_t target;     /* child, output: the register loaded; same: the other */
    Py_ssize_t number;     /* op: arity; operand checks: the position */
    int flag;              /* op: outside; input, output: deep */
    void *address;         /* identity */
    PyObject *entry;       /* op: the op entry; input, output: ACCESS */
    PyObject *attrs;       /* op: attrs; output: the index */
    PyObject *types;       /* op: attribute types, or NULL; constant: the type */
    PyObject *label;       /* op: spec label; input, label: label;
                              identity: kind; constant: the value */
    /* op, input: a spec whose label this instruction found equal in the
     * replace (or match) call numbered ``known_call``: the labels depend
     * only on the spec within a call, and most nodes an instruction sees
     * share a few interned specs, so the label's dict lookup and
     * comparison run once per spec and call.  Held (specs are few). */
    PyObject *known_spec;
    unsigned long long known_call;
    /* rows: the table last read (held, so that its address stays its
     * own) and its number of rows, -1 if unknown; and the length of list
     * last compared with the label, plus one (0: none yet), and whether
     * it was equal.  A list of Python ints has the same label as any other
     * of its length (Signer._operand_label): asking Python for it cost
     * 2.5 us a leaf, a quarter of a 25-tree evaluation. */
    PyObject *table;
    Py_ssize_t table_rows;
    Py_ssize_t known_length;
    int length_same;
} Instruction;

/* Numbers the replace and match calls (for Instruction.known_spec). */
static unsigned long long match_calls;

typedef struct {
    PyObject_HEAD
    Py_ssize_t count, registers;
    Instruction *code;
} MatchProgram;

static PyTypeObject *program_type;

static void
program_dealloc(PyObject *self)
{
    MatchProgram *program = (MatchProgram *)self;
    PyTypeObject *type = Py_TYPE(self);
    for (Py_ssize_t i = 0; i < program->count; i++) {
        Instruction *in = &program->code[i];
        Py_XDECREF(in->entry);
        Py_XDECREF(in->attrs);
        Py_XDECREF(in->types);
        Py_XDECREF(in->label);
        Py_XDECREF(in->known_spec);
        Py_XDECREF(in->table);
    }
    PyMem_Free(program->code);
    type->tp_free(self);
    Py_DECREF(type);
}

/* A non-negative int below ``limit`` at item ``index`` of instruction ``k``. */
static int
read_index(PyObject *item, Py_ssize_t index, Py_ssize_t limit, Py_ssize_t k,
           Py_ssize_t *out)
{
    PyObject *value = PyTuple_GET_ITEM(item, index);
    Py_ssize_t number = PyLong_Check(value) ? PyLong_AsSsize_t(value) : -1;
    if (number == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (number < 0 || number >= limit) {
        PyErr_Format(PyExc_ValueError,
                     "instruction %zd: item %zd is %R, not an int in [0, %zd)",
                     k, index, value, limit);
        return -1;
    }
    *out = number;
    return 0;
}

/* Reads instruction ``k`` into ``in``; ``registers`` counts the registers
 * loaded so far (a register must be loaded before it is read). */
static int
read_instruction(PyObject *item, Py_ssize_t k, Py_ssize_t *registers,
                 Instruction *in)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) == 0
            || !PyUnicode_Check(PyTuple_GET_ITEM(item, 0))) {
        PyErr_Format(PyExc_TypeError,
                     "instruction %zd must be a tuple starting with its "
                     "opcode, not %R", k, item);
        return -1;
    }
    const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(item, 0));
    if (name == NULL)
        return -1;
    int code = 0;
    while (code < OPCODES && strcmp(opcodes[code].name, name) != 0)
        code++;
    if (code == OPCODES) {
        PyErr_Format(PyExc_ValueError, "instruction %zd: unknown opcode %R",
                     k, PyTuple_GET_ITEM(item, 0));
        return -1;
    }
    if (PyTuple_GET_SIZE(item) != opcodes[code].size) {
        PyErr_Format(PyExc_ValueError,
                     "instruction %zd: %s takes %zd items, not %zd", k, name,
                     opcodes[code].size, PyTuple_GET_SIZE(item));
        return -1;
    }
    in->code = code;
    if (code == FAIL)
        return 0;
    if (read_index(item, 1, *registers, k, &in->node) < 0)
        return -1;
    PyObject *a = opcodes[code].size > 2 ? PyTuple_GET_ITEM(item, 2) : NULL;
    PyObject *b = opcodes[code].size > 3 ? PyTuple_GET_ITEM(item, 3) : NULL;
    PyObject *c = opcodes[code].size > 4 ? PyTuple_GET_ITEM(item, 4) : NULL;
    Py_ssize_t last = opcodes[code].size - 1;
    switch (code) {
    case OP: {
        if (read_index(item, 3, PY_SSIZE_T_MAX, k, &in->number) < 0)
            return -1;
        PyObject *types = PyTuple_GET_ITEM(item, 5);
        if (types != Py_None && !PyTuple_Check(types)) {
            PyErr_Format(PyExc_TypeError, "instruction %zd: attribute types "
                         "must be a tuple or None", k);
            return -1;
        }
        if ((in->flag = PyObject_IsTrue(PyTuple_GET_ITEM(item, 6))) < 0)
            return -1;
        in->entry = Py_NewRef(a);
        in->attrs = Py_NewRef(c);
        in->types = types == Py_None ? NULL : Py_NewRef(types);
        in->label = Py_NewRef(PyTuple_GET_ITEM(item, 7));
        return 0;
    }
    case CHILD:
    case IDENTITY:
    case CONSTANT:
    case LABEL:
        if (read_index(item, 2, PY_SSIZE_T_MAX, k, &in->number) < 0)
            return -1;
        if (code == CHILD) {
            if (read_index(item, 3, *registers + 1, k, &in->target) < 0)
                return -1;
            if (in->target != *registers) {
                PyErr_Format(PyExc_ValueError, "instruction %zd: child loads "
                             "register %zd, not the next one (%zd)", k,
                             in->target, *registers);
                return -1;
            }
            ++*registers;
        }
        else if (code == IDENTITY) {
            if (!PyUnicode_Check(b) || !PyLong_Check(c)) {
                PyErr_Format(PyExc_TypeError, "instruction %zd: identity "
                             "takes a kind (str) and an address (int)", k);
                return -1;
            }
            in->address = PyLong_AsVoidPtr(c);
            if (in->address == NULL && PyErr_Occurred())
                return -1;
            in->label = Py_NewRef(b);
        }
        else if (code == CONSTANT) {
            if (!PyType_Check(b)) {
                PyErr_Format(PyExc_TypeError, "instruction %zd: constant "
                             "takes a type, not %R", k, b);
                return -1;
            }
            in->types = Py_NewRef(b);
            in->label = Py_NewRef(c);
        }
        else {
            in->label = Py_NewRef(b);
        }
        return 0;
    case ROWS:
        if (read_index(item, 2, PY_SSIZE_T_MAX, k, &in->number) < 0
                || read_index(item, 3, PY_SSIZE_T_MAX, k, &in->target) < 0)
            return -1;
        in->label = Py_NewRef(c);
        return 0;
    case NODE:
    case UNSEEN:
        return 0;
    case INPUT:
        if ((in->flag = PyObject_IsTrue(b)) < 0)
            return -1;
        in->entry = Py_NewRef(a);
        in->label = Py_NewRef(c);
        return 0;
    case OUTPUT:
        if ((in->flag = PyObject_IsTrue(c)) < 0)
            return -1;
        if (read_index(item, last, *registers + 1, k, &in->target) < 0)
            return -1;
        if (in->target != *registers) {
            PyErr_Format(PyExc_ValueError, "instruction %zd: output loads "
                         "register %zd, not the next one (%zd)", k,
                         in->target, *registers);
            return -1;
        }
        ++*registers;
        in->entry = Py_NewRef(a);
        in->attrs = Py_NewRef(b);
        return 0;
    case SAME:
        return read_index(item, 2, *registers, k, &in->target);
    }
    return 0;
}

static PyObject *
program_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *instructions;
    if (!PyArg_ParseTuple(args, "O!:MatchProgram", &PyTuple_Type, &instructions))
        return NULL;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "MatchProgram takes no keywords");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(instructions);
    MatchProgram *program = (MatchProgram *)type->tp_alloc(type, 0);
    if (program == NULL)
        return NULL;
    program->count = 0;
    program->registers = 1;     /* the root */
    program->code = PyMem_Calloc(count + 1, sizeof(Instruction));
    if (program->code == NULL) {
        Py_DECREF(program);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        /* Counted first, so that dealloc frees what a failed read took. */
        program->count++;
        if (read_instruction(PyTuple_GET_ITEM(instructions, k), k,
                             &program->registers, &program->code[k]) < 0) {
            Py_DECREF(program);
            return NULL;
        }
    }
    return (PyObject *)program;
}

static PyObject *
program_repr(PyObject *self)
{
    MatchProgram *program = (MatchProgram *)self;
    return PyUnicode_FromFormat("<MatchProgram: %zd instructions, %zd registers>",
                                program->count, program->registers);
}

static PyType_Slot program_slots[] = {
    {Py_tp_new, program_new},
    {Py_tp_dealloc, program_dealloc},
    {Py_tp_repr, program_repr},
    {Py_tp_doc, "MatchProgram(instructions)\n--\n\n"
                "One pattern's structural comparison at one depth, checked "
                "once\n(see native/match.c for the instructions)."},
    {0, NULL},
};

static PyType_Spec program_spec = {
    .name = "subgraphjit._native.MatchProgram",
    .basicsize = sizeof(MatchProgram),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = program_slots,
};

/* -- labels ------------------------------------------------------------------- */

/* The Signer's state, from the ``labels`` tuple (see Signer._match_labels). */
typedef struct {
    IdSet required;
    PyObject *spec_labels, *spec_label;     /* dict by spec, and its filler */
    PyObject *input_labels, *input_label;   /* dict by spec; filler of a node */
    PyObject *operand_kinds;                /* dict: type -> label kind */
    PyObject *operand_label;                /* a non-node operand's label */
} Labels;

static PyObject *str_value;   /* "value": the label kind of NumPy and lists */

static int
labels_read(Labels *labels, PyObject *given)
{
    labels->required.keys = NULL;
    labels->required.used = NULL;
    if (!PyTuple_Check(given) || PyTuple_GET_SIZE(given) != 7) {
        PyErr_SetString(PyExc_TypeError, "labels must be a tuple of 7 "
                        "(see Signer._match_labels)");
        return -1;
    }
    PyObject *required = PyTuple_GET_ITEM(given, 0);
    PyObject **fields[] = {&labels->spec_labels, &labels->spec_label,
                           &labels->input_labels, &labels->input_label,
                           &labels->operand_kinds, &labels->operand_label};
    for (int i = 0; i < 6; i++) {
        PyObject *field = PyTuple_GET_ITEM(given, i + 1);
        int dict = i == 0 || i == 2 || i == 4;
        if (dict ? !PyDict_Check(field) : !PyCallable_Check(field)) {
            PyErr_Format(PyExc_TypeError, "labels item %d must be %s", i + 1,
                         dict ? "a dict" : "callable");
            return -1;
        }
        *fields[i] = field;
    }
    return idset_read(&labels->required, required, "labels item 0 (required)");
}

/* A cached label by ``key``, else ``fill(argument)``'s (a new reference). */
static PyObject *
cached(PyObject *cache, PyObject *key, PyObject *fill, PyObject *argument)
{
    PyObject *found = PyDict_GetItemWithError(cache, key);
    if (found != NULL)
        return Py_NewRef(found);
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallOneArg(fill, argument);
}

/* 1 if ``label`` equals ``expected``, 0 if not, -1 on error; steals label. */
static int
equal(PyObject *label, PyObject *expected)
{
    if (label == NULL)
        return -1;
    int same = PyObject_RichCompareBool(label, expected, Py_EQ);
    Py_DECREF(label);
    return same;
}

/* The label kind of a non-node operand: a property of its type, so cached
 * by type; a miss asks Python for the operand's label (kind first). */
static PyObject *
operand_kind(Labels *labels, PyObject *operand)
{
    PyObject *type = (PyObject *)Py_TYPE(operand);
    PyObject *kind = PyDict_GetItemWithError(labels->operand_kinds, type);
    if (kind != NULL)
        return Py_NewRef(kind);
    if (PyErr_Occurred())
        return NULL;
    PyObject *label = PyObject_CallOneArg(labels->operand_label, operand);
    if (label == NULL)
        return NULL;
    if (!PyTuple_Check(label) || PyTuple_GET_SIZE(label) == 0) {
        PyErr_Format(PyExc_TypeError, "operand_label returned %R, not a "
                     "tuple starting with its kind", label);
        Py_DECREF(label);
        return NULL;
    }
    kind = Py_NewRef(PyTuple_GET_ITEM(label, 0));
    Py_DECREF(label);
    if (PyDict_SetItem(labels->operand_kinds, type, kind) < 0)
        Py_CLEAR(kind);
    return kind;
}

/* -- running a program ----------------------------------------------------------- */

static inline Py_ssize_t
operand_count(Node *node)
{
    return node->input_count;
}

static inline PyObject *
operand_at(Node *node, Py_ssize_t position)
{
    return position < node->input_count ? node_input(node, position) : NULL;
}

/* Kept outside any pattern but as its root or input (thesis 5.5)? */
static inline int
outside(Labels *labels, Node *node)
{
    return node->consumers > 1 || idset_contains(&labels->required, node->id);
}

/* The number of rows of a lookup's ``table`` (signature.table_rows): the
 * first dimension of its shape (a node's spec's), -1 if unknown. */
static Py_ssize_t
rows_of(PyObject *table)
{
    PyObject *holder = is_node(table) ? ((Node *)table)->spec : table;
    if (holder == NULL)
        return -1;
    PyObject *shape = PyObject_GetAttrString(holder, "shape");
    PyObject *first = shape == NULL ? NULL : PySequence_GetItem(shape, 0);
    Py_XDECREF(shape);
    Py_ssize_t rows = first != NULL && PyLong_CheckExact(first) ? PyLong_AsSsize_t(first) : -1;
    Py_XDECREF(first);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        rows = -1;
    }
    return rows;
}

/* Is ``operand`` a list or tuple of Python ints, each in [0, rows)? */
static int
rows_within(PyObject *operand, Py_ssize_t rows)
{
    if (rows < 0 || !(PyList_CheckExact(operand) || PyTuple_CheckExact(operand)))
        return 0;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(operand);
    PyObject **items = PySequence_Fast_ITEMS(operand);
    for (Py_ssize_t i = 0; i < count; i++) {
        int overflow = 0;
        long long row = PyLong_CheckExact(items[i])
            ? PyLong_AsLongLongAndOverflow(items[i], &overflow) : -1;
        if (overflow || row < 0 || row >= rows)
            return 0;
    }
    return 1;
}

/* Is operand ``position`` of ``node``, a list or tuple, the rows a lookup
 * reads, each in its table (signature.looked_up_rows)?  1, 0, or -1 on
 * error.  (Asked only of lists and tuples at a walk's possible stops:
 * rare; a template's lookups are checked by the "rows" instruction.) */
static int
looked_up_rows(Node *node, Py_ssize_t position)
{
    PyObject *positions = PyObject_GetAttrString(node->entry, "index_positions");
    if (positions == NULL)
        return -1;
    PyObject *number = PyLong_FromSsize_t(position);
    int found = number == NULL ? -1 : PySequence_Contains(positions, number);
    Py_XDECREF(number);
    Py_DECREF(positions);
    if (found <= 0)
        return found;
    static PyObject *name;   /* "looks_up_rows", made once */
    if (name == NULL && (name = PyUnicode_InternFromString("looks_up_rows")) == NULL)
        return -1;
    PyObject *looks = PyObject_CallMethodOneArg(node->entry, name, node->attrs);
    int lookup = looks == NULL ? -1 : PyObject_IsTrue(looks);
    Py_XDECREF(looks);
    if (lookup <= 0)
        return lookup;
    PyObject *from = PyObject_GetAttrString(node->entry, "gathers_from");
    Py_ssize_t table = from != NULL && PyLong_Check(from) ? PyLong_AsSsize_t(from) : -1;
    Py_XDECREF(from);
    if (PyErr_Occurred())
        return -1;
    if (table < 0 || table >= node->input_count)
        return 0;
    return rows_within(node_input(node, position), rows_of(node_input(node, table)));
}

/* ``has_value_operand(node)`` (signature.py): is an operand a NumPy or
 * list value, whose label kind is "value", other than a lookup's row
 * numbers?  Kinds are cached by type. */
static int
has_value_operand(Labels *labels, Node *node)
{
    for (Py_ssize_t i = 0; i < node->input_count; i++) {
        PyObject *operand = node_input(node, i);
        if (is_node(operand) || PyLong_CheckExact(operand)
                || PyFloat_CheckExact(operand) || PyBool_Check(operand))
            continue;
        if (PyList_CheckExact(operand) || PyTuple_CheckExact(operand)) {
            int rows = looked_up_rows(node, i);
            if (rows < 0)
                return -1;
            if (rows)
                continue;
        }
        Py_INCREF(operand);  /* the kind's callback may replace the inputs */
        int value = equal(operand_kind(labels, operand), str_value);
        Py_DECREF(operand);
        if (value != 0)
            return value;
    }
    return 0;
}

/* One run's state: registers (each holds a node: the root, or one a
 * "child" or "output" instruction checked), the walk's inputs and nodes,
 * the ids of the inputs met, and every object it holds a reference to
 * (``held``, at most two per instruction).  All arrays are bounded by the
 * program's length and registers, so they are allocated once. */
typedef struct {
    PyObject **reg, **inputs, **nodes, **held;
    long long *seen;
    Py_ssize_t input_count, node_count, held_count, seen_count;
} Run;

#define STACK_SLOTS 256

static int
run_start(Run *run, Py_ssize_t registers, Py_ssize_t count, PyObject **stack)
{
    Py_ssize_t size = registers + 4 * (count + 1);
    PyObject **slots = stack;
    if (size > STACK_SLOTS) {
        slots = PyMem_New(PyObject *, size);
        if (slots == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    run->reg = slots;
    run->inputs = slots + registers;
    run->nodes = run->inputs + count + 1;
    run->held = run->nodes + count + 1;
    run->seen = PyMem_New(long long, count + 1);
    if (run->seen == NULL) {
        if (slots != stack)
            PyMem_Free(slots);
        PyErr_NoMemory();
        return -1;
    }
    run->input_count = run->node_count = run->held_count = run->seen_count = 0;
    return 0;
}

static void
run_release(Run *run)
{
    for (Py_ssize_t i = 0; i < run->held_count; i++)
        Py_DECREF(run->held[i]);
    run->held_count = run->input_count = run->node_count = run->seen_count = 0;
}

static void
run_end(Run *run, PyObject **stack)
{
    run_release(run);
    if (run->reg != stack)
        PyMem_Free(run->reg);
    PyMem_Free(run->seen);
}

/* Held (a new reference in ``held``) and returned. */
static inline PyObject *
hold(Run *run, PyObject *object)
{
    run->held[run->held_count++] = Py_NewRef(object);
    return object;
}

static inline int
seen(Run *run, long long id)
{
    for (Py_ssize_t i = 0; i < run->seen_count; i++)
        if (run->seen[i] == id)
            return 1;
    return 0;
}

static inline int
known(Instruction *in, PyObject *spec)
{
    return in->known_spec == spec && in->known_call == match_calls;
}

static inline void
remember(Instruction *in, PyObject *spec)
{
    Py_XSETREF(in->known_spec, Py_NewRef(spec));
    in->known_call = match_calls;
}

/* Runs ``program`` from ``root``: 1 on a match (run's inputs and nodes are
 * the walk's), 0 if none, -1 with an exception set.  The root itself is
 * held by the caller. */
static int
run_program(MatchProgram *program, Node *root, Labels *labels, Run *run)
{
    run_release(run);
    run->reg[0] = (PyObject *)root;
    for (Py_ssize_t k = 0; k < program->count; k++) {
        Instruction *in = &program->code[k];
        Node *node = (Node *)run->reg[in->node];
        int same;
        switch (in->code) {
        case OP: {
            if (node->entry != in->entry || operand_count(node) != in->number)
                return 0;
            if (node->attrs == NULL)
                return 0;
            PyObject *attrs = hold(run, node->attrs);
            same = PyObject_RichCompareBool(attrs, in->attrs, Py_EQ);
            if (same <= 0)
                return same;
            if (in->types != NULL) {
                Py_ssize_t count = PyTuple_GET_SIZE(in->types);
                if (!PyTuple_Check(attrs) || PyTuple_GET_SIZE(attrs) != count)
                    return 0;
                for (Py_ssize_t i = 0; i < count; i++) {
                    same = PyObject_RichCompareBool(
                        (PyObject *)Py_TYPE(PyTuple_GET_ITEM(attrs, i)),
                        PyTuple_GET_ITEM(in->types, i), Py_EQ);
                    if (same <= 0)
                        return same;
                }
            }
            if (in->flag && outside(labels, node))
                return 0;
            if (node->spec == NULL)
                return 0;
            if (!known(in, node->spec)) {
                same = equal(cached(labels->spec_labels, node->spec,
                                    labels->spec_label, node->spec), in->label);
                if (same <= 0)
                    return same;
                remember(in, node->spec);
            }
            break;
        }
        case CHILD: {
            PyObject *operand = operand_at(node, in->number);
            if (operand == NULL || !is_node(operand))
                return 0;
            run->reg[in->target] = hold(run, operand);
            break;
        }
        case IDENTITY:
        case CONSTANT:
        case LABEL: {
            PyObject *operand = operand_at(node, in->number);
            if (operand == NULL || is_node(operand))
                return 0;
            hold(run, operand);
            if (in->code == IDENTITY) {
                if ((void *)operand != in->address)
                    return 0;
                same = equal(operand_kind(labels, operand), in->label);
            }
            else if (in->code == CONSTANT) {
                if (!Py_IS_TYPE(operand, (PyTypeObject *)in->types))
                    return 0;
                same = PyObject_RichCompareBool(operand, in->label, Py_EQ);
            }
            else {
                same = equal(PyObject_CallOneArg(labels->operand_label, operand),
                             in->label);
            }
            if (same <= 0)
                return same;
            run->inputs[run->input_count++] = operand;
            break;
        }
        case ROWS: {
            PyObject *operand = operand_at(node, in->number);
            PyObject *table = operand_at(node, in->target);
            if (operand == NULL || table == NULL || is_node(operand))
                return 0;
            hold(run, operand);
            Py_ssize_t rows;
            if (is_node(table))   /* (not kept: it would keep its graph) */
                rows = rows_of(table);
            else {
                if (table != in->table) {   /* (a template's: one variable) */
                    Py_XSETREF(in->table, Py_NewRef(table));
                    in->table_rows = rows_of(table);
                }
                rows = in->table_rows;
            }
            if (!rows_within(operand, rows))
                return 0;
            Py_ssize_t length = PySequence_Fast_GET_SIZE(operand);
            if (in->known_length != length + 1) {
                same = equal(PyObject_CallOneArg(labels->operand_label, operand),
                             in->label);
                if (same < 0)
                    return same;
                in->known_length = length + 1;
                in->length_same = same;
            }
            if (!in->length_same)
                return 0;
            run->inputs[run->input_count++] = operand;
            break;
        }
        case NODE:
            run->nodes[run->node_count++] = (PyObject *)node;
            break;
        case UNSEEN:
            if (seen(run, node->id))
                return 0;
            break;
        case INPUT: {
            if (node->entry == in->entry) {
                PyObject *source = operand_at(node, 0);
                if (source != NULL) {
                    if (!is_node(source))
                        return 0;
                    Node *inner = (Node *)source;
                    if (seen(run, inner->id))
                        return 0;
                    if (in->flag && operand_count(inner) > 0
                            && inner->consumers < 2
                            && !idset_contains(&labels->required, inner->id))
                        return 0;
                }
            }
            else if (in->flag && operand_count(node) > 0
                     && node->consumers < 2
                     && !idset_contains(&labels->required, node->id)) {
                int value = has_value_operand(labels, node);
                if (value <= 0)
                    return value;
            }
            if (node->spec == NULL)
                return 0;
            if (!known(in, node->spec)) {
                same = equal(cached(labels->input_labels, node->spec,
                                    labels->input_label, (PyObject *)node),
                             in->label);
                if (same <= 0)
                    return same;
                remember(in, node->spec);
            }
            run->seen[run->seen_count++] = node->id;
            run->inputs[run->input_count++] = (PyObject *)node;
            break;
        }
        case OUTPUT: {
            PyObject *attrs = node->attrs;
            if (node->entry != in->entry || attrs == NULL || !PyTuple_Check(attrs)
                    || PyTuple_GET_SIZE(attrs) == 0)
                return 0;
            PyObject *source = operand_at(node, 0);
            if (source == NULL || !is_node(source))
                return 0;
            hold(run, attrs);
            hold(run, source);
            same = PyObject_RichCompareBool(PyTuple_GET_ITEM(attrs, 0),
                                            in->attrs, Py_EQ);
            if (same <= 0)
                return same;
            Node *inner = (Node *)source;
            int stops = !in->flag || operand_count(inner) == 0
                        || outside(labels, inner);
            if (stops && !seen(run, inner->id))
                return 0;
            run->reg[in->target] = source;
            break;
        }
        case SAME:
            if (run->reg[in->node] != run->reg[in->target])
                return 0;
            break;
        case FAIL:
            return 0;
        }
    }
    return 1;
}

static PyObject *
list_of(PyObject **items, Py_ssize_t count)
{
    PyObject *list = PyList_New(count);
    if (list != NULL)
        for (Py_ssize_t i = 0; i < count; i++)
            PyList_SET_ITEM(list, i, Py_NewRef(items[i]));
    return list;
}

PyDoc_STRVAR(match_doc,
"match(program, root, labels)\n--\n\n"
"Runs a MatchProgram from node ``root``: (inputs, nodes) as the Signer's\n"
"walk lists them if the subgraph there is the program's pattern, else\n"
"None.  ``labels`` is Signer._match_labels().");

static PyObject *
match(PyObject *module, PyObject *args)
{
    PyObject *program, *root, *given;
    if (!PyArg_ParseTuple(args, "O!OO:match", program_type, &program, &root,
                          &given))
        return NULL;
    if (!is_node(root)) {
        PyErr_Format(PyExc_TypeError, "match(): the root must be a "
                     "VirtualNode, not %.100s", Py_TYPE(root)->tp_name);
        return NULL;
    }
    Labels labels;
    if (labels_read(&labels, given) < 0)
        return NULL;
    PyObject *stack[STACK_SLOTS], *result = NULL;
    Run run;
    if (run_start(&run, ((MatchProgram *)program)->registers,
                  ((MatchProgram *)program)->count, stack) < 0) {
        idset_free(&labels.required);
        return NULL;
    }
    match_calls++;
    Py_INCREF(root);
    int found = run_program((MatchProgram *)program, (Node *)root, &labels, &run);
    if (found > 0) {
        PyObject *inputs = list_of(run.inputs, run.input_count);
        PyObject *nodes = list_of(run.nodes, run.node_count);
        if (inputs != NULL && nodes != NULL)
            result = PyTuple_Pack(2, inputs, nodes);
        Py_XDECREF(inputs);
        Py_XDECREF(nodes);
    }
    else if (found == 0) {
        result = Py_NewRef(Py_None);
    }
    Py_DECREF(root);
    run_end(&run, stack);
    idset_free(&labels.required);
    return result;
}

/* -- replace ------------------------------------------------------------------------ */

/* Rewrites ``node`` into one node running the pattern of ``candidate``
 * (program, op entry, argument_positions) after a match: its inputs become
 * the walk's inputs at the argument positions, and the subgraph's other
 * nodes are recorded as swallowed.  0, or -1 with an exception set. */
static int
rewrite(Node *node, PyObject *candidate, Run *run)
{
    PyObject *positions = PyTuple_GET_ITEM(candidate, 2);
    Py_ssize_t count = PyTuple_GET_SIZE(positions);
    PyObject *operands = PyTuple_New(count);
    if (operands == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyTuple_GET_ITEM(positions, i);
        Py_ssize_t position = PyLong_Check(item) ? PyLong_AsSsize_t(item) : -1;
        if (position == -1 && PyErr_Occurred())
            PyErr_Clear();
        if (position < 0 || position >= run->input_count) {
            PyErr_Format(PyExc_IndexError, "argument position %R is not "
                         "one of the match's %zd inputs", item,
                         run->input_count);
            Py_DECREF(operands);
            return -1;
        }
        PyTuple_SET_ITEM(operands, i, Py_NewRef(run->inputs[position]));
    }
    /* The root is the last of the walk's nodes; the others are swallowed. */
    for (Py_ssize_t i = 0; i + 1 < run->node_count; i++)
        ((Node *)run->nodes[i])->swallowed = 1;
    PyObject *no_attrs = PyTuple_New(0);
    int set = no_attrs == NULL ? -1
              : node_set_inputs(node, PySequence_Fast_ITEMS(operands), count);
    Py_DECREF(operands);
    if (set < 0) {
        Py_XDECREF(no_attrs);
        return -1;
    }
    Py_XSETREF(node->entry, Py_NewRef(PyTuple_GET_ITEM(candidate, 1)));
    Py_XSETREF(node->attrs, no_attrs);
    return 0;
}

/* Memory the programs read soon, asked for early.  The programs walk a
 * node's operands and theirs, each first touched there and anywhere in
 * memory; waiting for each in turn was most of the search's time (perf:
 * half of run_program's samples on the first read of a child).  A node's
 * operands are asked for when it is queued and again, with theirs, when
 * it is visited (``prefetch_node``). */
static inline void
prefetch_inputs(Node *node)
{
    for (int i = 0; i < node->input_count; i++)
        prefetch_node(node_input(node, i));
}

static inline void
prefetch_below(Node *node)
{
    for (int i = 0; i < node->input_count; i++) {
        PyObject *operand = node_input(node, i);
        if (is_node(operand)) {
            Node *child = (Node *)operand;
            __builtin_prefetch(child->attrs);
            prefetch_inputs(child);
        }
    }
}

/* The search's step: reach the nodes among ``operands`` not reached
 * before; ``reached`` holds a reference to each, and ``pending``
 * (borrowing) lists them to visit.  With ``required`` (the operands of a
 * visited node; else the roots), only unevaluated nodes are reached, and
 * an access node that nodes read, that no one asked for and that is no
 * root is passed through to its multi-output node: it stays out of the
 * evaluation, whose nodes read the output from that node
 * (describe_graph), and takes its output when asked for (swallowed;
 * ``VirtualNode.value``).  Three in four nodes of a Tree-LSTM
 * minibatch's evaluation were such access nodes, which every pass after
 * this one read, and which got a value nobody read.  No Python code runs
 * here. */
static int
enqueue(PyObject *const *operands, Py_ssize_t count, const IdSet *required,
        IdBits *ids, KeyedArray *reached, KeyedArray *pending)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *operand = operands[i];
        if (!is_node(operand) || (required != NULL && !unevaluated((Node *)operand)))
            continue;
        Node *read = (Node *)operand;
        if (required != NULL && stays_out(read, access_entry, required)
                && !idbits_contains(ids, read->id)) {   /* (not a root) */
            read->swallowed = 1;
            operand = node_input(read, 0);
            if (!unevaluated((Node *)operand))
                continue;
        }
        int added = idbits_add(ids, ((Node *)operand)->id);
        if (added < 0 || (added && keyed_push(reached, (Node *)operand) < 0))
            return -1;
        if (!added)
            continue;
        Py_INCREF(operand);   /* (reached's, released with it) */
        if (keyed_push(pending, (Node *)operand) < 0)
            return -1;
        prefetch_inputs((Node *)operand);
    }
    return 0;
}

/* The candidates for a node: a tuple of (MatchProgram, op entry,
 * argument_positions) triples, checked on first use. */
static int
check_candidates(PyObject *node_candidates)
{
    if (!PyTuple_Check(node_candidates))
        goto bad;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(node_candidates); i++) {
        PyObject *candidate = PyTuple_GET_ITEM(node_candidates, i);
        if (!PyTuple_Check(candidate) || PyTuple_GET_SIZE(candidate) != 3
                || !Py_IS_TYPE(PyTuple_GET_ITEM(candidate, 0), program_type)
                || !PyTuple_Check(PyTuple_GET_ITEM(candidate, 2)))
            goto bad;
    }
    return 0;
bad:
    PyErr_Format(PyExc_TypeError, "candidates must map an op entry to a tuple "
                 "of (MatchProgram, entry, argument positions), not %R",
                 node_candidates);
    return -1;
}

PyDoc_STRVAR(replace_doc,
"replace(roots, candidates, labels)\n--\n\n"
"Stage 2 of the pattern search: a search from ``roots`` (nodes)\n"
"tries each reached node's candidates (``candidates`` maps its op entry to\n"
"a tuple of (MatchProgram, pattern entry, argument positions), in the order\n"
"to try); the first that matches rewrites the node in place into one\n"
"running the pattern on the walk's inputs at the argument positions,\n"
"marks the subgraph's other nodes swallowed, and the search goes on\n"
"from those inputs; a node that matches nothing is passed\n"
"by, and the search goes on from its operands.  Only unevaluated nodes\n"
"are reached, and no access node read by a reached node unless asked for\n"
"or a root (see ``enqueue``).  Returns (reached, replaced, matches): lists\n"
"of nodes, in id order, and a dict of the replaced nodes per pattern entry.");

static PyObject *
replace(PyObject *module, PyObject *args)
{
    PyObject *roots, *given_candidates, *given;
    if (!PyArg_ParseTuple(args, "OO!O:replace", &roots, &PyDict_Type,
                          &given_candidates, &given))
        return NULL;
    /* Copies: Python code run by label callbacks cannot change them. */
    PyObject *root_list = PySequence_Fast(roots, "replace(): roots must be "
                                          "a sequence of nodes");
    if (root_list == NULL)
        return NULL;
    PyObject *candidates = PyDict_Copy(given_candidates);
    if (candidates == NULL) {
        Py_DECREF(root_list);
        return NULL;
    }
    Labels labels;
    if (labels_read(&labels, given) < 0) {
        Py_DECREF(root_list);
        Py_DECREF(candidates);
        return NULL;
    }
    /* ``reached`` holds a reference to each node reached, ``pending``
     * borrows, ``replaced`` holds the ids of the rewritten ones.  The
     * search is depth first: a node's operands
     * next, which were recorded just before it, rather than the whole
     * minibatch's nodes at one distance from the roots (a breadth-first
     * order reads every tree at each step, missing the cache with
     * minibatches of 256).  The order changes no match: a node a pattern could swallow
     * has one consumer, so it is visited after that consumer in any
     * order, and the rest never becomes a pattern's interior. */
    PyObject *result = NULL, *stack[STACK_SLOTS];
    KeyedArray reached = {0}, pending = {0};
    IdBits replaced = {0};
    Py_ssize_t replaced_count = 0;
    Tally matches = {0};
    IdBits ids = {0};
    Run run;
    int running = 0;

    /* One run's arrays fit every candidate program. */
    Py_ssize_t registers = 1, length = 0, position = 0;
    PyObject *op_entry, *node_candidates;
    while (PyDict_Next(candidates, &position, &op_entry, &node_candidates)) {
        if (check_candidates(node_candidates) < 0)
            goto done;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(node_candidates); i++) {
            MatchProgram *program = (MatchProgram *)PyTuple_GET_ITEM(
                PyTuple_GET_ITEM(node_candidates, i), 0);
            registers = Py_MAX(registers, program->registers);
            length = Py_MAX(length, program->count);
        }
    }
    if (run_start(&run, registers, length, stack) < 0)
        goto done;
    running = 1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(root_list); i++) {
        PyObject *root = PySequence_Fast_GET_ITEM(root_list, i);
        if (!is_node(root)) {
            PyErr_Format(PyExc_TypeError, "replace(): root %zd is a %.100s, "
                         "not a VirtualNode", i, Py_TYPE(root)->tp_name);
            goto done;
        }
    }
    match_calls++;
    if (enqueue(PySequence_Fast_ITEMS(root_list), PySequence_Fast_GET_SIZE(root_list),
                NULL, &ids, &reached, &pending) < 0)
        goto done;

    while (pending.size > 0) {
        Node *node = (Node *)pending.items[--pending.size].node;
        prefetch_below(node);
        node_candidates = node->entry == NULL ? NULL
                          : PyDict_GetItemWithError(candidates, node->entry);
        if (node_candidates == NULL && PyErr_Occurred())
            goto done;
        /* (A root fed a NumPy or list value never matches: collection
         * never walks one, so no pattern holds such a value.) */
        for (Py_ssize_t i = 0; node_candidates != NULL
                               && i < PyTuple_GET_SIZE(node_candidates); i++) {
            PyObject *candidate = PyTuple_GET_ITEM(node_candidates, i);
            int found = run_program((MatchProgram *)PyTuple_GET_ITEM(candidate, 0),
                                    node, &labels, &run);
            if (found < 0)
                goto done;
            if (found) {   /* the first match wins: the largest pattern */
                if (rewrite(node, candidate, &run) < 0
                        || idbits_add(&replaced, node->id) < 0
                        || tally_add(&matches, PyTuple_GET_ITEM(candidate, 1)) < 0)
                    goto done;
                replaced_count++;
                break;
            }
        }
        /* On from its operands, or from the pattern's inputs it now has. */
        if (enqueue(node_inputs(node), node->input_count, &labels.required, &ids, &reached,
                    &pending) < 0)
            goto done;
    }
    /* The reached list takes over ``reached``'s references, and the
     * replaced nodes are picked from the same sorted array: no other
     * touch of each node (a cache miss each, at 65,000 nodes). */
    if (keyed_sort(reached.items, reached.size) != reached.size) {
        if (!PyErr_Occurred())   /* (ids are unique: it drops none) */
            PyErr_SetString(PyExc_SystemError, "replace(): a node reached twice");
        goto done;
    }
    PyObject *reached_list = node_list(reached.size);
    PyObject *replaced_list = reached_list == NULL ? NULL : node_list(replaced_count);
    if (replaced_list != NULL) {
        Py_ssize_t placed = 0;
        for (Py_ssize_t i = 0; i < reached.size; i++) {
            PyObject *node = reached.items[i].node;
            PyList_SET_ITEM(reached_list, i, node);
            if (idbits_contains(&replaced, reached.items[i].id))
                PyList_SET_ITEM(replaced_list, placed++, Py_NewRef(node));
        }
        reached.size = 0;
    }
    PyObject *match_counts = replaced_list == NULL ? NULL : tally_dict(&matches);
    if (match_counts != NULL)
        result = PyTuple_Pack(3, reached_list, replaced_list, match_counts);
    Py_XDECREF(reached_list);
    Py_XDECREF(replaced_list);
    Py_XDECREF(match_counts);
done:
    if (running)
        run_end(&run, stack);
    for (Py_ssize_t i = 0; i < reached.size; i++)
        Py_DECREF(reached.items[i].node);
    PyMem_Free(reached.items);
    PyMem_Free(pending.items);
    idbits_free(&replaced);
    PyMem_Free(matches.items);
    idbits_free(&ids);
    idset_free(&labels.required);
    Py_DECREF(candidates);
    Py_DECREF(root_list);
    return result;
}

/* -- registration ---------------------------------------------------------------- */

static PyMethodDef match_methods[] = {
    {"match", match, METH_VARARGS, match_doc},
    {"replace", replace, METH_VARARGS, replace_doc},
    {NULL},
};

int
add_match_functions(PyObject *module)
{
    str_value = PyUnicode_InternFromString("value");
    program_type = (PyTypeObject *)PyType_FromSpec(&program_spec);
    if (str_value == NULL || program_type == NULL
            || PyModule_AddObjectRef(module, "MatchProgram",
                                     (PyObject *)program_type) < 0)
        return -1;
    return PyModule_AddFunctions(module, match_methods);
}
