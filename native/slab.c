/* Storage for VirtualNodes: 64 KiB chunks, filled in recording order.
 *
 * Python's allocator hands out a freed block of the same size first, so
 * after a few minibatches a new minibatch's nodes lie wherever the last
 * ones died, scattered over the heap, and every pass over the graph (the
 * ancestors' walk, the pattern search, the graph description, freeing)
 * misses the cache at nearly every node: with minibatches of 256, most
 * of those passes' time.  Here consecutive nodes share a chunk: a chunk is
 * filled in allocation order, and one that empties is refilled from its
 * start.  A chunk a few long-lived nodes keep is reused once half of it is
 * free, so a user who keeps every minibatch's loss pins no memory.
 *
 * The chunk holding a slot is its address rounded down to the chunk
 * size, so freeing needs no lookup.  All of it runs under the GIL. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#include "native.h"

#ifdef _WIN32
#include <malloc.h>
#define aligned_alloc(alignment, size) _aligned_malloc((size), (alignment))
#define free _aligned_free
#endif

#define CHUNK_BYTES ((size_t)64 * 1024)
/* Empty chunks kept for the next minibatch, beyond which they go back to
 * the system: 32 MiB, about 350,000 nodes. */
#define KEEP_EMPTY 512

typedef struct Chunk {
    struct Chunk *prev, *next;   /* on the empty or the roomy list */
    void *free_slots;            /* freed slots, linked through their first word */
    Py_ssize_t live;             /* slots in use */
    Py_ssize_t fresh;            /* slots from here on were never used */
    char listed;
} Chunk;

/* Slots start at a cache line; each is one Node. */
#define FIRST_SLOT ((sizeof(Chunk) + 63) & ~(size_t)63)
#define SLOT_BYTES ((sizeof(Node) + 15) & ~(size_t)15)
#define CAPACITY ((Py_ssize_t)((CHUNK_BYTES - FIRST_SLOT) / SLOT_BYTES))

static Chunk *current;            /* where nodes are allocated now */
/* Circular lists with sentinels: chunks with no node, and chunks at most
 * half full (not the current one). */
static Chunk empty = {&empty, &empty}, roomy = {&roomy, &roomy};
static Py_ssize_t chunks, empty_count, nodes;   /* nodes: live ones */

static void
unlink_chunk(Chunk *chunk)
{
    chunk->prev->next = chunk->next;
    chunk->next->prev = chunk->prev;
    chunk->listed = 0;
}

static void
push_chunk(Chunk *list, Chunk *chunk)
{
    chunk->next = list->next;
    chunk->prev = list;
    list->next->prev = chunk;
    list->next = chunk;
    chunk->listed = 1;
}

/* The next chunk to fill: an empty one, else one at most half full, else
 * a new one; NULL when out of memory. */
static Chunk *
next_chunk(void)
{
    Chunk *chunk;
    if (empty.next != &empty) {
        chunk = empty.next;
        empty_count--;
    }
    else if (roomy.next != &roomy) {
        chunk = roomy.next;
    }
    else {
        chunk = aligned_alloc(CHUNK_BYTES, CHUNK_BYTES);
        if (chunk == NULL)
            return NULL;
        chunks++;
        chunk->free_slots = NULL;
        chunk->live = chunk->fresh = 0;
        chunk->listed = 0;
        return chunk;
    }
    unlink_chunk(chunk);
    return chunk;
}

void *
slab_alloc(void)
{
    if (current == NULL
            || (current->free_slots == NULL && current->fresh == CAPACITY)) {
        Chunk *chunk = next_chunk();
        if (chunk == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        current = chunk;
    }
    void *slot = current->free_slots;
    if (slot != NULL)
        current->free_slots = *(void **)slot;
    else
        slot = (char *)current + FIRST_SLOT + SLOT_BYTES * current->fresh++;
    current->live++;
    nodes++;
    return slot;
}

void
slab_free(void *slot)
{
    Chunk *chunk = (Chunk *)((uintptr_t)slot & ~(uintptr_t)(CHUNK_BYTES - 1));
    chunk->live--;
    nodes--;
    if (chunk->live == 0) {
        /* Refilled from its start: consecutive nodes stay together. */
        chunk->free_slots = NULL;
        chunk->fresh = 0;
        if (chunk == current)
            return;
        if (chunk->listed)
            unlink_chunk(chunk);
        if (empty_count >= KEEP_EMPTY) {
            chunks--;
            free(chunk);
            return;
        }
        push_chunk(&empty, chunk);
        empty_count++;
        return;
    }
    *(void **)slot = chunk->free_slots;
    chunk->free_slots = slot;
    if (chunk != current && !chunk->listed && chunk->live <= CAPACITY / 2)
        push_chunk(&roomy, chunk);
}

PyObject *
slab_statistics(PyObject *module, PyObject *unused)
{
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n}", "nodes", nodes,
                         "chunks", chunks, "empty_chunks", empty_count,
                         "nodes_per_chunk", CAPACITY,
                         "chunk_bytes", (Py_ssize_t)CHUNK_BYTES);
}
