package pool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// logRecord is one captured slog record with its attributes flattened.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]slog.Value
}

// captureHandler is a slog.Handler that records everything.
type captureHandler struct {
	mu    *sync.Mutex
	recs  *[]logRecord
	attrs []slog.Attr
}

func newCapture() *captureHandler {
	return &captureHandler{mu: new(sync.Mutex), recs: new([]logRecord)}
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	m := map[string]slog.Value{}
	for _, a := range h.attrs {
		m[a.Key] = a.Value.Resolve()
	}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.Resolve()
		return true
	})
	h.mu.Lock()
	*h.recs = append(*h.recs, logRecord{level: r.Level, msg: r.Message, attrs: m})
	h.mu.Unlock()
	return nil
}

func (h *captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &captureHandler{mu: h.mu, recs: h.recs, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *captureHandler) WithGroup(string) slog.Handler { return h }

func (h *captureHandler) records() []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]logRecord(nil), *h.recs...)
}

// unifiedLogTest is the part of a unified-format logging test the pool can act out.
type unifiedLogTest struct {
	Description string `json:"description"`
	Operations  []struct {
		Name      string `json:"name"`
		Arguments struct {
			Entities []struct {
				Client struct {
					URIOptions map[string]any `json:"uriOptions"`
				} `json:"client"`
			} `json:"entities"`
		} `json:"arguments"`
	} `json:"operations"`
	ExpectLogMessages []struct {
		Messages []struct {
			Level     string         `json:"level"`
			Component string         `json:"component"`
			Data      map[string]any `json:"data"`
		} `json:"messages"`
	} `json:"expectLogMessages"`
}

// TestSpecLogging acts out, on a bare pool, each scenario of the spec's
// logging/*.json tests and compares the log records with the expected messages:
// same messages in the same order, debug level, connection component, and every
// expected key present with the expected type or value.
func TestSpecLogging(t *testing.T) {
	dir := specDir(t, "logging")
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(files) == 0 {
		t.Fatalf("no logging tests in %s", dir)
	}
	sort.Strings(files)
	ran := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var file struct {
			Tests []unifiedLogTest `json:"tests"`
		}
		if err := json.Unmarshal(raw, &file); err != nil {
			t.Fatal(err)
		}
		for _, lt := range file.Tests {
			t.Run(lt.Description, func(t *testing.T) {
				recs, ok := actOutLogTest(t, lt)
				if !ok {
					return
				}
				ran++
				var want []map[string]any
				for _, e := range lt.ExpectLogMessages {
					for _, m := range e.Messages {
						if m.Level != "debug" || m.Component != "connection" {
							t.Fatalf("unexpected expectation %s/%s", m.Level, m.Component)
						}
						want = append(want, m.Data)
					}
				}
				if len(recs) != len(want) {
					t.Errorf("got %d messages, want %d:\n got  %v\n want %v", len(recs), len(want), messages(recs), want)
				}
				for i := 0; i < len(recs) && i < len(want); i++ {
					if err := matchLog(want[i], recs[i]); err != nil {
						t.Errorf("message %d (%q): %v", i, recs[i].msg, err)
					}
				}
			})
		}
	}
	if ran < 5 {
		t.Errorf("only %d logging scenarios ran", ran)
	}
}

// actOutLogTest performs the pool operations the driver test implies and returns the
// pool's log records. It skips the scenarios of deprecated options (the spec says they
// MUST NOT be implemented).
func actOutLogTest(t *testing.T, lt unifiedLogTest) ([]logRecord, bool) {
	capt := newCapture()
	o := pool.DefaultOptions()
	o.Logger = slog.New(capt)
	var uri map[string]any
	if len(lt.Operations) > 0 && len(lt.Operations[0].Arguments.Entities) > 0 {
		uri = lt.Operations[0].Arguments.Entities[0].Client.URIOptions
	}
	for k, v := range uri {
		n, _ := v.(float64)
		switch k {
		case "minPoolSize":
			o.MinPoolSize = int(n)
		case "maxPoolSize":
			o.MaxPoolSize = int(n)
		case "maxIdleTimeMS":
			o.MaxIdleTime = time.Duration(n) * time.Millisecond
		case "maxConnecting":
			o.MaxConnecting = int(n)
		case "waitQueueTimeoutMS":
			o.WaitQueueTimeout = time.Duration(n) * time.Millisecond
		case "waitQueueSize", "waitQueueMultiple":
			t.Skipf("%s is deprecated: the spec forbids implementing it", k)
		}
	}
	rec := newRecorder(o)
	o.Monitor = rec
	var self atomic.Pointer[pool.Pool]
	mc := &mockConnector{}
	desc := strings.ToLower(lt.Description)
	failing := strings.Contains(desc, "error establishing")
	if failing {
		// The driver's handshake error handling (SDAM) clears the pool before the
		// failed connection is closed; a topology-aware Connector does the same.
		mc.fail = func(int64) error {
			self.Load().Clear(false)
			return errors.New("saslContinue: connection closed by fail point")
		}
	}
	p, err := pool.New("localhost:27017", mc, o)
	if err != nil {
		t.Fatal(err)
	}
	self.Store(p)
	defer p.Close()
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	switch {
	case strings.Contains(desc, "run a command, and close"):
		for range 2 {
			c, err := p.CheckOut(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := p.CheckIn(c); err != nil {
				t.Fatal(err)
			}
		}
		p.Close()
	case failing:
		if _, err := p.CheckOut(ctxT(t)); !errors.As(err, new(*pool.ConnectionError)) {
			t.Fatalf("checkout: %v", err)
		}
	case o.MinPoolSize > 0:
		if err := rec.waitFor(pool.ConnectionReady, 1, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		// The recorder may hear the event before the log monitor has
		// written its record: wait for the record itself.
		deadline := time.Now().Add(5 * time.Second)
		for !hasMessage(capt.records(), "Connection ready") {
			if time.Now().After(deadline) {
				t.Fatal("no \"Connection ready\" log record after 5s")
			}
			time.Sleep(time.Millisecond)
		}
	}
	return capt.records(), true
}

func hasMessage(recs []logRecord, msg string) bool {
	for _, r := range recs {
		if r.msg == msg {
			return true
		}
	}
	return false
}

func messages(recs []logRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.msg
	}
	return out
}

// matchLog checks one record against the unified format's expected data.
func matchLog(want map[string]any, r logRecord) error {
	if r.level != slog.LevelDebug {
		return fmt.Errorf("level %v, want debug", r.level)
	}
	if c := r.attrs["component"]; c.Kind() != slog.KindString || c.String() != "connection" {
		return fmt.Errorf("component %v, want connection", c)
	}
	for k, w := range want {
		if k == "message" {
			if r.msg != w {
				return fmt.Errorf("message %q, want %q", r.msg, w)
			}
			continue
		}
		v, present := r.attrs[k]
		switch w := w.(type) {
		case map[string]any:
			if _, ok := w["$$exists"]; ok {
				if !present {
					return fmt.Errorf("key %s missing", k)
				}
				continue
			}
			if !present {
				return fmt.Errorf("key %s missing", k)
			}
			var types []string
			switch tt := w["$$type"].(type) {
			case string:
				types = []string{tt}
			case []any:
				for _, x := range tt {
					s, _ := x.(string)
					types = append(types, s)
				}
			default:
				return fmt.Errorf("unsupported expectation %v", w)
			}
			if !kindMatches(v.Kind(), types) {
				return fmt.Errorf("key %s has kind %v, want one of %v", k, v.Kind(), types)
			}
		case string:
			if !present || v.Kind() != slog.KindString || v.String() != w {
				return fmt.Errorf("key %s = %v, want %q", k, v, w)
			}
		case float64:
			if !present || !numberEquals(v, w) {
				return fmt.Errorf("key %s = %v, want %v", k, v, w)
			}
		default:
			return fmt.Errorf("unsupported expectation %s: %v", k, w)
		}
	}
	return nil
}

func kindMatches(k slog.Kind, types []string) bool {
	for _, t := range types {
		switch {
		case t == "string" && k == slog.KindString,
			(t == "int" || t == "long") && (k == slog.KindInt64 || k == slog.KindUint64),
			t == "double" && k == slog.KindFloat64:
			return true
		}
	}
	return false
}

func numberEquals(v slog.Value, w float64) bool {
	switch v.Kind() {
	case slog.KindInt64:
		return float64(v.Int64()) == w
	case slog.KindUint64:
		return float64(v.Uint64()) == w
	case slog.KindFloat64:
		return v.Float64() == w
	}
	return false
}

// The log texts of every reason, and the address split into serverHost/serverPort.
func TestLogMonitorDetails(t *testing.T) {
	capt := newCapture()
	m := pool.NewLogMonitor(slog.New(capt))
	if pool.NewLogMonitor(nil) != nil {
		t.Fatal("NewLogMonitor(nil) must be nil")
	}
	boom := errors.New("boom")
	for _, e := range []pool.Event{
		{Type: pool.ConnectionClosed, Address: "db1:27018", ConnectionID: 3, Reason: pool.ReasonStale},
		{Type: pool.ConnectionClosed, Address: "db1", ConnectionID: 3, Reason: pool.ReasonIdle},
		{Type: pool.ConnectionClosed, Address: "[::1]:27017", ConnectionID: 3, Reason: pool.ReasonError, Err: boom},
		{Type: pool.ConnectionClosed, Address: "/tmp/mongodb-27017.sock", ConnectionID: 3, Reason: pool.ReasonPoolClosed},
		{Type: pool.ConnectionCheckOutFailed, Address: "h:1", Reason: pool.ReasonTimeout, Duration: 1500 * time.Microsecond},
		{Type: pool.ConnectionCheckOutFailed, Address: "h:1", Reason: pool.ReasonConnectionError, Err: boom},
		{Type: pool.ConnectionCheckOutFailed, Address: "h:1", Reason: pool.ReasonPoolClosed},
		{Type: pool.PoolCleared, Address: "h:1", HasServiceID: true, ServiceID: svcA},
	} {
		m.HandleEvent(e)
	}
	recs := capt.records()
	want := []struct {
		host   string
		port   int64 // 0: absent
		reason string
		err    bool
	}{
		{"db1", 27018, "Connection became stale because the pool was cleared", false},
		{"db1", 27017, "Connection has been available but unused for longer than the configured max idle time", false},
		{"::1", 27017, "An error occurred while using the connection", true},
		{"/tmp/mongodb-27017.sock", 0, "Connection pool was closed", false},
		{"h", 1, "Wait queue timeout elapsed without a connection becoming available", false},
		{"h", 1, "An error occurred while trying to establish a new connection", true},
		{"h", 1, "Connection pool was closed", false},
	}
	for i, w := range want {
		r := recs[i]
		port, hasPort := r.attrs["serverPort"]
		if r.attrs["serverHost"].String() != w.host || hasPort != (w.port != 0) || (hasPort && port.Int64() != w.port) {
			t.Errorf("record %d: host %v port %v", i, r.attrs["serverHost"], port)
		}
		if r.attrs["reason"].String() != w.reason {
			t.Errorf("record %d: reason %q", i, r.attrs["reason"])
		}
		if _, has := r.attrs["error"]; has != w.err {
			t.Errorf("record %d: error present %v", i, has)
		}
	}
	if d := recs[4].attrs["durationMS"]; d.Kind() != slog.KindFloat64 || d.Float64() != 1.5 {
		t.Errorf("durationMS %v", d)
	}
	if s := recs[7].attrs["serviceId"]; recs[7].msg != "Connection pool cleared" || s.String() != svcA.Hex() {
		t.Errorf("pool cleared record %v %v", recs[7].msg, s)
	}
}
