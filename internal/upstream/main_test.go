package upstream

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
)

// dev is one FerretDB server shared by the package's tests (with a Unix
// socket as well); tests that need a scripted server use fakeServer.
var dev *devmongo.Server

// quiet keeps the logs of the code under test out of test output.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestMain(m *testing.M) {
	var err error
	dev, err = devmongo.StartMainWith(devmongo.Options{UnixSocket: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "upstream tests: starting devmongo:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := dev.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "upstream tests: stopping devmongo:", err)
		code = 1
	}
	// After Stop, so the helper's own goroutines are gone too.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
