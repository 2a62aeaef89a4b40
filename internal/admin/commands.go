package admin

import (
	"context"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// command is one admin command, shared by the wire (first key of the
// command document) and HTTP (method and path) front ends, so both have the
// same semantics by construction.
type command struct {
	name   string // wire name, e.g. showPools
	path   string // HTTP path, e.g. /admin/pools
	action bool   // changes state: POST over HTTP, logged at info
	route  bool   // takes an optional route ("" = every route)
	run    func(c *core, route string) (result, error)
}

// result is a successful command's answer: {<key>: value, note, ok: 1}.
// Actions have no key, only a note.
type result struct {
	key   string
	value any
	note  string
}

var commands = []command{
	{name: "showPools", path: "/admin/pools", run: func(c *core, _ string) (result, error) {
		return result{key: "pools", value: sortedPools(c.ctl.Pools())}, nil
	}},
	{name: "showStats", path: "/admin/stats", run: func(c *core, _ string) (result, error) {
		return result{key: "stats", value: c.stats()}, nil
	}},
	{name: "showClients", path: "/admin/clients", run: func(c *core, _ string) (result, error) {
		return result{key: "clients", value: clientViews(c.ctl.Clients(), c.now())}, nil
	}},
	{name: "showServers", path: "/admin/servers", run: func(c *core, _ string) (result, error) {
		return result{key: "servers", value: serverViews(c.ctl.Servers(), c.now())}, nil
	}},
	{name: "showConfig", path: "/admin/config", run: func(c *core, _ string) (result, error) {
		cfg := c.ctl.Config()
		if cfg == nil {
			cfg = map[string]any{}
		}
		return result{key: "config", value: cfg}, nil
	}},
	{name: "pause", path: "/admin/pause", action: true, route: true, run: func(c *core, route string) (result, error) {
		if err := c.ctl.Pause(route); err != nil {
			return result{}, err
		}
		return result{note: "paused " + routeText(route) + ": in-flight requests finish, new requests wait for resume"}, nil
	}},
	{name: "resume", path: "/admin/resume", action: true, route: true, run: func(c *core, route string) (result, error) {
		if err := c.ctl.Resume(route); err != nil {
			return result{}, err
		}
		return result{note: "resumed " + routeText(route)}, nil
	}},
	{name: "reconnect", path: "/admin/reconnect", action: true, route: true, run: func(c *core, route string) (result, error) {
		if err := c.ctl.Reconnect(route); err != nil {
			return result{}, err
		}
		return result{note: "reconnecting " + routeText(route) + ": in-use connections close after their request, new requests get new connections"}, nil
	}},
	{name: "reload", path: "/admin/reload", action: true, run: func(c *core, _ string) (result, error) {
		if err := c.ctl.Reload(); err != nil {
			return result{}, err
		}
		return result{note: "configuration reloaded"}, nil
	}},
	{name: "shutdown", path: "/admin/shutdown", action: true, run: func(c *core, _ string) (result, error) {
		c.ctl.Shutdown()
		return result{note: "shutting down: new requests get ShutdownInProgress (91), in-flight ones finish"}, nil
	}},
}

// commandNames lists the valid commands for the CommandNotFound message.
var commandNames = func() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}()

func routeText(route string) string {
	if route == "" {
		return "every route"
	}
	return "route " + route
}

// lookupCommand finds a command by its wire name. Case does not matter:
// operators coming from PgBouncer type SHOW POOLS habits into mongosh.
func lookupCommand(name string) (*command, bool) {
	i := slices.IndexFunc(commands, func(c command) bool { return strings.EqualFold(c.name, name) })
	if i < 0 {
		return nil, false
	}
	return &commands[i], true
}

// core is the state both front ends share: the Controller and the previous
// showStats snapshot.
type core struct {
	ctl Controller
	log *slog.Logger
	now func() time.Time

	mu sync.Mutex
	// prevStats is the snapshot taken by the previous showStats: the
	// start of the next rate window. havePrev is false until the first
	// showStats, whose window starts at process start. Both guarded by mu.
	prevStats StatsInfo
	havePrev  bool
}

func newCore(ctl Controller, logger *slog.Logger) *core {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &core{ctl: ctl, log: logger, now: time.Now}
}

// stats returns showStats, with rates since the previous call.
func (c *core) stats() StatsReport {
	cur := c.ctl.Stats()
	c.mu.Lock()
	prev, since := c.prevStats, SincePrevious
	// A window that does not move forward (two calls within the clock's
	// resolution, or a Controller restarted under us) says nothing: fall
	// back to the whole uptime.
	if !c.havePrev || cur.Uptime <= prev.Uptime {
		prev, since = StatsInfo{}, SinceStart
	}
	c.prevStats, c.havePrev = cur, true
	c.mu.Unlock()
	return statsReport(cur, rates(prev, cur, since))
}

// exec runs cmd for a front end; via and peer only go to the log. Errors
// come back as *Error, ready to answer.
func (c *core) exec(cmd *command, route, via, peer string) (result, *Error) {
	res, err := cmd.run(c, route)
	if err != nil {
		ae := asAdminError(err)
		c.log.LogAttrs(context.Background(), slog.LevelWarn, "admin command failed",
			slog.String("command", cmd.name), slog.String("route", route), slog.String("via", via),
			slog.String("peer", peer), slog.Int("code", int(ae.Code)), slog.String("error", ae.Msg))
		return result{}, ae
	}
	level := slog.LevelDebug
	if cmd.action {
		level = slog.LevelInfo
	}
	c.log.LogAttrs(context.Background(), level, "admin command",
		slog.String("command", cmd.name), slog.String("route", route), slog.String("via", via), slog.String("peer", peer))
	return res, nil
}

// orderedValue turns maps (at any depth) into documents sorted by key.
// bson encodes a Go map in iteration order, which is random: showConfig
// would come out shuffled on every call. Anything else is kept as is.
func orderedValue(v any) any {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return v
		}
		keys := make([]string, 0, rv.Len())
		for _, k := range rv.MapKeys() {
			keys = append(keys, k.String())
		}
		slices.Sort(keys)
		d := make(bson.D, 0, len(keys))
		for _, k := range keys {
			d = append(d, bson.E{Key: k, Value: orderedValue(rv.MapIndex(reflect.ValueOf(k).Convert(rv.Type().Key())).Interface())})
		}
		return d
	case reflect.Slice, reflect.Array:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return v
		}
		a := make(bson.A, rv.Len())
		for i := range a {
			a[i] = orderedValue(rv.Index(i).Interface())
		}
		return a
	}
	return v
}
