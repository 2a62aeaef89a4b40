package admin

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"net/http"
)

// statusPage is the whole status page: markup, style and script inline,
// so it works on an air-gapped host and the CSP below can forbid every
// other source.
//
//go:embed status.html
var statusPage []byte

// statusCSP allows exactly the page's own inline script (by hash), inline
// style, and fetches to this origin: an appName that slipped into markup
// could not run, and the page cannot load anything from elsewhere.
var statusCSP = func() string {
	_, rest, ok := bytes.Cut(statusPage, []byte("<script>"))
	script, _, ok2 := bytes.Cut(rest, []byte("</script>"))
	if !ok || !ok2 {
		panic("admin: status.html has no inline <script>") // a build-time defect, caught by every test
	}
	sum := sha256.Sum256(script)
	return "default-src 'none'; script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) +
		"'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

func serveStatusPage(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", statusCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(statusPage)
}
