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

#endif
