/*
 * cfx_run, the local launcher: environment of the ranks, line-prefixed
 * output, failure propagation, exit statuses and the timeout.  The ranks
 * are small sh scripts, so these tests need no transport.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CFX_BIN_DIR
#error "CFX_BIN_DIR must name the bin directory of the build"
#endif

/* Run the shell command @p cmd with stdout and stderr merged into *out
 * (malloc'd, NUL terminated); returns its exit status (128+sig when killed). */
static int run_sh(const char *cmd, char **out, double *secs)
{
    struct timespec t0, t1;
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    FILE *f;

    cr_assert_not_null(buf);
    cr_log_info("%s", cmd);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    f = popen(cmd, "r");
    cr_assert_not_null(f, "cannot run %s", cmd);
    for (;;) {
        if (cap - len < 4096) {
            cap *= 2;
            buf = realloc(buf, cap);
            cr_assert_not_null(buf);
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        if (n == 0)
            break;
        len += n;
    }
    buf[len] = '\0';
    int st = pclose(f);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (secs)
        *secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    *out = buf;
    cr_assert(st != -1);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Run `cfx_run ARGS`, as run_sh(). */
static int run(const char *args, char **out, double *secs)
{
    char cmd[4096];

    snprintf(cmd, sizeof(cmd), "%s/cfx_run %s 2>&1", CFX_BIN_DIR, args);
    return run_sh(cmd, out, secs);
}

static int has_line(const char *out, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = out; (p = strstr(p, line)); p++)
        if ((p == out || p[-1] == '\n') && (p[n] == '\n' || p[n] == '\0'))
            return 1;
    return 0;
}

TestSuite(cfx_run, .timeout = 60);

Test(cfx_run, ranks_see_their_environment)
{
    char *out;
    int rc =
        run("-n 3 sh -c 'echo out $CFX_RANK/$CFX_LOCAL_RANK/$CFX_WORLD_SIZE; "
            "echo err $CFX_RANK >&2; case $CFX_COORD in 127.0.0.1:[0-9]*) echo coord ok;; esac; "
            "echo token ${#CFX_TOKEN} $(head -n 1 \"$CFX_TOKEN_FILE\" | tr -d \"\\n\" | wc -c)'",
            &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    for (int r = 0; r < 3; r++) {
        char l[64];
        snprintf(l, sizeof(l), "[%d] out %d/%d/3", r, r, r);
        cr_assert(has_line(out, l), "missing '%s' in:\n%s", l, out);
        snprintf(l, sizeof(l), "[%d] err %d", r, r);
        cr_assert(has_line(out, l), "missing '%s' in:\n%s", l, out);
        snprintf(l, sizeof(l), "[%d] coord ok", r);
        cr_assert(has_line(out, l), "missing '%s' in:\n%s", l, out);
        /* 16 random bytes in hex, in a file: never in the environment */
        snprintf(l, sizeof(l), "[%d] token 0 32", r);
        cr_assert(has_line(out, l), "missing '%s' in:\n%s", l, out);
    }
    free(out);
}

/*
 * The run's coordinator lets all of its ranks wait in the challenge at once
 * (they start together, all from this host): its per-address cap is twice
 * the ranks' count, not conflux-coord's 16.  A 48-rank run had connections
 * cut and tried again, with a coordinator warning a second.  Rank 0 of 12
 * opens 20 silent connections, then asks the coordinator's status (answered
 * after the 20 were accepted) and counts those it closed (an end of file
 * after the challenge): none; 5 before.
 */
static const char challenge_py[] =
    "import os, socket, subprocess, sys\n"
    "h, p = os.environ['CFX_COORD'].rsplit(':', 1)\n"
    "ss = [socket.create_connection((h, int(p)), timeout=10) for i in range(20)]\n"
    "subprocess.run([sys.argv[1] + '/rdmactl', 'status'], check=True,\n"
    "               stdout=subprocess.DEVNULL)\n"
    "n = 0\n"
    "for s in ss:\n"
    "    s.setblocking(False)\n"
    "    try:\n"
    "        while s.recv(4096):\n"
    "            pass\n"
    "        n += 1\n"
    "    except BlockingIOError:\n"
    "        pass\n"
    "print('closed', n)\n";

Test(cfx_run, ranks_of_one_host_may_all_wait_in_the_challenge)
{
    char path[] = "/tmp/cfx-test-challenge-XXXXXX", *out, args[512];
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, challenge_py, sizeof(challenge_py) - 1),
                 (ssize_t)sizeof(challenge_py) - 1);
    close(fd);
    snprintf(args, sizeof(args), "-n 12 --timeout 50 sh -c "
             "'[ $CFX_RANK != 0 ] || exec python3 %s %s'", path, CFX_BIN_DIR);
    int rc = run(args, &out, NULL);
    unlink(path);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    cr_assert(has_line(out, "[0] closed 0"), "connections cut at a cap:\n%s", out);
    free(out);
}

Test(cfx_run, options_become_variables)
{
    char *out;
    int rc =
        run("-n 2 --transport tcp --chunk-size 1M --token s3cret --coord-port 0 "
            "sh -c 'echo \"$CFX_TRANSPORT $CFX_CHUNK_SIZE ${CFX_TOKEN-unset} $(cat $CFX_TOKEN_FILE)\"'",
            &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    cr_assert(has_line(out, "[0] tcp 1M unset s3cret"), "output:\n%s", out);
    cr_assert(has_line(out, "[1] tcp 1M unset s3cret"), "output:\n%s", out);
    cr_assert(strstr(out, "--token puts the cluster token on the command line"), "%s", out);
    free(out);
}

/*
 * The token value never reaches a rank's command line or environment (what
 * ps and /proc/PID/{cmdline,environ} show to the same user and root): each
 * rank greps its own.  Before the fix every rank had CFX_TOKEN=value in its
 * environment.  --token-file passes the user's file as it is, and the
 * temporary file cfx_run makes otherwise is gone when it exits.
 */
Test(cfx_run, token_value_not_in_ranks_cmdline_or_environ)
{
    char *out, cmd[1024], path[] = "/tmp/cfx-run-token-test-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "9f3c1a77d04e4b2a8c55e2d1b6a09f31\n", 33), 33);
    close(fd);
    const char *probe =
        /* the pattern is put together so that this script's own text lacks it */
        "sh -c 'p=9f3c1a77; p=${p}d04e4b2a; "
        "c=$(tr \"\\0\" \"\\n\" < /proc/$$/cmdline | grep -c $p); "
        "e=$(tr \"\\0\" \"\\n\" < /proc/$$/environ | grep -c $p); "
        "echo seen $c $e; echo file $CFX_TOKEN_FILE'";
    snprintf(cmd, sizeof(cmd), "-n 2 --token-file %s %s", path, probe);
    int rc = run(cmd, &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    for (int r = 0; r < 2; r++) {
        char l[128];
        snprintf(l, sizeof(l), "[%d] seen 0 0", r);
        cr_assert(has_line(out, l), "missing '%s' in:\n%s", l, out);
        snprintf(l, sizeof(l), "[%d] file %s", r, path);
        cr_assert(has_line(out, l), "missing '%s' in:\n%s", l, out);
    }
    free(out);
    /* --token: on cfx_run's own command line only (with a warning), never the ranks' */
    snprintf(cmd, sizeof(cmd), "-n 2 --token 9f3c1a77d04e4b2a8c55e2d1b6a09f31 %s", probe);
    rc = run(cmd, &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    char tmpfile[256] = "";
    for (int r = 0; r < 2; r++) {
        char l[64];
        snprintf(l, sizeof(l), "[%d] seen 0 0", r);
        cr_assert(has_line(out, l), "missing '%s' in:\n%s", l, out);
    }
    const char *f = strstr(out, "[0] file ");
    cr_assert_not_null(f, "%s", out);
    sscanf(f + 9, "%255s", tmpfile);
    cr_assert(access(tmpfile, F_OK) != 0, "token file %s left behind", tmpfile);
    free(out);
    unlink(path);
}

Test(cfx_run, partial_last_line_gets_prefix_and_newline)
{
    char *out;
    int rc = run("-n 1 sh -c 'printf abc; sleep 0.1; printf \"def\\nghi\"'", &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    cr_assert(has_line(out, "[0] abcdef"), "output:\n%s", out);
    cr_assert(has_line(out, "[0] ghi"), "output:\n%s", out);
    free(out);
}

Test(cfx_run, lines_never_interleave)
{
    char *out;
    int rc = run("-n 4 sh -c 'i=0; while [ $i -lt 2000 ]; do "
                 "echo \"rank $CFX_RANK line $i ........................................\"; "
                 "i=$((i+1)); done'",
                 &out, NULL);
    cr_assert_eq(rc, 0);
    int count[4] = { 0 };
    char *save = NULL;
    for (char *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        int r1, r2, i, n = 0;
        cr_assert(sscanf(l, "[%d] rank %d line %d ....%n", &r1, &r2, &i, &n) == 3 && n > 0,
                  "mangled line '%s'", l);
        cr_assert_eq(r1, r2, "line of rank %d prefixed with %d", r2, r1);
        cr_assert_eq(i, count[r1], "rank %d: line %d after %d lines", r1, i, count[r1]);
        cr_assert_eq(strlen(l),
                     strlen("[0] rank 0 line ") + (size_t)snprintf(NULL, 0, "%d", i) + 1 + 40);
        count[r1]++;
    }
    for (int r = 0; r < 4; r++)
        cr_assert_eq(count[r], 2000, "rank %d: %d lines", r, count[r]);
    free(out);
}

/* cfx_run exits with the failing rank's status (3).  The other ranks say
 * that they were stopped (they would otherwise sleep past the suite's
 * timeout): the mechanism, not how soon.  Rank 1 fails only
 * once ranks 0 and 2 have their SIGTERM trap in place (each leaves a file),
 * or a loaded machine could deliver the signal before the trap exists. */
Test(cfx_run, failed_rank_stops_the_others)
{
    char *out, dir[] = "/tmp/cfx_run_stopXXXXXX", args[1024];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(args, sizeof(args),
             "-n 3 sh -c 'trap \"echo rank $CFX_RANK stopped by SIGTERM; kill $! 2>/dev/null; "
             "exit 143\" TERM; if [ $CFX_RANK = 1 ]; then i=0; while [ ! -e %s/0 ] || "
             "[ ! -e %s/2 ]; do i=$((i+1)); [ $i -lt 6000 ] || exit 4; sleep 0.01; done; exit 3; "
             "fi; sleep 600 & touch %s/$CFX_RANK; wait'",
             dir, dir, dir);
    int rc = run(args, &out, NULL);
    char rm[128];
    snprintf(rm, sizeof(rm), "rm -rf %s", dir);
    cr_assert_eq(system(rm), 0);
    cr_assert_eq(rc, 3, "output:\n%s", out);
    cr_assert(strstr(out, "cfx_run: rank 1 exited with status 3"), "output:\n%s", out);
    cr_assert(strstr(out, "[0] rank 0 stopped by SIGTERM"), "rank 0 not stopped:\n%s", out);
    cr_assert(strstr(out, "[2] rank 2 stopped by SIGTERM"), "rank 2 not stopped:\n%s", out);
    free(out);
}

/* Rank 1 ignores SIGTERM and never ends by itself: that cfx_run returns at
 * all (within the suite's timeout) and says SIGKILL is the check. */
Test(cfx_run, rank_ignoring_sigterm_is_killed)
{
    char *out, dir[] = "/tmp/cfx_run_killXXXXXX", args[1024], rm[128];
    cr_assert_not_null(mkdtemp(dir));
    /* rank 0 fails once rank 1 ignores SIGTERM (it leaves a file) */
    snprintf(args, sizeof(args),
             "-n 2 sh -c 'trap \"\" TERM; if [ $CFX_RANK = 0 ]; then i=0; while [ ! -e %s/1 ]; "
             "do i=$((i+1)); [ $i -lt 6000 ] || exit 4; sleep 0.01; done; exit 1; fi; "
             "touch %s/1; while :; do sleep 0.1; done'",
             dir, dir);
    int rc = run(args, &out, NULL);
    snprintf(rm, sizeof(rm), "rm -rf %s", dir);
    cr_assert_eq(system(rm), 0);
    cr_assert_eq(rc, 1, "output:\n%s", out);
    cr_assert(strstr(out, "SIGKILL"), "output:\n%s", out);
    free(out);
}

/* A rank allowed to fail that does: its status is said, as any rank's is
 * (it said "exited non-zero"), and cfx_run exits 0. */
Test(cfx_run, allowed_rank_failing_says_its_status)
{
    char *out;
    int rc = run("-n 2 --allow-fail 1 sh -c 'exit $((CFX_RANK * 9))'", &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    cr_assert(strstr(out, "cfx_run: rank 1 (allowed to fail) exited with status 9"),
              "output:\n%s", out);
    free(out);
}

Test(cfx_run, killed_rank_gives_128_plus_signal)
{
    char *out;
    int rc =
        run("-n 2 sh -c 'if [ $CFX_RANK = 0 ]; then kill -SEGV $$; fi; exec sleep 60'", &out, NULL);
    cr_assert_eq(rc, 128 + 11, "output:\n%s", out);
    cr_assert(strstr(out, "cfx_run: rank 0 exited with signal SIGSEGV"), "output:\n%s", out);
    free(out);
}

Test(cfx_run, timeout_exits_124)
{
    char *out;
    double secs;
    int rc = run("-n 2 --timeout 0.5 sleep 600", &out, &secs);
    cr_assert_eq(rc, 124, "output:\n%s", out);
    cr_assert(strstr(out, "timed out"), "output:\n%s", out);
    cr_assert_geq(secs, 0.5, "timed out after %.1f s, before its 0.5 s", secs);
    free(out);
}

Test(cfx_run, usage_errors)
{
    char *out;

    /* usage errors exit 2; test_tool_args checks what they say */
    cr_assert_eq(run("sh -c true", &out, NULL), 2, "no -n accepted:\n%s", out);
    free(out);
    cr_assert_eq(run("-n 0 true", &out, NULL), 2);
    free(out);
    cr_assert_eq(run("-n 2", &out, NULL), 2, "no command accepted:\n%s", out);
    free(out);
    cr_assert_eq(run("-n 1 --timeout -1 true", &out, NULL), 2);
    free(out);
    cr_assert_eq(run("-n 1 --chunk-size lots true", &out, NULL), 2);
    free(out);
    /* the rank's own status: 127, the shell's "not found" */
    cr_assert_eq(run("-n 1 /nonexistent/program", &out, NULL), 127);
    cr_assert(strstr(out, "cannot execute /nonexistent/program: No such file or directory\n"),
              "output:\n%s", out);
    free(out);
    /* several ranks: the first to fail ends the others, each of which said
     * why in one line or not at all (its reason came in a write of its own
     * before, and a rank terminated between the two left "...: " alone) */
    cr_assert_eq(run("-n 4 /nonexistent/program", &out, NULL), 127);
    int whole = 0;
    for (const char *l = out; (l = strstr(l, "cannot execute ")); l++) {
        const char *eol = strchr(l, '\n');
        cr_assert(eol, "a line without its end:\n%s", out);
        static const char why[] = "/nonexistent/program: No such file or directory";
        cr_assert((size_t)(eol - l) == strlen("cannot execute ") + strlen(why) &&
                  !strncmp(l + strlen("cannot execute "), why, strlen(why)),
                  "a line cut short:\n%s", out);
        whole++;
    }
    cr_assert_geq(whole, 1, "output:\n%s", out);
    free(out);
}

Test(cfx_run, sigterm_is_forwarded)
{
    char cmd[2048], *out;

    /* cfx_run in the background; SIGTERM to it once both ranks have set
     * their trap (each touches a file then), or after 20 s at worst. */
    snprintf(
        cmd, sizeof(cmd),
        "d=$(mktemp -d); "
        "%s/cfx_run -n 2 sh -c 'trap \"echo got TERM; exit 7\" TERM; echo ready; "
        "touch '$d'/$CFX_RANK; sleep 60 & wait' 2>&1 & p=$!; "
        "i=0; while [ $i -lt 200 ] && ! [ -e $d/0 -a -e $d/1 ]; do sleep 0.1; i=$((i+1)); done; "
        "kill -TERM $p; wait $p; echo \"status $?\"; rm -rf $d",
        CFX_BIN_DIR);
    int rc = run_sh(cmd, &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    cr_assert(has_line(out, "[0] ready") && has_line(out, "[1] ready"), "output:\n%s", out);
    cr_assert(has_line(out, "[0] got TERM"), "output:\n%s", out);
    cr_assert(has_line(out, "[1] got TERM"), "output:\n%s", out);
    cr_assert(strstr(out, "cfx_run: got SIGTERM: forwarding to 2 ranks"), "output:\n%s", out);
    cr_assert(has_line(out, "status 143"), "output:\n%s", out);
    free(out);
}

/* SIGINT, then SIGTERM: the second kills every rank, and the message names
 * both signals (it said "SIGTERM again" though the first was SIGINT).  The
 * ranks ignore SIGINT, so only the second signal ends them; the SIGTERM is
 * sent once cfx_run said it forwarded the SIGINT. */
Test(cfx_run, second_signal_names_both)
{
    char cmd[2048], *out;

    snprintf(
        cmd, sizeof(cmd),
        "d=$(mktemp -d); "
        "%s/cfx_run -n 2 sh -c 'trap \"\" INT; touch '$d'/$CFX_RANK; exec sleep 60' "
        ">$d/out 2>&1 & p=$!; "
        "i=0; while [ $i -lt 200 ] && ! [ -e $d/0 -a -e $d/1 ]; do sleep 0.1; i=$((i+1)); done; "
        "kill -INT $p; "
        "i=0; while [ $i -lt 200 ] && ! grep -q forwarding $d/out; do sleep 0.1; i=$((i+1)); "
        "done; kill -TERM $p; wait $p; echo \"status $?\"; cat $d/out; rm -rf $d",
        CFX_BIN_DIR);
    int rc = run_sh(cmd, &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    cr_assert(has_line(out, "cfx_run: got SIGINT: forwarding to 2 ranks"), "output:\n%s", out);
    cr_assert(has_line(out, "cfx_run: second signal (SIGTERM; the first was SIGINT): killing "
                            "every rank"), "output:\n%s", out);
    cr_assert(has_line(out, "status 130"), "output:\n%s", out);
    free(out);
}

/*
 * A rank killed from outside (SIGKILL, as the OOM killer or an operator
 * would) while cfx_run waits for its ranks.  Rank 1 writes its pid and
 * sleeps; ranks 0 and 2 set a SIGTERM trap and leave a file; once all three
 * files are there the shell kills rank 1.  cfx_run names the rank and the
 * signal, stops the others (each says so from its trap) and exits 128+9.
 */
Test(cfx_run, rank_killed_while_waiting)
{
    char cmd[2048], *out;

    snprintf(
        cmd, sizeof(cmd),
        "d=$(mktemp -d); "
        "%s/cfx_run -n 3 sh -c 'if [ $CFX_RANK = 1 ]; then echo $$ > '$d'/pid.tmp; "
        "mv '$d'/pid.tmp '$d'/pid; exec sleep 600; fi; "
        "trap \"echo rank $CFX_RANK stopped by SIGTERM; kill $! 2>/dev/null; exit 143\" TERM; "
        "sleep 600 & touch '$d'/$CFX_RANK; wait' 2>&1 & p=$!; "
        "i=0; while [ $i -lt 600 ] && ! [ -e $d/0 -a -e $d/2 -a -e $d/pid ]; do "
        "sleep 0.1; i=$((i+1)); done; "
        "kill -KILL $(cat $d/pid); wait $p; echo \"status $?\"; rm -rf $d",
        CFX_BIN_DIR);
    int rc = run_sh(cmd, &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    cr_assert(strstr(out, "cfx_run: rank 1 exited with signal SIGKILL"), "output:\n%s", out);
    cr_assert(has_line(out, "[0] rank 0 stopped by SIGTERM"), "rank 0 not stopped:\n%s", out);
    cr_assert(has_line(out, "[2] rank 2 stopped by SIGTERM"), "rank 2 not stopped:\n%s", out);
    cr_assert(has_line(out, "status 137"), "output:\n%s", out);
    free(out);
}

/* The same kill of a rank that is allowed to fail: the others are not
 * stopped; each sees the victim gone (its pid no longer exists), says so
 * and exits 0, and so does cfx_run. */
Test(cfx_run, allowed_rank_killed_while_waiting)
{
    char cmd[2048], *out;

    snprintf(
        cmd, sizeof(cmd),
        "d=$(mktemp -d); "
        "%s/cfx_run -n 3 --allow-fail 1 sh -c 'if [ $CFX_RANK = 1 ]; then "
        "echo $$ > '$d'/pid.tmp; mv '$d'/pid.tmp '$d'/pid; exec sleep 600; fi; "
        "touch '$d'/$CFX_RANK; i=0; while [ ! -e '$d'/pid ] || kill -0 $(cat '$d'/pid) "
        "2>/dev/null; do i=$((i+1)); [ $i -lt 6000 ] || exit 4; sleep 0.01; done; "
        "echo rank $CFX_RANK saw the victim gone' 2>&1 & p=$!; "
        "i=0; while [ $i -lt 600 ] && ! [ -e $d/0 -a -e $d/2 -a -e $d/pid ]; do "
        "sleep 0.1; i=$((i+1)); done; "
        "kill -KILL $(cat $d/pid); wait $p; echo \"status $?\"; rm -rf $d",
        CFX_BIN_DIR);
    int rc = run_sh(cmd, &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    cr_assert(strstr(out, "cfx_run: rank 1 (allowed to fail) exited with signal SIGKILL"),
              "output:\n%s", out);
    cr_assert(has_line(out, "[0] rank 0 saw the victim gone"), "output:\n%s", out);
    cr_assert(has_line(out, "[2] rank 2 saw the victim gone"), "output:\n%s", out);
    cr_assert(has_line(out, "status 0"), "output:\n%s", out);
    free(out);
}

/* ---- --hosts: ranks started through a remote shell ------------------------ */

/*
 * Fake remote shells, written into @p dir: "rsh HOST CMD" runs the shell
 * command CMD here, as ssh runs it on HOST, with CFX_TEST_HOST=HOST so that
 * a rank can say where it was sent.  "rsh-detached" also runs CMD in a
 * session of its own, so that, as with ssh, a signal to the rsh's process
 * group does not reach the remote command: only the end of its stdin does.
 */
static void write_fake_rsh(const char *dir)
{
    char path[256];
    FILE *f;

    snprintf(path, sizeof(path), "%s/rsh", dir);
    f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "#!/bin/sh\nCFX_TEST_HOST=$1; export CFX_TEST_HOST; shift\nexec sh -c \"$*\"\n");
    fclose(f);
    cr_assert_eq(chmod(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/rsh-detached", dir);
    f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "#!/bin/sh\nCFX_TEST_HOST=$1; export CFX_TEST_HOST; shift\n"
               "exec 3<&0\nsetsid -w sh -c \"$*\" <&3 3<&- &\nwait $!\n");
    fclose(f);
    cr_assert_eq(chmod(path, 0755), 0);
}

/*
 * Four ranks on three "hosts" (ha:2,hb,hc) through the fake rsh: each says
 * where it runs and its local rank (placement by slot: 0,1 on ha, 2 on hb,
 * 3 on hc), checks that the token's value is neither in its own nor in its
 * remote wrapper's (its parent's) /proc cmdline and environ, that its token
 * file is mode 600 and not the --token-file path, then runs cfx_boottest:
 * an int32 allreduce through cfx_run's coordinator, every element compared.
 * The token files made on the "hosts" are gone afterwards, and -x values
 * arrive as given (a quote and a $ in one).
 */
Test(cfx_run, hosts_allreduce_through_rsh_token_off_cmdline_and_environ)
{
    char *out, dir[] = "/tmp/cfx_run_hostsXXXXXX", args[2048], path[256];
    cr_assert_not_null(mkdtemp(dir));
    write_fake_rsh(dir);
    snprintf(path, sizeof(path), "%s/token", dir);
    FILE *tf = fopen(path, "w");
    cr_assert_not_null(tf);
    fprintf(tf, "9f3c1a77d04e4b2a8c55e2d1b6a09f31\n");
    fclose(tf);
    cr_assert_eq(chmod(path, 0600), 0);
    snprintf(args, sizeof(args),
             "--hosts ha:2,hb,hc -n 4 --rsh %s/rsh --coord-addr 127.0.0.1 --token-file %s "
             "--timeout 50 -x 'CFX_XV=it'\\''s $HOME' -x PLAIN_XV=7 sh -c '"
             "echo \"x $CFX_XV $PLAIN_XV\"; "
             "p=9f3c1a77; p=${p}d04e4b2a; n=0; for q in $$ $PPID; do "
             "n=$((n + $(tr \"\\0\" \"\\n\" < /proc/$q/cmdline | grep -c $p))); "
             "n=$((n + $(tr \"\\0\" \"\\n\" < /proc/$q/environ | grep -c $p))); done; "
             "echo seen $n mode $(stat -c %%a $CFX_TOKEN_FILE); echo file $CFX_TOKEN_FILE; "
             "echo on $CFX_TEST_HOST local $CFX_LOCAL_RANK of $CFX_WORLD_SIZE; "
             "[ $CFX_TOKEN_FILE != %s ] || echo same file; "
             "exec %s/cfx_boottest 100003'",
             dir, path, path, CFX_BIN_DIR);
    int rc = run(args, &out, NULL);
    cr_assert_eq(rc, 0, "output:\n%s", out);
    static const char *const where[4] = { "ha local 0", "ha local 1", "hb local 0",
                                          "hc local 0" };
    char sum[64] = "";
    for (int r = 0; r < 4; r++) {
        char l[128], *ok, file[256] = "";
        snprintf(l, sizeof(l), "[%d] seen 0 mode 600", r);
        cr_assert(has_line(out, l), "missing '%s' in:\n%s", l, out);
        snprintf(l, sizeof(l), "[%d] on %s of 4", r, where[r]);
        cr_assert(has_line(out, l), "missing '%s' in:\n%s", l, out);
        /* -x values reach the host verbatim: quotes and $ pass the remote shell */
        snprintf(l, sizeof(l), "[%d] x it's $HOME 7", r);
        cr_assert(has_line(out, l), "missing '%s' in:\n%s", l, out);
        snprintf(l, sizeof(l), "[%d] rank %d/4 ok: ", r, r);
        ok = strstr(out, l);
        cr_assert_not_null(ok, "rank %d did not check its allreduce:\n%s", r, out);
        if (!sum[0])
            sscanf(ok + strlen(l), "%63s", sum);
        snprintf(l + strlen(l), sizeof(l) - strlen(l), "%s", sum);
        cr_assert(has_line(out, l), "rank %d's sum differs from '%s':\n%s", r, sum, out);
        snprintf(l, sizeof(l), "[%d] file ", r);
        const char *f = strstr(out, l);
        cr_assert_not_null(f, "%s", out);
        sscanf(f + strlen(l), "%255s", file);
        cr_assert(access(file, F_OK) != 0, "rank %d's token file %s left behind", r, file);
    }
    cr_assert_null(strstr(out, "same file"), "%s", out);
    free(out);
    snprintf(args, sizeof(args), "rm -rf %s", dir);
    cr_assert_eq(system(args), 0);
}

/*
 * Through an rsh that, like ssh, does not pass signals on (rsh-detached):
 * rank 1 on hb exits 3 once ranks 0 and 2 have their SIGTERM trap set;
 * cfx_run exits 3 naming the rank and its host, and the other two remote
 * commands are stopped by the end of their stdin (the lifeline cfx_run
 * closes): each trap leaves a file, waited for here (up to 20 s).
 */
Test(cfx_run, hosts_failing_rank_gives_its_status_and_stops_the_others)
{
    char *out, dir[] = "/tmp/cfx_run_hfailXXXXXX", args[2048];
    cr_assert_not_null(mkdtemp(dir));
    write_fake_rsh(dir);
    snprintf(args, sizeof(args),
             "--hosts ha,hb,hc --rsh %s/rsh-detached --coord-addr 127.0.0.1 --timeout 50 "
             "sh -c 'if [ $CFX_RANK = 1 ]; then i=0; while [ ! -e %s/0 ] || [ ! -e %s/2 ]; do "
             "i=$((i+1)); [ $i -lt 6000 ] || exit 4; sleep 0.01; done; exit 3; fi; "
             "trap \"touch %s/stopped.$CFX_RANK; kill $! 2>/dev/null; exit 143\" TERM; "
             "sleep 600 & touch %s/$CFX_RANK; wait'",
             dir, dir, dir, dir, dir);
    int rc = run(args, &out, NULL);
    cr_assert_eq(rc, 3, "output:\n%s", out);
    cr_assert(strstr(out, "cfx_run: rank 1 on hb exited with status 3"), "output:\n%s", out);
    for (int r = 0; r <= 2; r += 2) {
        char f[128];
        snprintf(f, sizeof(f), "%s/stopped.%d", dir, r);
        for (int i = 0; i < 2000 && access(f, F_OK) != 0; i++)
            usleep(10000);
        cr_assert(access(f, F_OK) == 0, "rank %d was not stopped:\n%s", r, out);
    }
    free(out);
    snprintf(args, sizeof(args), "rm -rf %s", dir);
    cr_assert_eq(system(args), 0);
}
