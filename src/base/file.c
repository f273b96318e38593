/* Writing a file safely: output paths are checked before anything is written,
 * data goes to a fresh temporary file beside the target (created with O_EXCL, so a
 * planted symlink or FIFO at the temporary name is never followed), and the rename
 * happens only after the data is durable and the target is checked again. A target
 * that exists and is not a regular file (a device node, a FIFO, a socket, a
 * directory, a symlink) is refused: renaming over /dev/null as root would replace
 * the device node with our file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

static const char *kind_of(mode_t m) {
    if (S_ISLNK(m)) return "a symbolic link";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

pkv_status pkv_file_check_output(const char *path) {
    if (!path || !*path) return pkv_err(PKV_ERR_INVALID, "output path is empty");
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return PKV_OK;
        return pkv_err(PKV_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        return pkv_err(PKV_ERR_IO, "%s is %s; refusing to replace it (write to a regular file or a new path)", path,
                       kind_of(st.st_mode));
    return PKV_OK;
}

int pkv_file_open_lock(const char *path) {
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        pkv_err(PKV_ERR_IO, "the lock file %s is %s, not a regular file: refused (a lock file is never followed; "
                            "remove it)", path, kind_of(st.st_mode));
        errno = EINVAL;
        return -1;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP) /* made a symlink after the lstat */
            pkv_err(PKV_ERR_IO, "the lock file %s is a symbolic link: refused (a lock file is never followed; "
                                "remove it)", path);
        else
            pkv_err(PKV_ERR_IO, "cannot create the lock file %s: %s", path, strerror(e));
        errno = e;
    }
    return fd;
}

pkv_status pkv_wfile_open(pkv_wfile *w, const char *path) {
    memset(w, 0, sizeof *w);
    pkv_status s = pkv_file_check_output(path);
    if (s) return s;
    size_t n = strlen(path);
    w->path = pkv_strdup(path);
    w->tmp = pkv_malloc(n + 16);
    if (!w->path || !w->tmp) {
        pkv_free(w->path);
        pkv_free(w->tmp);
        memset(w, 0, sizeof *w);
        return pkv_err(PKV_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(w->tmp, path, n);
    memcpy(w->tmp + n, ".tmp-XXXXXX", 12);
    int fd = mkstemp(w->tmp); /* O_CREAT|O_EXCL, mode 0600 */
    if (fd < 0) {
        s = pkv_err(PKV_ERR_IO, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
        pkv_free(w->path);
        pkv_free(w->tmp);
        memset(w, 0, sizeof *w);
        return s;
    }
    /* the permissions a plain fopen would have given (0666 less the umask) */
    mode_t um = umask(022);
    umask(um);
    (void)fchmod(fd, 0666 & ~um);
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        s = pkv_err(PKV_ERR_IO, "%s: %s", w->tmp, strerror(errno));
        close(fd);
        unlink(w->tmp);
        pkv_free(w->path);
        pkv_free(w->tmp);
        memset(w, 0, sizeof *w);
        return s;
    }
    return PKV_OK;
}

void pkv_wfile_abort(pkv_wfile *w) {
    if (!w || !w->tmp) return;
    if (w->f) fclose(w->f);
    unlink(w->tmp);
    pkv_free(w->path);
    pkv_free(w->tmp);
    memset(w, 0, sizeof *w);
}

/* The rename is a change of the directory: fsync the directory too, or a power
 * loss may forget the new name (the file's data was already synced). Filesystems
 * that cannot sync a directory (EINVAL) or are read-only (EROFS) are let be, as for
 * the file. After an error here the file is in place under its name; only its
 * surviving a power loss is not known. */
static pkv_status sync_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = NULL;
    if (slash) {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        if (!(dir = pkv_malloc(n + 1))) return pkv_err(PKV_ERR_NOMEM, "%s: out of memory", path);
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    int fd = open(dir ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0 && fsync(fd) != 0 && errno != EINVAL && errno != EROFS) err = errno;
    if (fd >= 0) close(fd);
    pkv_status s = PKV_OK;
    if (err) s = pkv_err(PKV_ERR_IO, "%s: written and renamed, but its directory %s could not be synced: %s", path,
                         dir ? dir : ".", strerror(err));
    pkv_free(dir);
    return s;
}

pkv_status pkv_wfile_commit(pkv_wfile *w) {
    if (!w || !w->f) return pkv_err(PKV_ERR_INVALID, "commit: no file open");
    int err = ferror(w->f) ? (errno ? errno : EIO) : 0;
    if (fflush(w->f) != 0 && !err) err = errno ? errno : EIO;
    /* durable before the rename, so a crash never leaves a renamed partial file */
    if (!err && fsync(fileno(w->f)) != 0 && errno != EINVAL && errno != EROFS) err = errno;
    if (fclose(w->f) != 0 && !err) err = errno ? errno : EIO;
    w->f = NULL;
    pkv_status s = PKV_OK;
    if (err) s = pkv_err(PKV_ERR_IO, "%s: write failed: %s", w->path, strerror(err));
    /* the target may have changed since open: check it again just before the rename */
    if (!s) s = pkv_file_check_output(w->path);
    if (!s && rename(w->tmp, w->path) != 0)
        s = pkv_err(PKV_ERR_IO, "%s: cannot rename %s over it: %s", w->path, w->tmp, strerror(errno));
    if (s) unlink(w->tmp);
    else s = sync_dir_of(w->path);
    pkv_free(w->path);
    pkv_free(w->tmp);
    memset(w, 0, sizeof *w);
    return s;
}
