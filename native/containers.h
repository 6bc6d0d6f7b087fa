/* The small containers the C files of subgraphjit._native share. */
#ifndef SUBGRAPHJIT_CONTAINERS_H
#define SUBGRAPHJIT_CONTAINERS_H

#include "native.h"

/* -- growable arrays ---------------------------------------------------------- */

/* Arrays grow by doubling; PyMem_Realloc keeps the old block on failure,
 * so a failed push leaves the array as it was (and MemoryError set). */
static inline int
array_grow(void **items, Py_ssize_t *capacity, size_t item_size)
{
    Py_ssize_t grown = *capacity ? 2 * *capacity : 64;
    void *block = PyMem_Realloc(*items, grown * item_size);
    if (block == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *items = block;
    *capacity = grown;
    return 0;
}

typedef struct {
    void **items;
    Py_ssize_t size, capacity;
} PtrArray;

static inline int
ptr_push(PtrArray *array, void *item)
{
    if (array->size == array->capacity
            && array_grow((void **)&array->items, &array->capacity, sizeof(void *)) < 0)
        return -1;
    array->items[array->size++] = item;
    return 0;
}

/* int32 items (a program's index arrays, handed to TensorFlow as int32). */
typedef struct {
    int *items;
    Py_ssize_t size, capacity;
} IntArray;

/* ``value`` as an int32 in ``*out``, or OverflowError. */
static inline int
as_int32(Py_ssize_t value, int *out)
{
    if (value > 2147483647 || value < -2147483647) {
        PyErr_SetString(PyExc_OverflowError, "an index exceeds int32");
        return -1;
    }
    *out = (int)value;
    return 0;
}

static inline int
int_push(IntArray *array, Py_ssize_t value)
{
    int item;
    if (as_int32(value, &item) < 0)
        return -1;
    if (array->size == array->capacity
            && array_grow((void **)&array->items, &array->capacity, sizeof(int)) < 0)
        return -1;
    array->items[array->size++] = item;
    return 0;
}

/* -- a Python callback's results, once per key --------------------------------- */

/* ``fill(argument)``, called once per ``key`` of the dict ``cache``: a
 * borrowed reference (the cache holds it), or NULL with an exception set.
 * For the rare-case callbacks the passes ask about an op entry or an operand
 * type, which thousands of nodes share. */
static inline PyObject *
memo(PyObject *cache, PyObject *key, PyObject *fill, PyObject *argument)
{
    PyObject *found = PyDict_GetItemWithError(cache, key);
    if (found != NULL || PyErr_Occurred())
        return found;
    found = PyObject_CallOneArg(fill, argument);
    if (found == NULL)
        return NULL;
    int stored = PyDict_SetItem(cache, key, found);
    Py_DECREF(found);   /* the cache holds it */
    return stored < 0 ? NULL : found;
}

/* -- a set of node ids ------------------------------------------------------ */

/* Open addressing, kept at most half full, so probes stay short (ids are
 * distinct per node). */
typedef struct {
    long long *keys;
    unsigned char *used;
    size_t mask, count;
} IdSet;

static inline size_t
id_slot(const IdSet *set, long long id)
{
    size_t slot = ((unsigned long long)id * 0x9E3779B97F4A7C15ull) >> 17;
    slot &= set->mask;
    while (set->used[slot] && set->keys[slot] != id)
        slot = (slot + 1) & set->mask;
    return slot;
}

static inline int
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

static inline void
idset_free(IdSet *set)
{
    PyMem_Free(set->keys);
    PyMem_Free(set->used);
    set->keys = NULL;   /* (freeing twice is harmless) */
    set->used = NULL;
}

/* Adds ``id``: 1 if it was new, 0 if present, -1 on memory error.  Kept at
 * most half full, so probes stay short. */
static inline int
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

static inline int
idset_contains(const IdSet *set, long long id)
{
    return set->used[id_slot(set, id)];
}

/* ``set`` made from a Python set of node ids (``what`` names it in the
 * errors): 0, or -1 with an exception set and nothing to free. */
static inline int
idset_read(IdSet *set, PyObject *ids, const char *what)
{
    set->keys = NULL;
    set->used = NULL;
    if (!PyAnySet_Check(ids)) {
        PyErr_Format(PyExc_TypeError, "%s must be a set of node ids", what);
        return -1;
    }
    if (idset_init(set, 64) < 0)
        return -1;
    PyObject *iterator = PyObject_GetIter(ids), *id;
    if (iterator == NULL) {
        idset_free(set);
        return -1;
    }
    while ((id = PyIter_Next(iterator)) != NULL) {
        long long value = PyLong_Check(id) ? PyLong_AsLongLong(id) : -1;
        int bad = !PyLong_Check(id) || (value == -1 && PyErr_Occurred());
        if (bad) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s holds %R, not a node id", what, id);
        }
        Py_DECREF(id);
        if (bad || idset_add(set, value) < 0)
            break;
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) {
        idset_free(set);
        return -1;
    }
    return 0;
}

/* -- a set of node ids as bits over their range ----------------------------- */

/* Node ids come from one counter, so the nodes a walk meets fill most of
 * their id range: one bit per id of the range is a set whose 600,000 ids
 * (a 256-tree minibatch) take 75 KB, in cache, where an IdSet's probes are
 * cache misses.  The range grows to where ids fall; past IDBITS_MAX_WORDS
 * (ids recorded across far-apart times) the set becomes an IdSet. */
#define IDBITS_MAX_WORDS ((Py_ssize_t)1 << 20)   /* 64M ids in 8 MB */

typedef struct {
    long long low;                 /* the id of bit 0 */
    unsigned long long *words;
    Py_ssize_t word_count;
    IdSet hashed;                  /* in use once hashed.keys != NULL */
} IdBits;

static inline int
idbits_contains(const IdBits *bits, long long id)
{
    if (bits->hashed.keys != NULL)
        return idset_contains(&bits->hashed, id);
    if (bits->words == NULL || id < bits->low)
        return 0;
    unsigned long long offset = (unsigned long long)(id - bits->low);
    if (offset >= 64 * (unsigned long long)bits->word_count)
        return 0;
    return (bits->words[offset >> 6] >> (offset & 63)) & 1;
}

static inline void
idbits_free(IdBits *bits)
{
    PyMem_Free(bits->words);
    bits->words = NULL;
    if (bits->hashed.keys != NULL)
        idset_free(&bits->hashed);
    bits->hashed.keys = NULL;
}

/* Moves the set to an IdSet (0, or -1 with MemoryError). */
static inline int
idbits_to_hashed(IdBits *bits)
{
    if (idset_init(&bits->hashed, 1024) < 0)
        return -1;
    for (Py_ssize_t w = 0; w < bits->word_count; w++) {
        for (unsigned long long word = bits->words[w]; word != 0; word &= word - 1) {
            long long id = bits->low + 64 * (long long)w + __builtin_ctzll(word);
            if (idset_add(&bits->hashed, id) < 0) {
                idset_free(&bits->hashed);
                bits->hashed.keys = NULL;
                return -1;
            }
        }
    }
    PyMem_Free(bits->words);
    bits->words = NULL;
    return 0;
}

/* Widens the range to take ``id``: at least double, on the side it falls. */
static inline int
idbits_widen(IdBits *bits, long long id)
{
    Py_ssize_t count = bits->word_count;
    long long low = bits->low;
    if (id < low) {
        long long need = (low - id + 63) / 64;
        Py_ssize_t extra = need > count ? (Py_ssize_t)need + count : count;
        if (count + extra > IDBITS_MAX_WORDS || need > IDBITS_MAX_WORDS)
            return idbits_to_hashed(bits);
        unsigned long long *words = PyMem_Calloc(count + extra, sizeof(*words));
        if (words == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(words + extra, bits->words, count * sizeof(*words));
        PyMem_Free(bits->words);
        bits->words = words;
        bits->low = low - 64 * (long long)extra;
        bits->word_count = count + extra;
        return 0;
    }
    long long need = (id - low) / 64 + 1 - count;
    Py_ssize_t extra = need > count ? (Py_ssize_t)need + count : count;
    if (count + extra > IDBITS_MAX_WORDS || need > IDBITS_MAX_WORDS)
        return idbits_to_hashed(bits);
    unsigned long long *words = PyMem_Realloc(bits->words, (count + extra) * sizeof(*words));
    if (words == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(words + count, 0, extra * sizeof(*words));
    bits->words = words;
    bits->word_count = count + extra;
    return 0;
}

/* Adds ``id``: 1 if it was new, 0 if present, -1 on memory error. */
static inline int
idbits_add(IdBits *bits, long long id)
{
    if (bits->hashed.keys == NULL && bits->words == NULL) {
        /* Walks go from new nodes to older ones: room mostly below. */
        bits->word_count = 1024;
        bits->low = id - 64 * 1000;
        bits->words = PyMem_Calloc(bits->word_count, sizeof(*bits->words));
        if (bits->words == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    while (bits->hashed.keys == NULL
           && (id < bits->low
               || (unsigned long long)(id - bits->low) >= 64 * (unsigned long long)bits->word_count)) {
        if (idbits_widen(bits, id) < 0)
            return -1;
    }
    if (bits->hashed.keys != NULL)
        return idset_add(&bits->hashed, id);
    unsigned long long offset = (unsigned long long)(id - bits->low);
    unsigned long long mask = 1ull << (offset & 63);
    if (bits->words[offset >> 6] & mask)
        return 0;
    bits->words[offset >> 6] |= mask;
    return 1;
}

/* -- counts per object ------------------------------------------------------- */

/* How often each of a few objects came up (a minibatch's replacements per
 * pattern entry, its joins per joined pattern), counted as they happen: a
 * linear search over the handful seen.  The objects are borrowed: the
 * caller holds them while it counts. */
typedef struct {
    PyObject *entry;
    Py_ssize_t count;
} Tallied;

typedef struct {
    Tallied *items;
    Py_ssize_t size, capacity;
} Tally;

static inline int
tally_add(Tally *tally, PyObject *entry)
{
    for (Py_ssize_t i = 0; i < tally->size; i++) {
        if (tally->items[i].entry == entry) {
            tally->items[i].count++;
            return 0;
        }
    }
    if (tally->size == tally->capacity
            && array_grow((void **)&tally->items, &tally->capacity, sizeof(Tallied)) < 0)
        return -1;
    tally->items[tally->size++] = (Tallied){entry, 1};
    return 0;
}

/* The tally as a new dict {entry: count}, or NULL with an exception set. */
static inline PyObject *
tally_dict(Tally *tally)
{
    PyObject *dict = PyDict_New();
    for (Py_ssize_t i = 0; dict != NULL && i < tally->size; i++) {
        PyObject *count = PyLong_FromSsize_t(tally->items[i].count);
        if (count == NULL || PyDict_SetItem(dict, tally->items[i].entry, count) < 0)
            Py_CLEAR(dict);
        Py_XDECREF(count);
    }
    return dict;
}

/* -- nodes in id order --------------------------------------------------------- */

typedef struct {
    long long id;
    PyObject *node;
} Keyed;

static inline int
keyed_by_id(const void *a, const void *b)
{
    long long x = ((const Keyed *)a)->id, y = ((const Keyed *)b)->id;
    return (x > y) - (x < y);
}

/* Sorts nodes by id, each once (a node given twice is kept once): the new
 * count, or -1 with MemoryError.  One evaluation's nodes were mostly
 * recorded together, so their ids usually span a range not much wider than
 * their number, or a few times it (a minibatch's pattern nodes: one in
 * eight of its recorded nodes): then each goes to its place in a table of
 * that range, with no comparisons (a scan of the range costs less than a
 * qsort's comparisons up to 32 ids a node); otherwise a qsort on the copied
 * ids (comparing reads no node). */
static inline Py_ssize_t
keyed_sort(Keyed *items, Py_ssize_t count)
{
    if (count < 2)
        return count;
    long long low = items[0].id, high = low;
    for (Py_ssize_t i = 1; i < count; i++) {
        low = items[i].id < low ? items[i].id : low;
        high = items[i].id > high ? items[i].id : high;
    }
    if ((unsigned long long)(high - low) < 32 * (unsigned long long)count) {
        PyObject **table = PyMem_Calloc(high - low + 1, sizeof(PyObject *));
        if (table == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < count; i++)
            table[items[i].id - low] = items[i].node;
        Py_ssize_t placed = 0;
        for (long long slot = 0; slot <= high - low; slot++)
            if (table[slot] != NULL)
                items[placed++] = (Keyed){low + slot, table[slot]};
        PyMem_Free(table);
        return placed;
    }
    qsort(items, count, sizeof(Keyed), keyed_by_id);
    Py_ssize_t kept = 1;
    for (Py_ssize_t i = 1; i < count; i++)
        if (items[i].id != items[kept - 1].id)
            items[kept++] = items[i];
    return kept;
}

typedef struct {
    Keyed *items;
    Py_ssize_t size, capacity;
} KeyedArray;

static inline int
keyed_push(KeyedArray *array, Node *node)
{
    if (array->size == array->capacity
            && array_grow((void **)&array->items, &array->capacity, sizeof(Keyed)) < 0)
        return -1;
    array->items[array->size++] = (Keyed){node->id, (PyObject *)node};
    return 0;
}

/* The nodes of ``array`` as a new list in id order, each once (the array
 * is sorted, and shortened, in place), or NULL with an exception set. */
static inline PyObject *
keyed_list(KeyedArray *array)
{
    Py_ssize_t count = keyed_sort(array->items, array->size);
    if (count < 0)
        return NULL;
    array->size = count;
    PyObject *list = PyList_New(count);
    for (Py_ssize_t i = 0; list != NULL && i < count; i++)
        PyList_SET_ITEM(list, i, Py_NewRef(array->items[i].node));
    return list;
}

/* -- an access node left out of an evaluation ----------------------------------- */

/* Whether ``node`` is an access node (one output of the multi-output node
 * it reads) that nodes read and whose id no one asked for (``required``):
 * then it stays out of the evaluation, its readers read the output from
 * that node (describe_graph), and it takes the output when asked for
 * (``VirtualNode._output_taken``).  The one rule of the search's
 * ``enqueue`` (match.c) and of fuse's joined consumers (fuse.c); here for
 * the IdSet both read it with.  The caller marks it swallowed. */
static inline int
stays_out(Node *node, PyObject *access_entry, const IdSet *required)
{
    return access_entry != NULL && node->entry == access_entry
           && node->consumers > 0 && node->input_count > 0
           && is_node(node_input(node, 0)) && !idset_contains(required, node->id);
}

#endif
