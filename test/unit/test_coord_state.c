/*
 * The coordinator's durable record store (control/coord_state.c): records
 * written by one coordinator are read back by the next, versions count up,
 * a process killed with SIGKILL right after a put loses nothing, and a
 * corrupt or half-written file is ignored rather than trusted.
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "control/coord_int.h"

static char dir[128];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/cfx-state-%d", (int)getpid());
}

static void teardown(void)
{
    char cmd[192];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)!system(cmd);
}

TestSuite(coord_state, .init = setup, .fini = teardown, .timeout = 30);

static struct cfx_coord *open_store(void)
{
    struct cfx_coord *co = calloc(1, sizeof(*co));
    cr_assert_eq(cfx__coord_state_open(co, dir), CFX_OK, "%s", cfx_last_error());
    return co;
}

static void close_store(struct cfx_coord *co)
{
    cfx__coord_state_close(co);
    free(co);
}

static void expect(struct cfx_coord *co, const char *key, const char *val, uint64_t version)
{
    void *v = NULL;
    size_t len = 0;
    uint64_t ver = 0;
    cr_assert_eq(cfx__coord_state_get(co, key, &v, &len, &ver), CFX_OK, "record %s missing", key);
    cr_assert_eq(len, strlen(val));
    cr_assert(!memcmp(v, val, len));
    cr_assert_eq(ver, version);
    free(v);
}

Test(coord_state, records_survive_a_restart_with_their_versions)
{
    struct cfx_coord *co = open_store();
    uint64_t v;
    cr_assert_eq(cfx__coord_state_put(co, "group.train", "ranks=4", 7, &v), CFX_OK);
    cr_assert_eq(v, 1);
    cr_assert_eq(cfx__coord_state_put(co, "group.train", "ranks=8", 7, &v), CFX_OK);
    cr_assert_eq(v, 2);
    cr_assert_eq(cfx__coord_state_put(co, "shardmap.w", "v1", 2, &v), CFX_OK);
    cr_assert_eq(cfx__coord_state_put(co, "gone", "x", 1, &v), CFX_OK);
    cr_assert_eq(cfx__coord_state_del(co, "gone", true), CFX_OK);
    cr_assert_eq(cfx__coord_state_put(co, "../escape", "x", 1, &v), CFX_ERR_INVALID);
    cr_assert_eq(cfx__coord_state_put(co, "", "x", 1, &v), CFX_ERR_INVALID);
    close_store(co);

    co = open_store();
    expect(co, "group.train", "ranks=8", 2);
    expect(co, "shardmap.w", "v1", 1);
    cr_assert_eq(cfx__coord_state_get(co, "gone", NULL, NULL, NULL), CFX_ERR_NOT_FOUND);
    close_store(co);
}

Test(coord_state, kill_9_after_put_loses_nothing)
{
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        struct cfx_coord *co = calloc(1, sizeof(*co));
        char key[32], val[32];
        if (cfx__coord_state_open(co, dir) != CFX_OK)
            _exit(1);
        for (int i = 0; i < 50; i++) {
            snprintf(key, sizeof(key), "k%d", i % 5);
            snprintf(val, sizeof(val), "value-%d", i);
            if (cfx__coord_state_put(co, key, val, strlen(val), NULL) != CFX_OK)
                _exit(1);
        }
        kill(getpid(), SIGKILL);
        _exit(2);
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child did not die by SIGKILL");
    struct cfx_coord *co = open_store();
    for (int k = 0; k < 5; k++) {
        char key[32], val[32];
        snprintf(key, sizeof(key), "k%d", k);
        snprintf(val, sizeof(val), "value-%d", 45 + k);
        expect(co, key, val, 10);
    }
    close_store(co);
}

Test(coord_state, corrupt_and_half_written_files_are_ignored)
{
    struct cfx_coord *co = open_store();
    cr_assert_eq(cfx__coord_state_put(co, "good", "ok", 2, NULL), CFX_OK);
    cr_assert_eq(cfx__coord_state_put(co, "bad", "will be flipped", 15, NULL), CFX_OK);
    close_store(co);
    char path[256];
    snprintf(path, sizeof(path), "%s/bad.rec", dir);
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, "X", 1, 30), 1);
    close(fd);
    snprintf(path, sizeof(path), "%s/bad.tmp", dir);
    fd = open(path, O_WRONLY | O_CREAT, 0600);
    cr_assert_eq(write(fd, "CFXSTAT1", 8), 8);
    close(fd);

    co = open_store();
    expect(co, "good", "ok", 1);
    cr_assert_eq(cfx__coord_state_get(co, "bad", NULL, NULL, NULL), CFX_ERR_NOT_FOUND);
    cr_assert_neq(access(path, F_OK), 0, "a half-written temp file was left behind");
    close_store(co);
}

/* One coordinator per state directory: a second one is refused with
 * CFX_ERR_BUSY naming it (two would hand out the same node ids and write
 * over each other's records); once the first is gone, it may start. */
Test(coord_state, second_coordinator_on_the_directory_is_refused)
{
    struct cfx_coord *a = open_store();
    struct cfx_coord *b = calloc(1, sizeof(*b));
    cr_assert_eq(cfx__coord_state_open(b, dir), CFX_ERR_BUSY);
    cr_assert(strstr(cfx_last_error(), "in use by another coordinator"), "%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), dir), "%s", cfx_last_error());
    cfx__coord_state_close(b);
    free(b);
    close_store(a);
    b = open_store(); /* the lock went with the first */
    close_store(b);
}
