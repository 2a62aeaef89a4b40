// Tests of the restart workload's stuck-command diagnostic: a command is
// reported once, after the wait, with the connection ids; answered and
// failed commands and hellos are not.

package loadgen

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
)

func TestWatchStuckReportsOnceAfterTheWait(t *testing.T) {
	c := &connCounter{s: ConnStats{CommandsFailed: map[string]int{}}, inflight: map[int64]*inflightCmd{}}
	ctx := context.Background()
	sid := int64(77)
	start := func(id int64, name string) {
		c.commandStarted(ctx, &event.CommandStartedEvent{CommandName: name, RequestID: id, ConnectionID: "127.0.0.1:1[-3]", ServerConnectionID: &sid})
	}
	start(1, "insert") // never answered
	start(2, "insert")
	start(3, "find")
	start(4, "hello") // awaitable hellos wait by design
	c.commandSucceeded(ctx, &event.CommandSucceededEvent{CommandFinishedEvent: event.CommandFinishedEvent{RequestID: 2}})
	c.commandFailed(ctx, &event.CommandFailedEvent{CommandFinishedEvent: event.CommandFinishedEvent{RequestID: 3, CommandName: "find"}, Failure: errors.New("boom")})

	var mu sync.Mutex
	var got []string
	var at time.Duration
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	began := time.Now()
	go func() {
		defer close(done)
		c.watchStuck(wctx, 300*time.Millisecond, func(s string) {
			mu.Lock()
			got, at = append(got, s), time.Since(began)
			mu.Unlock()
		})
	}()
	time.Sleep(1200 * time.Millisecond) // several ticks past the wait
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watchStuck did not end with its context")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("reports = %q, want one (request 1)", got)
	}
	for _, want := range []string{"insert", "requestId=1 ", "conn=127.0.0.1:1[-3]", "serverConnectionId=77"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("report %q lacks %q", got[0], want)
		}
	}
	if at < 300*time.Millisecond {
		t.Errorf("reported %v after the start, before the wait", at)
	}
}
