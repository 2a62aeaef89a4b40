package e2e

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/proxy"
	"github.com/mongobouncer/mongobouncer/internal/testutil/seccomp"
	"github.com/mongobouncer/mongobouncer/internal/uring"
)

// ioModel is one way mongobouncer serves its clients: a goroutine per
// client, or the event loop on epoll or on io_uring. The paths differ (the
// loop reads, parses and queues requests itself and hands the rest to a
// goroutine), so a behaviour checked on one model is not checked on the
// others.
type ioModel struct {
	name string
	loop bool               // event_loop
	io   config.EventLoopIO // event_loop_io
}

var (
	ioGoroutine = ioModel{"goroutine", false, config.EventLoopIOAuto}
	ioEpoll     = ioModel{"epoll", true, config.EventLoopIOEpoll}
	// ioUring requires io_uring rather than "auto", which would quietly
	// run epoll where the kernel refuses it or the ring cannot start (a
	// locked-memory limit): startup fails instead, and so does the test.
	ioUring = ioModel{"io_uring", true, config.EventLoopIOUring}
	// ioAdaptive is "auto" where io_uring is allowed: both drivers, the
	// endpoints moving between them with the load (evloop/adapt_linux.go);
	// skipped where "auto" would be epoll alone.
	ioAdaptive = ioModel{"adaptive", true, config.EventLoopIOAuto}
	// ioDefault is the shipped configuration, for oneIO tests.
	ioDefault = ioModel{"default", true, config.EventLoopIOAuto}
)

func (m ioModel) apply(c *config.Config) {
	c.Global.EventLoop = m.loop
	c.Global.EventLoopIO = m.io
}

// uringSupported is asked once: each call creates and drops a ring.
var uringSupported = sync.OnceValue(uring.Supported)

// eachIO runs f once per I/O model, as subtests named goroutine, epoll,
// io_uring and adaptive; every mongobouncer f starts (bouncer, fileBouncer, ...) serves
// its clients that way. It is the default for an end-to-end test: wrap the
// test's body in it.
//
// A bouncer started outside eachIO, loopIO or oneIO fails its test, so a
// new test cannot silently run on one model only. The tests that run once
// (oneIO) are those the I/O model cannot affect, and those that choose
// event_loop themselves:
//   - TestReloadKeepsRestartOnlySettings: no client connects; it reads the
//     configuration back.
//   - TestEmptyRouteArgumentDoesNotPauseEverything: the admin argument
//     parser, reached the same way on every model (admin commands always
//     run on a client goroutine).
//   - TestReloadRenamesRouteKeepingItsListenAddress: listeners only (and
//     skipped as a known limitation).
//   - TestStatusPageWithRealTraffic: the admin HTTP page and its charts;
//     the driver traffic only feeds them (and a browser run per model
//     would cost a minute).
//   - TestPoolClearedWhileWaitingOnGoroutine: its cases set event_loop
//     themselves (a goroutine-served request in both).
//   - TestRouteDrainHonoursShutdownTimeout, TestGracefulCloseEndsRouteDrains:
//     a reload's route drain, done by the app; their clients are in
//     session mode, which the event loop never serves.
//   - TestClientLoginFailuresLookAlike,
//     TestAuthUserLookupWrongAuthUserPassword: failed logins only, and
//     every login step is served on the client's goroutine in every model
//     (a client logging in does not enter the loop); no command follows.
//   - TestTLSReloadNewCertificate, TestMongoshTLS, TestPymongoTLS,
//     TestMongocTLS: TLS clients, which never enter the event loop; the
//     tools' plain client on an allow port is served like any plain one,
//     per model in TestTLSAllowPlainAndTLSOnOnePort.
//   - TestLoginCost: a measurement, run on demand, of the shipped
//     configuration (MONGOBOUNCER_LOGIN_COST_IO=goroutine for the other);
//     logins are served on goroutines anyway.
//   - BenchmarkPing, BenchmarkPingLoggedIn: measure the shipped
//     configuration.
func eachIO(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	runIO(t, []ioModel{ioGoroutine, ioEpoll, ioUring, ioAdaptive}, f)
}

// loopIO is eachIO for tests of the event loop itself: epoll and io_uring
// only.
func loopIO(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	runIO(t, []ioModel{ioEpoll, ioUring, ioAdaptive}, f)
}

// oneIO marks t as a test that runs once, with the shipped configuration
// (see eachIO for which tests and why).
func oneIO(t testing.TB) {
	setIOModel(t, ioDefault)
}

func runIO(t *testing.T, models []ioModel, f func(t *testing.T)) {
	t.Helper()
	for _, m := range models {
		t.Run(m.name, func(t *testing.T) {
			if m.loop && !proxy.EventLoopSupported {
				t.Skip("the event loop is Linux only")
			}
			if (m.io == config.EventLoopIOUring || m == ioAdaptive) && !uringSupported() {
				t.Skip("io_uring: the kernel refuses it here (too old, kernel.io_uring_disabled, or a seccomp profile)")
			}
			setIOModel(t, m)
			f(t)
		})
	}
}

// ioModels maps a test's name to its I/O model. Subtests of a test find
// their model under their parent's name.
var ioModels sync.Map // string → ioModel

func setIOModel(t testing.TB, m ioModel) {
	name := t.Name()
	ioModels.Store(name, m)
	t.Cleanup(func() { ioModels.Delete(name) })
}

// ioModelOf returns the I/O model of t or of the nearest parent test that
// has one, and fails t if none has.
func ioModelOf(t testing.TB) ioModel {
	t.Helper()
	for name := t.Name(); ; {
		if m, ok := ioModels.Load(name); ok {
			return m.(ioModel)
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			break
		}
		name = name[:i]
	}
	t.Fatalf("%s starts a mongobouncer with no I/O model: wrap the test's body in eachIO (or loopIO), or call oneIO where the model cannot matter", t.Name())
	return ioModel{}
}

// Where the kernel refuses io_uring, eachIO skips the io_uring subtest and
// still runs the other two.
func TestEachIOSkipsIOUringWhereRefused(t *testing.T) {
	if !seccomp.RefuseIOUring(t) {
		return
	}
	var ran []string
	eachIO(t, func(t *testing.T) { ran = append(ran, ioModelOf(t).name) })
	if !slices.Equal(ran, []string{"goroutine", "epoll"}) {
		t.Fatalf("eachIO ran %v with io_uring refused, want [goroutine epoll]", ran)
	}
}
