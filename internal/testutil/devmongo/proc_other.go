//go:build !unix

package devmongo

import "os"

// Without SIGTERM, the only portable stop is a kill.
func interrupt(p *os.Process) error { return p.Kill() }
