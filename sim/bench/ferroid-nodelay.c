/*
 * ferroid-nodelay.so: sets TCP_NODELAY on every connection a process accepts, by LD_PRELOAD.
 *
 * Why: ferroid-tonic-server 2.0.0 hands tonic a plain TcpListenerStream (src/main.rs), so its
 * accepted sockets keep Nagle's algorithm, while our servers (and tonic's own `serve`) set
 * TCP_NODELAY. A StreamIds reply is several small writes (headers, data, trailers): Nagle holds the
 * later ones until the client ACKs the first, and the client delays that ACK (~40 ms on Linux).
 * ids-bench measures ferroid as shipped AND with this shim, so that the comparison shows the
 * servers' work, not one missing socket option. Built by install-ferroid.sh; not linked into
 * anything of ours.
 *
 * Left out: connect() (ferroid only accepts) and any other socket option.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static int nodelay(int fd) {
  if (fd >= 0) {
    int one = 1;
    /* Fails harmlessly (EOPNOTSUPP) on a Unix socket. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

int accept4(int s, struct sockaddr *addr, socklen_t *len, int flags) {
  static int (*real)(int, struct sockaddr *, socklen_t *, int);
  if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
  return nodelay(real(s, addr, len, flags));
}

int accept(int s, struct sockaddr *addr, socklen_t *len) {
  static int (*real)(int, struct sockaddr *, socklen_t *);
  if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
  return nodelay(real(s, addr, len));
}
