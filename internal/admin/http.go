package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// HTTPOption configures NewHTTPHandler.
type HTTPOption func(*httpOptions)

type httpOptions struct {
	sampler *Sampler
}

// WithSampler makes /status/data serve s's history. The caller starts and
// stops s. Without it, the handler samples on demand when /status/data is
// fetched, so the page's history covers only the time someone watched it.
func WithSampler(s *Sampler) HTTPOption {
	return func(o *httpOptions) { o.sampler = s }
}

// NewHTTPHandler returns the admin HTTP interface: /metrics (the given
// handler; 404 when nil), /healthz, /readyz, the /admin/... JSON commands
// (same commands and semantics as over the wire), /status and /status/data.
// A nil logger discards.
func NewHTTPHandler(ctl Controller, metrics http.Handler, logger *slog.Logger, opts ...HTTPOption) http.Handler {
	var o httpOptions
	for _, opt := range opts {
		opt(&o)
	}
	h := &httpHandler{c: newCore(ctl, logger), sampler: o.sampler}
	if h.sampler == nil {
		h.sampler = NewSampler(ctl, 0, 0)
	}
	mux := http.NewServeMux()
	// State-changing endpoints refuse cross-origin browser requests, so a
	// web page open on the operator's machine cannot POST /admin/shutdown
	// to a loopback admin listener. curl sends no Origin and is allowed.
	csrf := http.NewCrossOriginProtection()
	for i := range commands {
		cmd := &commands[i]
		var hf http.Handler = h.command(cmd)
		if cmd.action {
			hf = csrf.Handler(hf)
		}
		mux.Handle(cmd.path, hf)
	}
	mux.HandleFunc("/admin/", h.unknown)
	if metrics != nil {
		mux.Handle("/metrics", metrics)
	} else {
		mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "metrics are not enabled", http.StatusNotFound)
		})
	}
	mux.Handle("/healthz", methods(http.HandlerFunc(healthz), http.MethodGet))
	mux.Handle("/readyz", methods(http.HandlerFunc(h.readyz), http.MethodGet))
	mux.Handle("/status", methods(http.HandlerFunc(serveStatusPage), http.MethodGet))
	mux.Handle("/status/data", methods(http.HandlerFunc(h.statusData), http.MethodGet))
	mux.Handle("/{$}", methods(http.HandlerFunc(index), http.MethodGet))
	h.mux = mux
	return h
}

type httpHandler struct {
	c       *core
	sampler *Sampler
	mux     *http.ServeMux
}

// ServeHTTP implements http.Handler.
func (h *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// With so_reuseport two processes share the admin address during an
	// upgrade; the pid says which one answered (docs/operations.md).
	w.Header().Set(PIDHeader, pid)
	h.mux.ServeHTTP(w, r)
}

// PIDHeader names the response header that carries the process id of the
// mongobouncer that answered an admin HTTP request.
const PIDHeader = "Mongobouncer-Pid"

var pid = strconv.Itoa(os.Getpid())

// methods answers 405, with Allow, to any method not in allowed (HEAD is
// allowed wherever GET is).
func methods(next http.Handler, allowed ...string) http.Handler {
	if slices.Contains(allowed, http.MethodGet) {
		allowed = append(allowed, http.MethodHead)
	}
	allow := strings.Join(allowed, ", ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(allowed, r.Method) {
			w.Header().Set("Allow", allow)
			http.Error(w, "method "+r.Method+" not allowed; use "+allow, http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (h *httpHandler) command(cmd *command) http.Handler {
	method := http.MethodGet
	if cmd.action {
		method = http.MethodPost
	}
	return methods(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		route := q.Get("route")
		if q.Has("route") && !cmd.route {
			writeError(w, errorf(CodeBadValue, "%s takes no route argument", cmd.name))
			return
		}
		if q.Has("route") && route == "" {
			// Most likely an unset variable in a script: never "every route".
			writeError(w, errorf(CodeBadValue, "route must not be empty; leave it out for every route"))
			return
		}
		res, aerr := h.c.exec(cmd, route, "http", r.RemoteAddr)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		writeResult(w, res)
	}), method)
}

func (h *httpHandler) unknown(w http.ResponseWriter, r *http.Request) {
	paths := make([]string, len(commands))
	for i, c := range commands {
		paths[i] = c.path
	}
	writeError(w, errorf(CodeCommandNotFound, "no such admin endpoint %q; valid endpoints: %s", r.URL.Path, strings.Join(paths, ", ")))
}

// writeResult writes {<key>: value, "note": ..., "ok": 1} indented: the
// /admin endpoints are mostly read by people through curl.
func writeResult(w http.ResponseWriter, res result) {
	var b bytes.Buffer
	b.WriteString("{\n")
	if res.key != "" {
		v, err := json.MarshalIndent(res.value, "  ", "  ")
		if err != nil {
			writeError(w, errorf(CodeInternalError, "cannot encode the %s reply: %v", res.key, err))
			return
		}
		b.WriteString(`  "` + res.key + `": `)
		b.Write(v)
		b.WriteString(",\n")
	}
	if res.note != "" {
		n, _ := json.Marshal(res.note)
		b.WriteString(`  "note": `)
		b.Write(n)
		b.WriteString(",\n")
	}
	b.WriteString("  \"ok\": 1\n}\n")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b.Bytes())
}

// errorBody is the JSON twin of the wire error document.
type errorBody struct {
	OK       int    `json:"ok"`
	Errmsg   string `json:"errmsg"`
	Code     int32  `json:"code"`
	CodeName string `json:"codeName"`
}

func writeError(w http.ResponseWriter, e *Error) {
	b, _ := json.MarshalIndent(errorBody{Errmsg: "mongobouncer: " + e.Msg, Code: e.Code, CodeName: e.CodeName()}, "", "  ")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(e.httpStatus())
	_, _ = w.Write(append(b, '\n'))
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte("ok\n"))
}

func (h *httpHandler) readyz(w http.ResponseWriter, _ *http.Request) {
	ready, reasons := h.c.ctl.Ready()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case ready:
		// Ready with reasons: warnings a probe passes over but an operator
		// reading the page should see (an open-file limit too low for
		// max_client_conn).
		_, _ = w.Write([]byte("ok\n"))
	case len(reasons) == 0:
		reasons = []string{"not ready"}
		fallthrough
	default:
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	for _, r := range reasons {
		// One reason per line, whatever the Controller put in it.
		_, _ = w.Write([]byte(strings.ReplaceAll(r, "\n", " ") + "\n"))
	}
}

func (h *httpHandler) statusData(w http.ResponseWriter, _ *http.Request) {
	if !h.sampler.running() {
		h.sampler.sampleIfOlder(h.sampler.interval / 2)
	}
	b, err := json.Marshal(h.sampler.Data())
	if err != nil {
		writeError(w, errorf(CodeInternalError, "cannot encode the status data: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

const indexText = `mongobouncer admin listener

GET  /status            status page (charts)
GET  /status/data       the status page's data (JSON)
GET  /metrics           Prometheus metrics
GET  /healthz           200 while the process is alive
GET  /readyz            200 when every route can serve a primary read, else 503 and why (warnings follow "ok")
GET  /admin/pools       showPools
GET  /admin/stats       showStats
GET  /admin/clients     showClients
GET  /admin/servers     showServers
GET  /admin/config      showConfig
POST /admin/pause       pause     [?route=NAME]
POST /admin/resume      resume    [?route=NAME]
POST /admin/reconnect   reconnect [?route=NAME]
POST /admin/reload      reload
POST /admin/shutdown    shutdown
`

func index(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(indexText))
}

// Server is the admin HTTP listener: the NewHTTPHandler handler with
// timeouts, and a Sampler that runs while the server serves.
type Server struct {
	srv     *http.Server
	sampler *Sampler
}

// NewServer returns a Server sampling every DefaultSampleInterval for
// DefaultSampleWindow.
func NewServer(ctl Controller, metrics http.Handler, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := NewSampler(ctl, DefaultSampleInterval, DefaultSampleWindow)
	return &Server{sampler: s, srv: HTTPServer(NewHTTPHandler(ctl, metrics, logger, WithSampler(s)), logger)}
}

// HTTPServer returns an http.Server for h with the admin listener's
// bounds, so that slow or idle clients cannot hold its connections: 5s for
// the headers, 10s for the request, 30s for the response, 60s idle, 64 KiB
// of headers. Its own errors go to logger at Warn.
func HTTPServer(h http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// Serve starts the sampler and serves l until Shutdown, after which it
// returns nil; any other error is returned as is.
func (s *Server) Serve(l net.Listener) error {
	s.sampler.Start()
	err := s.srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	s.sampler.Stop()
	return err
}

// Shutdown stops the sampler, closes the listener and waits for requests
// in progress until ctx ends (see http.Server.Shutdown).
func (s *Server) Shutdown(ctx context.Context) error {
	s.sampler.Stop()
	return s.srv.Shutdown(ctx)
}
