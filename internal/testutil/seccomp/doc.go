// Package seccomp lets a test run as a kernel that refuses io_uring would
// run it, as container runtimes' default seccomp profiles make the kernel
// do: the test is run again in a child process in which io_uring_setup
// fails with EPERM. This is how the fallback from io_uring to epoll, and
// the startup error when io_uring is required, are tested on a machine
// whose kernel has io_uring. RefuseLargeIOUring refuses only rings over a
// size, so that a small probe succeeds where the event loop's rings fail.
package seccomp
