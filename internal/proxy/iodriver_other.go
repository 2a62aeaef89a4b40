//go:build !linux

package proxy

// Without Linux there is no event loop, so no I/O driver to name
// (Server.LoopIO).

func loopDriverName(*loops) string { return LoopIOOff }
