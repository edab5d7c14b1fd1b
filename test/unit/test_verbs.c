/*
 * verbs transport specifics (the shared contract is test_transport.c).
 *
 * On a host without RDMA these check the "no device" behaviour: iface_open
 * fails with CFX_ERR_NO_DEVICE and a message a user can act on, and the
 * device listing says so.  Tests that need a device skip with the reason;
 * in the Soft-RoCE guest they run for real.  Built without verbs, every
 * test skips.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/common/util.h"
#include "dataplane/transport.h"

/* Only present in libconflux when the verbs transport is built; weak so
 * this file links either way (the table entry pulls the object in). */
int cfx__verbs_devices_print(FILE *out, int json) __attribute__((weak));
uint32_t cfx__verbs_rcache_invalidate(struct cfx_tp_iface *iface, const void *addr,
                                      size_t len) __attribute__((weak));

static const struct cfx_transport_ops *verbs_or_skip(void)
{
    const struct cfx_transport_ops *ops = cfx__transport_find("verbs");
    if (!ops)
        cr_skip_test("built without the verbs transport");
    return ops;
}

static struct cfx_tp_iface *open_or_skip(const struct cfx_transport_ops *ops, uint32_t node)
{
    struct cfx_tp_iface_params p = { .field_mask = CFX_TP_IFACE_PARAM_NODE_ID, .node_id = node };
    struct cfx_tp_iface *iface = NULL;
    int rc = ops->iface_open(&p, &iface);
    if (rc == CFX_ERR_NO_DEVICE)
        cr_skip_test("no RDMA device: %s", cfx_last_error());
    cr_assert_eq(rc, CFX_OK, "iface_open: %s %s", cfx_errname(rc), cfx_last_error());
    return iface;
}

TestSuite(verbs);

Test(verbs, no_device_is_reported_cleanly)
{
    const struct cfx_transport_ops *ops = verbs_or_skip();
    struct cfx_tp_iface *iface = NULL;
    int rc = ops->iface_open(NULL, &iface);
    if (rc == CFX_OK) {
        ops->iface_close(iface);
        cr_skip_test("an RDMA device is present: nothing to check here");
    }
    if (rc == CFX_ERR_MEMLOCK) {
        cr_assert(strstr(cfx_last_error(), "ulimit -l"), "%s", cfx_last_error());
        cr_skip_test("locked-memory limit too low here: %s", cfx_last_error());
    }
    cr_assert_eq(rc, CFX_ERR_NO_DEVICE, "iface_open: %s %s", cfx_errname(rc), cfx_last_error());
    cr_assert_null(iface);
    cr_assert(strstr(cfx_last_error(), "RDMA"), "message: %s", cfx_last_error());
}

Test(verbs, devices_listing)
{
    verbs_or_skip();
    cr_assert_not_null(cfx__verbs_devices_print);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int rc = cfx__verbs_devices_print(f, 0);
    fclose(f);
    if (rc == CFX_ERR_NO_DEVICE) {
        cr_assert(strstr(buf, "no RDMA devices found: "), "text: %s", buf);
    } else {
        cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
        cr_assert(strstr(buf, "hca_id:"), "text: %s", buf);
        cr_assert(strstr(buf, "active_mtu:"), "text: %s", buf);
    }
    free(buf);

    f = open_memstream(&buf, &len);
    int rc2 = cfx__verbs_devices_print(f, 1);
    fclose(f);
    cr_assert_eq(rc2, rc);
    cr_assert_eq(buf[0], '{', "json: %s", buf);
    cr_assert(strstr(buf, "\"devices\": ["), "json: %s", buf);
    /* Balanced braces and brackets outside strings: a cheap validity check. */
    int depth = 0;
    bool in_str = false;
    for (const char *p = buf; *p; p++) {
        if (in_str) {
            if (*p == '\\')
                p++;
            else if (*p == '"')
                in_str = false;
            continue;
        }
        if (*p == '"')
            in_str = true;
        else if (*p == '{' || *p == '[')
            depth++;
        else if (*p == '}' || *p == ']')
            cr_assert_geq(--depth, 0, "json: %s", buf);
    }
    cr_assert_eq(depth, 0, "json: %s", buf);
    if (rc == CFX_ERR_NO_DEVICE)
        cr_assert(strstr(buf, "\"error\": \"no RDMA devices found: "), "json: %s", buf);
    free(buf);
    cr_assert_eq(cfx__verbs_devices_print(NULL, 0), CFX_ERR_INVALID);
}

Test(verbs, iface_basics)
{
    const struct cfx_transport_ops *ops = verbs_or_skip();
    struct cfx_tp_iface *iface = open_or_skip(ops, 7);
    char addr[CFX_TP_ADDR_MAX];
    size_t len = sizeof(addr);

    cr_assert_eq(ops->iface_addr(iface, addr, &len), CFX_OK);
    cr_assert_eq(strlen(addr) + 1, len);
    const char *hp = strncmp(addr, "oob:", 4) ? addr : addr + 4;
    cr_assert(strchr(hp, ':'), "address '%s' is IP:PORT", addr);
    cr_assert_geq(ops->iface_fd(iface), 0);
    int rc;
    for (int i = 0; i < 10 && (rc = ops->iface_arm(iface)) == CFX_ERR_AGAIN; i++)
        ops->poll(iface, NULL, 0);
    cr_assert_eq(rc, CFX_OK);

    /* Registration and descriptor. */
    size_t sz = 3 * 4096 + 100;
    uint8_t *buf = aligned_alloc(4096, 4 * 4096);
    struct cfx_tp_mem_desc md = { .addr = buf + 100, .len = sz - 100,
                                  .memtype = CFX_MEMTYPE_HOST, .shm_fd = -1 };
    struct cfx_tp_mr *a, *b;
    struct cfx_tp_rdesc rd;
    cr_assert_eq(ops->mem_reg(iface, &md, CFX_TP_ACCESS_REMOTE_WRITE | CFX_TP_ACCESS_LOCAL, &a),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(ops->mem_reg(iface, &md, CFX_TP_ACCESS_LOCAL, &b), CFX_OK);
    cr_assert_eq(ops->mr_pack(a, &rd), CFX_OK);
    cr_assert(rd.len > 0 && rd.len <= CFX_TP_RDESC_MAX);
    cr_assert_eq(rd.data[0], 'V');
    ops->mem_dereg(b);
    ops->mem_dereg(a);
    cr_assert_eq(cfx__verbs_rcache_invalidate(iface, buf, 4 * 4096), 0,
                 "user memory is not cached after its last dereg");
    free(buf);
    ops->iface_close(iface);
}

Test(verbs, invalidate_ignores_other_transports)
{
    verbs_or_skip();
    const struct cfx_transport_ops *tcp = cfx__transport_find("tcp");
    struct cfx_tp_iface *iface;
    cr_assert_eq(tcp->iface_open(NULL, &iface), CFX_OK);
    cr_assert_eq(cfx__verbs_rcache_invalidate(iface, &iface, 64), 0);
    cr_assert_eq(cfx__verbs_rcache_invalidate(NULL, &iface, 64), 0);
    tcp->iface_close(iface);
}

Test(verbs, connect_mode_mismatch_is_refused)
{
    const struct cfx_transport_ops *ops = verbs_or_skip();
    struct cfx_tp_iface *iface = open_or_skip(ops, 1);
    char addr[CFX_TP_ADDR_MAX];
    size_t len = sizeof(addr);
    cr_assert_eq(ops->iface_addr(iface, addr, &len), CFX_OK);
    char other[CFX_TP_ADDR_MAX + 8];
    if (!strncmp(addr, "oob:", 4))
        snprintf(other, sizeof(other), "%s", addr + 4);
    else
        snprintf(other, sizeof(other), "oob:%s", addr);
    struct cfx_tp_ep *ep = NULL;
    int rc = ops->ep_connect(iface, other, strlen(other) + 1, 2, &ep);
    cr_assert_eq(rc, CFX_ERR_CONNECT, "ep_connect: %s", cfx_errname(rc));
    cr_assert(strstr(cfx_last_error(), "CFX_IB_CONNECT"), "%s", cfx_last_error());
    ops->iface_close(iface);
}
