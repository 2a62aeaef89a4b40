// Package sysconn duplicates socket descriptors for code that takes sockets
// out of Go's netpoller to poll them itself (the proxy's event loop, the
// upstream connections it uses, and the load tool's epoll relay). It is
// Linux only; elsewhere it is empty.
package sysconn
