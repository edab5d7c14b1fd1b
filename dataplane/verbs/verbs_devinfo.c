/*
 * verbs transport: device enumeration shared with iface_open, and the
 * device listing behind `rdmactl devices`.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>

#include "verbs.h"
#include "verbs_devinfo.h"

int cfx__verbs_device_list(struct ibv_device ***out, int *n)
{
    int num = 0;

    errno = 0;
    struct ibv_device **list = ibv_get_device_list(&num);
    if (!list) {
        int err = errno ? errno : ENODEV;
        return cfx__err(CFX_ERR_NO_DEVICE,
                        "no RDMA devices found: ibv_get_device_list: %s (the kernel has no "
                        "RDMA support or no RDMA driver is loaded; for Soft-RoCE: modprobe "
                        "rdma_rxe, then 'rdma link add rxe0 type rxe netdev <interface>')",
                        strerror(err));
    }
    if (num <= 0) {
        ibv_free_device_list(list);
        return cfx__err(CFX_ERR_NO_DEVICE,
                        "no RDMA devices found: libibverbs sees no device (load the HCA "
                        "driver and its provider package ibverbs-providers, or add a Soft-RoCE "
                        "device: 'rdma link add rxe0 type rxe netdev <interface>')");
    }
    *out = list;
    *n = num;
    return CFX_OK;
}

const char *cfx__verbs_gid_type_str(uint32_t type, uint8_t link_layer)
{
    if (link_layer != IBV_LINK_LAYER_ETHERNET)
        return "IB";
    switch (type) {
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
    case IBV_GID_TYPE_IB:      return "IB";
    default:                   return "unknown";
    }
}

const char *cfx__verbs_port_state_str(enum ibv_port_state s)
{
    switch (s) {
    case IBV_PORT_DOWN:         return "DOWN";
    case IBV_PORT_INIT:         return "INIT";
    case IBV_PORT_ARMED:        return "ARMED";
    case IBV_PORT_ACTIVE:       return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default:                    return "NOP";
    }
}

const char *cfx__verbs_link_layer_str(uint8_t ll)
{
    switch (ll) {
    case IBV_LINK_LAYER_ETHERNET:   return "Ethernet";
    case IBV_LINK_LAYER_INFINIBAND:
    case IBV_LINK_LAYER_UNSPECIFIED: return "InfiniBand";
    default:                         return "unknown";
    }
}

bool cfx__verbs_gid_ipv4(const union ibv_gid *gid, struct in_addr *out)
{
    static const uint8_t prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
    if (memcmp(gid->raw, prefix, sizeof(prefix)))
        return false;
    memcpy(&out->s_addr, gid->raw + 12, 4);
    return true;
}

static int mtu_bytes(enum ibv_mtu m)
{
    return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128 << m : 0;
}

/* JSON string body with the characters JSON requires escaped. */
static void json_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

static void guid_str(uint64_t be_guid, char *buf, size_t len)
{
    uint64_t g = be64toh(be_guid);
    snprintf(buf, len, "%04x:%04x:%04x:%04x", (unsigned)(g >> 48) & 0xffff,
             (unsigned)(g >> 32) & 0xffff, (unsigned)(g >> 16) & 0xffff, (unsigned)g & 0xffff);
}

static void print_gids(FILE *out, int json, struct ibv_context *ctx, uint8_t port,
                       const struct ibv_port_attr *pa)
{
    bool first = true;
    for (int i = 0; i < pa->gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        char gs[INET6_ADDRSTRLEN], ifname[IF_NAMESIZE] = "", ip[INET_ADDRSTRLEN] = "";
        struct in_addr a;

        if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0))
            continue;
        static const union ibv_gid zero;
        if (!memcmp(&e.gid, &zero, sizeof(zero)))
            continue;
        inet_ntop(AF_INET6, e.gid.raw, gs, sizeof(gs));
        if (e.ndev_ifindex && !if_indextoname(e.ndev_ifindex, ifname))
            ifname[0] = '\0';
        if (cfx__verbs_gid_ipv4(&e.gid, &a))
            inet_ntop(AF_INET, &a, ip, sizeof(ip));
        const char *type = cfx__verbs_gid_type_str(e.gid_type, pa->link_layer);
        if (json) {
            fprintf(out, "%s\n          {\"index\": %d, \"gid\": ", first ? "" : ",", i);
            json_str(out, gs);
            fprintf(out, ", \"type\": ");
            json_str(out, type);
            fprintf(out, ", \"netdev\": ");
            json_str(out, ifname);
            fprintf(out, ", \"ipv4\": ");
            json_str(out, ip);
            fprintf(out, "}");
        } else {
            fprintf(out, "\t\t\tGID[%3d]:\t\t%s, %s%s%s%s%s\n", i, gs, type,
                    ifname[0] ? ", " : "", ifname, ip[0] ? ", " : "", ip);
        }
        first = false;
    }
    if (json)
        fprintf(out, "%s", first ? "" : "\n        ");
}

static void print_port(FILE *out, int json, struct ibv_context *ctx, uint8_t port, bool first)
{
    struct ibv_port_attr pa;
    if (ibv_query_port(ctx, port, &pa)) {
        if (json)
            fprintf(out, "%s\n      {\"port\": %u, \"error\": \"ibv_query_port failed\"}",
                    first ? "" : ",", port);
        else
            fprintf(out, "\t\tport:\t%u\n\t\t\t(ibv_query_port: %s)\n", port, strerror(errno));
        return;
    }
    if (json) {
        fprintf(out, "%s\n      {\"port\": %u, \"state\": \"%s\", \"max_mtu\": %d, "
                "\"active_mtu\": %d, \"link_layer\": \"%s\", \"lid\": %u, \"sm_lid\": %u, "
                "\"gid_tbl_len\": %d, \"gids\": [",
                first ? "" : ",", port, cfx__verbs_port_state_str(pa.state),
                mtu_bytes(pa.max_mtu), mtu_bytes(pa.active_mtu),
                cfx__verbs_link_layer_str(pa.link_layer), pa.lid, pa.sm_lid, pa.gid_tbl_len);
        print_gids(out, json, ctx, port, &pa);
        fprintf(out, "]}");
    } else {
        fprintf(out, "\t\tport:\t%u\n", port);
        fprintf(out, "\t\t\tstate:\t\t\tPORT_%s (%d)\n", cfx__verbs_port_state_str(pa.state),
                pa.state);
        fprintf(out, "\t\t\tmax_mtu:\t\t%d (%d)\n", mtu_bytes(pa.max_mtu), pa.max_mtu);
        fprintf(out, "\t\t\tactive_mtu:\t\t%d (%d)\n", mtu_bytes(pa.active_mtu), pa.active_mtu);
        fprintf(out, "\t\t\tsm_lid:\t\t\t%u\n", pa.sm_lid);
        fprintf(out, "\t\t\tport_lid:\t\t%u\n", pa.lid);
        fprintf(out, "\t\t\tlink_layer:\t\t%s\n", cfx__verbs_link_layer_str(pa.link_layer));
        fprintf(out, "\t\t\tgid_tbl_len:\t\t%d\n", pa.gid_tbl_len);
        print_gids(out, json, ctx, port, &pa);
    }
}

int cfx__verbs_devices_print(FILE *out, int json)
{
    struct ibv_device **list = NULL;
    int n = 0, rc;

    if (!out)
        return cfx__err(CFX_ERR_INVALID, "verbs devices: NULL stream");
    if ((rc = cfx__verbs_device_list(&list, &n)) != CFX_OK) {
        if (json) {
            fprintf(out, "{\"devices\": [], \"error\": ");
            json_str(out, cfx_last_error());
            fprintf(out, "}\n");
        } else {
            fprintf(out, "%s\n", cfx_last_error());
        }
        return rc;
    }

    if (json)
        fprintf(out, "{\"devices\": [");
    for (int d = 0; d < n; d++) {
        const char *name = ibv_get_device_name(list[d]);
        struct ibv_device_attr da;
        struct ibv_context *ctx = ibv_open_device(list[d]);
        char node[24], sys[24];

        if (json) {
            fprintf(out, "%s\n  {\"name\": ", d ? "," : "");
            json_str(out, name);
        } else {
            fprintf(out, "hca_id:\t%s\n", name);
        }
        if (!ctx || ibv_query_device(ctx, &da)) {
            if (json)
                fprintf(out, ", \"error\": \"cannot open or query the device\"}");
            else
                fprintf(out, "\t(cannot open or query the device: %s)\n\n", strerror(errno));
            if (ctx)
                ibv_close_device(ctx);
            continue;
        }
        guid_str(da.node_guid, node, sizeof(node));
        guid_str(da.sys_image_guid, sys, sizeof(sys));
        if (json) {
            fprintf(out, ", \"transport\": \"%s\", \"fw_ver\": ",
                    ibv_node_type_str(list[d]->node_type));
            json_str(out, da.fw_ver);
            fprintf(out, ", \"node_guid\": \"%s\", \"sys_image_guid\": \"%s\", "
                    "\"vendor_id\": %u, \"vendor_part_id\": %u, \"hw_ver\": %u, "
                    "\"max_qp\": %d, \"max_qp_wr\": %d, \"max_cqe\": %d, \"max_mr_size\": %llu, "
                    "\"phys_port_cnt\": %u, \"ports\": [",
                    node, sys, da.vendor_id, da.vendor_part_id, da.hw_ver, da.max_qp,
                    da.max_qp_wr, da.max_cqe, (unsigned long long)da.max_mr_size,
                    da.phys_port_cnt);
        } else {
            fprintf(out, "\ttransport:\t\t\t%s (%d)\n", ibv_node_type_str(list[d]->node_type),
                    list[d]->transport_type);
            fprintf(out, "\tfw_ver:\t\t\t\t%s\n", da.fw_ver);
            fprintf(out, "\tnode_guid:\t\t\t%s\n", node);
            fprintf(out, "\tsys_image_guid:\t\t\t%s\n", sys);
            fprintf(out, "\tvendor_id:\t\t\t0x%04x\n", da.vendor_id);
            fprintf(out, "\tvendor_part_id:\t\t\t%u\n", da.vendor_part_id);
            fprintf(out, "\thw_ver:\t\t\t\t0x%X\n", da.hw_ver);
            fprintf(out, "\tmax_qp:\t\t\t\t%d\n", da.max_qp);
            fprintf(out, "\tmax_qp_wr:\t\t\t%d\n", da.max_qp_wr);
            fprintf(out, "\tmax_cqe:\t\t\t%d\n", da.max_cqe);
            fprintf(out, "\tmax_mr_size:\t\t\t0x%llx\n", (unsigned long long)da.max_mr_size);
            fprintf(out, "\tphys_port_cnt:\t\t\t%u\n", da.phys_port_cnt);
        }
        for (uint8_t p = 1; p <= da.phys_port_cnt; p++)
            print_port(out, json, ctx, p, p == 1);
        if (json)
            fprintf(out, "%s]}", da.phys_port_cnt ? "\n    " : "");
        else
            fprintf(out, "\n");
        ibv_close_device(ctx);
    }
    if (json)
        fprintf(out, "\n]}\n");
    ibv_free_device_list(list);
    return CFX_OK;
}
