package pool_test

// The CMAP conformance runner: every file of the official cmap-format suite, read at
// run time from ../shared/specs/cmap (or $CMAP_SPEC_DIR), never copied into the repo.
// Unit tests run against mock connections; integration tests run the real dialer
// (internal/upstream) against the scripted fake server (internal/testutil/fakemongo),
// which honours the failCommand fail points they use.
//
// The runner is stricter than the Go driver's: all 33 files run,
// `interruptInUseConnections` is compared like any other field, every event's
// counts are checked (total = available + pending + in use, total <= maxPoolSize,
// pending <= maxConnecting), and a checkout that failed with reason "timeout" must
// have waited at least waitQueueTimeoutMS. The files give `duration` only as the
// "any value" placeholder, so the runner checks every measured duration against
// the times it saw the events and ran the checkouts instead (checkDurations).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// specTest is one cmap-format file.
type specTest struct {
	Version     int              `json:"version"`
	Style       string           `json:"style"`
	Description string           `json:"description"`
	PoolOptions map[string]any   `json:"poolOptions"`
	Operations  []map[string]any `json:"operations"`
	Error       map[string]any   `json:"error"`
	Events      []map[string]any `json:"events"`
	Ignore      []string         `json:"ignore"`
	FailPoint   json.RawMessage  `json:"failPoint"`
}

const (
	specWaitForEventTimeout = 10 * time.Second // when a waitForEvent gives none
	specThreadTimeout       = 15 * time.Second // waitForThread and final thread cleanup
	specCheckOutTimeout     = 30 * time.Second // safety bound of every checkOut
)

func TestCMAPSpec(t *testing.T) {
	dir := specDir(t, "cmap-format")
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no CMAP test files in %s", dir)
	}
	sort.Strings(files)
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var st specTest
			if err := json.Unmarshal(raw, &st); err != nil {
				t.Fatalf("parse %s: %v", f, err)
			}
			runSpecTest(t, &st)
		})
	}
}

// specRun is the state of one running spec test.
type specRun struct {
	t    *testing.T
	pool *pool.Pool
	rec  *recorder

	mu        sync.Mutex
	conns     map[string]*pool.Conn // labelled checkouts
	threads   map[string]*specThread
	checkouts []*checkoutWindow // every checkOut operation, in start order
}

// specThread runs the operations scheduled on one named thread, in order; after the
// first error it skips the rest (the error surfaces through waitForThread only).
type specThread struct {
	ops  chan map[string]any
	done chan struct{}
	err  error // written by the thread before done is closed
}

func runSpecTest(t *testing.T, st *specTest) {
	opts, err := specOptions(st.PoolOptions)
	if err != nil {
		t.Fatal(err)
	}
	var connector pool.Connector
	address := "mongodb.test:27017"
	switch st.Style {
	case "unit":
		connector = &mockConnector{}
	case "integration":
		srv := fakemongo.Start(t, fakemongo.Options{})
		if len(st.FailPoint) > 0 {
			fp, err := specFailPoint(st.FailPoint)
			if err != nil {
				t.Fatal(err)
			}
			srv.SetFailPoint(fp)
			t.Cleanup(srv.ClearFailPoint)
		}
		appName, _ := st.PoolOptions["appName"].(string)
		connector = upstream.NewDialer(upstream.Options{AppName: appName, ConnectTimeout: 30 * time.Second})
		address = srv.Addr()
	default:
		t.Fatalf("unknown style %q", st.Style)
	}

	rec := newRecorder(opts)
	opts.Monitor = rec
	// The runner is the topology layer: an error while populating the pool clears it,
	// as the test README says SDAM would.
	var self atomic.Pointer[pool.Pool]
	opts.OnBackgroundError = func(error) {
		if p := self.Load(); p != nil {
			p.Clear(false)
		}
	}
	p, err := pool.New(address, connector, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	self.Store(p)
	r := &specRun{t: t, pool: p, rec: rec, conns: map[string]*pool.Conn{}, threads: map[string]*specThread{}}
	defer r.cleanup()

	var mainErr error
	for i, op := range st.Operations {
		if th, _ := op["thread"].(string); th != "" {
			if err := r.schedule(th, op); err != nil {
				t.Fatalf("operation %d: %v", i, err)
			}
			continue
		}
		if mainErr = r.exec(op); mainErr != nil {
			break
		}
	}
	events, at := rec.stamped()

	if st.Error != nil {
		if mainErr == nil {
			t.Errorf("expected error %v, got none", st.Error)
		} else if err := match(st.Error, errorMap(mainErr), "error"); err != nil {
			t.Errorf("error %v does not match %v: %v", mainErr, st.Error, err)
		}
	} else if mainErr != nil {
		t.Errorf("unexpected error: %v", mainErr)
	}

	ignore := map[string]bool{}
	for _, n := range st.Ignore {
		ignore[n] = true
	}
	var actual []pool.Event
	for _, e := range events {
		if !ignore[e.Type.String()] {
			actual = append(actual, e)
		}
	}
	for i, exp := range st.Events {
		if i >= len(actual) {
			t.Errorf("event %d: expected %v, but only %d events: %v", i, exp, len(actual), types(actual))
			break
		}
		if err := match(exp, eventMap(actual[i]), fmt.Sprintf("events[%d]", i)); err != nil {
			t.Errorf("event %d: %v\n expected %v\n actual   %v\n all      %v", i, err, exp, eventMap(actual[i]), types(actual))
		}
	}
	for _, e := range events {
		if e.Type == pool.ConnectionCheckOutFailed && e.Reason == pool.ReasonTimeout &&
			opts.WaitQueueTimeout > 0 && e.Duration < opts.WaitQueueTimeout {
			t.Errorf("checkout timed out after %v, before waitQueueTimeout %v", e.Duration, opts.WaitQueueTimeout)
		}
	}
	checkDurations(t, events, at, r.checkoutWindows())
	rec.checkInvariants(t)
}

// specOptions maps a test's poolOptions onto Options.
func specOptions(po map[string]any) (pool.Options, error) {
	o := pool.DefaultOptions()
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	for k, v := range po {
		if k == "appName" {
			continue
		}
		n, ok := v.(float64)
		if !ok {
			return o, fmt.Errorf("poolOptions.%s: not a number: %v", k, v)
		}
		switch k {
		case "maxPoolSize":
			o.MaxPoolSize = int(n)
		case "minPoolSize":
			o.MinPoolSize = int(n)
		case "maxIdleTimeMS":
			o.MaxIdleTime = ms(n)
		case "maxConnecting":
			o.MaxConnecting = int(n)
		case "waitQueueTimeoutMS":
			o.WaitQueueTimeout = ms(n)
		case "backgroundThreadIntervalMS":
			if n < 0 {
				o.MaintenanceInterval = -1
			} else {
				o.MaintenanceInterval = ms(n)
			}
		default:
			return o, fmt.Errorf("unsupported pool option %q", k)
		}
	}
	return o, nil
}

// specFailPoint converts a test's configureFailPoint command for the fake server.
func specFailPoint(raw json.RawMessage) (fakemongo.FailPoint, error) {
	var doc bson.D
	if err := bson.UnmarshalExtJSON(raw, false, &doc); err != nil {
		return fakemongo.FailPoint{}, err
	}
	b, err := bson.Marshal(doc)
	if err != nil {
		return fakemongo.FailPoint{}, err
	}
	return fakemongo.ParseFailPoint(b)
}

// schedule queues op on the named thread.
func (r *specRun) schedule(name string, op map[string]any) error {
	r.mu.Lock()
	th := r.threads[name]
	r.mu.Unlock()
	if th == nil {
		return fmt.Errorf("thread %q not started", name)
	}
	th.ops <- op
	return nil
}

// exec runs one operation on the calling goroutine.
func (r *specRun) exec(op map[string]any) error {
	name, _ := op["name"].(string)
	switch name {
	case "start":
		target, _ := op["target"].(string)
		th := &specThread{ops: make(chan map[string]any, 64), done: make(chan struct{})}
		r.mu.Lock()
		r.threads[target] = th
		r.mu.Unlock()
		go func() {
			defer close(th.done)
			for op := range th.ops {
				if th.err == nil {
					th.err = r.exec(op)
				}
			}
		}()
		return nil
	case "wait":
		ms, _ := op["ms"].(float64)
		time.Sleep(time.Duration(ms * float64(time.Millisecond)))
		return nil
	case "waitForThread":
		target, _ := op["target"].(string)
		r.mu.Lock()
		th := r.threads[target]
		delete(r.threads, target)
		r.mu.Unlock()
		if th == nil {
			return fmt.Errorf("waitForThread: no thread %q", target)
		}
		close(th.ops)
		select {
		case <-th.done:
			return th.err
		case <-time.After(specThreadTimeout):
			return fmt.Errorf("waitForThread %q: still running after %v", target, specThreadTimeout)
		}
	case "waitForEvent":
		ev, _ := op["event"].(string)
		count, _ := op["count"].(float64)
		timeout := specWaitForEventTimeout
		if ms, ok := op["timeout"].(float64); ok {
			timeout = time.Duration(ms * float64(time.Millisecond))
		}
		typ, ok := eventTypeByName(ev)
		if !ok {
			return fmt.Errorf("waitForEvent: unknown event %q", ev)
		}
		return r.rec.waitFor(typ, int(count), timeout)
	case "checkOut":
		ctx, cancel := context.WithTimeout(context.Background(), specCheckOutTimeout)
		defer cancel()
		w := r.startCheckout()
		c, err := r.pool.CheckOut(ctx)
		r.endCheckout(w, c, err)
		if err != nil {
			return err
		}
		label, _ := op["label"].(string)
		if label == "" {
			label = fmt.Sprintf("unlabelled-%d", c.ID())
		}
		r.mu.Lock()
		r.conns[label] = c
		r.mu.Unlock()
		return nil
	case "checkIn":
		label, _ := op["connection"].(string)
		r.mu.Lock()
		c := r.conns[label]
		delete(r.conns, label)
		r.mu.Unlock()
		if c == nil {
			return fmt.Errorf("checkIn: no connection labelled %q", label)
		}
		return r.pool.CheckIn(c)
	case "clear":
		interrupt, _ := op["interruptInUseConnections"].(bool)
		r.pool.Clear(interrupt)
		return nil
	case "close":
		r.pool.Close()
		return nil
	case "ready":
		return r.pool.Ready()
	}
	return fmt.Errorf("unknown operation %q", name)
}

// cleanup closes the pool, lets every thread finish (a closed pool fails their
// checkouts) and checks in what they hold.
func (r *specRun) cleanup() {
	r.pool.Close()
	r.mu.Lock()
	threads := r.threads
	r.threads = nil
	r.mu.Unlock()
	for name, th := range threads {
		close(th.ops)
		select {
		case <-th.done:
		case <-time.After(specThreadTimeout):
			r.t.Errorf("thread %q did not finish after the pool was closed", name)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		if err := r.pool.CheckIn(c); err != nil {
			r.t.Errorf("cleanup check-in of connection %d: %v", c.ID(), err)
		}
	}
}

func eventTypeByName(name string) (pool.EventType, bool) {
	for t := pool.PoolCreated; t <= pool.ConnectionCheckedIn; t++ {
		if t.String() == name {
			return t, true
		}
	}
	return 0, false
}

// eventMap renders an event with the spec's field names and JSON types.
func eventMap(e pool.Event) map[string]any {
	m := map[string]any{"type": e.Type.String(), "address": e.Address}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	switch e.Type {
	case pool.PoolCreated:
		if o := e.Options; o != nil {
			m["options"] = map[string]any{
				"maxPoolSize":        float64(o.MaxPoolSize),
				"minPoolSize":        float64(o.MinPoolSize),
				"maxIdleTimeMS":      ms(o.MaxIdleTime),
				"maxConnecting":      float64(o.MaxConnecting),
				"waitQueueTimeoutMS": ms(o.WaitQueueTimeout),
			}
		}
	case pool.PoolCleared:
		m["interruptInUseConnections"] = e.InterruptInUseConnections
		if e.HasServiceID {
			m["serviceId"] = e.ServiceID.Hex()
		}
	case pool.ConnectionCreated, pool.ConnectionCheckedIn:
		m["connectionId"] = float64(e.ConnectionID)
	case pool.ConnectionReady, pool.ConnectionCheckedOut:
		m["connectionId"] = float64(e.ConnectionID)
		m["duration"] = ms(e.Duration)
	case pool.ConnectionClosed:
		m["connectionId"] = float64(e.ConnectionID)
		m["reason"] = string(e.Reason)
	case pool.ConnectionCheckOutFailed:
		m["reason"] = string(e.Reason)
		m["duration"] = ms(e.Duration)
	}
	return m
}

// errorMap renders a pool error with the spec's type names.
func errorMap(err error) map[string]any {
	m := map[string]any{"message": err.Error()}
	var (
		closed  *pool.PoolClosedError
		cleared *pool.PoolClearedError
		timeout *pool.WaitQueueTimeoutError
		connErr *pool.ConnectionError
	)
	switch {
	case errors.As(err, &closed):
		m["type"], m["message"], m["address"] = "PoolClosedError", closed.Message(), closed.Address
	case errors.As(err, &cleared):
		m["type"], m["message"], m["address"] = "PoolClearedError", cleared.Message(), cleared.Address
	case errors.As(err, &timeout):
		m["type"], m["message"], m["address"] = "WaitQueueTimeoutError", timeout.Message(), timeout.Address
	case errors.As(err, &connErr):
		m["type"], m["message"], m["address"] = "ConnectionError", connErr.Message(), connErr.Address
	default:
		m["type"] = fmt.Sprintf("%T", err)
	}
	return m
}

// isPlaceholder reports whether v is the spec's "any value" (42 or "42").
func isPlaceholder(v any) bool {
	switch x := v.(type) {
	case float64:
		return x == 42
	case string:
		return x == "42"
	}
	return false
}

// match implements the spec's MATCH: actual MATCHES expected when expected is a
// subset of actual, 42 / "42" meaning "present, any value".
func match(expected, actual any, path string) error {
	if isPlaceholder(expected) {
		if actual == nil {
			return fmt.Errorf("%s: missing", path)
		}
		return nil
	}
	switch e := expected.(type) {
	case map[string]any:
		a, ok := actual.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, have %T %v", path, actual, actual)
		}
		keys := make([]string, 0, len(e))
		for k := range e {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := match(e[k], a[k], path+"."+k); err != nil {
				return err
			}
		}
		return nil
	case []any:
		a, ok := actual.([]any)
		if !ok {
			return fmt.Errorf("%s: want an array, have %T", path, actual)
		}
		for i, v := range e {
			if i >= len(a) {
				return fmt.Errorf("%s[%d]: missing", path, i)
			}
			if err := match(v, a[i], fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	if reflect.TypeOf(expected) != reflect.TypeOf(actual) {
		return fmt.Errorf("%s: want %T %v, have %T %v", path, expected, expected, actual, actual)
	}
	if expected != actual {
		return fmt.Errorf("%s: want %v, have %v", path, expected, actual)
	}
	return nil
}
