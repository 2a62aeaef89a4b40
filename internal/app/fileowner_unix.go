//go:build unix

package app

// The owner of a file, for the auth_file's mode rule (clientauth.go).

import (
	"os"
	"syscall"
)

// fileOwner returns the uid that owns the file fi describes.
func fileOwner(fi os.FileInfo) (uint32, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Uid, true
}
