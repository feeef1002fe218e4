//go:build cgo && amd64

// The native sandbox's init, in C without a C library: raw system calls and
// a few helpers of its own. The worker starts one init per sandbox, so the
// init's start is on the creation path, and on this machine's virtual CPU a
// program's start is dominated by the CPUID instructions its runtime runs
// to pick string routines (glibc's start cost 0.9 ms of CPU, a Go program's
// 1.1 ms, this one's 0.1 ms). Built two ways from this one file:
//
//   - standalone (scripts/build-sandbox-init.sh, BRISK_INIT_STANDALONE):
//     its own _start, no libc linked at all: bin/brisk-sandbox-init, what
//     workers run;
//   - in the nsinit package by cgo: a constructor that takes over, before
//     the Go runtime starts, any binary linking the package when its first
//     argument is "__native-init" — brisk itself when brisk-sandbox-init is
//     not installed, and the native runtime's test binary.
//
// Either way it never returns: it execs the function or exits. The bind
// message's layout is nsinit.go's (Bind.Encode); this file is its reader.

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define CONTROL_FD 3
#define MAX_MESSAGE (192 << 10)  // nsinit.MaxMessage
#define MAX_FDS 4
#define SECRETS_DIR "/var/openfaas/secrets"  // nsinit.SecretsDir
#define MAGIC "BRB3"                        // nsinit.bindMagic (its version: 3 has the bind mounts)
#define PAGE 4096                           // tmpfs sizes only: rounding up is harmless

// ---- system calls ----

static long sys6(long n, long a, long b, long c, long d, long e, long f) {
#if defined(__x86_64__)
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
#else
#error "brisk's sandbox init is written for amd64"
#endif
}

// S makes a system call; it returns -errno on failure, as the kernel does.
#define S(n, a, b, c, d, e, f) sys6(n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))
#define S1(n, a) S(n, a, 0, 0, 0, 0, 0)
#define S2(n, a, b) S(n, a, b, 0, 0, 0, 0)
#define S3(n, a, b, c) S(n, a, b, c, 0, 0, 0)
#define S4(n, a, b, c, d) S(n, a, b, c, d, 0, 0)
#define S5(n, a, b, c, d, e) S(n, a, b, c, d, e, 0)

static long x_write(int fd, const void *p, size_t n) { return S3(SYS_write, fd, p, n); }
static void x_exit(int code) {
  for (;;) S1(SYS_exit_group, code);
}
static long x_mount(const char *src, const char *dst, const char *type, unsigned long flags, const void *data) {
  return S5(SYS_mount, src, dst, type, flags, data);
}
static long x_mkdir(const char *p, int mode) { return S3(SYS_mkdirat, AT_FDCWD, p, mode); }
static long x_chmod(const char *p, int mode) { return S4(SYS_fchmodat, AT_FDCWD, p, mode, 0); }
static long x_open(const char *p, int flags, int mode) { return S4(SYS_openat, AT_FDCWD, p, flags, mode); }
static long x_close(int fd) { return S1(SYS_close, fd); }
static long x_stat(const char *p, struct stat *st, int flags) { return S4(SYS_newfstatat, AT_FDCWD, p, st, flags); }
static long x_chdir(const char *p) { return S1(SYS_chdir, p); }

// ---- helpers a C library would have given ----

#ifdef BRISK_INIT_STANDALONE
// The compiler may call these for copies and clears of its own.
void *memcpy(void *d, const void *s, size_t n) {
  char *dd = d;
  const char *ss = s;
  while (n--) *dd++ = *ss++;
  return d;
}
void *memmove(void *d, const void *s, size_t n) {
  char *dd = d;
  const char *ss = s;
  if (dd < ss)
    while (n--) *dd++ = *ss++;
  else
    while (n--) dd[n] = ss[n];
  return d;
}
void *memset(void *d, int c, size_t n) {
  char *dd = d;
  while (n--) *dd++ = (char)c;
  return d;
}
int memcmp(const void *a, const void *b, size_t n) {
  const unsigned char *x = a, *y = b;
  for (; n; n--, x++, y++)
    if (*x != *y) return *x - *y;
  return 0;
}
#endif

static size_t x_strlen(const char *s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}
static int x_streq(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return *a == *b;
}
static int x_hasprefix(const char *s, const char *p) {
  while (*p)
    if (*s++ != *p++) return 0;
  return 1;
}
static const char *x_strchr(const char *s, char c) {
  for (; *s; s++)
    if (*s == c) return s;
  return 0;
}
static void x_copy(void *d, const void *s, size_t n) {
  char *dd = d;
  const char *ss = s;
  while (n--) *dd++ = *ss++;
}

// alloc hands out memory from a static arena (zero pages until touched):
// the init allocates only while decoding one message, and never frees.
// Each string costs its bytes, a NUL, rounding to 16 and an 8-byte pointer
// against 4 bytes of length in the message: at most 7 times the message.
static char arena[7 * MAX_MESSAGE];
static size_t arena_used;
static void fail(const char *fmt, ...);
static void *alloc(size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (n > sizeof arena - arena_used) fail("bind message: out of memory");
  void *p = arena + arena_used;
  arena_used += n;
  return p;
}

// fmtv is a small vsnprintf: %s, %.*s, %d, %u, %zu, %llu, %lld and %%.
struct out {
  char *p;
  size_t n, len;
};
static void put(struct out *o, char c) {
  if (o->len + 1 < o->n) o->p[o->len] = c;
  o->len++;
}
static void puts_n(struct out *o, const char *s, size_t n) {
  for (size_t i = 0; i < n && s[i]; i++) put(o, s[i]);
}
static void putu(struct out *o, unsigned long long v) {
  char d[24];
  int i = 0;
  do d[i++] = (char)('0' + v % 10);
  while (v /= 10);
  while (i) put(o, d[--i]);
}
static size_t fmtv(char *buf, size_t n, const char *f, va_list ap) {
  struct out o = {buf, n, 0};
  for (; *f; f++) {
    if (*f != '%') {
      put(&o, *f);
      continue;
    }
    f++;
    size_t prec = (size_t)-1;
    if (f[0] == '.' && f[1] == '*') {
      prec = (size_t)va_arg(ap, int);
      f += 2;
    }
    int longs = 0;
    while (*f == 'l' || *f == 'z') f++, longs++;
    switch (*f) {
      case 's': {
        const char *s = va_arg(ap, const char *);
        puts_n(&o, s ? s : "(null)", prec);
        break;
      }
      case 'd': {
        long long v = longs ? va_arg(ap, long long) : va_arg(ap, int);
        if (v < 0) put(&o, '-'), v = -v;
        putu(&o, (unsigned long long)v);
        break;
      }
      case 'u':
        putu(&o, longs ? va_arg(ap, unsigned long long) : va_arg(ap, unsigned));
        break;
      case '%':
        put(&o, '%');
        break;
      default:
        put(&o, '?');
    }
  }
  if (n) o.p[o.len < n ? o.len : n - 1] = 0;
  return o.len < n ? o.len : n - 1;
}
static size_t fmt(char *buf, size_t n, const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  size_t k = fmtv(buf, n, f, ap);
  va_end(ap);
  return k;
}

// fail reports why the sandbox could not start — to the worker on the
// control socket, and to the log (stderr) — and ends the init.
static void fail(const char *f, ...) {
  static char msg[1024], line[1100];
  size_t k = fmt(msg, sizeof msg, "init: ");
  va_list ap;
  va_start(ap, f);
  k += fmtv(msg + k, sizeof msg - k, f, ap);
  va_end(ap);
  x_write(CONTROL_FD, msg, k);
  k = fmt(line, sizeof line, "brisk sandbox %s\n", msg);
  x_write(2, line, k);
  x_exit(127);
}

// es says what a (negative) system call result means, in Go's words, so
// that the worker's errors read the same as the syscall package's.
static const char *es(long r) {
  static const struct {
    int e;
    const char *s;
  } t[] = {
      {EPERM, "operation not permitted"}, {ENOENT, "no such file or directory"}, {EINTR, "interrupted system call"},
      {EIO, "input/output error"}, {E2BIG, "argument list too long"}, {ENOEXEC, "exec format error"},
      {EBADF, "bad file descriptor"}, {EAGAIN, "resource temporarily unavailable"}, {ENOMEM, "cannot allocate memory"},
      {EACCES, "permission denied"}, {EFAULT, "bad address"}, {EBUSY, "device or resource busy"},
      {EEXIST, "file exists"}, {EXDEV, "invalid cross-device link"}, {ENODEV, "no such device"},
      {ENOTDIR, "not a directory"}, {EISDIR, "is a directory"}, {EINVAL, "invalid argument"},
      {EMFILE, "too many open files"}, {ETXTBSY, "text file busy"}, {EFBIG, "file too large"},
      {ENOSPC, "no space left on device"}, {EROFS, "read-only file system"}, {EPIPE, "broken pipe"},
      {ENAMETOOLONG, "file name too long"}, {ENOSYS, "function not implemented"}, {ELOOP, "too many levels of symbolic links"},
      {ENOTEMPTY, "directory not empty"}, {EOPNOTSUPP, "operation not supported"}, {ELIBBAD, "accessing a corrupted shared library"},
  };
  int e = (int)-r;
  for (size_t i = 0; i < sizeof t / sizeof *t; i++)
    if (t[i].e == e) return t[i].s;
  static char b[32];
  fmt(b, sizeof b, "errno %d", e);
  return b;
}

// ---- the bind message (nsinit.Bind.Encode) ----

struct secret {
  char *name;
  uint64_t size;
};

struct file {
  char *name;  // under /etc
  char *data;
};

struct mnt {
  char *src;  // host path
  char *dst;  // path in the new root
};

struct bind {
  char *lower;
  char **argv;  // NULL-terminated
  char **env;   // NULL-terminated
  char *dir;
  uint32_t flags;
  uint32_t uid, gid;
  char *hostname;
  uint64_t caps;
  struct sock_filter *seccomp;
  uint32_t seccomp_len;  // instructions
  struct secret *secrets;
  uint32_t nsecrets;
  struct file *files;
  uint32_t nfiles;
  struct mnt *mounts;
  uint32_t nmounts;
};

#define FLAG_EXEC_FD 1u
#define FLAG_TEMPLATE 2u  // nsinit.Bind.Template
#define FLAG_STANDBY 4u   // nsinit.Bind.Standby
#define TEMPLATE_FD 10    // nsinit.TemplateFD

struct reader {
  const char *p, *end;
};

static void need(struct reader *r, size_t n) {
  if ((size_t)(r->end - r->p) < n) fail("bind message: cut short");
}

static uint32_t u32(struct reader *r) {
  uint32_t v;
  need(r, 4);
  x_copy(&v, r->p, 4);
  r->p += 4;
  return v;
}

static uint64_t u64(struct reader *r) {
  uint64_t v;
  need(r, 8);
  x_copy(&v, r->p, 8);
  r->p += 8;
  return v;
}

// str copies a length-prefixed string out as a C string; the encoder
// refuses NUL bytes, so none is cut short.
static char *str(struct reader *r) {
  uint32_t n = u32(r);
  need(r, n);
  char *s = alloc((size_t)n + 1);
  x_copy(s, r->p, n);
  s[n] = 0;
  r->p += n;
  return s;
}

static char **strs(struct reader *r) {
  uint32_t n = u32(r);
  if (n > MAX_MESSAGE / 4) fail("bind message: %u strings", n);
  char **v = alloc(((size_t)n + 1) * sizeof *v);
  for (uint32_t i = 0; i < n; i++) v[i] = str(r);
  v[n] = 0;
  return v;
}

static void decode(const char *msg, size_t n, struct bind *b) {
  struct reader r = {msg, msg + n};
  need(&r, 4);
  if (!x_hasprefix(r.p, MAGIC)) fail("bind message: not version " MAGIC);
  r.p += 4;
  b->lower = str(&r);
  b->argv = strs(&r);
  b->env = strs(&r);
  b->dir = str(&r);
  b->flags = u32(&r);
  b->uid = u32(&r);
  b->gid = u32(&r);
  b->hostname = str(&r);
  b->caps = u64(&r);
  uint32_t sl = u32(&r);
  need(&r, sl);
  if (sl % sizeof(struct sock_filter) != 0 || sl / sizeof(struct sock_filter) > 0xffff)
    fail("bind message: seccomp program of %u bytes", sl);
  b->seccomp = alloc(sl);  // aligned, unlike its place in the message
  x_copy(b->seccomp, r.p, sl);
  b->seccomp_len = sl / sizeof(struct sock_filter);
  r.p += sl;
  b->nsecrets = u32(&r);
  if (b->nsecrets > MAX_MESSAGE / 12) fail("bind message: %u secrets", b->nsecrets);
  b->secrets = alloc(((size_t)b->nsecrets + 1) * sizeof *b->secrets);
  for (uint32_t i = 0; i < b->nsecrets; i++) {
    b->secrets[i].name = str(&r);
    b->secrets[i].size = u64(&r);
  }
  b->nfiles = u32(&r);
  if (b->nfiles > 16) fail("bind message: %u files", b->nfiles);
  b->files = alloc(((size_t)b->nfiles + 1) * sizeof *b->files);
  for (uint32_t i = 0; i < b->nfiles; i++) {
    b->files[i].name = str(&r);
    b->files[i].data = str(&r);
  }
  b->nmounts = u32(&r);
  if (b->nmounts > 8) fail("bind message: %u mounts", b->nmounts);
  b->mounts = alloc(((size_t)b->nmounts + 1) * sizeof *b->mounts);
  for (uint32_t i = 0; i < b->nmounts; i++) {
    b->mounts[i].src = str(&r);
    b->mounts[i].dst = str(&r);
  }
  if (r.p != r.end) fail("bind message: %zu bytes too many", (size_t)(r.end - r.p));
  if (!b->argv[0]) fail("bind message: no arguments");
}

static char msgbuf[MAX_MESSAGE];

// receive waits for the bind message and its descriptors.
static size_t receive(int *fds, int *nfds) {
  struct iovec iov = {msgbuf, sizeof msgbuf};
  union {
    char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct cmsghdr align;
  } oob;
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = oob.buf, .msg_controllen = sizeof oob.buf};
  long n;
  do n = S3(SYS_recvmsg, CONTROL_FD, &m, MSG_CMSG_CLOEXEC);
  while (n == -EINTR);
  if (n < 0) fail("receive: %s", es(n));
  if (n == 0) fail("the worker closed the control socket");
  if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) fail("receive: message or descriptors cut short");
  *nfds = 0;
  // The worker sends one SCM_RIGHTS message.
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
    int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < k && i < MAX_FDS; i++) x_copy(&fds[(*nfds)++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
  }
  return (size_t)n;
}

// ---- while parked ----

static void join(char *out, size_t n, const char *a, const char *b) {
  if (fmt(out, n, "%s/%s", a, b) >= n - 1) fail("path %s/%s too long", a, b);
}

static void mkdir_or_fail(const char *p) {
  long r = x_mkdir(p, 0755);
  if (r < 0 && r != -EEXIST) fail("mkdir %s: %s", p, es(r));
}

static const struct {
  const char *name;
  unsigned major, minor;
} devices[] = {{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};

// prepare builds what does not depend on the function inside the init's
// mount namespace: a tmpfs on staging with the writable layer's
// directories, /proc of its PID namespace, a minimal /dev and a read-only
// /sys, moved under the root at bind. Its failure is reported at bind.
static const char *prepare(const char *st, const char *mb) {
  static char why[512];
  char p[4096], opts[64];
  long r;
  if (!*mb) return "usage: init STAGING TMPFS-MB";
  for (const char *c = mb; *c; c++)
    if (*c < '0' || *c > '9') return "usage: init STAGING TMPFS-MB";
  if ((r = x_mount("", "/", 0, MS_REC | MS_PRIVATE, 0)) < 0) {
    fmt(why, sizeof why, "make mounts private: %s", es(r));
    return why;
  }
  fmt(opts, sizeof opts, "mode=0755,size=%sm", mb);
  if ((r = x_mount("tmpfs", st, "tmpfs", MS_NOSUID | MS_NODEV, opts)) < 0) {
    fmt(why, sizeof why, "tmpfs on %s: %s", st, es(r));
    return why;
  }
  static const char *dirs[] = {"upper", "work", "root", "proc", "dev", "sys"};
  for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
    join(p, sizeof p, st, dirs[i]);
    mkdir_or_fail(p);
  }
  static const struct {
    const char *src, *dst, *type;
    unsigned long flags;
    const char *data;
    int optional;
  } mnts[] = {
      {"proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, 0, 0},
      {"tmpfs", "dev", "tmpfs", MS_NOSUID | MS_STRICTATIME, "mode=755,size=65536k", 0},
      {"shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=65536k", 0},
      {"sysfs", "sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, 0, 1},
  };
  for (size_t i = 0; i < sizeof mnts / sizeof *mnts; i++) {
    join(p, sizeof p, st, mnts[i].dst);
    mkdir_or_fail(p);
    if ((r = x_mount(mnts[i].src, p, mnts[i].type, mnts[i].flags, mnts[i].data)) < 0 && !mnts[i].optional) {
      fmt(why, sizeof why, "mount %s on /%s: %s", mnts[i].type, mnts[i].dst, es(r));
      return why;
    }
  }
  // runc's read-only and masked paths: with no user namespace a root
  // sandbox is the host's root, and /proc/sys, /proc/sysrq-trigger and the
  // like are the host kernel's. Paths this kernel lacks are skipped.
  static const char *ro[] = {"proc/bus", "proc/fs", "proc/irq", "proc/sys", "proc/sysrq-trigger"};
  for (size_t i = 0; i < sizeof ro / sizeof *ro; i++) {
    join(p, sizeof p, st, ro[i]);
    if ((r = x_mount(p, p, 0, MS_BIND | MS_REC, 0)) == -ENOENT) continue;
    if (r == 0) r = x_mount(p, p, 0, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, 0);
    if (r < 0) {
      fmt(why, sizeof why, "read-only /%s: %s", ro[i], es(r));
      return why;
    }
  }
  static const char *masked[] = {"proc/acpi", "proc/asound", "proc/kcore", "proc/keys", "proc/latency_stats",
                                 "proc/timer_list", "proc/timer_stats", "proc/sched_debug", "proc/scsi",
                                 "sys/firmware", "sys/devices/virtual/powercap"};
  for (size_t i = 0; i < sizeof masked / sizeof *masked; i++) {
    struct stat ms;
    join(p, sizeof p, st, masked[i]);
    if (x_stat(p, &ms, AT_SYMLINK_NOFOLLOW) < 0) continue;
    r = S_ISDIR(ms.st_mode) ? x_mount("tmpfs", p, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0")
                            : x_mount("/dev/null", p, 0, MS_BIND, 0);
    if (r < 0) {
      fmt(why, sizeof why, "mask /%s: %s", masked[i], es(r));
      return why;
    }
  }
  // Device nodes made, not bind-mounted from the host (as runc does outside
  // a user namespace); where mknod is refused (a worker in a user
  // namespace) bind-mounted, as runc does there.
  for (size_t i = 0; i < sizeof devices / sizeof *devices; i++) {
    char host[64];
    fmt(p, sizeof p, "%s/dev/%s", st, devices[i].name);
    unsigned long dev = (devices[i].major << 8) | devices[i].minor;  // small numbers: the old encoding
    r = S4(SYS_mknodat, AT_FDCWD, p, S_IFCHR | 0666, dev);
    if (r == 0) {
      r = x_chmod(p, 0666);  // whatever the umask
    } else if (r == -EPERM) {
      fmt(host, sizeof host, "/dev/%s", devices[i].name);
      long fd = x_open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
      r = fd < 0 ? fd : x_close((int)fd);
      if (r == 0) r = x_mount(host, p, 0, MS_BIND, 0);
    }
    if (r < 0) {
      fmt(why, sizeof why, "make /dev/%s: %s", devices[i].name, es(r));
      return why;
    }
  }
  static const char *links[][2] = {{"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"}};
  for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
    fmt(p, sizeof p, "%s/dev/%s", st, links[i][0]);
    if ((r = S3(SYS_symlinkat, links[i][1], AT_FDCWD, p)) < 0) {
      fmt(why, sizeof why, "symlink /dev/%s: %s", links[i][0], es(r));
      return why;
    }
  }
  return 0;
}

// ---- at bind ----

static void mkdir_public(char *dir);
static void bind_mounts(const struct bind *b, const char *root);

// build_root mounts the tmpfs upper layer over the read-only lower layer,
// moves the prepared /proc, /dev and /sys under it and pivots into it.
static void build_root(const struct bind *b, const char *st) {
  static char upper[4096], work[4096], root[4096], p[4096], q[4096];
  long r;
  join(upper, sizeof upper, st, "upper");
  join(work, sizeof work, st, "work");
  join(root, sizeof root, st, "root");
  size_t on = x_strlen(b->lower) + x_strlen(upper) + x_strlen(work) + 64;
  char *opts = alloc(on);
  fmt(opts, on, "lowerdir=%s,upperdir=%s,workdir=%s", b->lower, upper, work);
  if ((r = x_mount("overlay", root, "overlay", MS_NOSUID | MS_NODEV, opts)) < 0)
    fail("overlay root over %s: %s", b->lower, es(r));
  static const char *moved[] = {"proc", "dev", "sys"};
  for (size_t i = 0; i < 3; i++) {
    join(p, sizeof p, root, moved[i]);
    mkdir_or_fail(p);
    join(q, sizeof q, st, moved[i]);
    if ((r = x_mount(q, p, 0, MS_MOVE, 0)) < 0) fail("move /%s: %s", moved[i], es(r));
  }
  bind_mounts(b, root);
  // An image without /tmp gets one anyone can write to, as in a container.
  join(p, sizeof p, root, "tmp");
  struct stat s;
  if (x_stat(p, &s, AT_SYMLINK_NOFOLLOW) < 0) {
    if ((r = x_mkdir(p, 0755)) < 0 || (r = x_chmod(p, 01777)) < 0) fail("make /tmp: %s", es(r));
  }
  // pivot_root(".", ".") stacks the old root under the new one; unmounting
  // "." then drops it, with no directory needed for it.
  if ((r = x_chdir(root)) < 0) fail("chdir %s: %s", root, es(r));
  if ((r = S2(SYS_pivot_root, ".", ".")) < 0) fail("pivot_root: %s", es(r));
  if ((r = S2(SYS_umount2, ".", MNT_DETACH)) < 0) fail("detach the old root: %s", es(r));
  if ((r = x_chdir("/")) < 0) fail("chdir /: %s", es(r));
}

// mkdir_public makes dir and its missing parents 0755 whatever the umask,
// so that the sandbox's user can reach the mount.
static void mkdir_public(char *dir) {
  struct stat s;
  long r;
  if (x_stat(dir, &s, 0) == 0) {
    if (!S_ISDIR(s.st_mode)) fail("%s is not a directory", dir);
    return;
  }
  char *slash = 0;
  for (char *c = dir; *c; c++)
    if (*c == '/') slash = c;
  if (slash && slash != dir) {
    *slash = 0;
    mkdir_public(dir);
    *slash = '/';
  }
  if ((r = x_mkdir(dir, 0755)) < 0 && r != -EEXIST) fail("mkdir %s: %s", dir, es(r));
  if ((r = x_chmod(dir, 0755)) < 0) fail("chmod %s: %s", dir, es(r));
}

// bind_mounts binds the bind's host directories read-only into the new
// root (mounted at root, not yet pivoted into): a code function's source
// and runner. The mount points are made in the writable layer when the
// lower one lacks them.
static void bind_mounts(const struct bind *b, const char *root) {
  static char p[4096];
  long r;
  for (uint32_t i = 0; i < b->nmounts; i++) {
    const struct mnt *m = &b->mounts[i];
    if (m->dst[0] != '/' || m->src[0] != '/') fail("mount %s on %s: paths must be absolute", m->src, m->dst);
    if (fmt(p, sizeof p, "%s%s", root, m->dst) >= sizeof p - 1) fail("mount %s: path too long", m->dst);
    mkdir_public(p);
    if ((r = x_mount(m->src, p, 0, MS_BIND | MS_REC, 0)) < 0) fail("bind %s on %s: %s", m->src, m->dst, es(r));
    if ((r = x_mount("", p, 0, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, 0)) < 0)
      fail("remount %s read-only: %s", m->dst, es(r));
  }
}

// mount_secrets mounts a tmpfs on SECRETS_DIR in the new root, writes the
// secrets there from fd (their values one after another) and remounts it
// read-only.
static void mount_secrets(const struct bind *b, int fd) {
  uint64_t total = 0, size = 0;
  long r;
  for (uint32_t i = 0; i < b->nsecrets; i++) {
    const char *n = b->secrets[i].name;
    if (!*n || x_streq(n, ".") || x_streq(n, "..") || x_strchr(n, '/') || b->secrets[i].size > (1ull << 40))
      fail("secrets: bad secret \"%s\"", n);
    total += b->secrets[i].size;
    size += (b->secrets[i].size + PAGE - 1) / PAGE * PAGE;
  }
  struct stat s;
  if ((r = S2(SYS_fstat, fd, &s)) < 0) fail("secrets: %s", es(r));
  if ((uint64_t)s.st_size != total) fail("secrets: %lld bytes of values, want %llu", (long long)s.st_size, (unsigned long long)total);
  char dir[] = SECRETS_DIR;
  mkdir_public(dir);
  const unsigned long flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
  char data[128];
  fmt(data, sizeof data, "mode=0755,size=%llu,nr_inodes=%u", (unsigned long long)(size + 16 * PAGE), b->nsecrets + 16);
  if ((r = x_mount("tmpfs", SECRETS_DIR, "tmpfs", flags, data)) < 0) fail("secrets: tmpfs on %s: %s", SECRETS_DIR, es(r));
  static char buf[64 << 10];
  long long off = 0;
  for (uint32_t i = 0; i < b->nsecrets; i++) {
    char p[4096];
    const char *name = b->secrets[i].name;
    join(p, sizeof p, SECRETS_DIR, name);
    long out = x_open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
    if (out < 0) fail("secrets: %s: %s", name, es(out));
    for (uint64_t left = b->secrets[i].size; left > 0;) {
      long n = S4(SYS_pread64, fd, buf, left < sizeof buf ? left : sizeof buf, off);
      if (n <= 0) fail("secrets: %s: read: %s", name, n < 0 ? es(n) : "end of values");
      for (long w = 0; w < n;) {
        long k = x_write((int)out, buf + w, n - w);
        if (k < 0) fail("secrets: %s: %s", name, es(k));
        w += k;
      }
      off += n;
      left -= n;
    }
    if ((r = S2(SYS_fchmod, out, 0444)) < 0 || (r = x_close((int)out)) < 0) fail("secrets: %s: %s", name, es(r));
  }
  if ((r = x_mount("", SECRETS_DIR, "", MS_REMOUNT | MS_RDONLY | flags, 0)) < 0)
    fail("secrets: remount %s read-only: %s", SECRETS_DIR, es(r));
}

// write_etc writes the bind's files into the new root's /etc (the
// writable layer): /etc/resolv.conf and /etc/hosts of the sandbox's
// network. What the lower layer had there (a file, or a symbolic link such
// as systemd-resolved's) is replaced, never followed.
static void write_etc(const struct bind *b) {
  long r;
  if (b->nfiles == 0) return;
  if ((r = x_mkdir("/etc", 0755)) < 0 && r != -EEXIST) fail("mkdir /etc: %s", es(r));
  for (uint32_t i = 0; i < b->nfiles; i++) {
    const char *n = b->files[i].name;
    if (!*n || x_streq(n, ".") || x_streq(n, "..") || x_strchr(n, '/')) fail("etc: bad file \"%s\"", n);
    char p[4096];
    join(p, sizeof p, "/etc", n);
    if ((r = S3(SYS_unlinkat, AT_FDCWD, p, 0)) < 0 && r != -ENOENT) fail("etc: remove %s: %s", p, es(r));
    long fd = x_open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) fail("etc: %s: %s", p, es(fd));
    const char *d = b->files[i].data;
    for (size_t w = 0, len = x_strlen(d); w < len;) {
      long k = x_write((int)fd, d + w, len - w);
      if (k < 0) fail("etc: %s: %s", p, es(k));
      w += (size_t)k;
    }
    if ((r = S2(SYS_fchmod, fd, 0644)) < 0 || (r = x_close((int)fd)) < 0) fail("etc: %s: %s", p, es(r));
  }
}

// look_path finds name in env's PATH inside the new root.
static const char *look_path(const char *name, char **env) {
  const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (char **e = env; *e; e++)
    if (x_hasprefix(*e, "PATH=")) path = *e + 5;
  static char p[4096];
  for (const char *d = path; *d;) {
    const char *end = x_strchr(d, ':');
    size_t n = end ? (size_t)(end - d) : x_strlen(d);
    if (n > 0 && d[0] == '/' && fmt(p, sizeof p, "%.*s/%s", (int)n, d, name) < sizeof p - 1) {
      struct stat s;
      if (x_stat(p, &s, 0) == 0 && S_ISREG(s.st_mode) && (s.st_mode & 0111)) return p;
    }
    if (!end) break;
    d = end + 1;
  }
  fail("\"%s\" not found in the sandbox's PATH \"%s\": %s", name, path, es(-ENOENT));
  return 0;
}

// drop_privileges leaves the process with what runc gives a container: the
// bounding set cut to b->caps, no supplementary groups, the sandbox's uid
// and gid (a non-root uid then has no capabilities at all), no_new_privs.
static void drop_privileges(const struct bind *b) {
  long r;
  for (int c = 0; c < 64; c++) {
    if (b->caps & (1ull << c)) continue;
    if ((r = S2(SYS_prctl, PR_CAPBSET_DROP, c)) < 0 && r != -EINVAL) fail("drop capability %d: %s", c, es(r));
  }
  if ((r = S2(SYS_setgroups, 0, 0)) < 0) fail("setgroups: %s", es(r));
  if ((r = S3(SYS_setresgid, b->gid, b->gid, b->gid)) < 0) fail("setresgid %u: %s", b->gid, es(r));
  if ((r = S3(SYS_setresuid, b->uid, b->uid, b->uid)) < 0) fail("setresuid %u: %s", b->uid, es(r));
  if (b->uid == 0) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2] = {{0, 0, 0}, {0, 0, 0}};
    for (int c = 0; c < 64; c++)
      if (b->caps & (1ull << c)) d[c / 32].effective |= 1u << (c % 32);
    for (int i = 0; i < 2; i++) d[i].permitted = d[i].inheritable = d[i].effective;
    if ((r = S2(SYS_capset, &h, d)) < 0) fail("capset: %s", es(r));
  }
  if ((r = S5(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) < 0) fail("no_new_privs: %s", es(r));
}

// write_proc writes s to a file of /proc/self.
static void write_proc(const char *p, const char *s) {
  long fd = x_open(p, O_WRONLY | O_CLOEXEC, 0), r;
  if (fd < 0) fail("%s: %s", p, es(fd));
  if ((r = x_write((int)fd, s, x_strlen(s))) < 0) fail("%s: %s", p, es(r));
  x_close((int)fd);
}

// enter_user_namespace makes a template's process (already the sandbox's
// user, with no capability left on the host) root of a user namespace of
// its own, mapped to that user: it then holds capabilities over the
// namespaces its children make in it (a private mount namespace and /tmp
// each) and over nothing else (user_namespaces(7)). docs/security.md,
// "Templates".
static void enter_user_namespace(const struct bind *b) {
  long r;
  char map[64];
  if ((r = S1(SYS_unshare, CLONE_NEWUSER)) < 0) fail("user namespace: %s", es(r));
  // The change of uid made the process non-dumpable, which leaves its
  // /proc/self files root's: the maps could not be written.
  if ((r = S5(SYS_prctl, PR_SET_DUMPABLE, 1, 0, 0, 0)) < 0) fail("dumpable: %s", es(r));
  write_proc("/proc/self/setgroups", "deny");
  fmt(map, sizeof map, "0 %u 1", b->uid);
  write_proc("/proc/self/uid_map", map);
  fmt(map, sizeof map, "0 %u 1", b->gid);
  write_proc("/proc/self/gid_map", map);
}

// start builds the sandbox and execs its entrypoint; it returns only by
// fail.
static void start(struct bind *b, int *fds, int nfds, const char *st) {
  long r;
  int tpl = !!(b->flags & FLAG_TEMPLATE);
  int ctl = tpl || (b->flags & FLAG_STANDBY);
  int want = 1 + !!(b->flags & FLAG_EXEC_FD) + (b->nsecrets > 0) + ctl;
  if (nfds != want) fail("bind message: %d descriptors, want %d", nfds, want);
  int secrets_fd = fds[1 + !!(b->flags & FLAG_EXEC_FD)];
  if ((r = S3(SYS_dup3, fds[0], 1, 0)) < 0 || (r = S3(SYS_dup3, fds[0], 2, 0)) < 0) fail("log: %s", es(r));
  x_close(fds[0]);
  if (ctl) {
    // The template's control socket, at a number the runner is told; not
    // close-on-exec, unlike every other descriptor received.
    if ((r = S3(SYS_dup3, fds[nfds - 1], TEMPLATE_FD, 0)) < 0) fail("template socket: %s", es(r));
    x_close(fds[nfds - 1]);
  }
  build_root(b, st);
  write_etc(b);
  if (b->nsecrets > 0) {
    mount_secrets(b, secrets_fd);
    x_close(secrets_fd);  // not for the function
  }
  if ((r = S2(SYS_sethostname, b->hostname, x_strlen(b->hostname))) < 0) fail("hostname: %s", es(r));
  const char *path = b->argv[0];
  char fdpath[64];
  if (b->flags & FLAG_EXEC_FD) {
    fmt(fdpath, sizeof fdpath, "/proc/self/fd/%d", fds[1]);
    path = fdpath;
  } else if (!x_strchr(path, '/')) {
    path = look_path(path, b->env);
  }
  const char *dir = *b->dir ? b->dir : "/";
  if ((r = x_chdir(dir)) < 0) fail("working directory %s: %s", dir, es(r));
  drop_privileges(b);
  if (tpl) enter_user_namespace(b);
  if (b->seccomp_len > 0) {
    struct sock_fprog prog = {.len = (unsigned short)b->seccomp_len, .filter = b->seccomp};
    if ((r = S3(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)) < 0) fail("seccomp: %s", es(r));
  }
  // The executable's descriptor stays open across the exec (a script run
  // from it is read by path); every other one received is close-on-exec.
  if (b->flags & FLAG_EXEC_FD) S3(SYS_fcntl, fds[1], F_SETFD, 0);
  S3(SYS_fcntl, CONTROL_FD, F_SETFD, FD_CLOEXEC);
  r = S3(SYS_execve, path, b->argv, b->env);
  fail("exec %s: %s", b->argv[0], es(r));
}

// nsinit_main is the init's whole life: args are the staging directory and
// the size of the writable layer in MiB.
static void nsinit_main(int argc, char **argv) {
  // Nothing the worker inherited reaches the function: only 0-2 and the
  // control socket were meant for the init (descriptors received later are
  // close-on-exec).
  if (S3(SYS_close_range, CONTROL_FD + 1, ~0U, 0) == -ENOSYS)
    for (int fd = CONTROL_FD + 1; fd < 65536; fd++) x_close(fd);
  const char *perr = "usage: init STAGING TMPFS-MB";
  // Only as the first process of a fresh PID namespace (a shell the worker
  // cloned): run by hand, prepare would change the host's mounts.
  if (S(SYS_getpid, 0, 0, 0, 0, 0, 0) != 1)
    perr = "not the first process of a new PID namespace (the worker starts the init)";
  else if (argc == 2)
    perr = prepare(argv[0], argv[1]);
  int fds[MAX_FDS], nfds = 0;
  size_t n = receive(fds, &nfds);
  if (perr) fail("%s", perr);
  struct bind b = {0};
  decode(msgbuf, n, &b);
  start(&b, fds, nfds, argv[0]);
}

static void run(int argc, char **argv) {
  if (argc >= 2 && x_streq(argv[1], "__native-init")) nsinit_main(argc - 2, argv + 2);
}

#ifdef BRISK_INIT_STANDALONE
// start_c gets the initial stack: argc, then argv.
__attribute__((used)) static void start_c(long *sp) {
  int argc = (int)sp[0];
  char **argv = (char **)(sp + 1);
  run(argc, argv);
  static const char usage[] =
      "brisk-sandbox-init is the native runtime's sandbox init; workers run it, as:\n"
      "  brisk-sandbox-init __native-init STAGING TMPFS-MB\n";
  x_write(2, usage, sizeof usage - 1);
  x_exit(2);
}
#if defined(__x86_64__)
__asm__(".text\n.global _start\n_start:\n xor %rbp,%rbp\n mov %rsp,%rdi\n and $-16,%rsp\n call start_c\n hlt\n");
#endif
#else
// brisk_nsinit runs before main (and before the Go runtime starts) in any
// binary linking this package; it takes over only when asked to be an init.
// Only glibc passes (argc, argv, envp) to constructors; elsewhere the init
// is the standalone binary's alone.
#ifdef __GLIBC__
__attribute__((constructor)) static void brisk_nsinit(int argc, char **argv, char **envp) {
  (void)envp;
  run(argc, argv);
}
#endif
#endif
