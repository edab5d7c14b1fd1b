/*
 * The data network by interface, as NCCL_SOCKET_IFNAME chooses it:
 *
 *   CFX_SOCKET_IFNAME=eth        interfaces whose name begins with "eth"
 *   CFX_SOCKET_IFNAME==eth0      exactly eth0 (a leading '=')
 *   CFX_SOCKET_IFNAME=^docker,lo every interface but those beginning so
 *   CFX_SOCKET_IFNAME=ib,eth     either prefix (a comma-separated list)
 *
 * The first interface (in the kernel's order) that is up, has an IPv4
 * address and is selected gives the address the transports bind.  An
 * exclusion list never picks loopback (name it to get it).  CFX_BIND_ADDR
 * also takes an interface name where it does not hold an IPv4 address.
 */
#include "engine.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

/* Does @p name match one entry of the list @p p ("a,b"), exactly or as a
 * prefix? */
static bool list_match(const char *p, const char *name, bool exact)
{
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n && !strncmp(p, name, n) && (!exact || name[n] == '\0'))
            return true;
        p += n + (p[n] == ',');
    }
    return false;
}

static bool selected(const char *spec, bool exact, const struct ifaddrs *ifa)
{
    if (exact)
        return list_match(spec, ifa->ifa_name, true);
    if (spec[0] == '^')
        return !(ifa->ifa_flags & IFF_LOOPBACK) && !list_match(spec + 1, ifa->ifa_name, false);
    if (spec[0] == '=')
        return list_match(spec + 1, ifa->ifa_name, true);
    return list_match(spec, ifa->ifa_name, false);
}

int cfx__netif_pick(const char *var, const char *spec, bool exact, char *ip, size_t len)
{
    struct ifaddrs *all, *ifa;
    char seen[512] = "";
    size_t used = 0;

    if (!spec || !*spec || !strcmp(spec, "^") || !strcmp(spec, "="))
        return cfx__err(CFX_ERR_INVALID, "%s is empty: name an interface or a prefix", var);
    if (getifaddrs(&all) != 0)
        return cfx__err(cfx__status_from_errno(errno), "%s=%s: cannot list the interfaces: %s", var,
                        spec, strerror(errno));
    for (ifa = all; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET || !(ifa->ifa_flags & IFF_UP))
            continue;
        char a[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((struct sockaddr_in *)ifa->ifa_addr)->sin_addr, a, sizeof(a));
        if (selected(spec, exact, ifa)) {
            snprintf(ip, len, "%s", a);
            CFX_LOG(INFO, INIT, "%s=%s: interface %s, address %s", var, spec, ifa->ifa_name, a);
            freeifaddrs(all);
            return CFX_OK;
        }
        int n = snprintf(seen + used, sizeof(seen) - used, "%s%s (%s)", used ? ", " : "",
                         ifa->ifa_name, a);
        if (n > 0 && (size_t)n < sizeof(seen) - used)
            used += (size_t)n;
    }
    freeifaddrs(all);
    return cfx__err(CFX_ERR_INVALID,
                    "%s=%s selects no interface that is up with an IPv4 "
                    "address; there are: %s",
                    var, spec, used ? seen : "none");
}
