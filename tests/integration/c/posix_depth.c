/* Calls Python cannot issue directly, for test_fuse_posix_depth.py.
 *
 *   posix_depth seekdir DIR      telldir/seekdir at random positions while entries
 *                                are added and removed: prints "ok" or the failure
 *   posix_depth aio_direct FILE  an asynchronous (Linux AIO) O_DIRECT write after a
 *                                buffered read of the same range; then a buffered
 *                                read must return the new bytes: prints "ok" or the failure
 *   posix_depth direct_write FILE OFF   one 4096-byte O_DIRECT write of 'y' at OFF: prints "ok"
 *   posix_depth exec PATH        execv(PATH) (prints the errno name if that fails)
 *   posix_depth as UID CMD ...   run CMD (one of the above) as UID/GID UID, no groups
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/syscall.h>
#include <unistd.h>

#define N 200

/* Partial reads, telldir at random points, entries removed (also the ones just
 * read) and added between reads, then seekdir back to a remembered point: the
 * next entry is never EOF while an entry that existed throughout follows it. */
static int seekdir_interleaved(const char *dir) {
    char path[4096];
    DIR *d = opendir(dir);
    if (!d) { perror("opendir"); return 2; }
    long marks[64];
    char after[64][256];  /* the entry read right after each mark */
    int nm = 0, created = 0;
    for (int round = 0; round < 400; round++) {
        int op = rand() % 4;
        if (op == 0 && nm < 64) {
            long pos = telldir(d);
            struct dirent *e = readdir(d);
            if (!e) { seekdir(d, 0); continue; }
            marks[nm] = pos;
            snprintf(after[nm], sizeof after[nm], "%s", e->d_name);
            nm++;
        } else if (op == 1) {
            for (int k = rand() % 20; k >= 0; k--) if (!readdir(d)) break;
        } else if (op == 2) {
            snprintf(path, sizeof path, "%s/x%05d", dir, created++);
            int fd = open(path, O_CREAT | O_WRONLY, 0644);
            if (fd < 0) { perror("create"); return 2; }
            close(fd);
            if (created % 3 == 0) {
                snprintf(path, sizeof path, "%s/x%05d", dir, rand() % created);
                unlink(path);
            }
        } else if (nm > 0) {
            int i = rand() % nm;
            seekdir(d, marks[i]);
            struct dirent *e;
            do { e = readdir(d); } while (e && (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")));
            /* Entries named e* with an even number survive throughout; after[i]
             * might have been removed, but anything sorting after it must come. */
            int want_more = 0;
            char last[64];
            snprintf(last, sizeof last, "e%04d", N - 1);
            if (strcmp(after[i], last) < 0 && after[i][0] == 'e') want_more = 1;
            if (!e && want_more) {
                printf("round %d: seekdir to the mark before %s gave EOF\n", round, after[i]);
                return 1;
            }
        }
    }
    closedir(d);
    printf("ok\n");
    return 0;
}

static int seekdir_test(const char *dir) {
    char path[4096];
    srand(12345);
    for (int i = 0; i < N; i++) {
        snprintf(path, sizeof path, "%s/e%04d", dir, i);
        int fd = open(path, O_CREAT | O_WRONLY, 0644);
        if (fd < 0) { perror("create"); return 2; }
        close(fd);
    }
    DIR *d = opendir(dir);
    if (!d) { perror("opendir"); return 2; }
    /* Read everything once, remembering the telldir offset before each entry. */
    long offs[N + 8];
    char names[N + 8][64];
    int n = 0;
    for (;;) {
        long pos = telldir(d);
        struct dirent *e = readdir(d);
        if (!e) break;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n >= N + 8) { printf("too many entries\n"); return 1; }
        offs[n] = pos;
        snprintf(names[n], sizeof names[n], "%s", e->d_name);
        n++;
    }
    if (n != N) { printf("listed %d entries, expected %d\n", n, N); return 1; }
    /* Remove every third entry (not the ones we will seek to) and add new ones. */
    int removed[N] = {0};
    for (int i = 0; i < N; i += 3) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (unlink(path)) { perror("unlink"); return 2; }
        removed[i] = 1;
    }
    for (int i = 0; i < 50; i++) {
        snprintf(path, sizeof path, "%s/new%04d", dir, i);
        int fd = open(path, O_CREAT | O_WRONLY, 0644);
        if (fd < 0) { perror("create new"); return 2; }
        close(fd);
    }
    /* Seek to random remembered offsets: the entry read next is the one that
     * was there, unless it was removed meanwhile; never EOF before the end. */
    for (int k = 0; k < 300; k++) {
        int i = rand() % n;
        seekdir(d, offs[i]);
        struct dirent *e = readdir(d);
        if (!e) { printf("seek to offset of entry %d (%s): EOF\n", i, names[i]); return 1; }
        if (!removed[i] && strcmp(e->d_name, names[i])) {
            printf("seek to offset of entry %d: got %s, expected %s\n", i, e->d_name, names[i]);
            return 1;
        }
        /* The rest of the listing from there: no entry twice, none of the survivors missed. */
        if (k % 50 == 0) {
            int seen[N] = {0};
            int pos = -1;
            do {
                if (!strncmp(e->d_name, "e", 1)) {
                    int j = atoi(e->d_name + 1);
                    if (seen[j]++) { printf("entry %s returned twice\n", e->d_name); return 1; }
                    if (removed[j]) { printf("removed entry %s returned\n", e->d_name); return 1; }
                    if (pos < 0) pos = j;
                }
            } while ((e = readdir(d)) != NULL);
            for (int j = i; j < n; j++) {
                int idx = atoi(names[j] + 1);
                if (!removed[j] && !seen[idx]) {
                    printf("after seeking to entry %d, surviving entry %s missing\n", i, names[j]);
                    return 1;
                }
            }
        }
    }
    closedir(d);
    return seekdir_interleaved(dir);
}

static int aio_direct_test(const char *file) {
    enum { SZ = 65536 };
    char *old, *neu, *got;
    if (posix_memalign((void **)&old, 4096, SZ) || posix_memalign((void **)&neu, 4096, SZ) ||
        posix_memalign((void **)&got, 4096, SZ))
        return 2;
    memset(old, 'o', SZ);
    memset(neu, 'n', SZ);
    int bfd = open(file, O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (bfd < 0) { perror("open"); return 2; }
    if (pwrite(bfd, old, SZ, 0) != SZ || fsync(bfd)) { perror("pwrite"); return 2; }
    int dfd = open(file, O_RDWR | O_DIRECT);
    if (dfd < 0) { perror("open O_DIRECT"); return 2; }
    /* A buffered read after both opens: the old bytes are now in the page cache. */
    if (pread(bfd, got, SZ, 0) != SZ || memcmp(got, old, SZ)) { printf("first read wrong\n"); return 1; }
    aio_context_t ctx = 0;
    if (syscall(SYS_io_setup, 8, &ctx)) { perror("io_setup"); return 2; }
    struct iocb cb;
    memset(&cb, 0, sizeof cb);
    cb.aio_fildes = dfd;
    cb.aio_lio_opcode = IOCB_CMD_PWRITE;
    cb.aio_buf = (unsigned long)neu;
    cb.aio_nbytes = SZ;
    cb.aio_offset = 0;
    struct iocb *cbs[1] = {&cb};
    if (syscall(SYS_io_submit, ctx, 1, cbs) != 1) { perror("io_submit"); return 2; }
    struct io_event ev;
    if (syscall(SYS_io_getevents, ctx, 1, 1, &ev, NULL) != 1) { perror("io_getevents"); return 2; }
    if ((long)ev.res != SZ) { printf("aio write returned %lld\n", (long long)ev.res); return 1; }
    syscall(SYS_io_destroy, ctx);
    memset(got, 0, SZ);
    if (pread(bfd, got, SZ, 0) != SZ) { perror("pread"); return 2; }
    if (memcmp(got, neu, SZ)) {
        printf("buffered read after O_DIRECT aio write returned old bytes (first byte %c)\n", got[0]);
        return 1;
    }
    close(dfd);
    close(bfd);
    printf("ok\n");
    return 0;
}

static int direct_write(const char *file, long off) {
    char *buf;
    if (posix_memalign((void **)&buf, 4096, 4096)) return 2;
    memset(buf, 'y', 4096);
    int fd = open(file, O_WRONLY | O_DIRECT);
    if (fd < 0) { printf("open: %s\n", strerrorname_np(errno)); return 1; }
    if (pwrite(fd, buf, 4096, off) != 4096) { printf("pwrite: %s\n", strerrorname_np(errno)); return 1; }
    if (close(fd)) { printf("close: %s\n", strerrorname_np(errno)); return 1; }
    printf("ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "as")) {
        int id = atoi(argv[2]);
        if (setgroups(0, NULL) || setresgid(id, id, id) || setresuid(id, id, id)) {
            perror("drop privileges");
            return 2;
        }
        argc -= 2;
        argv += 2;
    }
    if (argc == 3 && !strcmp(argv[1], "exec")) {
        char *args[] = {argv[2], NULL};
        execv(argv[2], args);
        printf("%s\n", strerrorname_np(errno));
        fflush(stdout);
        return 126;
    }
    if (argc == 4 && !strcmp(argv[1], "direct_write")) return direct_write(argv[2], atol(argv[3]));
    if (argc == 3 && !strcmp(argv[1], "seekdir")) return seekdir_test(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "aio_direct")) return aio_direct_test(argv[2]);
    fprintf(stderr, "usage: %s [as UID] seekdir DIR | aio_direct FILE | direct_write FILE OFF | exec PATH\n", argv[0]);
    return 2;
}
