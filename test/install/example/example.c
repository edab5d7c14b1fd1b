/*
 * Smallest user of the installed library: public headers only, the shared
 * library's exported symbols only.  Exits 0 when everything matches.
 */
#include <stdio.h>
#include <string.h>

#include <conflux/conflux.h>

int main(void)
{
    unsigned v = cfx_version();
    const char *text = cfx_strerror(CFX_ERR_TIMEOUT);
    const char *name = cfx_errname(CFX_ERR_TIMEOUT);
    int bad = 0;

    printf("conflux %s (header 0x%06x, library 0x%06x)\n", CFX_VERSION_STRING,
           (unsigned)CFX_VERSION_HEX, v);
    printf("CFX_ERR_TIMEOUT: %s (%s)\n", name, text);
    printf("memory types: %s, %s\n", cfx_memtype_name(CFX_MEMTYPE_HOST),
           cfx_memtype_name(CFX_MEMTYPE_CUDA));

    if (v != CFX_VERSION_HEX) {
        fprintf(stderr, "example: header version 0x%06x but library 0x%06x\n",
                (unsigned)CFX_VERSION_HEX, v);
        bad = 1;
    }
    if (strcmp(name, "CFX_ERR_TIMEOUT") != 0 || strcmp(text, "timed out") != 0) {
        fprintf(stderr, "example: unexpected status text\n");
        bad = 1;
    }
    if (strcmp(cfx_errname(12345), "CFX_UNKNOWN") != 0) {
        fprintf(stderr, "example: unknown status not reported as such\n");
        bad = 1;
    }
    if (strcmp(cfx_memtype_name(CFX_MEMTYPE_HOST), "host") != 0) {
        fprintf(stderr, "example: memory type name wrong\n");
        bad = 1;
    }
    return bad;
}
