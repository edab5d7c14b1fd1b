/*
 * Transport contract tests (dataplane/transport.h), as test_transport.c's:
 * the arguments a transport refuses to register or grant, once per
 * transport in cfx__transports[] (verbs in the Soft-RoCE guest).
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "dataplane/common/util.h"
#include "dataplane/transport.h"
#include "testutil.h"

#include "tp_pair.h"

/*
 * What a transport refuses to register or grant, by code and naming the
 * call: no region or an empty one, unknown access bits, memory of a type it
 * cannot register (CUDA on all but verbs, which registers it by GPUDirect;
 * an unknown type on all), a grant of a region registered without remote
 * writes, a grant naming another iface's endpoint or with nothing to fill.
 * A registration keeps the access it was given; one without remote writes
 * is still described (mr_pack: its key matches nothing).
 */
TP_TEST(bad_registrations_and_grants_refused)
{
    struct pair p;
    struct region loc, dst;
    struct cfx_tp_mr *mr = NULL;
    struct cfx_tp_rdesc rd;
    static uint8_t buf[4096];
    struct cfx_tp_mem_desc md = { .addr = buf, .len = sizeof(buf),
                                  .memtype = CFX_MEMTYPE_HOST, .file_fd = -1 };
    char want[64];

    pair_open(&p, param);
    if (!p.ops->mr_grant) {
        const char *name = p.ops->name;
        pair_close(&p);
        cr_skip_test("transport %s has no write grants", name);
    }
    pair_connect(&p);
    struct cfx_tp_iface *b = p.s[1].iface;
    const bool verbs = !strcmp(p.ops->name, "verbs");
    cr_assert_eq(p.ops->mem_reg(b, NULL, CFX_TP_ACCESS_LOCAL, &mr), CFX_ERR_INVALID);
    md.len = 0;
    cr_assert_eq(p.ops->mem_reg(b, &md, CFX_TP_ACCESS_LOCAL, &mr), CFX_ERR_INVALID);
    md.len = sizeof(buf);
    cr_assert_eq(p.ops->mem_reg(b, &md, 1u << 7, &mr), CFX_ERR_INVALID);
    snprintf(want, sizeof(want), "%s mem_reg: unknown access bits 0x80", p.ops->name);
    cr_assert(strstr(cfx_last_error(), want), "'%s' missing: %s", want, cfx_last_error());
    md.memtype = (enum cfx_memtype)99;
    cr_assert_eq(p.ops->mem_reg(b, &md, CFX_TP_ACCESS_LOCAL, &mr), CFX_ERR_UNSUPPORTED);
    md.memtype = CFX_MEMTYPE_CUDA;
    if (!verbs)
        cr_assert_eq(p.ops->mem_reg(b, &md, CFX_TP_ACCESS_LOCAL, &mr), CFX_ERR_UNSUPPORTED);
    cr_assert_null(mr, "a refused registration was handed out");

    region_reg(&p, 1, &loc, 4096, CFX_TP_ACCESS_LOCAL, 0); /* packs all the same */
    cr_assert_eq(loc.mr->access, CFX_TP_ACCESS_LOCAL);
    cr_assert_eq(p.ops->mr_grant(loc.mr, p.ba, &rd), CFX_ERR_INVALID);
    snprintf(want, sizeof(want), "%s mr_grant: region %p is not remote-writable", p.ops->name,
             (void *)loc.buf);
    cr_assert(strstr(cfx_last_error(), want), "'%s' missing: %s", want, cfx_last_error());
    region_reg(&p, 1, &dst, 4096, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    cr_assert_eq(dst.mr->access, CFX_TP_ACCESS_REMOTE_WRITE);
    cr_assert_eq(p.ops->mr_grant(dst.mr, p.ab, &rd), CFX_ERR_INVALID); /* a's endpoint */
    cr_assert(strstr(cfx_last_error(), "another iface's ep"), "%s", cfx_last_error());
    cr_assert_eq(p.ops->mr_grant(NULL, p.ba, &rd), CFX_ERR_INVALID);
    cr_assert_eq(p.ops->mr_grant(dst.mr, p.ba, NULL), CFX_ERR_INVALID);
    cr_assert_eq(p.ops->mr_grant(dst.mr, p.ba, &rd), CFX_OK, "%s", cfx_last_error());
    region_free(&p, &dst);
    region_free(&p, &loc);
    pair_close(&p);
}
