/* list.h -- the one linked list of the parent's C core: intrusive and doubly
 * linked, its links in a ring with the list's anchor.
 *
 * An object on a list holds an mj_list_t (its link), the list is an
 * mj_list_t of its own (the anchor, set up by mj__list_init). The ring
 * spares every test for the list's ends: a link is taken off without knowing
 * its list. A link on no list has next == NULL (as in memory zeroed), and
 * taking it off again does nothing: an object is unlinked by whichever of
 * its ends comes first. New links go first and walks go first to last:
 * newest first.
 */
#ifndef MJ_LIST_H
#define MJ_LIST_H

#include <stddef.h>

typedef struct mj_list_s {
  struct mj_list_s *next, *prev;
} mj_list_t;

/* An empty list: the anchor alone in its ring. */
static inline void mj__list_init(mj_list_t *anchor) {
  anchor->next = anchor->prev = anchor;
}

static inline int mj__list_empty(const mj_list_t *anchor) {
  return anchor->next == anchor;
}

static inline int mj__list_linked(const mj_list_t *link) {
  return link->next != NULL;
}

/* Puts the link first on the list. */
static inline void mj__list_push(mj_list_t *anchor, mj_list_t *link) {
  link->next = anchor->next;
  link->prev = anchor;
  anchor->next->prev = link;
  anchor->next = link;
}

/* Takes the link off its list, if it is on one. */
static inline void mj__list_unlink(mj_list_t *link) {
  if (!mj__list_linked(link)) return;
  link->prev->next = link->next;
  link->next->prev = link->prev;
  link->next = link->prev = NULL;
}

/* The object of `type` whose member `field` is the link. */
#define MJ_LIST_ITEM(link, type, field) ((type *) (void *) ((char *) (link) - offsetof(type, field)))

/* Walks the list, `it` being each link in turn; the body must leave `it`
 * on the list. */
#define MJ_LIST_EACH(it, anchor) for (mj_list_t *it = (anchor)->next; it != (anchor); it = it->next)

/* The same, for a body that may take `it` off (and free its object): the
 * link after it is read first, so that one must stay. */
#define MJ_LIST_EACH_SAFE(it, anchor)                                             \
  for (mj_list_t *it = (anchor)->next, *it##_after = it->next; it != (anchor); \
       it = it##_after, it##_after = it->next)

#endif
