/* Status codes: the X-macro table, strings, names, per-thread error detail. */
#include <criterion/criterion.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/common/util.h"

static void clear_error(void)
{
    cfx__err_clear();
}

TestSuite(status, .init = clear_error);

struct status_row {
    int value;
    const char *name; /* "CFX_ERR_TIMEOUT", spelled from the table */
};

static const struct status_row rows[] = {
#define ROW_(name, value, text) { (value), "CFX_" #name },
    CFX_STATUS_MAP(ROW_)
#undef ROW_
};
#define NROWS ((int)(sizeof(rows) / sizeof(rows[0])))

Test(status, ok_is_zero_and_errors_negative)
{
    cr_assert_eq(CFX_OK, 0);
    cr_assert_eq(rows[0].value, 0);
    for (int i = 1; i < NROWS; i++)
        cr_assert_lt(rows[i].value, 0, "%s = %d", rows[i].name, rows[i].value);
}

Test(status, codes_are_dense_and_end_at_last)
{
    /* 0, -1, -2, ... in table order, then CFX_STATUS_LAST one past. */
    for (int i = 0; i < NROWS; i++)
        cr_assert_eq(rows[i].value, -i, "%s = %d, expected %d", rows[i].name, rows[i].value, -i);
    cr_assert_eq(CFX_STATUS_LAST, -NROWS);
}

Test(status, every_status_has_distinct_text_and_name)
{
    for (int i = 0; i < NROWS; i++) {
        const char *text = cfx_strerror(rows[i].value);
        const char *name = cfx_errname(rows[i].value);

        cr_assert_not_null(text);
        cr_assert_not_null(name);
        cr_assert_neq(text[0], '\0', "%s has an empty string", rows[i].name);
        cr_assert_str_neq(text, "unknown status", "%s has no string", rows[i].name);
        cr_assert_str_eq(name, rows[i].name);
        for (int j = 0; j < i; j++) {
            cr_assert_str_neq(text, cfx_strerror(rows[j].value), "%s and %s share a string",
                              rows[i].name, rows[j].name);
            cr_assert_str_neq(name, cfx_errname(rows[j].value));
        }
    }
}

Test(status, some_names_by_hand)
{
    cr_assert_str_eq(cfx_errname(CFX_OK), "CFX_OK");
    cr_assert_str_eq(cfx_errname(CFX_ERR_TIMEOUT), "CFX_ERR_TIMEOUT");
    cr_assert_str_eq(cfx_strerror(CFX_ERR_TIMEOUT), "timed out");
    cr_assert_str_eq(cfx_errname(CFX_ERR_INTERNAL), "CFX_ERR_INTERNAL");
}

Test(status, unknown_codes)
{
    static const int unknown[] = { 1,     2,       100,    CFX_STATUS_LAST, CFX_STATUS_LAST - 1,
                                   -1000, INT_MIN, INT_MAX };

    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        cr_assert_str_eq(cfx_strerror(unknown[i]), "unknown status", "code %d", unknown[i]);
        cr_assert_str_eq(cfx_errname(unknown[i]), "CFX_UNKNOWN", "code %d", unknown[i]);
    }
}

Test(status, errno_translation_stays_in_the_table)
{
    cr_assert_eq(cfx__status_from_errno(0), CFX_OK);
    cr_assert_eq(cfx__status_from_errno(EINVAL), CFX_ERR_INVALID);
    cr_assert_eq(cfx__status_from_errno(ENOMEM), CFX_ERR_NOMEM);
    cr_assert_eq(cfx__status_from_errno(ETIMEDOUT), CFX_ERR_TIMEOUT);
    cr_assert_eq(cfx__status_from_errno(ECONNREFUSED), CFX_ERR_CONNECT);
    cr_assert_eq(cfx__status_from_errno(ECONNRESET), CFX_ERR_PEER_FAILED);
    cr_assert_eq(cfx__status_from_errno(EXDEV), CFX_ERR_IO); /* anything unlisted */
    for (int e = 0; e < 200; e++) {
        int s = cfx__status_from_errno(e);
        cr_assert(s <= 0 && s > CFX_STATUS_LAST, "errno %d -> %d", e, s);
        cr_assert_str_neq(cfx_errname(s), "CFX_UNKNOWN", "errno %d", e);
    }
}

Test(status, last_error_set_and_cleared)
{
    cr_assert_str_eq(cfx_last_error(), "");
    cr_assert_eq(cfx__err(CFX_ERR_TIMEOUT, "waiting for node %u", 7u), CFX_ERR_TIMEOUT);
    cr_assert_str_eq(cfx_last_error(), "waiting for node 7");
    cfx__err_clear();
    cr_assert_str_eq(cfx_last_error(), "");
}

Test(status, last_error_long_detail_truncated)
{
    char big[4096];

    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    cfx__err(CFX_ERR_INVALID, "%s", big);
    size_t len = strlen(cfx_last_error());
    cr_assert_gt(len, 100);
    cr_assert_lt(len, sizeof(big) - 1);
    cr_assert_eq(strspn(cfx_last_error(), "x"), len);
}

struct thread_arg {
    char seen_before[64]; /* the thread's detail before it set one */
    char seen_after[64];  /* and after */
};

static void *thread_main(void *p)
{
    struct thread_arg *a = p;

    snprintf(a->seen_before, sizeof(a->seen_before), "%s", cfx_last_error());
    cfx__err(CFX_ERR_IO, "thread detail");
    snprintf(a->seen_after, sizeof(a->seen_after), "%s", cfx_last_error());
    return NULL;
}

Test(status, last_error_is_per_thread)
{
    struct thread_arg a = { { 0 }, { 0 } };
    pthread_t t;

    cfx__err(CFX_ERR_AUTH, "main detail");
    cr_assert_eq(pthread_create(&t, NULL, thread_main, &a), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert_str_eq(a.seen_before, "", "a new thread saw another thread's error");
    cr_assert_str_eq(a.seen_after, "thread detail");
    cr_assert_str_eq(cfx_last_error(), "main detail", "another thread overwrote this one's");
}
