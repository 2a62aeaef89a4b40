package loadgen

// A metric over time: what the sweep records from mongobouncer's /metrics
// while it runs (the adaptive pool limit), scraped at a fixed interval.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Point is one reading of a metric, At after the series' origin.
type Point struct {
	At    time.Duration `json:"at_ns"`
	Value float64       `json:"value"`
}

// ScrapeValue reads a Prometheus text exposition and returns the sum of
// every series of the metric named name (all label sets), and whether any
// was found.
func ScrapeValue(r io.Reader, name string) (float64, bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var sum float64
	found := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		switch {
		case strings.HasPrefix(rest, "{"):
			i := strings.LastIndexByte(rest, '}')
			if i < 0 {
				continue
			}
			rest = rest[i+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // another metric whose name starts with name
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		sum += v
		found = true
	}
	return sum, found
}

// WatchMetric scrapes url (a /metrics endpoint) every interval until ctx
// ends and returns the readings of metric name, timed from origin. Failed
// or empty scrapes leave no point. Every scrape is bounded by interval.
func WatchMetric(ctx context.Context, url, name string, origin time.Time, interval time.Duration) []Point {
	client := &http.Client{Timeout: max(4*interval, time.Second)}
	t := time.NewTicker(interval)
	defer t.Stop()
	var out []Point
	for {
		if v, err := scrapeOnce(ctx, client, url, name); err == nil {
			out = append(out, Point{At: time.Since(origin), Value: v})
		}
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
	}
}

func scrapeOnce(ctx context.Context, client *http.Client, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	v, ok := ScrapeValue(resp.Body, name)
	if !ok {
		return 0, fmt.Errorf("%s: no %s", url, name)
	}
	return v, nil
}
