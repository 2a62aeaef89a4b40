// Package specdir finds the official MongoDB conformance suites for the
// spec runners. The suites are never copied into the repository (their
// licence forbids it): they are read at run time from ../shared/specs beside
// the module root, or from a directory named by an environment variable.
package specdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// EnvRoot names the environment variable that may point at the specs
// directory (the one holding sdam/, server-selection/, ...), for runs where
// ../shared is not beside the module root.
const EnvRoot = "MONGOBOUNCER_SPECS"

// Dir returns the directory of one suite, path elements below the specs
// root (for example "sdam", "rs"). When it is missing the test is skipped
// with a message saying where it looked, or fails when $CI is set, so a CI
// run can never pass without the suites.
func Dir(t testing.TB, elem ...string) string {
	t.Helper()
	root := os.Getenv(EnvRoot)
	if root == "" {
		mod, err := moduleRoot()
		if err != nil {
			t.Fatal(err)
		}
		root = filepath.Join(mod, "..", "shared", "specs")
	}
	dir := filepath.Join(append([]string{root}, elem...)...)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		msg := fmt.Sprintf("spec tests not found: directory %s is missing (set %s to the specs directory)", dir, EnvRoot)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// Files returns the files matching pattern (for example "*.json") in the
// suite directory dir, failing the test when there are none: an empty suite
// must not pass silently.
func Files(t testing.TB, dir, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no %s files in %s", pattern, dir)
	}
	return files
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the test directory")
		}
		dir = parent
	}
}
