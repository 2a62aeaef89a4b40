package config

import (
	"errors"
	"runtime"
	"strings"
	"testing"
)

// so_reuseport is read, defaults to false, is global only, and is refused
// off Linux.
func TestSoReuseport(t *testing.T) {
	c, err := Parse([]byte(route), "t.toml")
	if err != nil || c.Global.SoReuseport {
		t.Fatalf("default: %v, %v", c.Global.SoReuseport, err)
	}
	c, err = Parse([]byte("[mongobouncer]\nso_reuseport = true\n"+route), "t.toml")
	if runtime.GOOS == "linux" {
		if err != nil || !c.Global.SoReuseport {
			t.Fatalf("set: %v, %v", c.Global.SoReuseport, err)
		}
	} else if !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "Linux only") {
		t.Fatalf("set off Linux: %v, want a Linux-only error", err)
	}
	if _, err := Parse([]byte("[mongobouncer]\nso_reuseport = \"yes\"\n"+route), "t.toml"); err == nil {
		t.Fatal("a string so_reuseport was accepted")
	}
	if _, err := Parse([]byte("[mongobouncer]\n[databases.x]\nconnection_string = \"mongodb://h/\"\nso_reuseport = true\n"), "t.toml"); err == nil {
		t.Fatal("so_reuseport in a route was accepted")
	}
}
