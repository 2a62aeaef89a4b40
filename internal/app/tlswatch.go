package app

// The watch of the TLS files: every tls_watch_interval the client
// certificate, key and CA files (tls_*) and each route's upstream TLS files
// (tlsCAFile, tlsCertificateKeyFile) are read through their paths and
// hashed, so that a certificate rotated on disk (cert-manager renewing a
// Kubernetes Secret, which swaps the mount's ..data symlink atomically)
// applies without a SIGHUP. Contents, not inodes or mtimes, are compared:
// after a symlink swap the path names another file whose mtime may be the
// old one's, and an editor may rewrite a file in place.
//
// A change of the client files loads them as a reload does (clientTLS) and
// gives the new settings to the server, which new handshakes read from an
// atomic pointer: nothing restarts and connected clients keep their
// connections. A change of a route's upstream files rebuilds that route and
// switches it as a reload does (switchRoutes): new pool, the old one
// drains. Files that do not load (a certificate and a key caught
// mid-rotation that do not match, garbage) leave what runs in place, with
// one warning per distinct failure; every tick tries again.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
)

// tlsWatch is the state of the watch goroutine.
type tlsWatch struct {
	// stop ends the goroutine, which closes done; kick makes it read
	// tls_watch_interval again (a reload changed it). Set by
	// startTLSWatch under App.mu; nil before Start.
	stop, kick, done chan struct{}
	// failed is the last failure logged per file set ("client" or
	// "route <name>"), so that each is logged once (guarded by App.mu).
	failed map[string]string
	// checks counts the ticks done: tests wait on it rather than on
	// the clock.
	checks atomic.Uint64
}

// startTLSWatch starts the watch goroutine; the caller holds a.mu. It runs
// even with tls_watch_interval = "0s", idle, so that a reload can turn it
// on.
func (a *App) startTLSWatch() {
	w := &a.tlsWatch
	if w.done != nil {
		return
	}
	w.stop, w.kick, w.done = make(chan struct{}), make(chan struct{}, 1), make(chan struct{})
	w.failed = map[string]string{}
	go a.watchTLS(w.stop, w.kick, w.done)
}

// kickTLSWatch tells the watch that tls_watch_interval changed; the caller
// holds a.mu.
func (a *App) kickTLSWatch() {
	if a.tlsWatch.kick == nil {
		return
	}
	select {
	case a.tlsWatch.kick <- struct{}{}:
	default: // a kick is pending already
	}
}

// stopTLSWatch ends the watch goroutine and waits for it; a check under way
// finishes first. Safe to call more than once, and before Start.
func (a *App) stopTLSWatch() {
	a.mu.Lock()
	stop, done := a.tlsWatch.stop, a.tlsWatch.done
	if stop != nil {
		select {
		case <-stop:
		default:
			close(stop)
		}
	}
	a.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (a *App) watchTLS(stop, kick <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		a.mu.Lock()
		every := a.cfg.Global.TLSWatchInterval
		a.mu.Unlock()
		var tick <-chan time.Time
		var t *time.Timer
		if every > 0 {
			t = time.NewTimer(every)
			tick = t.C
		}
		select {
		case <-stop:
			if t != nil {
				t.Stop()
			}
			return
		case <-kick:
			if t != nil {
				t.Stop()
			}
		case <-tick:
			a.checkTLSFiles()
		}
	}
}

// checkTLSFiles runs one tick of the watch.
func (a *App) checkTLSFiles() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.checkClientTLS()
	a.checkUpstreamTLS()
	a.tlsWatch.checks.Add(1)
}

// checkClientTLS reloads the client TLS files if their contents changed;
// the caller holds a.mu.
func (a *App) checkClientTLS() {
	g := a.cfg.Global
	d := clientTLSDigest(g)
	if d == a.clientTLSDigest {
		// Back to the files in use (a bad file put back): the next
		// failure is news again.
		delete(a.tlsWatch.failed, "client")
		return
	}
	ctls, err := clientTLS(g)
	if err != nil {
		a.tlsWatchFailed("client", d, "client TLS files changed but do not load; new clients still get the certificate in use",
			err, "tls_cert_file", g.TLSCertFile, "tls_key_file", g.TLSKeyFile, "tls_ca_file", g.TLSCAFile)
		return
	}
	if err := a.server.SetTLS(ctls); err != nil {
		a.log.Warn("client TLS files changed but not applied", "error", err) // cannot happen: clientTLS gives a config
		return
	}
	a.clientTLSDigest = d
	delete(a.tlsWatch.failed, "client")
	attrs := []any{"tls_cert_file", g.TLSCertFile, "tls_key_file", g.TLSKeyFile, "tls_ca_file", g.TLSCAFile}
	if c := ctls.Config.Certificates; len(c) > 0 && c[0].Leaf != nil {
		attrs = append(attrs, "subject", c[0].Leaf.Subject.String(), "serial", c[0].Leaf.SerialNumber.String(),
			"not_after", c[0].Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	a.log.Info("client TLS files changed: new clients get the new certificate", attrs...)
}

// checkUpstreamTLS rebuilds each route whose upstream TLS files changed
// and switches to it as a reload does; the caller holds a.mu.
func (a *App) checkUpstreamTLS() {
	var next map[string]*route
	var changed []string
	for name, r := range a.routes {
		if !r.eff.Conn.TLS {
			continue
		}
		d := tlsFilesDigest(r.eff.Conn)
		if d == r.tlsDigest {
			delete(a.tlsWatch.failed, "route "+name)
			continue
		}
		nr, err := a.buildRoute(r.eff)
		if err != nil {
			a.tlsWatchFailed("route "+name, d, "upstream TLS files changed but do not load; the route keeps its pools",
				err, "route", name)
			continue
		}
		if next == nil {
			next = maps.Clone(a.routes)
		}
		next[name] = nr
		changed = append(changed, name)
		delete(a.tlsWatch.failed, "route "+name)
	}
	if next == nil {
		return
	}
	routes, err := a.cfg.Routes()
	if err == nil && len(routes) != len(next) {
		err = errRouteSetChanged
	}
	var order []string
	for _, er := range routes {
		if next[er.Name] == nil {
			err = errRouteSetChanged
		}
		order = append(order, er.Name)
	}
	if err == nil {
		_, err = a.switchRoutes(order, next, a.cfg.Global.ShutdownTimeout)
	}
	if err != nil {
		// Cannot happen: a.cfg is the configuration the routes came from.
		a.log.Warn("upstream TLS files changed but the routes were not switched", "error", err)
		for _, name := range changed {
			next[name].topo.Close()
		}
		return
	}
	a.routes = next
	for _, name := range changed {
		a.log.Info("upstream TLS files changed: new pools for the route, the old ones drain", "route", name)
	}
}

// errRouteSetChanged says a.cfg's routes are not a.routes' (a bug).
var errRouteSetChanged = errors.New("the configured routes are not the running ones")

// tlsWatchFailed logs a failure to load changed TLS files at warn, once
// per distinct failure of the file set key: the same files (digest) with
// the same error are not logged again at every tick. The caller holds
// a.mu. The error names the file and the reason (crypto/tls's "private key
// does not match public key", "no PEM certificate found"), never a key's
// contents.
func (a *App) tlsWatchFailed(key, digest, msg string, err error, attrs ...any) {
	failure := digest + "\x00" + err.Error()
	if a.tlsWatch.failed[key] == failure {
		return
	}
	a.tlsWatch.failed[key] = failure
	a.log.Warn(msg, append(attrs, "error", err)...)
}

// clientTLSDigest is a digest of the contents of the client TLS files of g
// ("" with tls_mode disable). A file that cannot be read gives a digest
// naming the error, which differs from any running one, so the watch tries
// to load the files and logs why it cannot.
func clientTLSDigest(g config.Global) string {
	if g.TLSMode == config.TLSModeDisable || g.TLSMode == "" {
		return ""
	}
	h := sha256.New()
	for _, f := range []struct{ key, path string }{{"tls_cert_file", g.TLSCertFile}, {"tls_key_file", g.TLSKeyFile}, {"tls_ca_file", g.TLSCAFile}} {
		if f.path == "" {
			h.Write([]byte{0})
			continue
		}
		b, err := readTLSFile(f.key, f.path)
		if err != nil {
			return "unreadable: " + err.Error()
		}
		sum := sha256.Sum256(b)
		h.Write(sum[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}
