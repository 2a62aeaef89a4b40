package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestScrapeValue(t *testing.T) {
	text := `# HELP mongobouncer_pool_limit x
# TYPE mongobouncer_pool_limit gauge
mongobouncer_pool_limit{route="*",server="a:1"} 12
mongobouncer_pool_limit{route="b",server="a:1"} 3
mongobouncer_pool_limit_gradient{route="*",server="a:1"} 0.5
other 7
`
	if v, ok := ScrapeValue(strings.NewReader(text), "mongobouncer_pool_limit"); !ok || v != 15 {
		t.Fatalf("limit = %v %v, want 15 (both series, not the gradient)", v, ok)
	}
	if v, ok := ScrapeValue(strings.NewReader(text), "other"); !ok || v != 7 {
		t.Fatalf("unlabelled = %v %v", v, ok)
	}
	if _, ok := ScrapeValue(strings.NewReader(text), "absent"); ok {
		t.Fatal("found an absent metric")
	}
}

func TestWatchMetric(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "m{a=\"b\"} %d\n", n.Add(1))
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Millisecond)
	defer cancel()
	pts := WatchMetric(ctx, srv.URL, "m", time.Now(), 10*time.Millisecond)
	if len(pts) < 3 {
		t.Fatalf("%d points in 120ms at 10ms", len(pts))
	}
	for i := 1; i < len(pts); i++ {
		if pts[i].Value <= pts[i-1].Value || pts[i].At <= pts[i-1].At {
			t.Fatalf("points out of order: %v", pts)
		}
	}
}
