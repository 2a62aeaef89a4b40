// Tests of --version: the version and, when the build set it, the source
// revision (make image and the Dockerfile set both with -ldflags -X).
package main

import (
	"bytes"
	"testing"
)

func TestVersionNamesTheRevision(t *testing.T) {
	defer func(v, r string) { version, revision = v, r }(version, revision)
	for _, c := range []struct{ version, revision, want string }{
		{"1.2.3", "", "mongobouncer 1.2.3\n"},
		{"1.2.3", "0123abcd", "mongobouncer 1.2.3 (revision 0123abcd)\n"},
	} {
		version, revision = c.version, c.revision
		var out, errb bytes.Buffer
		if code := run([]string{"--version"}, &out, &errb, nil); code != 0 || out.String() != c.want {
			t.Errorf("revision %q: --version = %d %q (stderr %q), want %q", c.revision, code, out.String(), errb.String(), c.want)
		}
	}
}
