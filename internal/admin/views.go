package admin

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// The views below are what showClients, showServers and showStats (and
// their /admin/... twins) return. They add the derived numbers an operator
// would otherwise compute by hand (ages, rates, milliseconds) to the
// Controller's snapshots.

// ClientView is one client in showClients: the Controller's ClientInfo and
// how long the client has been connected.
type ClientView struct {
	ClientInfo `bson:",inline"`
	// ConnectedForSec is how long the client has been connected.
	ConnectedForSec float64 `json:"connectedForSec" bson:"connectedForSec"`
}

// ServerConnView is one upstream connection in showServers.
type ServerConnView struct {
	Route      string `json:"route" bson:"route"`
	Server     string `json:"server" bson:"server"`
	ID         int64  `json:"id" bson:"id"`
	State      string `json:"state" bson:"state"`
	Generation uint64 `json:"generation" bson:"generation"`
	// Role is the server's role now (PoolInfo.Role).
	Role      string    `json:"role" bson:"role"`
	CreatedAt time.Time `json:"createdAt" bson:"createdAt"`
	// AgeSec is how long ago the connection was created.
	AgeSec float64 `json:"ageSec" bson:"ageSec"`
	// LastUsed and IdleSec are absent for a connection never checked out,
	// so mongosh shows no year-1 dates.
	LastUsed *time.Time `json:"lastUsed,omitempty" bson:"lastUsed,omitempty"`
	IdleSec  *float64   `json:"idleSec,omitempty" bson:"idleSec,omitempty"`
}

// StatsReport is showStats: the Controller's totals, rates over a window,
// and latencies both in milliseconds (to read) and nanoseconds (to compute
// with).
type StatsReport struct {
	UptimeSec      float64 `json:"uptimeSec" bson:"uptimeSec"`
	ClientsCurrent int     `json:"clientsCurrent" bson:"clientsCurrent"`
	ClientsTotal   uint64  `json:"clientsTotal" bson:"clientsTotal"`
	Operations     uint64  `json:"operations" bson:"operations"`
	Errors         uint64  `json:"errors" bson:"errors"`
	BytesIn        uint64  `json:"bytesIn" bson:"bytesIn"`
	BytesOut       uint64  `json:"bytesOut" bson:"bytesOut"`
	Rates          Rates   `json:"rates" bson:"rates"`
	WaitAvgMs      float64 `json:"waitAvgMs" bson:"waitAvgMs"`
	WaitP99Ms      float64 `json:"waitP99Ms" bson:"waitP99Ms"`
	QueryAvgMs     float64 `json:"queryAvgMs" bson:"queryAvgMs"`
	QueryP99Ms     float64 `json:"queryP99Ms" bson:"queryP99Ms"`
	UptimeNs       int64   `json:"uptimeNs" bson:"uptimeNs"`
	WaitAvgNs      int64   `json:"waitAvgNs" bson:"waitAvgNs"`
	WaitP99Ns      int64   `json:"waitP99Ns" bson:"waitP99Ns"`
	QueryAvgNs     int64   `json:"queryAvgNs" bson:"queryAvgNs"`
	QueryP99Ns     int64   `json:"queryP99Ns" bson:"queryP99Ns"`
	// DBWaits, DBEvictions and UserClientRefused are StatsInfo's.
	DBWaits           uint64 `json:"dbWaits" bson:"dbWaits"`
	DBEvictions       uint64 `json:"dbEvictions" bson:"dbEvictions"`
	UserClientRefused uint64 `json:"userClientRefused" bson:"userClientRefused"`
}

// Rates are per-second rates over WindowSec, which ends now and starts at
// the previous showStats (Since "previousShowStats") or, for the first one,
// at process start (Since "start").
type Rates struct {
	Since            string  `json:"since" bson:"since"`
	WindowSec        float64 `json:"windowSec" bson:"windowSec"`
	OperationsPerSec float64 `json:"operationsPerSec" bson:"operationsPerSec"`
	ErrorsPerSec     float64 `json:"errorsPerSec" bson:"errorsPerSec"`
	BytesInPerSec    float64 `json:"bytesInPerSec" bson:"bytesInPerSec"`
	BytesOutPerSec   float64 `json:"bytesOutPerSec" bson:"bytesOutPerSec"`
	ClientsPerSec    float64 `json:"clientsPerSec" bson:"clientsPerSec"`
}

// Rates.Since values.
const (
	SinceStart    = "start"
	SincePrevious = "previousShowStats"
)

// round keeps d decimals: µs precision for milliseconds, enough for rates,
// and no 17-digit floats on the operator's screen.
func round(x float64, d int) float64 {
	p := math.Pow10(d)
	return math.Round(x*p) / p
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 3) }

func sec(d time.Duration) float64 { return round(d.Seconds(), 3) }

// rates computes Rates from prev to cur; a zero prev means process start.
func rates(prev, cur StatsInfo, since string) Rates {
	window := cur.Uptime - prev.Uptime
	r := Rates{Since: since, WindowSec: sec(window)}
	if window <= 0 {
		return r
	}
	per := func(a, b uint64) float64 {
		if b < a { // a counter went backwards: no honest rate
			return 0
		}
		return round(float64(b-a)/window.Seconds(), 2)
	}
	r.OperationsPerSec = per(prev.Operations, cur.Operations)
	r.ErrorsPerSec = per(prev.Errors, cur.Errors)
	r.BytesInPerSec = per(prev.BytesIn, cur.BytesIn)
	r.BytesOutPerSec = per(prev.BytesOut, cur.BytesOut)
	r.ClientsPerSec = per(prev.ClientsTotal, cur.ClientsTotal)
	return r
}

func statsReport(cur StatsInfo, r Rates) StatsReport {
	return StatsReport{
		UptimeSec:      sec(cur.Uptime),
		ClientsCurrent: cur.ClientsCurrent,
		ClientsTotal:   cur.ClientsTotal,
		Operations:     cur.Operations,
		Errors:         cur.Errors,
		BytesIn:        cur.BytesIn,
		BytesOut:       cur.BytesOut,
		Rates:          r,
		WaitAvgMs:      ms(cur.WaitAvg),
		WaitP99Ms:      ms(cur.WaitP99),
		QueryAvgMs:     ms(cur.QueryAvg),
		QueryP99Ms:     ms(cur.QueryP99),
		UptimeNs:       int64(cur.Uptime),
		WaitAvgNs:      int64(cur.WaitAvg),
		WaitP99Ns:      int64(cur.WaitP99),
		QueryAvgNs:     int64(cur.QueryAvg),
		QueryP99Ns:     int64(cur.QueryP99),

		DBWaits:           cur.DBWaits,
		DBEvictions:       cur.DBEvictions,
		UserClientRefused: cur.UserClientRefused,
	}
}

func clientViews(cs []ClientInfo, now time.Time) []ClientView {
	out := make([]ClientView, 0, len(cs))
	for _, c := range cs {
		out = append(out, ClientView{ClientInfo: c, ConnectedForSec: sec(now.Sub(c.ConnectedAt))})
	}
	slices.SortFunc(out, func(a, b ClientView) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func serverViews(ss []ServerConnInfo, now time.Time) []ServerConnView {
	out := make([]ServerConnView, 0, len(ss))
	for _, s := range ss {
		v := ServerConnView{
			Route: s.Route, Server: s.Server, ID: s.ID, State: s.State, Generation: s.Generation, Role: s.Role,
			CreatedAt: s.CreatedAt, AgeSec: sec(now.Sub(s.CreatedAt)),
		}
		if !s.LastUsed.IsZero() {
			lu, idle := s.LastUsed, sec(now.Sub(s.LastUsed))
			v.LastUsed, v.IdleSec = &lu, &idle
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b ServerConnView) int {
		return cmp.Or(cmp.Compare(a.Route, b.Route), cmp.Compare(a.Server, b.Server), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// sortedPools returns a sorted copy: the Controller's order is whatever
// its maps give, and operators compare consecutive outputs by eye.
func sortedPools(ps []PoolInfo) []PoolInfo {
	out := make([]PoolInfo, len(ps))
	copy(out, ps)
	slices.SortFunc(out, func(a, b PoolInfo) int {
		return cmp.Or(cmp.Compare(a.Route, b.Route), cmp.Compare(a.Server, b.Server), cmp.Compare(a.User, b.User))
	})
	return out
}
